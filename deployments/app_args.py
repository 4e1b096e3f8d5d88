"""The arguments of `app.builder:build_app`, from `serve_config.yaml` or `serve run ... key=value`.

The command line hands every value over as a string, so fields coerce: "128" -> 128,
"true" -> True, "none"/"null"/"" -> None, "a,b" -> ["a", "b"].
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_NULLS = {"", "none", "null", "~"}


class AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str  # a local Hugging Face checkpoint directory
    draft_model: str | None = None  # the draft checkpoint (same tokenizer) for speculation
    served_model_name: str | None = None  # default: the checkpoint directory's name
    dtype: str = "float32"
    device: str = "auto"  # auto: one GPU per target replica where the cluster has GPUs, else CPU
    max_model_len: int | None = Field(None, ge=1)
    num_kv_blocks: int | None = Field(None, ge=1)
    kv_cache_memory_gib: float = Field(1.0, gt=0)
    block_size: int = 16
    max_num_seqs: int = Field(128, ge=1)
    max_num_batched_tokens: int = Field(1024, ge=1)
    enable_prefix_caching: bool = True
    enable_cuda_graphs: bool = True
    enable_jump_forward: bool = True  # guided decoding: forced text as always-accepted drafts
    attention_backend: str = "auto"
    seed: int = 0
    # Speculative decoding: the draft model (DraftModel deployment) or n-gram prompt lookup
    # (in the target replica) proposes; k = num_speculative_tokens at small batches, less as the
    # batch grows (speculation_schedule, e.g. {1: 4, 8: 2, 32: 0}; None: the engine's default).
    speculative_method: Literal["draft", "ngram"] | None = None
    num_speculative_tokens: int = Field(4, ge=0)
    speculation_schedule: dict[int, int] | None = None
    api_keys: list[str] | None = None  # when set, requests need `Authorization: Bearer <key>`
    # (unset: the comma-separated keys in $SPECSERVE_API_KEYS, if any)
    # Engine requests (one per choice) allowed to wait for the running batch, per target
    # replica; beyond it new ones get a 429. None: no cap.
    max_num_waiting_requests: int | None = Field(128, ge=0)
    max_request_body_bytes: int = Field(8 * 1024 * 1024, ge=1)  # larger bodies get a 413
    # At most one streamed chunk per request per this many ms after the first (0: every step):
    # fewer, larger chunks cost Serve less per token; the first and last are never delayed.
    stream_interval_ms: float = Field(0.0, ge=0)
    # Run each target replica's engine in a process of its own (false: a thread of the replica,
    # where it shares the GIL with the replica's streaming; see app/engine/engine_process.py).
    engine_process: bool = True

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

    @field_validator("speculation_schedule", mode="before")
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
    def _check(self) -> "AppArgs":
        if self.speculative_method == "draft" and not self.draft_model:
            raise ValueError("speculative_method=draft needs draft_model")
        return self

