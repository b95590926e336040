"""Which sessions run a bundle's graphs on a device: a registry of per-device session factories.

``open_bundle(path, device)`` asks the factory registered for ``device`` to check the request
before any file is read, then to open the graphs. onnxruntime's CPU and CUDA providers are
registered here. Other backends register themselves: ``aggdec.engines`` registers "tensorrt"
when imported, and an installed distribution may name a factory under the
``aggdec.devices`` entry-point group (aggdec's own names ``aggdec.engines.runtime:TENSORRT``),
which is loaded the first time its device is asked for. So the runtime never imports a
backend: a backend imports the runtime and registers itself.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

from .errors import BundleError, ProviderError
from .graph_specs import VERIFIER_GRAPHS
from .manifest import BundleFiles, Manifest
from .session import DEVICES as ORT_DEVICES
from .session import OrtSession, Session, check_device

ENTRY_POINTS = "aggdec.devices"


@dataclass(frozen=True)
class SessionRequest:
    """How the caller wants the graphs run (``Generator``'s and ``open_bundle``'s arguments)."""

    device: str
    threads: int | None = None
    tf32: bool = False
    io_binding: bool | None = None  # None: the factory's choice
    engines: Path | None = None  # prebuilt engines (TensorRT); refused by factories that have none
    # the verifier graphs under onnxruntime's CUDA graphs (Generator(cuda_graphs=True)); refused
    # by factories that have none
    cuda_graphs: bool = False


class SessionFactory(Protocol):
    """Opens a bundle's graphs on one device. A factory for a device outside the built-in
    table (``loader.PRECISION_DEVICES``) also names the bundle precisions it runs, as a
    ``precisions`` attribute (a tuple such as ``("fp32",)``). A factory whose sessions cannot be
    run on an arbitrary probe input (engines with fixed shape profiles) sets
    ``probes_vocabulary = False`` to skip the load-time vocabulary probe (``bundle_probe``)."""

    def check(self, request: SessionRequest) -> bool:
        """Refuse what this device cannot do before any file is read (a missing library, an
        option it does not take); returns whether the decode loop's cache is IO-bound
        (``request.io_binding`` resolved)."""
        ...

    def open(self, root: Path, manifest: Manifest, graphs: Sequence[str], request: SessionRequest,
             files: BundleFiles) -> dict[str, Session]:
        """A session per graph name of ``graphs``. ``files`` reads the bundle's listed files, each
        checked against its sha256 as it is read: a factory that can hand a graph's bytes (and
        its external data) over from memory should, so that what runs is what was hashed."""
        ...


class OrtFactory:
    """onnxruntime's CPU or CUDA execution provider."""

    def check(self, request: SessionRequest) -> bool:
        check_device(request.device, request.tf32)
        if request.engines is not None:
            raise ProviderError(f"engines applies to device 'tensorrt' only, not {request.device!r}.")
        if request.cuda_graphs and request.device != "cuda":
            raise ProviderError(f"CUDA graphs apply to device 'cuda' only, not {request.device!r}.")
        if request.cuda_graphs and request.io_binding is False:
            raise ProviderError("CUDA graphs replay calls whose every input and output is bound on the device: "
                                "they need io_binding.")
        return True if request.io_binding is None else bool(request.io_binding)

    def open(self, root: Path, manifest: Manifest, graphs: Sequence[str], request: SessionRequest,
             files: BundleFiles) -> dict[str, Session]:
        return {name: self._session(root, manifest, name, request, files) for name in graphs}

    def _session(self, root: Path, manifest: Manifest, name: str, request: SessionRequest,
                 files: BundleFiles) -> OrtSession:
        def make(cuda_graph: bool) -> OrtSession:
            return OrtSession(root / manifest.graph(name).file, request.device, request.threads, request.tf32,
                              manifest.graph(name), name, contents=files.read(manifest.graph(name).file),
                              external_data=files.external_data(), cuda_graph=cuda_graph)

        # only the verifier's and the encoder's calls have static shapes (a static batch encodes
        # one source at a time at the source allocation's width)
        if not (request.cuda_graphs and (name in VERIFIER_GRAPHS or name == "encoder")):
            return make(False)
        try:
            return make(True)
        except BundleError as exc:
            # onnxruntime refuses enable_cuda_graph for a graph with a node off the CUDA provider
            # (or with control flow): the graph still decodes, without CUDA graphs (and says why)
            session = make(False)
            session.cuda_graph_refused = str(exc)[:600]
            return session


_FACTORIES: dict[str, SessionFactory] = {device: OrtFactory() for device in ORT_DEVICES}
_LOCK = threading.Lock()


def register_device(device: str, factory: SessionFactory) -> None:
    """Make ``device`` openable with ``factory`` (replacing any factory it had)."""
    if not isinstance(device, str) or not device:
        raise ValueError(f"a device name must be a non-empty string, got {device!r}.")
    with _LOCK:
        _FACTORIES[device] = factory


def registered_devices() -> tuple[str, ...]:
    """The devices registered so far (entry points not yet loaded are not among them)."""
    with _LOCK:
        return tuple(_FACTORIES)


def session_factory(device: str) -> SessionFactory:
    """The factory registered for ``device``, loading its entry point on first use; a
    ProviderError naming the known devices if there is none."""
    with _LOCK:
        factory = _FACTORIES.get(device)
    if factory is not None:
        return factory
    for entry in entry_points(group=ENTRY_POINTS):
        if entry.name == device:
            loaded = entry.load()
            register_device(device, loaded() if isinstance(loaded, type) else loaded)
            return _FACTORIES[device]
    raise ProviderError(f"unknown device {device!r}; choose one of: {', '.join(registered_devices())} "
                        "(a backend registers its device with aggdec.runtime.devices.register_device).")
