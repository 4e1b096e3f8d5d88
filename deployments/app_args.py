"""The arguments of `app.builder:build_app`, from `serve_config.yaml` or `serve run ... key=value`.

They are derived, not copied: every field of the engine's `EngineConfig` (app/config.py) and of
its front's `FrontConfig` (app/engine/front_config.py), with their types and defaults (their
meaning is written there), plus the few settings only the deployment graph reads. An unknown
argument is refused by name, never dropped.

The command line hands every value over as a string, so fields coerce: "128" -> 128,
"true" -> True, "none"/"null"/"" -> None, "a,b" -> ["a", "b"], "1:4,8:2" -> {1: 4, 8: 2}.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from app.config import EngineConfig
from app.engine.front_config import FrontConfig
from deployments.reasoning import REASONING_PARSERS
from deployments.constraint import DEFAULT_COMPILE_TIMEOUT_S, DEFAULT_MAX_CACHED_INDEXES
from deployments.request_gate import DEFAULT_MAX_BODY_BYTES
from deployments.response_store import DEFAULT_MAX_EVENT_BYTES
from deployments.tool_calls import TOOL_CALL_PARSERS

_NULLS = {"", "none", "null", "~"}
DERIVED_FIELDS = ("markup_tokens",)  # set by the builder from the checkpoint, never by the config


def _fields_of(config_class: type) -> dict[str, tuple[Any, Any]]:
    hints = get_type_hints(config_class)
    return {f.name: (hints[f.name], ... if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(config_class) if f.name not in DERIVED_FIELDS}


class _GraphArgs(BaseModel):
    """What only the deployment graph reads; the rest is `EngineConfig` and `FrontConfig`."""
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    served_model_name: str | None = None  # default: the checkpoint directory's name
    # The sampling fields a request leaves unset: "model", the checkpoint's generation_config.json
    # where it sets them (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens),
    # as vLLM's default `--generation-config auto` does; "openai", the API's own defaults.
    sampling_defaults: Literal["model", "openai"] = "model"
    api_keys: list[str] | None = None  # when set, requests need `Authorization: Bearer <key>`
    # (unset: the comma-separated keys in $SPECSERVE_API_KEYS, if any)
    max_request_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1)  # larger bodies get a 413
    # Run each target replica's engine in a process of its own (false: a thread of the replica,
    # where it shares the GIL with the replica's streaming; see app/engine/engine_process.py).
    engine_process: bool = True
    # How the ingress picks a target replica: "prefix_aware", the one whose KV cache holds the
    # longest prefix of the prompt unless it is loaded (deployments/prefix_routing.py), or
    # "power_of_two", Serve's default (two random replicas, the shorter queue).
    request_router: Literal["prefix_aware", "power_of_two"] = "prefix_aware"
    # Output formats: how long one compile may take, and how many compiled indexes the
    # ConstraintService keeps (deployments/constraint.py).
    guided_compile_timeout_s: float = Field(DEFAULT_COMPILE_TIMEOUT_S, gt=0)
    guided_max_cached_indexes: int = Field(DEFAULT_MAX_CACHED_INDEXES, ge=1)
    # A thinking model's reasoning goes to chat replies' `reasoning` field, apart from the answer
    # (vLLM's --reasoning-parser; deployments/reasoning.py). None: the output is all content.
    reasoning_parser: Literal[REASONING_PARSERS] | None = None
    # How the model writes tool calls (vLLM's --tool-call-parser names: deployments/tool_calls.py).
    # None: as its chat template shows.
    tool_call_parser: Literal[tuple(TOOL_CALL_PARSERS)] | None = None
    # Responses API answers kept in memory, newest first, for `previous_response_id` and GET
    # /v1/responses/{id} (deployments/response_store.py). 0: none kept.
    max_stored_responses: int = Field(1000, ge=0)
    # Of those, streamed background responses' events, kept for `GET ...?stream=true` (~250 bytes
    # a token): past this, the oldest that ended a minute ago go first. Streams still running are kept.
    max_stored_event_bytes: int = Field(DEFAULT_MAX_EVENT_BYTES, ge=0)

    @field_validator("*", mode="before")
    @classmethod
    def _nulls(cls, v, info):
        if isinstance(v, str) and v.strip().lower() in _NULLS and info.field_name not in ("model", "dtype"):
            return None
        return v

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v):
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    @field_validator("speculation_schedule", mode="before", check_fields=False)
    @classmethod
    def _parse_schedule(cls, v):
        """`serve run ... speculation_schedule=1:4,8:2,32:0` (the YAML form is a mapping)."""
        if isinstance(v, str):
            try:
                return {int(b): int(k) for b, k in (item.split(":") for item in v.split(",") if item.strip())}
            except ValueError:
                raise ValueError("speculation_schedule must look like 1:4,8:2,32:0") from None
        return v

    @model_validator(mode="after")
    def _check(self) -> "_GraphArgs":
        if self.speculative_method == "draft" and not self.draft_model:
            raise ValueError("speculative_method=draft needs draft_model")
        self.engine_config()  # the configs' own checks, now rather than at deployment
        self.front_config()
        return self

    def engine_config(self, **overrides) -> EngineConfig:
        return EngineConfig(**{**{name: getattr(self, name) for name in _fields_of(EngineConfig)}, **overrides})

    def front_config(self) -> FrontConfig:
        return FrontConfig(**{name: getattr(self, name) for name in _fields_of(FrontConfig)})


AppArgs = create_model("AppArgs", __base__=_GraphArgs, __module__=__name__,
                       **_fields_of(EngineConfig), **_fields_of(FrontConfig))
