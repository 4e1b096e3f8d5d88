"""`build_app(args)`: the Serve deployment graph (docs/architecture.md), bound and ready to run.

    serve run serve_config.yaml                                   # the default tiny pair
    serve run app.builder:build_app model=/path/to/checkpoint     # any local checkpoint

Ingress ──▶ TargetModel ──▶ DraftModel; TargetModel ──▶ ConstraintService; Ingress ──▶ ResponseStore;
every stage ──▶ MetricsHub. (Every stage is deployed whatever the arguments, so that a config naming
it stays valid.)

Configuration flows one way: the arguments become one `EngineConfig` per model and the front's
`FrontConfig` here, with the context length resolved once from the checkpoint, and the
replicas get them at construction. Relative checkpoint paths resolve against the working
directory, then against the repository root, and are made absolute before they are bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from transformers import PreTrainedTokenizerFast

from deployments.app_args import AppArgs
from app.config import EngineConfig
from app.models.config import ModelConfig
from app.models.generation_config import GenerationDefaults
from app.sampling_params import SamplingParams
from deployments.constraint import ConstraintService
from deployments.draft import DraftModel
from deployments.ingress import Ingress
from deployments.markup_tokens import markup_tokens
from deployments.request_gate import api_keys_from_env
from deployments.response_store import ResponseStore
from deployments.metrics import MetricsHub
from deployments.prefix_router import PrefixAwareRouter
from deployments.reasoning import reasoning_tags
from deployments.target import TargetModel
from deployments.tool_calls import ToolCallSyntax, tool_call_syntax

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


DRAFT_GPU_SHARE = 0.2  # of one GPU, for a draft replica placed beside a target replica


@dataclass(frozen=True)
class Placement:
    device: str  # the model stages' engines: "cuda..." or "cpu"
    target_gpus: float  # per TargetModel replica
    draft_gpus: float  # per DraftModel replica


def placement(device: str, drafting: bool) -> Placement:
    """Where the model stages run for the `device` argument. With GPUs a target replica takes a
    whole GPU, or all but DRAFT_GPU_SHARE of one when the draft model speculates, so that Ray
    can put a draft replica beside it on the same GPU: a draft in use never falls back to the
    CPU there. Without GPUs both run on the CPU."""
    if device == "auto":
        device = "cuda" if cluster_gpus() > 0 else "cpu"
    if not device.startswith("cuda"):
        return Placement(device, 0.0, 0.0)
    if not drafting:
        return Placement(device, 1.0, 0.0)
    return Placement(device, 1.0 - DRAFT_GPU_SHARE, DRAFT_GPU_SHARE)


ROUTING_STATS_PERIOD_S = 1.0  # how often a target replica tells the routers what its cache holds


def request_router_config(args: AppArgs) -> RequestRouterConfig | None:
    """TargetModel's router (None: Serve's default, power of two choices)."""
    if args.request_router != "prefix_aware":
        return None
    return RequestRouterConfig(
        request_router_class=PrefixAwareRouter,
        request_router_kwargs={"block_size": args.block_size, "remember_sent_s": 4 * ROUTING_STATS_PERIOD_S},
        request_routing_stats_period_s=ROUTING_STATS_PERIOD_S, request_routing_stats_timeout_s=5.0)


def engine_config(args: AppArgs, model: str, device: str, **overrides) -> EngineConfig:
    """The engine's config for `model`, its context length resolved from the checkpoint."""
    max_model_len = ModelConfig.from_dir(model).max_model_len(args.max_model_len)
    return args.engine_config(**{"model": model, "device": device, "max_model_len": max_model_len, **overrides})


