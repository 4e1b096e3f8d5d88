"""Serve started in this process the way `serve run serve_config.yaml` starts it: the
environment the file gives its application, and the controller options it starts Serve with
(HAProxy as the HTTP ingress). The tests' apps and `prefix_routing.py` start Serve this way.

Both stop and redeploy apps often, and behind HAProxy a stopping Ingress replica stays up
Ray's 30 s so that a load balancer can take it out of rotation first: here it stays 1 s.
"""

from __future__ import annotations

from pathlib import Path

import yaml

SERVE_CONFIG = Path(__file__).resolve().parent.parent / "serve_config.yaml"
SHORT_INGRESS_DRAIN = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}


def _serve_config() -> dict:
    return yaml.safe_load(SERVE_CONFIG.read_text())


def app_env_vars() -> dict[str, str]:
    """The application's `runtime_env.env_vars` (Ray Serve's throughput mode, ...), with the
    short drain: for `ray.init(runtime_env=...)`, so every actor gets them."""
    [app] = _serve_config()["applications"]
    return {**app.get("runtime_env", {}).get("env_vars", {}), **SHORT_INGRESS_DRAIN}


def controller_options() -> dict | None:
    """The file's `controller_options`, with the short drain; None where it has none."""
    options = _serve_config().get("controller_options")
    if options is None:
        return None
    runtime_env = options.get("runtime_env", {})
    env_vars = {**runtime_env.get("env_vars", {}), **SHORT_INGRESS_DRAIN}
    return {**options, "runtime_env": {**runtime_env, "env_vars": env_vars}}
