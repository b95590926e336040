"""TensorRT engines for aggdec bundles (``aggdec build-engines``, ``Generator(device="tensorrt")``).

- :mod:`.profiles`: optimization profiles derived from the bundle's manifest, engine keys
  (bundle, graph, profile, GPU, TensorRT version, precision) and ``engines.json``; plain
  Python, tested without TensorRT.
- :mod:`.build`: ``build_engines(bundle, out, BuildOptions(...))``, with a timing cache.
- :mod:`.trt`: TensorRT and cuda-python, imported only when called; ``TrtSession`` runs an
  engine behind the runtime's Session protocol with cudaMalloc'd device buffers, no torch.
- :mod:`.runtime`: the "tensorrt" session factory, registered with ``aggdec.runtime.devices``
  on import (and named by pyproject's ``aggdec.devices`` entry points).

NOT RUN YET: written against TensorRT's documented Python API on a machine without TensorRT
or a GPU; the README (TensorRT) gives the commands that verify it on a TensorRT machine.
"""

from . import runtime  # noqa: F401 - registers device "tensorrt" with aggdec.runtime.devices
from .build import BuildOptions, build_engines, plan
from .profiles import (ProfileOptions, Target, bundle_profiles, default_engines_dir, dim_ranges, engine_key,
                       graph_profile)

__all__ = ["BuildOptions", "ProfileOptions", "Target", "build_engines", "bundle_profiles", "default_engines_dir",
           "dim_ranges", "engine_key", "graph_profile", "plan"]
