"""open_bundle apart from decoding, and the per-device session factory registry."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from aggdec.runtime import devices
from aggdec.runtime.continuous import RowDecoder
from aggdec.runtime.decoding.arrivals import Arrivals, Work
from aggdec.runtime.devices import OrtFactory, SessionRequest, register_device, registered_devices, session_factory
from aggdec.runtime.errors import BundleError, BundleNotFoundError, InputError, InputTypeError, ProviderError
from aggdec.runtime.generator import Generator
from aggdec.runtime.loader import OpenedBundle, open_bundle
from aggdec.runtime.manifest import BundleFiles, Manifest
from aggdec.runtime.session import OrtSession
from aggdec.runtime.tuning import tuning_for
from tests.runtime.test_gad import K, gad_bundle  # noqa: F401 - a fixture

TEXTS = ["w1 w2 w3 w4", "w5 w6", "w7 w8 w9"]
MAX_NEW = 12


def test_open_bundle_returns_what_decoding_needs(gad_bundle):  # noqa: F811
    opened = open_bundle(gad_bundle("marian"))
    assert isinstance(opened, OpenedBundle) and opened.device == "cpu" and opened.io_binding is True
    assert opened.manifest.draft_k == K and opened.codec.vocab_size == opened.manifest.vocab_size
    assert set(opened.sessions) == {"encoder", "verifier", "verifier_argmax", "drafter_int8"}
    assert opened.drafter_graph == "drafter_int8"
    assert all(isinstance(session, OrtSession) for session in opened.sessions.values())
    assert opened.drafter is not None and opened.drafter.k == K
    assert opened.drafter.session is opened.sessions["drafter_int8"]
    floating = open_bundle(gad_bundle("marian"), int8_drafter=False, io_binding=False)
    assert set(floating.sessions) == {"encoder", "verifier", "verifier_argmax", "drafter"} and floating.io_binding is False


def test_a_generator_decodes_an_opened_bundle_as_one_it_opens(gad_bundle):  # noqa: F811
    opened = open_bundle(gad_bundle("marian"))
    generator = Generator.from_bundle(opened, tuning=tuning_for("cpu").replace(max_block=4))
    assert generator.bundle is opened and generator.drafter is opened.drafter and generator.tuning.max_block == 4
    reference = Generator(gad_bundle("marian"))
    for mode in ("greedy", "iad", "gad"):
        assert [r.ids for r in generator.generate(TEXTS, mode=mode, max_new_tokens=MAX_NEW)] == \
            [r.ids for r in reference.generate(TEXTS, max_new_tokens=MAX_NEW)], mode
    with pytest.raises(InputError, match="bundle must be what open_bundle returns"):
        Generator.from_bundle(gad_bundle("marian"))


def test_open_bundle_refuses_before_decoding(bundle, tmp_path):
    with pytest.raises(ProviderError, match="unknown device 'tpu'; choose one of: cpu, cuda"):
        open_bundle(bundle("marian"), device="tpu")
    with pytest.raises(ProviderError, match="engines applies to device 'tensorrt' only"):
        open_bundle(bundle("marian"), engines=tmp_path)
    with pytest.raises(BundleNotFoundError):
        open_bundle(tmp_path / "missing")
    with pytest.raises(InputError, match="tuning must be"):
        Generator(tmp_path / "missing", tuning="fast")  # refused before any file is read
    copy = tmp_path / "bundle"
    shutil.copytree(bundle("marian"), copy)
    with (copy / "verifier.onnx").open("r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BundleError, match="verifier.onnx"):
        open_bundle(copy)


@pytest.mark.parametrize("name, value", [("shortlist", "no"), ("io_binding", "off"), ("verify", "false"),
                                         ("tf32", "yes"), ("int8_drafter", "x"), ("static_shapes", "no"),
                                         ("cuda_graphs", 1), ("shortlist", 0), ("verify", None), ("io_binding", 1.0)])
def test_every_flag_takes_a_bool_only(name, value, tmp_path):
    """``shortlist="no"`` decoded with the shortlist, ``io_binding="off"`` bound and
    ``verify="false"`` verified: a truthy string was True. Every flag is checked alike, before
    any file is read (the bundle here does not exist), as an InputError that is a TypeError."""
    optional = name in ("io_binding", "int8_drafter", "static_shapes")
    allowed = "True, False or None \\(not given\\)" if optional else "True or False"
    with pytest.raises(InputTypeError, match=f"^{name} must be {allowed}, got {value!r}") as refused:
        Generator(tmp_path / "missing", **{name: value})
    assert isinstance(refused.value, InputError) and isinstance(refused.value, TypeError)
    if name != "static_shapes":  # a Generator's own
        with pytest.raises(InputTypeError, match=f"^{name} must be"):
            open_bundle(tmp_path / "missing", **{name: value})


def test_a_bundle_or_engines_path_of_the_wrong_type_is_named(bundle):
    """``Generator(5)``, ``Generator(None)``, ``Generator(b"...")`` and ``engines=5`` were
    pathlib's bare TypeError, naming neither the argument nor the value."""
    for value in (5, None, str(bundle("marian")).encode(), ["bundle"]):
        with pytest.raises(InputTypeError, match=f"^bundle_dir must be a file system path \\(a str or pathlib.Path\\), "
                                                 f"not {type(value).__name__}"):
            Generator(value)
        with pytest.raises(TypeError, match="^path must be a file system path"):
            open_bundle(value)
    with pytest.raises(InputTypeError, match="^engines must be a file system path .*, not int \\(5\\)"):
        Generator(bundle("marian"), engines=5)
    assert Generator(Path(bundle("marian"))).root == Generator(str(bundle("marian"))).root


