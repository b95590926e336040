#!/usr/bin/env bash
# The CPU side of the GPU check: make what the calls carry (benchmarks/gpu/README.md has the calls).
# Run from the repository root, with the project installed ('.[cpu,export,bench,test]'):
#
#   bash benchmarks/gpu/prepare.sh [--base] [--wheel SPEC]... [--ort-version 1.31.1] [--no-ort] [--full-wheel] [--arch 90]
#
# Run it in the checkout the device tool sends (the session's own, not a helper's worktree).
# --no-ort keeps the onnxruntime-gpu parts made before.
#
#   .gpu-pack/onnxruntime-gpu/w1..wN
#                            onnxruntime-gpu slimmed to one GPU architecture (slim_ort.py: sm_90,
#                            the H100 and H200), a 58 MiB site archive: 2 or 3 parts, as the tree leaves room
#   .ort-gpu/w1..wN          with --full-wheel: the whole wheel in parts (../shared/tools/ort-gpu-chunks.sh;
#                            9 parts; it writes .git/info/exclude, so .git must be a folder)
#   .gpu-pack/data/w1        the UA-GEC test split as a TSV (source, annotators a1 and a2), small
#                            enough to ride along with .ort-gpu/w1
#   .gpu-pack/uagec-base/w*  with --base: the larger reference checkpoint (../shared/models/uagec-base/model)
#   .gpu-pack/wheels/w*      with --wheel: wheels the image lacks (pip download --no-deps, for the
#                            device's Python 3.12 on x86-64), installed there into /tmp/gpu-check/site
#
# Both folders are git-ignored: they travel only in a call's carry, one w folder per call.
# Last, it prints the device calls in order, with their carry paths and this commit.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
shared=${SHARED:-../shared}  # the shared folder beside the checkout: its tools and models
base=0
ort=1
full=0
arch=90
ort_version=1.31.1
wheels=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=1 ;;
    --no-ort) ort=0 ;;
    --full-wheel) full=1 ;;
    --arch) arch=$2; shift ;;
    --wheel) wheels+=("$2"); shift ;;
    --ort-version) ort_version=$2; shift ;;
    *) echo "prepare.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$ort" = 1 ] && [ "$full" = 1 ]; then
  if [ ! -d .git ]; then
    echo "prepare.sh: .git is not a folder here (a worktree?); ort-gpu-chunks.sh writes .git/info/exclude: run this" \
         "in the checkout the device tool sends, or pass --no-ort" >&2
    exit 2
  fi
  rm -rf .gpu-pack/onnxruntime-gpu  # one onnxruntime-gpu on the device: the whole wheel's parts only
  bash "$shared/tools/ort-gpu-chunks.sh" "$ort_version"
  "$py" benchmarks/gpu/carry.py describe-wheel .ort-gpu
elif [ "$ort" = 1 ]; then
  rm -rf .ort-gpu/w[0-9]*
  wheels_dir=$(mktemp -d)
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheels_dir" "onnxruntime-gpu==$ort_version"
  "$py" benchmarks/gpu/slim_ort.py "$wheels_dir"/onnxruntime_gpu-*.whl "$wheels_dir/onnxruntime-gpu.tar.xz" --arch "$arch"
  "$py" benchmarks/gpu/carry.py pack-site onnxruntime-gpu "$wheels_dir/onnxruntime-gpu.tar.xz"
  rm -rf "$wheels_dir"
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/data"
"$py" - "$scratch/data/uagec-test.tsv" <<'EOF'
import sys

from aggdec.uagec import load_pairs

def field(text):
    return " ".join((text or "").split())  # one line, no TAB: the TSV's own separators

with open(sys.argv[1], "w", encoding="utf-8") as out:
    pairs = load_pairs("test")
    for pair in pairs:
        out.write("\t".join(field(t) for t in (pair.source, pair.target, pair.target2)) + "\n")
print(f"UA-GEC test split: {len(pairs)} sentences")
EOF
"$py" benchmarks/gpu/carry.py pack data "$scratch/data/uagec-test.tsv" --room-mib 2

if [ "$base" = 1 ]; then
  "$py" benchmarks/gpu/carry.py pack uagec-base "$shared/models/uagec-base/model"
fi
if [ "${#wheels[@]}" -gt 0 ]; then
  mkdir -p "$scratch/wheels"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$scratch/wheels" "${wheels[@]}"
  "$py" benchmarks/gpu/carry.py pack wheels "$scratch/wheels" --wheels
fi

# the device calls, to issue back to back (the machine keeps /tmp only 30 s after a call)
sha=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || sha="$sha+uncommitted"
run="AGGDEC_COMMIT=$sha bash benchmarks/gpu/check.sh"
echo
echo "device calls (run, timeout_s 600, one after the other; benchmarks/gpu/README.md):"
mapfile -t parts < <(ls -d .gpu-pack/onnxruntime-gpu/w* .ort-gpu/w* 2>/dev/null | sort -V)
n=${#parts[@]}
call=1
for part in "${parts[@]}"; do
  if [ "$call" = 1 ]; then
    echo "$call. carry [\"$part\", \".gpu-pack/data/w1\"]  command: $run export"
  elif [ "$call" = "$n" ]; then
    echo "$call. carry [\"$part\"]  command: $run env equality fp16 graphs bench pytest   (timeout_s 600; it stops its stages at 540 s)"
  else
    echo "$call. carry [\"$part\"]  command: $run carry"
  fi
  call=$((call + 1))
done
echo "$call. no carry  command: $run STAGE...   (only if device time is left: the stages the last call left 'not started' or 'partial')"
for part in $(ls -d .gpu-pack/uagec-base/w* 2>/dev/null | sort -V); do
  call=$((call + 1))
  echo "$call. carry [\"$part\"]  command: $run carry   (optional: the larger model)"
done
if [ -d .gpu-pack/uagec-base ]; then
  echo "$((call + 1)). no carry  command: $run export equality fp16 --only uagec-base   (optional)"
fi
echo "source digest of this tree (the report records the device's): $("$py" benchmarks/gpu/check.py --digest)"
