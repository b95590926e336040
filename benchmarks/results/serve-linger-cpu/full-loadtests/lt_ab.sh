#!/bin/bash
# full load tests (offline before/after), fresh servers alternating between --max-wait-ms values
# BUNDLE=DIR bash lt_ab.sh OUT WAIT_MS...
cd "$(git rev-parse --show-toplevel)"
OUT=$1; shift
mkdir -p $OUT
for round in 1 2; do
for wait in "$@"; do
  OMP_NUM_THREADS=1 aggdec serve "$BUNDLE" --port 8731 --threads 1 --mode iad --max-batch 32 --max-wait-ms $wait > /dev/null 2>&1 &
  SP=$!
  sleep 10
  OMP_NUM_THREADS=1 aggdec loadtest http://127.0.0.1:8731 --bundle "$BUNDLE" --limit 512 --concurrency 8 32 --duration 20 --threads 1 --offline-batch 32 --out $OUT/wait$wait-r$round > /dev/null 2>&1
  kill $SP; wait $SP 2>/dev/null; sleep 1
  echo "wait $wait round $round: $(grep -E '^\| (8|32) \| [0-9]+ \|' $OUT/wait$wait-r$round/loadtest.md | awk -F'|' '{printf "c=%s %s t/s p99/p50 %s; ", $2,$5,$9}') served/offline $(grep -E '^\| 32 \| [0-9.]+x' $OUT/wait$wait-r$round/loadtest.md)"
done; done
