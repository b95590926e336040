"""A real uvicorn server on an ephemeral loopback port, in a thread of the test process."""

from __future__ import annotations

import threading
import time

import httpx
import uvicorn

from aggdec.serve.app import Settings, create_app
from aggdec.serve.server import bind


class Running:
    def __init__(self, generator, **settings) -> None:
        self.app = create_app(generator, Settings(**settings))
        self.state = self.app.state.aggdec
        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, lifespan="on", log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        self.client = httpx.Client(base_url=self.url, timeout=120)
        give_up = time.monotonic() + 120  # a bound on a hung start, not a performance check
        while time.monotonic() < give_up:
            try:
                if self.client.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the server never became ready: {self.state.warm}")

    def generate(self, texts, **options) -> httpx.Response:
        return self.client.post("/v1/generate", json={"texts": texts, **options})

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(60)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
