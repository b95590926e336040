"""The systems a benchmark can run: aggdec's modes and the tools users would otherwise pick."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SystemSpec:
    name: str
    kind: str  # the worker class: aggdec, transformers, optimum, ctranslate2
    label: str  # how tables and plots name it
    options: dict = field(default_factory=dict)
    batches: bool = True  # runs batch sizes above 1
    needs_drafter: bool = False
    exact: bool = True  # promised to equal greedy token for token (checked, not assumed)


SYSTEMS: tuple[SystemSpec, ...] = (
    SystemSpec("aggdec-greedy", "aggdec", "aggdec greedy", {"mode": "greedy"}),
    SystemSpec("aggdec-iad", "aggdec", "aggdec IAD", {"mode": "iad"}),
    SystemSpec("aggdec-gad", "aggdec", "aggdec GAD", {"mode": "gad"}, needs_drafter=True),
    SystemSpec("aggdec-gad++", "aggdec", "aggdec GAD++ (β3 τ1)", {"mode": "gad++", "beta": 3, "tau": 1.0},
               needs_drafter=True, exact=False),
    # the paper's high-efficiency GAD++ setting (beta 5, tau 3.0)
    SystemSpec("aggdec-gad++-he", "aggdec", "aggdec GAD++ (β5 τ3)", {"mode": "gad++", "beta": 5, "tau": 3.0},
               needs_drafter=True, exact=False),
    SystemSpec("hf-greedy", "transformers", "transformers greedy", {"num_beams": 1}),
    SystemSpec("hf-beam5", "transformers", "transformers beam 5", {"num_beams": 5}, exact=False),
    SystemSpec("optimum-greedy", "optimum", "optimum ORT greedy"),
    SystemSpec("ct2-fp32", "ctranslate2", "CTranslate2 fp32", {"compute_type": "float32"}),
    SystemSpec("ct2-int8", "ctranslate2", "CTranslate2 int8", {"compute_type": "int8"}, exact=False),
)

BY_NAME = {spec.name: spec for spec in SYSTEMS}
REFERENCE = "aggdec-greedy"  # every system's outputs are compared with this one's

# the Python package each kind needs, for the note when it is missing
REQUIRES = {"aggdec": "onnxruntime", "transformers": "transformers", "optimum": "optimum.onnxruntime",
            "ctranslate2": "ctranslate2"}
