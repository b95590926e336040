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
# (or export AGGDEC_OPTIMUM_PYTHON=optimum-env/bin/python). torch is pinned to the CPU build.
set -euo pipefail
DIR="${1:-optimum-env}"
python3 -m venv "$DIR"
"$DIR/bin/pip" install --quiet "torch==2.13.0" "optimum-onnx[onnxruntime]==0.1.0"
"$DIR/bin/python" -c "import optimum.onnxruntime, transformers; print('optimum env ready:', transformers.__version__)"
