"""The same API as a Ray Serve application (the [ray] extra): replicas, autoscaling, Ray's proxy.

Each replica is a Ray actor that loads the bundle and serves :func:`aggdec.serve.app.create_app`
through Ray Serve's own FastAPI ingress (``serve.ingress`` with a builder, evaluated on the
replica), so the routes, schemas, per-item errors, 413/422/429/504 and metrics are the ones
`aggdec serve` has; inside a replica, texts of concurrent requests share batches exactly as
in one `aggdec serve` process. Ray Serve does the rest: its HTTP proxy spreads requests over
replicas, restarts a replica whose actor dies (its health check), and scales the number of
replicas between ``replicas`` and ``max_replicas`` by requests in flight per replica
(``autoscaling_config``).

Three ways to run it:

- ``aggdec serve BUNDLE --ray --replicas 2 [--max-replicas 4]``: on the cluster of
  ``$RAY_ADDRESS`` (``ray://head:10001`` or ``auto``), or a local Ray started for it;
- ``serve run aggdec.serve.ray:app_builder bundle=/path/to/bundle replicas=2`` (Ray's CLI;
  the arguments are :func:`app_builder`'s);
- from Python: ``serve.run(aggdec.serve.ray.application("bundle/", replicas=2))``.

The bundle path must exist on every node that runs a replica (a shared file system, or the
same path baked into the image).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from pathlib import Path
from typing import Any

from ray import serve

from .app import Settings
from .engine import max_texts_within

APP_NAME = "aggdec"


def _build_app(bundle: str, device: str, threads: int | None, settings: Settings,
               generator_options: dict[str, Any] | None = None):
    """Runs on each replica: load the bundle, return the ASGI app (Ray runs its lifespan)."""
    from aggdec.runtime.generator import Generator

    from .app import create_app

    generator = Generator(bundle, device=device, threads=threads, **(generator_options or {}))
    return create_app(generator, settings)


def application(bundle: str | Path, *, device: str = "cpu", threads: int | None = None,
                settings: Settings | None = None, replicas: int = 1, max_replicas: int | None = None,
                num_cpus: float = 1.0, num_gpus: float = 0.0, target_ongoing_requests: float | None = None,
                generator_options: dict[str, Any] | None = None):
    """A Ray Serve application serving ``bundle``: ``replicas`` replicas, or autoscaling between
    ``replicas`` and ``max_replicas``. ``num_cpus``/``num_gpus``: Ray resources per replica.
    ``generator_options``: further :class:`~aggdec.runtime.generator.Generator` keywords for each
    replica (``tf32``, ``static_shapes``)."""
    settings = settings or Settings()
    bundle = str(Path(bundle).resolve())
    settings = dataclasses.replace(settings, warm_at_startup=True)  # a replica counts as started once warm

    def build():  # a plain function: Ray Serve evaluates it on each replica
        return _build_app(bundle, device, threads, settings, generator_options)

    options: dict[str, Any] = {
        "name": "AggdecServer",
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        # let requests reach a replica's own queue (it answers 429 past --max-queue) rather than
        # wait in Ray's
        "max_ongoing_requests": settings.max_queue + settings.max_batch,
        "graceful_shutdown_timeout_s": settings.timeout_s + 5,
        "health_check_period_s": 5,
    }
    if max_replicas is not None and max_replicas > replicas:
        options["autoscaling_config"] = {
            "min_replicas": replicas, "initial_replicas": replicas, "max_replicas": max_replicas,
            # a replica is "busy" when about a batch's worth of requests are in flight on it
            "target_ongoing_requests": target_ongoing_requests or settings.max_batch,
        }
    else:
        options["num_replicas"] = replicas
    deployment = serve.deployment(serve.ingress(build)(), **options)
    return deployment.bind()


def app_builder(args: dict[str, str]):
    """For ``serve run aggdec.serve.ray:app_builder bundle=DIR [replicas=N] [max_replicas=M]
    [device=cpu] [threads=N] [mode=iad] [max_batch=32] [max_queue=256] [max_texts=64] [timeout_s=30]
    [static_shapes=true|false] [tf32=true|false]``."""
    known = {"bundle", "replicas", "max_replicas", "device", "threads", "mode", "max_batch", "max_wait_ms",
             "max_queue", "timeout_s", "max_texts", "max_body_bytes", "num_cpus", "num_gpus", "static_shapes",
             "tf32"}
    unknown = set(args) - known
    if unknown or "bundle" not in args:
        raise ValueError(f"app_builder takes bundle=DIR and any of {sorted(known - {'bundle'})}; "
                         f"got {sorted(args)}")
    max_queue = int(args.get("max_queue", 256))
    # as `aggdec serve` has them (an InputError is a ValueError, as the checks above raise)
    max_texts = max_texts_within(int(args["max_texts"]) if "max_texts" in args else None, max_queue)
    settings = Settings(mode=args.get("mode", "iad"), max_batch=int(args.get("max_batch", 32)),
                        max_wait_ms=float(args.get("max_wait_ms", 0)), max_queue=max_queue,
                        timeout_s=float(args.get("timeout_s", 30)), max_texts=max_texts,
                        max_body_bytes=int(args.get("max_body_bytes", 1 << 20)))
    return application(args["bundle"], device=args.get("device", "cpu"),
                       threads=int(args["threads"]) if "threads" in args else None, settings=settings,
                       replicas=int(args.get("replicas", 1)),
                       max_replicas=int(args["max_replicas"]) if "max_replicas" in args else None,
                       num_cpus=float(args.get("num_cpus", 1)), num_gpus=float(args.get("num_gpus", 0)),
                       generator_options={name: _flag(args, name) for name in ("static_shapes", "tf32") if name in args})


def _flag(args: dict[str, str], name: str) -> bool:
    value = str(args[name]).lower()
    if value not in ("true", "false"):
        raise ValueError(f"app_builder's {name} takes true or false, got {args[name]!r}")
    return value == "true"


def run_ray(bundle: str, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu", threads: int | None = None,
            settings: Settings | None = None, replicas: int = 1, max_replicas: int | None = None,
            generator_options: dict[str, Any] | None = None) -> int:
    """`aggdec serve --ray`: deploy on ``$RAY_ADDRESS`` (or a local Ray), serve until SIGTERM/Ctrl-C,
    then delete the application (Ray drains its replicas) and disconnect."""
    import ray

    from aggdec.runtime.generator import Generator

    from .app import check_settings

    check_settings(Generator(bundle, device=device, threads=threads, **(generator_options or {})),
                   settings or Settings())  # fail early
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(bundle, device=device, threads=threads, settings=settings, replicas=replicas,
                              max_replicas=max_replicas, generator_options=generator_options),
                  name=APP_NAME, route_prefix="/")
        print(f"aggdec: serving {bundle} on Ray Serve at http://{host}:{port} ({replicas} replica(s)"
              f"{f', autoscaling to {max_replicas}' if max_replicas else ''}); docs at /docs", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        print("aggdec: stopping: Ray Serve drains the replicas", flush=True)
        serve.delete(APP_NAME)
    finally:
        ray.shutdown()
    return 0
