#!/bin/bash
# BUNDLE=DIR bash THIS_SCRIPT OUT WAIT_MS... : fresh servers alternating over the given --max-wait-ms values, two rounds
cd "$(git rev-parse --show-toplevel)"
OUT=$1; shift
mkdir -p $OUT
for round in 1 2; do
for wait in "$@"; do
  OMP_NUM_THREADS=1 aggdec serve "$BUNDLE" --port 8731 --threads 1 --mode iad --max-batch 32 --max-wait-ms $wait > /dev/null 2>&1 &
  SP=$!
  sleep 10
  OMP_NUM_THREADS=1 aggdec loadtest http://127.0.0.1:8731 --bundle "$BUNDLE" --limit 512 --concurrency 1 8 --duration 15 --threads 1 --offline-batch 0 --out $OUT/wait$wait-r$round > /dev/null 2>&1
  kill $SP; wait $SP 2>/dev/null; sleep 1
  echo "wait $wait round $round: $(grep -E '^\| (1|8) \|' $OUT/wait$wait-r$round/loadtest.md | awk -F'|' '{printf "c=%s %s t/s p50 %s p99 %s p99/p50 %s; ", $2,$5,$6,$8,$9}')"
done; done
