"""The graph on a three-node Ray cluster (`ray.cluster_utils.Cluster` on this machine), deployed
the way users deploy it: the repository's serve_config.yaml with per-stage `ray_actor_options`
naming each node's custom resource. The ingress sits on the head node, the two target
replicas on the two worker nodes (one each), the draft and the constraint service on
different workers from each other, the response store on a worker; requests are served with the
engine's own greedy text, and a stored response is continued."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from tests.serve.conftest import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PLACEMENT = {  # stage -> (replicas, custom resource it needs)
    "Ingress": (1, "head_node"),
    "MetricsHub": (1, "head_node"),
    "TargetModel": (2, "target_slot"),  # one slot on each worker node
    "DraftModel": (1, "worker_2"),
    "ConstraintService": (1, "worker_1"),
    "ResponseStore": (1, "worker_1"),  # away from the ingress that asks it
}


def deploy_config(target: Path, draft: Path, port: int) -> dict:
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    config["proxy_location"] = "HeadOnly"
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    [app] = config["applications"]
    app["args"].update(model=str(target), draft_model=str(draft), device="cpu", num_kv_blocks=128,
                       speculative_method="draft")
    app["args"].pop("kv_cache_memory_gib", None)
    for d in app["deployments"]:
        replicas, resource = PLACEMENT[d["name"]]
        d.pop("autoscaling_config", None)
        d["num_replicas"] = replicas
        options = d.get("ray_actor_options") or {}
        d["ray_actor_options"] = {"num_cpus": options.get("num_cpus", 1 if d["name"] == "TargetModel" else 0),
                                  "num_gpus": 0, "resources": {resource: 1}}
    return config


def test_graph_serves_across_three_nodes(checkpoints, ray_serve):
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster
    from ray.serve._private.api import serve_start  # what `serve run <config>` uses
    from ray.serve.schema import ServeDeploySchema
    from ray.util.state import list_actors

    target, draft = checkpoints
    ray_serve.stop()  # this test runs its own cluster
    dashboard_port = free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"head_node": 10}, "include_dashboard": True,
        "dashboard_port": dashboard_port})
    worker_1 = cluster.add_node(num_cpus=2, resources={"worker_1": 10, "target_slot": 1})
    worker_2 = cluster.add_node(num_cpus=2, resources={"worker_2": 10, "target_slot": 1})
    try:
        ray.init(address=cluster.address, runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1",
                                                                    "TOKENIZERS_PARALLELISM": "false"}})
        port = free_port()
        config = ServeDeploySchema.model_validate(deploy_config(target, draft, port))
        serve_start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly"
                    ).deploy_apps(config)
        name = config.applications[0].name
        deadline = time.monotonic() + 300
        while (status := serve.status().applications.get(name)) is None or status.status != "RUNNING":
            assert status is None or status.status not in ("DEPLOY_FAILED", "UNHEALTHY"), status
            assert time.monotonic() < deadline, status
            time.sleep(1)

        # Where the replicas are: Serve placed each stage on the node that has its resource.
        head = cluster.head_node.node_id
        nodes = {}
        for actor in list_actors(address=f"http://127.0.0.1:{dashboard_port}",
                                 filters=[("state", "=", "ALIVE")], limit=1000):
            if actor.class_name and actor.class_name.startswith(f"ServeReplica:{name}:"):
                nodes.setdefault(actor.class_name.rsplit(":", 1)[1], []).append(actor.node_id)
        assert nodes["Ingress"] == [head] and nodes["MetricsHub"] == [head], nodes
        assert sorted(nodes["TargetModel"]) == sorted([worker_1.node_id, worker_2.node_id]), nodes
        assert nodes["DraftModel"] == [worker_2.node_id], nodes
        assert nodes["ConstraintService"] == nodes["ResponseStore"] == [worker_1.node_id], nodes

        # It serves, correctly: greedy text equals the engine's own, from every request.
        from deployments.app_args import AppArgs
        from deployments.builder import engine_config
        from app.engine.engine import LLMEngine
        from app.sampling_params import SamplingParams
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target)
        prompt = "The capital of France is"
        args = AppArgs.model_validate({**config.applications[0].args, "speculative_method": None})
        engine = LLMEngine(engine_config(args, str(target), "cpu"))
        [ids] = engine.generate([tokenizer.encode(prompt)], SamplingParams(max_tokens=12, temperature=0))
        expected = tokenizer.decode(ids, skip_special_tokens=True)

        def complete(i: int) -> str:
            r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                              json={"prompt": prompt, "max_tokens": 12, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(complete, range(8)))
        assert texts == [expected] * 8

        # A stored response, kept on another node, is continued.
        def respond(**body) -> dict:
            r = requests.post(f"http://127.0.0.1:{port}/v1/responses", timeout=120,
                              json={"max_output_tokens": 4, "temperature": 0, **body})
            assert r.status_code == 200, r.text
            return r.json()

        first = respond(input=prompt)
        assert respond(input="And?", previous_response_id=first["id"])["previous_response_id"] == first["id"]
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