def build_app(args: dict) -> Application:
    a = args if isinstance(args, AppArgs) else AppArgs.model_validate(args)
    model = resolve_checkpoint(a.model)
    name = a.served_model_name or Path(model).name
    # The draft is deployed whenever a draft checkpoint is configured (Serve deploys what the
    # graph reaches, hence passed to the target even when unused), so that a config naming the
    # DraftModel stage stays valid when speculation is switched to ngram or off.
    with_draft = a.draft_model is not None or a.speculative_method == "draft"
    place = placement(a.device, a.speculative_method == "draft")  # an unused draft takes no GPU

    hub = MetricsHub.bind()
    tool_syntax, reasoning_parser, markup = text_conventions(model, a.tool_call_parser, a.reasoning_parser)
    target_config = engine_config(a, model, place.device, draft_model=None, markup_tokens=markup)
    draft = None
    if with_draft:
        draft_resources = {**DraftModel.ray_actor_options, "num_gpus": place.draft_gpus}  # CPUs, priority
        draft_device = place.device if place.draft_gpus else "cpu"
        draft = DraftModel.options(ray_actor_options=draft_resources).bind(engine_config(
            a, resolve_checkpoint(a.draft_model), draft_device, speculative_method=None, draft_model=None))
    constraint = ConstraintService.bind(model, hub, name, a.guided_compile_timeout_s,  # for the target's vocabulary
                                        a.guided_max_cached_indexes, markup_tokens=markup)
    target_resources = {**TargetModel.ray_actor_options, "num_gpus": place.target_gpus}  # CPUs, priority
    router = request_router_config(a)
    target = TargetModel.options(ray_actor_options=target_resources,
                                 **({"request_router_config": router} if router else {})).bind(
        target_config, a.front_config(), name, hub, draft, a.engine_process, constraint)  # draft used only when speculative_method is "draft"
    model_config = ModelConfig.from_dir(model)
    return Ingress.bind(target, hub, model, name, target_config.max_model_len, model_config.vocab_size,
                        api_keys(a), a.max_request_body_bytes, request_defaults(a, model),
                        model_config.eos_token_ids, target_config.scheduling_policy == "priority",
                        reasoning_parser, ResponseStore.bind(a.max_stored_responses, a.max_stored_event_bytes),
                        a.max_stored_responses, tool_syntax=tool_syntax, markup_tokens=markup)


def text_conventions(model: str, tool_call_parser: str | None,
                     reasoning_parser: str | None) -> tuple[ToolCallSyntax, str | None, tuple[str, ...]]:
    """How the model writes tool calls (the app's `tool_call_parser`, else its chat template's),
    its reasoning parser (the app's; for harmony replies "openai_gptoss", the only one that reads
    them), and the special tokens of its tokenizer that spell their markers or, with a reasoning
    parser, its reasoning tags (deployments/markup_tokens.py)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model, local_files_only=True)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    syntax = tool_call_syntax(tool_call_parser, template)
    if syntax.harmony and reasoning_parser not in (None, "openai_gptoss"):
        raise ValueError(f"reasoning_parser {reasoning_parser!r} cannot read this model's harmony replies "
                         "(tool_call_parser openai, or a template that writes <|channel|>); use openai_gptoss")
    if reasoning_parser == "openai_gptoss" and not syntax.harmony:
        raise ValueError(f"reasoning_parser openai_gptoss reads harmony replies, and this app reads "
                         f"{syntax.name!r} tool calls; set tool_call_parser: openai")
    if syntax.harmony:
        return syntax, "openai_gptoss", markup_tokens(tokenizer, syntax.markers)
    tags = reasoning_tags(reasoning_parser)
    markers = syntax.markers + ((tags.start, tags.end) if reasoning_parser else ())
    return syntax, reasoning_parser, markup_tokens(tokenizer, markers)


def request_defaults(args: AppArgs, model: str) -> GenerationDefaults:
    """What fills the fields a request leaves unset (`sampling_defaults`), checked now: a
    checkpoint's bad default is the server's error at start-up, not a 400 for every request."""
    if args.sampling_defaults == "openai":
        return GenerationDefaults()
    defaults = GenerationDefaults.from_dir(model)
    try:
        SamplingParams(**defaults.sampling, max_tokens=defaults.max_tokens or 1)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{model}/generation_config.json: {exc} (sampling_defaults: openai "
                         "leaves the file's sampling settings out)") from None
    return defaults


def api_keys(args: AppArgs) -> list[str] | None:
    """The config's `api_keys`, or when it sets none, those in $SPECSERVE_API_KEYS."""
    return args.api_keys if args.api_keys is not None else api_keys_from_env()
