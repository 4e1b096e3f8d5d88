"""Engine configuration: one dataclass, built once at the edge and passed down, never mutated."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_PROMPT_LOOKUP = 4  # the longest match of a request's last tokens n-gram lookup tries
SCHEDULING_POLICIES = ("fcfs", "priority")

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}") from None


def resolve_device(name: str) -> torch.device:
    """`auto` means the GPU where there is one, the CPU otherwise."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass(frozen=True)
class EngineConfig:
    model: str
    dtype: str = "float32"
    device: str = "auto"
    block_size: int = 16
    # KV pool: an explicit block count wins; otherwise `kv_cache_memory_gib` worth of blocks.
    num_kv_blocks: int | None = None
    kv_cache_memory_gib: float = 1.0
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 1024
    # "fcfs": requests in arrival order; "priority": by their `priority` (lower first, vLLM's
    # rule), then arrival, and the lowest-priority running request is the one preempted.
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = True
    seed: int = 0
    # "auto": Triton kernels on CUDA; on the CPU, the C++ paged kernel for decode and verify
    # rows where it builds ("cpu"), else plain PyTorch ("torch").
    attention_backend: str = "auto"
    enable_cuda_graphs: bool = True
    # Schedule and prepare step N+1 while step N runs on the device; its inputs read N's tokens
    # there (app/engine/engine.py). None: on CUDA only (on the CPU the forward runs in the
    # calling thread, so nothing would overlap).
    overlap_scheduling: bool | None = None
    # Speculative decoding: "draft" (a draft model proposes), "ngram" (prompt lookup) or None.
    speculative_method: str | None = None
    num_speculative_tokens: int = 4  # k at small batches
    # Batch size -> k thresholds, e.g. {1: 4, 16: 2, 32: 0}; None: `SpeculationSchedule.default`.
    speculation_schedule: dict | None = None
    # Pick k per batch size up to the schedule's, from the measured step times and acceptance
    # (app/engine/spec/adaptive.py), so speculation that does not pay here turns itself off.
    adaptive_speculation: bool = True
    draft_model: str | None = None  # a local draft checkpoint, run in-process (offline use)
    # With the draft model: a request whose last tokens occurred earlier in its own tokens takes
    # what followed them as drafts, without a draft call (app/engine/spec/speculator.py).
    prompt_lookup_first: bool = True
    # With "ngram": the shortest match of a request's last tokens that proposes (vLLM's name).
    prompt_lookup_min: int = 1
    # n-gram lookup ("ngram", and "draft"'s prompt_lookup_first): how many output tokens of the
    # requests that finished last it also searches when a request's own tokens hold no match
    # (app/engine/spec/recent_outputs.py); 0: none.
    lookup_recent_output_tokens: int = 32768
    # Guided decoding: insert the text a format forces (keys, punctuation) as drafts that are
    # always accepted, instead of decoding it token by token.
    enable_jump_forward: bool = True
    # The tokenizer's special tokens, by their text, that formats may write (as their text): the
    # tool-call markers a tokenizer holds as special tokens. The app derives them from the model's
    # tool-call syntax (deployments/markup_tokens.py); they are not one of its arguments.
    markup_tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a positive power of two")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        for name in ("max_model_len", "num_kv_blocks"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (or None)")
        if self.kv_cache_memory_gib <= 0:
            raise ValueError("kv_cache_memory_gib must be positive")
        resolve_dtype(self.dtype)
        if self.speculative_method not in (None, "draft", "ngram"):
            raise ValueError(f"speculative_method must be draft, ngram or None, got {self.speculative_method!r}")
        if self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        if not 1 <= self.prompt_lookup_min <= MAX_PROMPT_LOOKUP:
            raise ValueError(f"prompt_lookup_min must be in [1, {MAX_PROMPT_LOOKUP}]")
        if self.lookup_recent_output_tokens < 0:
            raise ValueError("lookup_recent_output_tokens must be >= 0")

    @property
    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype)

    @property
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)
