#!/bin/bash
# BUNDLE=DIR OLD=OLD_CHECKOUT [PY=python] bash disc_ab.sh OUT: fresh servers alternating the old code (OLD) and
# this checkout, two rounds, one load test at 8 and 32 clients each, offline IAD at batch 32 timed in each run
BUNDLE=${BUNDLE:?the fp32 reference bundle}; OUT=${1:?out dir}; mkdir -p $OUT
PY=${PY:-python}; NEW=$(git rev-parse --show-toplevel); OLD=${OLD:?a checkout of the old commit}
for round in 1 2; do
for side in old new; do
  tree=$NEW; [ $side = old ] && tree=$OLD
  (cd $tree && OMP_NUM_THREADS=1 exec $PY -m aggdec serve "$BUNDLE" --port 8731 --threads 1 --mode iad --max-batch 32 > /dev/null 2>&1) &
  SP=$!
  sleep 10
  OMP_NUM_THREADS=1 aggdec loadtest http://127.0.0.1:8731 --bundle "$BUNDLE" --limit 512 --concurrency 8 32 --duration 15 --threads 1 --offline-batch 32 --out $OUT/$side-r$round > /dev/null 2>&1
  pkill -f "aggdec serve $BUNDLE --port 8731"; wait $SP 2>/dev/null; sleep 1
  echo "$side round $round: $(grep -E '^\| [0-9]+ \| [0-9]+ \|' $OUT/$side-r$round/loadtest.md | awk -F'|' '{printf "c=%s %s t/s p50 %s p99 %s p99/p50 %s; ", $2,$5,$6,$8,$9}') $(grep -E '^\| [0-9]+ \| [0-9.]+x \|' $OUT/$side-r$round/loadtest.md | tr -d '\n')"
done; done
