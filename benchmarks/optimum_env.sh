#!/usr/bin/env bash
# A separate environment for the optimum peer of `aggdec bench`.
#
# optimum-onnx (the package behind optimum's ORTModelForSeq2SeqLM) pins transformers<4.58,
# while aggdec's export extra needs transformers 5, so optimum cannot share aggdec's
# environment. `aggdec bench` runs each system in a worker process of its own and starts the
# optimum worker with this environment's python:
#
#     bash benchmarks/optimum_env.sh [DIR]          # default DIR: optimum-env
#     aggdec bench --optimum-python optimum-env/bin/python
#
# (or export AGGDEC_OPTIMUM_PYTHON=optimum-env/bin/python). torch is pinned to its CPU build:
# PyPI's torch for Linux is the CUDA build (several GB of nvidia-* wheels), so torch comes first
# from PyTorch's CPU index (TORCH_INDEX to use a mirror); optimum-onnx's own torch requirement is
# then already met and pip keeps it.
set -euo pipefail
DIR="${1:-optimum-env}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
python3 -m venv "$DIR"
"$DIR/bin/pip" install --quiet --index-url "$TORCH_INDEX" "torch==2.13.0"
"$DIR/bin/pip" install --quiet "optimum-onnx[onnxruntime]==0.1.0"
"$DIR/bin/python" -c "
import optimum.onnxruntime, torch, transformers
assert torch.version.cuda is None, f'torch {torch.__version__} is a CUDA build; the CPU build was meant'
print('optimum env ready: transformers', transformers.__version__, 'torch', torch.__version__)"
