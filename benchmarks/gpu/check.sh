#!/usr/bin/env bash
# The GPU check, run from the repository root on the lent GPU machine, one call at a time
# (benchmarks/gpu/README.md lists the calls and what each carries):
#
#   bash benchmarks/gpu/check.sh [STAGE...] [check.py options]      # stages: env export pytest equality fp16 graphs bench
#   bash benchmarks/gpu/check.sh --dry-run --model tiny=CKPT ...     # the same on the CPU (tests/test_gpu_check.py)
#
# Every call:
# 1. stages what it carried (benchmarks/gpu/carry.py): parts of onnxruntime-gpu's wheel
#    (.ort-gpu/wK, from ../shared/tools/ort-gpu-chunks.sh) and of packs (.gpu-pack/NAME/wK) are
#    gathered in $GPU_CHECK_WORK/stage; a wheel whose parts are all there is installed into
#    $GPU_CHECK_WORK/site, a pack unpacked into $GPU_CHECK_WORK/carried/NAME;
# 2. puts $GPU_CHECK_WORK/site first on PYTHONPATH, ahead of the image's CPU onnxruntime;
# 3. installs aggdec itself once per machine, without dependencies and from no index (no extra:
#    [cpu] would pull the CPU onnxruntime, [gpu] onnxruntime-gpu's 1.5 GB of CUDA wheels, and the
#    image has neither an index nor need of them); if pip cannot (an old setuptools), a folder of
#    links lays the source tree out as the package and goes on PYTHONPATH;
# 4. runs check.py's stages with TF32 off (NVIDIA_TF32_OVERRIDE=0: onnxruntime's CUDA provider
#    and cuBLAS then run float32 products in float32), each within its budget, and writes the
#    results to $GPU_CHECK_WORK/results and, packed, to $OUT/results.tar.gz.
# $GPU_CHECK_WORK (default /tmp/gpu-check) lives as long as the machine stays warm (30 s between calls).
set -uo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
work=${GPU_CHECK_WORK:-/tmp/gpu-check}
dry=0
cpu=0  # a run on the CPU provider: the dry run, or --device cpu
previous=
for arg in "$@"; do
  [ "$arg" = --dry-run ] && dry=1 && cpu=1
  { [ "$arg" = --device=cpu ] || { [ "$previous" = --device ] && [ "$arg" = cpu ]; }; } && cpu=1
  previous=$arg
done
mkdir -p "$work"

"$py" benchmarks/gpu/carry.py stage --work "$work" || echo "check.sh: staging reported an error (above); going on"
if [ -d "$work/site" ] && [ "$cpu" = 1 ]; then
  # a checkout keeps the parts of a GPU session (.gpu-pack/), and they are staged here too: the
  # GPU's onnxruntime, built for the device's Python, so a run on the CPU keeps the environment's own
  echo "on the CPU: $work/site (what the parts carried for the GPU) left off PYTHONPATH"
elif [ -d "$work/site" ]; then
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi

here_aggdec() {  # is the aggdec Python imports, runtime included, this tree's? (asked from /: not the cwd's aggdec/)
  local repo=$PWD/
  (cd / && "$py" -c 'import sys, aggdec.runtime.session as s; sys.exit(0 if s.__file__.startswith(sys.argv[1]) else 1)' \
     "$repo" 2>/dev/null)
}
link_tree() {  # the source tree laid out as the installed package: aggdec/ with runtime, export, engines inside
  rm -rf "$work/src"
  mkdir -p "$work/src/aggdec"
  for entry in aggdec/*; do [ "$(basename "$entry")" = __pycache__ ] || ln -sfn "$PWD/$entry" "$work/src/aggdec/"; done
  for package in runtime export engines; do ln -sfn "$PWD/$package" "$work/src/aggdec/$package"; done
  echo "source links in $work/src on PYTHONPATH ($1)" > "$work/install.txt"
}
# GPU_CHECK_INSTALL: pip (the default; links if pip cannot) or links
if [ "$dry" = 1 ] && [ "${GPU_CHECK_INSTALL:-}" != links ]; then
  echo "dry run: the environment's own aggdec ($("$py" -c 'import aggdec; print(aggdec.__file__)' 2>&1))" > "$work/install.txt"
elif [ "${GPU_CHECK_INSTALL:-pip}" = links ]; then
  link_tree "GPU_CHECK_INSTALL=links"
elif [ ! -d "$work/src" ] && ! here_aggdec; then
  if "$py" -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$work/pip-aggdec.log" 2>&1 && here_aggdec; then
    echo "pip install --no-index --no-deps --no-build-isolation -e . (no extras)" > "$work/install.txt"
  else
    link_tree "pip could not install it: $(tail -1 "$work/pip-aggdec.log")"
  fi
fi
if [ -d "$work/src" ]; then export PYTHONPATH="$work/src:${PYTHONPATH:-}"; fi
cat "$work/install.txt" 2>/dev/null

# what staging and installing took comes off the stages' time (check.py's default --deadline-s)
export GPU_CHECK_SPENT=$SECONDS NVIDIA_TF32_OVERRIDE=0 PYTHONUNBUFFERED=1
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  "$py" benchmarks/gpu/check.py --work "$work" "$@" 2>&1 | tee "$OUT/check.log"
else
  "$py" benchmarks/gpu/check.py --work "$work" "$@"
fi
