"""`aggdec serve`: an HTTP API over a bundle, with dynamic batching (the [serve] extra).

- :mod:`aggdec.serve.engine`: decode loops fed by requests (no web framework);
- :mod:`aggdec.serve.app`: the FastAPI app (``create_app``);
- :mod:`aggdec.serve.server`: uvicorn with a drain on SIGTERM (``serve``);
- :mod:`aggdec.serve.ray`: the same app as a Ray Serve deployment (the [ray] extra);
- :mod:`aggdec.serve.loadtest`: `aggdec loadtest`, closed-loop clients checked against greedy.

Nothing is imported here, so that ``import aggdec.serve`` works without the extras.
"""
