"""The Ray Serve application answering on a local Ray instance (slow: Ray takes a while to start)."""

from __future__ import annotations

import shutil
import tempfile

import pytest

pytest.importorskip("fastapi")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

import httpx  # noqa: E402

from aggdec.runtime.generator import Generator  # noqa: E402
from aggdec.serve.app import Settings  # noqa: E402
from aggdec.serve.ray import app_builder, application  # noqa: E402
from aggdec.serve.server import bind  # noqa: E402

TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9", "w3 w3 w3 w3"]


@pytest.mark.slow
def test_the_ray_serve_deployment_answers_like_aggdec_serve(bundle, tmp_path):
    root = bundle("marian")
    want = [list(r.ids) for r in Generator(root).generate(TEXTS, mode="greedy", max_new_tokens=8)]
    probe = bind("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    # a short directory of its own: Ray's socket paths must fit in 107 bytes
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        settings = Settings(max_batch=4, max_queue=8, max_texts=16)
        serve.run(application(root, threads=1, settings=settings, replicas=1, num_cpus=0.5), name="aggdec",
                  route_prefix="/")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            assert http.get("/readyz").json()["status"] == "ready"
            response = http.post("/v1/generate", json={"texts": TEXTS, "mode": "iad", "max_new_tokens": 8})
            assert response.status_code == 200, response.text
            assert [item["ids"] for item in response.json()["outputs"]] == want
            items = http.post("/v1/generate", json={"texts": ["w1 w2 w3", ""], "max_new_tokens": 8}).json()["outputs"]
            assert items[0]["ids"] == want[0] and items[1]["error"]["kind"] == "input"
            assert http.post("/v1/generate", json={"texts": "w1"}).status_code == 422
            # more texts than the queue holds (application() takes max_texts 16 above max_queue 8): the
            # engine's 413, not a 429 that a client would retry for ever
            too_many = http.post("/v1/generate", json={"texts": ["w1"] * 9})
            assert too_many.status_code == 413 and "holds at once (8)" in too_many.json()["error"]["message"]
            assert "aggdec_texts_total" in http.get("/metrics").text
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def test_app_builder_checks_its_arguments():
    with pytest.raises(ValueError, match="bundle=DIR"):
        app_builder({"replicas": "2"})
    with pytest.raises(ValueError, match="bundle=DIR"):
        app_builder({"bundle": "b", "colour": "red"})
    with pytest.raises(ValueError, match="static_shapes takes true or false, got 'yes'"):
        app_builder({"bundle": "b", "static_shapes": "yes"})
    # as `aggdec serve` refuses it: a request of more texts than the queue holds is never admitted
    with pytest.raises(ValueError, match="max_texts 12 is above max_queue 10"):
        app_builder({"bundle": "b", "max_queue": "10", "max_texts": "12"})
