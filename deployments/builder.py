"""`build_app(args)`: the Serve deployment graph (docs/architecture.md), bound and ready to run.

    serve run serve_config.yaml                                   # the default tiny pair
    serve run app.builder:build_app model=/path/to/checkpoint     # any local checkpoint

Ingress ──▶ TargetModel ──▶ DraftModel; TargetModel ──▶ ConstraintService; every stage ──▶ MetricsHub.

Configuration flows one way: the arguments become one `EngineConfig` per model and the front's
`FrontConfig` here, with the context length resolved once from the checkpoint, and the
replicas get them at construction. Relative checkpoint paths resolve against the working
directory, then against the repository root, and are made absolute before they are bound.
"""

from __future__ import annotations

from pathlib import Path

import ray
from ray.serve import Application

from deployments.app_args import AppArgs
from app.config import EngineConfig
from app.models.config import ModelConfig
from deployments.constraint import ConstraintService
from deployments.draft import DraftModel
from deployments.ingress import Ingress
from deployments.request_gate import api_keys_from_env
from deployments.metrics import MetricsHub
from deployments.target import TargetModel

REPO_ROOT = Path(__file__).resolve().parent.parent


def resolve_checkpoint(path: str) -> str:
    p = Path(path).expanduser()
    for candidate in ([p] if p.is_absolute() else [Path.cwd() / p, REPO_ROOT / p]):
        if (candidate / "config.json").is_file():
            return str(candidate.resolve())
    raise FileNotFoundError(f"no checkpoint at {path!r} (looked for config.json in "
                            f"{'it' if p.is_absolute() else f'{Path.cwd()} and {REPO_ROOT}'}); "
                            "specserve serves local Hugging Face checkpoint directories")


def cluster_gpus() -> float:
    """GPUs in the Ray cluster; before Ray is up (`serve run module:builder`), this machine's."""
    if ray.is_initialized():
        return float(ray.cluster_resources().get("GPU", 0))
    import torch

    return float(torch.cuda.device_count())


def target_placement(device: str) -> tuple[str, float]:
    """(engine device, GPUs per target replica) for the `device` argument."""
    if device == "auto":
        return ("cuda", 1.0) if cluster_gpus() > 0 else ("cpu", 0.0)
    return device, (1.0 if device.startswith("cuda") else 0.0)


def engine_config(args: AppArgs, model: str, device: str, **overrides) -> EngineConfig:
    """The engine's config for `model`, its context length resolved from the checkpoint."""
    max_model_len = ModelConfig.from_dir(model).max_model_len(args.max_model_len)
    return args.engine_config(**{"model": model, "device": device, "max_model_len": max_model_len, **overrides})


def build_app(args: dict) -> Application:
    a = args if isinstance(args, AppArgs) else AppArgs.model_validate(args)
    model = resolve_checkpoint(a.model)
    name = a.served_model_name or Path(model).name
    device, num_gpus = target_placement(a.device)

    hub = MetricsHub.bind()
    target_config = engine_config(a, model, device, draft_model=None)
    draft = None
    if a.draft_model is not None or a.speculative_method == "draft":
        # Deployed whenever a draft checkpoint is configured (Serve deploys what the graph
        # reaches, hence passed to the target even when unused), so that a config naming the
        # DraftModel stage stays valid when speculation is switched to ngram or off. It runs
        # on the CPU in its own deployment; on GPU clusters see the README.
        draft = DraftModel.bind(engine_config(a, resolve_checkpoint(a.draft_model), "cpu",
                                              speculative_method=None, draft_model=None))
    constraint = ConstraintService.bind(model, hub, name, a.guided_compile_timeout_s,
                                        a.guided_max_cached_indexes)  # compiles for the target's vocabulary
    target_resources = {**TargetModel.ray_actor_options, "num_gpus": num_gpus}  # CPUs, priority
    target = TargetModel.options(ray_actor_options=target_resources).bind(
        target_config, a.front_config(), name, hub, draft, a.engine_process, constraint)  # draft used only when speculative_method is "draft"
    vocab_size = ModelConfig.from_dir(model).vocab_size
    return Ingress.bind(target, hub, model, name, target_config.max_model_len, vocab_size,
                        api_keys(a), a.max_request_body_bytes)


def api_keys(args: AppArgs) -> list[str] | None:
    """The config's `api_keys`, or when it sets none, those in $SPECSERVE_API_KEYS."""
    return args.api_keys if args.api_keys is not None else api_keys_from_env()
