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
# (or export AGGDEC_BERGAMOT_PYTHON=bergamot-env/bin/python). PYTHON310 names the interpreter
# (default: python3.10 on PATH, else the newest 3.10 that pyenv installed).
set -euo pipefail
DIR="${1:-bergamot-env}"
if [ -z "${PYTHON310:-}" ]; then
    # python3.10 on PATH, else a pyenv-installed 3.10 (pyenv's shim answers "command not found"
    # for a version that is installed but not selected)
    PYTHON310=python3.10
    if ! "$PYTHON310" -c "" 2>/dev/null; then
        PYTHON310="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10 2>/dev/null | tail -n 1 || true)"
    fi
fi
if [ -z "$PYTHON310" ] || ! "$PYTHON310" -c "import sys; assert sys.version_info[:2] == (3, 10)" 2>/dev/null; then
    echo "bergamot_env.sh: bergamot 0.4.5 needs CPython 3.10, and none was found; set PYTHON310=/path/to/python3.10" >&2
    exit 2
fi
echo "bergamot_env.sh: using $PYTHON310"
"$PYTHON310" -m venv "$DIR"
"$DIR/bin/pip" install --quiet "bergamot==0.4.5" "tokenizers>=0.15"
# the worker loads bergamot's extension module alone (importing the package fetches model lists)
"$DIR/bin/python" -c "
import importlib.util, pathlib, tokenizers, yaml
spec = importlib.util.find_spec('bergamot')
assert spec and any(pathlib.Path(spec.submodule_search_locations[0]).glob('_bergamot*.so')), 'no bergamot extension'
print('bergamot env ready: tokenizers', tokenizers.__version__)"
