"""`aggdec serve`: one process, one bundle, uvicorn, and a drain on SIGTERM.

On SIGTERM (or Ctrl-C) the server drains: `/readyz` turns 503 (a load balancer stops sending),
new generate requests get 503 with ``Connection: close``, requests in flight finish; once none
is left (or after ``drain_s``) uvicorn shuts down and the process exits with status 0. A
second signal skips the wait.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from types import FrameType
from typing import Any

import uvicorn

from aggdec.runtime.errors import AggdecError

from .app import ServerState, Settings, create_app

log = logging.getLogger("aggdec.serve")


class DrainingServer(uvicorn.Server):
    """uvicorn, with a first SIGTERM/SIGINT that drains instead of closing the listener."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_s = drain_s
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started is None and not self.should_exit:
            self.drain_started = time.monotonic()
            self.state.draining = True
            print(f"aggdec: draining ({signal.Signals(sig).name}): {self.state.in_flight} request(s) in flight",
                  flush=True)
            return
        super().handle_exit(sig, frame)  # a second signal: stop now

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            if self.state.in_flight == 0 or time.monotonic() - self.drain_started > self.drain_s:
                print(f"aggdec: drained, {self.state.in_flight} request(s) left; exiting", flush=True)
                self.should_exit = True
        return await super().on_tick(counter)


def serve(bundle: str, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu", threads: int | None = None,
          settings: Settings | None = None, drain_s: float | None = None, log_level: str = "warning",
          generator_options: dict[str, Any] | None = None) -> int:
    """Load ``bundle`` (errors surface here, before any socket is opened), then serve until SIGTERM.
    ``generator_options``: further :class:`~aggdec.runtime.generator.Generator` keywords (``tf32``,
    ``static_shapes``)."""
    from aggdec.runtime.generator import Generator

    settings = settings or Settings()
    generator = Generator(bundle, device=device, threads=threads, **(generator_options or {}))
    app = create_app(generator, settings)  # settings it cannot serve (check_settings): refused before listening
    state: ServerState = app.state.aggdec
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False,
                            timeout_graceful_shutdown=5)
    server = DrainingServer(config, state, settings.timeout_s + 5 if drain_s is None else drain_s)
    sock = bind(host, port)  # port 0: an ephemeral port, printed below
    bound = sock.getsockname()[1]
    print(f"aggdec: serving {bundle} on http://{host}:{bound} (mode {settings.mode}, max batch {settings.max_batch}, "
          f"max queue {settings.max_queue}); docs at /docs", flush=True)
    server.run(sockets=[sock])
    return 0


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (IPv6 if ``host`` is one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it a
    # response written in two parts waits for the client's delayed ACK (40 ms per keep-alive request)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AggdecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    except (OverflowError, ValueError, TypeError) as exc:  # a port outside 0..65535, a host with a NUL
        sock.close()
        raise AggdecError(f"cannot listen on {host!r} port {port}: {exc}.") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
