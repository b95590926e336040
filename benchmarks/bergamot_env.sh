#!/usr/bin/env bash
# A separate environment for the Bergamot peer of `aggdec bench` (translation, Marian folders).
#
# bergamot 0.4.5 (Bergamot's deployed int8 engine, PyPI) ships wheels for CPython 3.10 only, so
# it cannot share aggdec's environment. `aggdec bench` runs each system in a worker process of
# its own and starts the Bergamot worker with this environment's python; tokenizers counts the
# output tokens, pyyaml (a bergamot dependency) reads the decoding yml:
#
#     bash benchmarks/bergamot_env.sh [DIR]         # default DIR: bergamot-env
#     aggdec bench ... --bergamot-python bergamot-env/bin/python
#
# (or export AGGDEC_BERGAMOT_PYTHON=bergamot-env/bin/python). PYTHON310 names the interpreter.
set -euo pipefail
DIR="${1:-bergamot-env}"
PYTHON310="${PYTHON310:-python3.10}"
"$PYTHON310" -m venv "$DIR"
"$DIR/bin/pip" install --quiet "bergamot==0.4.5" "tokenizers>=0.15"
# the worker loads bergamot's extension module alone (importing the package fetches model lists)
"$DIR/bin/python" -c "
import importlib.util, pathlib, tokenizers, yaml
spec = importlib.util.find_spec('bergamot')
assert spec and any(pathlib.Path(spec.submodule_search_locations[0]).glob('_bergamot*.so')), 'no bergamot extension'
print('bergamot env ready: tokenizers', tokenizers.__version__)"