class CountingOrtFactory(OrtFactory):
    """onnxruntime on the CPU under another device name, recording the graphs it opens."""

    precisions = ("fp32",)

    def __init__(self) -> None:
        self.opened: list[list[str]] = []

    def check(self, request: SessionRequest) -> bool:
        return super().check(SessionRequest("cpu", request.threads, request.tf32, request.io_binding, request.engines))

    def open(self, root: Path, manifest: Manifest, graphs: Sequence[str], request: SessionRequest,
             files: BundleFiles):
        self.opened.append(list(graphs))
        cpu = SessionRequest("cpu", request.threads, request.tf32, request.io_binding, request.engines)
        return super().open(root, manifest, graphs, cpu, files)


def test_a_registered_device_opens_and_decodes(gad_bundle, bundle, converted):  # noqa: F811
    factory = CountingOrtFactory()
    register_device("counted-cpu", factory)
    try:
        assert "counted-cpu" in registered_devices() and session_factory("counted-cpu") is factory
        opened = open_bundle(gad_bundle("marian"), device="counted-cpu")
        # int8 drafters are for device "cpu"; so is an argmax graph that returns the logits
        # (graph_specs.argmax_graph_runs_on: off the CPU they would cross to the host every call)
        assert factory.opened == [["encoder", "verifier", "drafter"]]
        generator = Generator.from_bundle(opened, tuning=tuning_for("cpu"))
        reference = Generator(gad_bundle("marian"))
        assert [r.ids for r in generator.generate(TEXTS, mode="gad", max_new_tokens=MAX_NEW)] == \
            [r.ids for r in reference.generate(TEXTS, max_new_tokens=MAX_NEW)]
        with pytest.raises(InputError, match="no tuning profile for device 'counted-cpu'"):
            Generator(gad_bundle("marian"), device="counted-cpu")  # a new device brings its own tuning
        with pytest.raises(ProviderError, match="int8 bundle; device 'counted-cpu' runs fp32 bundles only"):
            open_bundle(converted(bundle("marian"), "int8"), device="counted-cpu")
    finally:
        with devices._LOCK:
            devices._FACTORIES.pop("counted-cpu", None)
    with pytest.raises(ProviderError, match="unknown device 'counted-cpu'"):
        session_factory("counted-cpu")


def test_tensorrt_is_found_without_the_runtime_importing_it():
    """The runtime names no backend: "tensorrt" comes from the aggdec.devices entry point
    (aggdec.engines registers itself on import)."""
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group=devices.ENTRY_POINTS) if e.name == "tensorrt"] == \
        ["aggdec.engines.runtime:TENSORRT"]
    import aggdec.engines.runtime as trt_runtime

    assert session_factory("tensorrt") is trt_runtime.TENSORRT


def test_the_row_decoder_serves_an_open_queue(bundle):
    generator = Generator(bundle("marian"))
    rows = RowDecoder(generator)
    work = Arrivals()
    limits = rows.limits(MAX_NEW)
    for index, text in enumerate(TEXTS):
        work.put(Work(index, rows.prepare(text, index)[1], limits))
    work.close()
    calls: list[int] = []
    got = {done.index: rows.result(done, TEXTS[done.index]) for done in rows.rows(work, "iad", 2,
                                                                                   on_call=calls.append)}
    assert [got[i].ids for i in range(len(TEXTS))] == [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW)]
    assert calls and max(calls) <= 2
    with pytest.raises(InputError, match="text 4 is empty"):
        rows.prepare("  ", 4)
    with pytest.raises(InputError, match="max_new_tokens"):
        rows.limits(0)
