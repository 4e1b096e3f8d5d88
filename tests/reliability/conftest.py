"""Reliability tests: one local Ray + Serve for the whole directory, one app per module.

Starting Ray costs ~30 s on a 2-core machine, deploying an app ~15 s, so the modules share a
Ray session (package scope) and each deploys its own app (`SERVE_APP_ARGS` overrides the
defaults) and deletes it at the end. A module that needs a cluster of its own (multi-node)
calls `ray_serve.stop()`; the next module's app starts a fresh session.

The app-start helpers and the checkpoint fixture are tests/serve's.
"""

from __future__ import annotations

import pytest

from tests.serve.conftest import checkpoints, deploy_app, start_ray_serve, stop_serve_app  # noqa: F401

DEFAULT_ARGS = {"device": "cpu", "num_kv_blocks": 256, "max_num_seqs": 64}


class RaySession:
    def __init__(self):
        self.port: int | None = None

    def ensure(self) -> int:
        import ray

        if self.port is None or not ray.is_initialized():
            self.port = start_ray_serve()
        return self.port

    def stop(self) -> None:
        import ray

        if ray.is_initialized():
            stop_serve_app()
        self.port = None


@pytest.fixture(scope="package")
def ray_serve():
    session = RaySession()
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def serve_app(request, checkpoints, ray_serve):  # noqa: F811
    """The module's app on the shared session; `SERVE_APP_ARGS` (dict) adds or overrides args."""
    from ray import serve

    target, draft = checkpoints
    args = {"model": str(target), "draft_model": str(draft), **DEFAULT_ARGS}
    args.update(getattr(request.module, "SERVE_APP_ARGS", {}))
    name = request.module.__name__.rsplit(".", 1)[-1]
    app = deploy_app(name, args, ray_serve.ensure())
    try:
        yield app
    finally:
        try:
            serve.delete(name)
        except Exception:  # noqa: BLE001 - a broken session is torn down by ray_serve anyway
            ray_serve.stop()
