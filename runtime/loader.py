"""Opening a bundle: the manifest, the tokenizer, a session per graph and the drafter, checked.

:func:`open_bundle` does everything that happens before the first text is decoded: the
device's session factory checks the request (``runtime/devices.py``), the manifest is read and
its hashes verified, the precision is matched with the device, the drafter graph is chosen,
the sessions are opened and checked against the manifest and the tokenizer. ``Generator``
decodes with what it returns; nothing here decodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import values
from .bundle_checks import check_consistency
from .bundle_probe import probe_lengths, probe_vocabulary
from .decoding.gad import Drafter
from .decoding.shortlist import Shortlist, load_shortlist
from .devices import SessionRequest, session_factory
from .errors import BundleError, ProviderError
from .graph_specs import VERIFIER_GRAPHS, argmax_graph_runs_on, drafter_takes_output_ids
from .manifest import TOKENIZER_FILE, BundleFiles, Manifest, load_manifest
from .segmentation import SENTENCEPIECE, SENTENCEPIECE_FILE
from .session import Session
from .tokenizer import TextCodec

# the devices each bundle precision runs on, and why the others cannot run it
PRECISION_DEVICES = {"fp32": ("cpu", "cuda", "tensorrt"), "int8": ("cpu",), "fp16": ("cuda", "cpu")}
PRECISION_LIMITS = {
    "int8": "its MatMulInteger products are a CPU kernel (onnxruntime's CUDA provider would run them on the CPU, "
            "copying every activation across, and TensorRT has no such layer)",
    "fp16": "aggdec's TensorRT engines are built from fp32 graphs (`aggdec build-engines --fp16` builds fp16 "
            "engines from them)",
}


def check_precision(manifest: Manifest, device: str, root: Path | str = "the bundle") -> None:
    """Refuse a bundle whose precision ``device`` cannot run, before any session is made."""
    devices = PRECISION_DEVICES.get(manifest.precision, ())
    if device not in devices:
        raise ProviderError(
            f"{str(root)!r} is an {manifest.precision} bundle, which runs on device {' or '.join(map(repr, devices))} "
            f"only, not {device!r}: {PRECISION_LIMITS[manifest.precision]}. Use "
            f"device {devices[0]!r}, or the fp32 bundle it was converted from on {device!r}."
        )


def drafter_graph(manifest: Manifest, device: str, int8_drafter: bool | None, root: Path | str = "the bundle"
                  ) -> str | None:
    """Which of the bundle's drafter graphs to open: "drafter_int8" (fp32 bundles exported by
    this aggdec carry one) on the CPU unless ``int8_drafter`` is False, else "drafter"; None
    when the bundle has no drafter. The drafter only proposes tokens, which the verifier checks,
    so its precision never changes an output (only how many drafts are accepted)."""
    values.flag("int8_drafter", int8_drafter, optional=True)
    if "drafter" not in manifest.graphs:
        if int8_drafter:
            raise BundleError(f"int8_drafter=True, but {str(root)!r} has no drafter; export it with --drafter.")
        return None
    if int8_drafter and device != "cpu":
        raise ProviderError(f"int8_drafter=True runs on device 'cpu' only, not {device!r} (int8 MatMulInteger is a "
                            "CPU kernel); leave it unset to use the float drafter there.")
    if int8_drafter and manifest.precision == "fp32" and "drafter_int8" not in manifest.graphs:
        raise BundleError(f"int8_drafter=True, but {str(root)!r} has no int8 drafter (drafter_int8): it was exported "
                          "before aggdec wrote one, or with --no-int8-drafter; re-export it, or leave int8_drafter "
                          "unset.")
    if device == "cpu" and int8_drafter is not False and "drafter_int8" in manifest.graphs:
        return "drafter_int8"
    return "drafter"  # in an int8 bundle, that one is int8 already


@dataclass
class OpenedBundle:
    """A bundle ready to decode: what :func:`open_bundle` returns and ``Generator`` runs.

    ``sessions``: one per graph opened (encoder, verifier, the chosen drafter graph and the
    drafter's own source layers when the bundle has them), by graph name. ``drafter``: GAD's
    drafter over its session, or None when the bundle has none. ``io_binding``: whether the
    decode loop binds its cache buffers (the device factory's resolution of the request).
    ``shortlist``: each sentence's output vocabulary (a bundle with Marian's lexical shortlist,
    unless opened with ``shortlist=False``), else None."""

    root: Path
    manifest: Manifest
    codec: TextCodec
    sessions: dict[str, Session]
    drafter: Drafter | None
    drafter_graph: str | None
    request: SessionRequest
    io_binding: bool
    shortlist: Shortlist | None = None

    @property
    def device(self) -> str:
        return self.request.device


def open_bundle(path: str | Path, device: str = "cpu", threads: int | None = None, io_binding: bool | None = None,
                verify: bool = True, tf32: bool = False, engines: str | Path | None = None,
                int8_drafter: bool | None = None, shortlist: bool = True, cuda_graphs: bool = False) -> OpenedBundle:
    """Open the bundle at ``path`` on ``device`` (arguments as ``Generator`` takes them).

    The order is the order of what can be refused cheapest: the device and its options (no
    file read), the manifest and every file's hash (``verify``), the precision against the
    device, the drafter choice, then the sessions, checked against the manifest and the
    tokenizer before any text meets them. Raises BundleError, BundleNotFoundError,
    ProviderError or InputError, each naming what to fix."""
    root = values.path("path", path)
    # every flag a bool, checked alike: a truthy string (shortlist="no") was taken for True
    for name, value, optional in (("io_binding", io_binding, True), ("verify", verify, False), ("tf32", tf32, False),
                                  ("int8_drafter", int8_drafter, True), ("shortlist", shortlist, False),
                                  ("cuda_graphs", cuda_graphs, False)):
        values.flag(name, value, optional)
    request = SessionRequest(device=device, threads=threads, tf32=tf32, io_binding=io_binding,
                             engines=None if engines is None else values.path("engines", engines),
                             cuda_graphs=cuda_graphs)
    factory = session_factory(device)
    bound = factory.check(request)  # before reading any file
    manifest = load_manifest(root, verify=verify)
    precisions = getattr(factory, "precisions", None)  # a registered device's own; the built-in ones' are above
    if precisions is None:
        check_precision(manifest, device, root)  # before any session is made
    elif manifest.precision not in precisions:
        raise ProviderError(f"{str(root)!r} is an {manifest.precision} bundle; device {device!r} runs "
                            f"{' and '.join(precisions)} bundles only.")
    chosen = drafter_graph(manifest, device, int8_drafter, root)
    files = BundleFiles(root, manifest, verify)  # what is read is what was hashed
    pieces = files.read(SENTENCEPIECE_FILE) if manifest.segmentation == SENTENCEPIECE else None
    codec = TextCodec(root / TOKENIZER_FILE, files.read(TOKENIZER_FILE), manifest.segmentation, manifest.vocab_size,
                      pieces, clean_up=bool(manifest.clean_up_tokenization_spaces),
                      split_special=bool(manifest.split_special_tokens))
    codec.encode(["a"])  # a post-processor adds its tokens to every text: an id past the vocabulary fails here
    unused = () if argmax_graph_runs_on(manifest, device) else ("verifier_argmax",)
    graphs = [name for name in ("encoder", *VERIFIER_GRAPHS, chosen, "drafter_source")
              if name is not None and name in manifest.graphs and name not in unused]  # drafter_source: a drafter's own layers
    sessions = factory.open(root, manifest, graphs, request, files)
    # the graphs must be what the manifest says they are, before any text meets them
    check_consistency(manifest, sessions, codec.vocab_size, codec.special_ids, unopened=unused)
    if getattr(factory, "probes_vocabulary", True):
        probe_vocabulary(manifest, sessions)  # and their vocabulary, which their IO does not show
        probe_lengths(manifest, sessions)  # and the lengths the manifest promises
    drafter = None
    if chosen is not None:
        drafter = Drafter(sessions[chosen], int(manifest.draft_k or 0), int(manifest.mask_token_id or 0),
                          int(manifest.draft_window or 0), sessions.get("drafter_source"),
                          source_positions=manifest.draft_positions == "source", vocab_size=manifest.vocab_size,
                          takes_output_ids=drafter_takes_output_ids(manifest))
    return OpenedBundle(root=root, manifest=manifest, codec=codec, sessions=sessions, drafter=drafter,
                        drafter_graph=chosen, request=request, io_binding=bound,
                        shortlist=load_shortlist(files, manifest) if shortlist else None)
