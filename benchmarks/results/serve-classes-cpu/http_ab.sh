#!/bin/bash
cd /work/wt-serveload
export OMP_NUM_THREADS=1
OUT=benchmarks/results/serve-classes-cpu
i=0
for side in A B B A A B; do
  i=$((i+1))
  if [ $side = A ]; then C=32,64; else C=48; fi
  nice -n 15 .venv/bin/python benchmarks/results/serve-classes-cpu/serve_with.py $C serve /tmp/sl/bundle --port 8731 --threads 1 --mode iad --max-batch 32 --max-wait-ms 5 > /tmp/sl/http/server$i.log 2>&1 &
  SP=$!
  for j in $(seq 90); do curl -sf http://127.0.0.1:8731/readyz >/dev/null 2>&1 && break; sleep 1; done
  echo "$(date -u +%T) $(cat /proc/loadavg) step $i side $side classes $C"
  nice -n 15 .venv/bin/aggdec loadtest http://127.0.0.1:8731 --bundle /tmp/sl/bundle --limit 512 --concurrency 8 32 \
     --duration 20 --threads 1 --offline-batch 32 --out $OUT/step$i-$side > /tmp/sl/http/loadtest$i.log 2>&1
  echo "$(date -u +%T) $(cat /proc/loadavg)"
  kill $SP; wait $SP
done
echo done
