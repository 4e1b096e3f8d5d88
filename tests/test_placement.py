"""Where the model stages run: the graph built for a cluster that reports GPUs gives each target
replica most of a GPU and each draft replica the rest of one (so Ray can put them side by side),
both on CUDA; without GPUs, both run on the CPU. Both keep normal CPU priority."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import deployments.builder as builder
from deployments.worker_niceness import NORMAL_PRIORITY_RUNTIME_ENV

ROOT = Path(__file__).resolve().parent.parent


def model_stages(gpus: float, monkeypatch, **overrides) -> tuple:
    """(target deployment, its EngineConfig, draft deployment or None, the draft's EngineConfig)."""
    monkeypatch.setattr(builder, "cluster_gpus", lambda: gpus)
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    app = builder.build_app({**args, **overrides})  # the graph, bound; nothing is deployed
    target = app._bound_deployment.init_args[0]._bound_deployment
    config, _front, _name, _hub, draft_app = target.init_args[:5]
    if draft_app is None:
        return target, config, None, None
    draft = draft_app._bound_deployment
    return target, config, draft, draft.init_args[0]


def test_on_a_cluster_with_gpus_the_draft_shares_a_gpu_beside_the_target(monkeypatch):
    target, target_config, draft, draft_config = model_stages(2.0, monkeypatch, speculative_method="draft")
    assert target_config.device == "cuda" and draft_config.device == "cuda"  # never the CPU silently
    target_gpus, draft_gpus = target.ray_actor_options["num_gpus"], draft.ray_actor_options["num_gpus"]
    assert 0 < draft_gpus < target_gpus < 1 and target_gpus + draft_gpus == pytest.approx(1.0)
    for stage in (target, draft):
        assert stage.ray_actor_options["runtime_env"] == NORMAL_PRIORITY_RUNTIME_ENV
        assert stage.ray_actor_options["num_cpus"] > 0


def test_a_target_without_a_draft_takes_a_whole_gpu(monkeypatch):
    target, config, draft, _ = model_stages(1.0, monkeypatch, draft_model=None, speculative_method="ngram")
    assert draft is None and config.device == "cuda" and target.ray_actor_options["num_gpus"] == 1.0


def test_a_draft_deployed_but_unused_takes_no_gpu(monkeypatch):
    """The shipped config keeps the DraftModel stage (one edit switches speculation to it) but
    speculates by n-gram lookup: the target then takes the whole GPU, the idle draft the CPU."""
    target, config, draft, draft_config = model_stages(1.0, monkeypatch)
    assert config.speculative_method == "ngram" and config.device == "cuda"
    assert target.ray_actor_options["num_gpus"] == 1.0
    assert draft.ray_actor_options["num_gpus"] == 0 and draft_config.device == "cpu"


def test_without_gpus_both_run_on_the_cpu(monkeypatch):
    target, target_config, draft, draft_config = model_stages(0.0, monkeypatch, speculative_method="draft")
    assert (target_config.device, draft_config.device) == ("cpu", "cpu")
    assert target.ray_actor_options["num_gpus"] == 0 and draft.ray_actor_options["num_gpus"] == 0
