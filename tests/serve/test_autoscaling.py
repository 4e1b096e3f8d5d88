"""TargetModel scales 1 -> 2 under load and back to 1 after it, on the engine-load policy.

A real Serve application from `app.builder:build_app` on the test checkpoint, with
TargetModel's autoscaling config swapped for a short-delay one (as Ray Serve's own
autoscaling tests do): load is many concurrent completions held until the second replica
runs, then removed. While two replicas run, one scrape of `/metrics` must show the KV usage
of both.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

ray = pytest.importorskip("ray")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from ray import serve  # noqa: E402

from deployments.autoscaling import engine_load_policy  # noqa: E402
from tests.serve.conftest import free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
STARTUP_TIMEOUT_S = 600  # a replica process (Ray worker, torch, engine) starting on a busy machine

APP = "autoscaling"
SHORT_DELAYS = {
    "min_replicas": 1, "max_replicas": 2, "initial_replicas": 1,
    "target_ongoing_requests": 2,          # engine requests (waiting + running) per replica
    "upscale_delay_s": 1, "downscale_delay_s": 2,
    "metrics_interval_s": 0.2, "look_back_period_s": 1,
    "policy": {"policy_function": engine_load_policy},
}


def start_ray(attempts: int = 3) -> None:
    """A fresh local cluster. On a loaded machine the raylet can give up on its agents'
    hard-coded 15 s start-up wait (ray-project/ray#65983): try again rather than fail."""
    for attempt in range(attempts):
        try:
            ray.init(address="local", num_cpus=4, include_dashboard=False,
                     runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
            return
        except Exception as exc:
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == attempts - 1:
                raise


@pytest.fixture(scope="module")
def app_url(checkpoints):
    """The app on the shared test checkpoint (tests/serve/conftest.py), without a draft model."""
    import deployments.builder as builder
    from deployments.target import TargetModel

    ckpt = checkpoints[0]
    port = free_port()
    start_ray()
    original = builder.TargetModel
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        builder.TargetModel = TargetModel.options(autoscaling_config=SHORT_DELAYS)
        serve.run(builder.build_app({"model": str(ckpt), "device": "cpu", "num_kv_blocks": 256}),
                  name=APP, route_prefix="/")
        builder.TargetModel = original
        yield f"http://127.0.0.1:{port}"
    finally:
        builder.TargetModel = original
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def running_targets() -> int:
    states = serve.status().applications[APP].deployments["TargetModel"].replica_states
    return states.get("RUNNING", 0)


def total_targets() -> int:
    states = serve.status().applications[APP].deployments["TargetModel"].replica_states
    return sum(states.values())


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    states = serve.status().applications[APP].deployments["TargetModel"].replica_states
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                         f"TargetModel replicas: {dict(states)}")


def kv_usage_replicas(url: str) -> set[str]:
    text = requests.get(f"{url}/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        if fam.name == "specserve:kv_cache_usage_perc":
            return {s.labels["replica"] for s in fam.samples}
    return set()


def test_target_scales_up_under_load_and_down_after(app_url):
    assert running_targets() == 1
    stop = threading.Event()
    body = {"prompt": "def main(self):", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    failures: list[str] = []

    def worker():
        while not stop.is_set():
            r = requests.post(f"{app_url}/v1/completions", json=body, timeout=120)
            if r.status_code != 200:
                failures.append(r.text)

    with ThreadPoolExecutor(8) as pool:
        for _ in range(8):
            pool.submit(worker)
        try:
            # The policy's decision comes within seconds of the load; a replica process can
            # take minutes to start on a loaded machine, hence the separate, generous wait.
            wait_for(lambda: total_targets() == 2, 120, "the autoscaler to add a TargetModel replica")
            wait_for(lambda: running_targets() == 2, STARTUP_TIMEOUT_S, "the second replica to run")
            # Both replicas report to the metrics hub: one scrape shows both KV pools.
            wait_for(lambda: len(kv_usage_replicas(app_url)) == 2, 60,
                     "both replicas' KV usage in /metrics")
        finally:
            stop.set()
    assert not failures, failures[:1]
    wait_for(lambda: total_targets() == 1 and running_targets() == 1, 300,
             "scale-down to one TargetModel replica")
