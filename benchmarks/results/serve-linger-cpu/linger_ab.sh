#!/bin/bash
# BUNDLE=DIR [OFFLINE=32] [DURATION=20] bash linger_ab.sh OUT "CLIENTS..." WAIT_MS... : fresh servers
# alternating over the given --max-wait-ms values, two rounds, one load test of the given client
# counts each (OFFLINE: also time offline IAD at that batch, for served/offline; 0 by default)
cd "$(git rev-parse --show-toplevel)"
OUT=$1; CLIENTS=$2; shift 2
OFFLINE=${OFFLINE:-0}; DURATION=${DURATION:-15}
mkdir -p $OUT
for round in 1 2; do
for wait in "$@"; do
  OMP_NUM_THREADS=1 aggdec serve "$BUNDLE" --port 8731 --threads 1 --mode iad --max-batch 32 --max-wait-ms $wait > /dev/null 2>&1 &
  SP=$!
  sleep 10
  OMP_NUM_THREADS=1 aggdec loadtest http://127.0.0.1:8731 --bundle "$BUNDLE" --limit 512 --concurrency $CLIENTS --duration $DURATION --threads 1 --offline-batch $OFFLINE --out $OUT/wait$wait-r$round > /dev/null 2>&1
  kill $SP; wait $SP 2>/dev/null; sleep 1
  echo "wait $wait round $round: $(grep -E '^\| [0-9]+ \| [0-9]+ \|' $OUT/wait$wait-r$round/loadtest.md | awk -F'|' '{printf "c=%s %s t/s p50 %s p99 %s p99/p50 %s; ", $2,$5,$6,$8,$9}') $(grep -E '^\| [0-9]+ \| [0-9.]+x \|' $OUT/wait$wait-r$round/loadtest.md | tr -d '\n')"
done; done
