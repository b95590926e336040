"""The runtime imports and decodes with torch, transformers, onnx and tensorrt unimportable."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_runtime_decodes_without_build_time_libraries(bundle):
    root = bundle("marian")
    script = textwrap.dedent(f"""
        import sys
        for name in ("torch", "transformers", "onnx", "tensorrt", "optimum", "aggdec.export", "aggdec.engines"):
            sys.modules[name] = None  # any import of these now raises ImportError
        from aggdec import Generator
        generator = Generator({str(root)!r})
        greedy = generator.generate(["w1 w2 w3 w4"], mode="greedy", max_new_tokens=12)[0]
        iad = generator.generate(["w1 w2 w3 w4"], mode="iad", max_new_tokens=12)[0]
        assert greedy.ids == iad.ids and len(greedy.ids) > 0, (greedy, iad)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "onnx", "tensorrt")
                        and sys.modules[m] is not None)
        assert not loaded, loaded
        print("ok", len(greedy.ids))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_runtime_sources_import_no_build_time_library():
    """A static check too: no runtime module names a build-time library in an import."""
    import pathlib
    import re

    import aggdec.runtime

    pattern = re.compile(r"^\s*(import|from)\s+(torch|transformers|onnx|tensorrt|optimum)\b", re.MULTILINE)
    root = pathlib.Path(aggdec.runtime.__file__).parent
    offenders = [str(p) for p in root.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
