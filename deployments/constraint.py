"""ConstraintService: compiles output formats (JSON schema, regex, choice) into token indexes.

The ingress calls `compile(format)` once per request that asks for a format: the format
becomes a regex, the regex an outlines-core `Index` over the served model's vocabulary, in a
worker thread (outlines-core releases the GIL) under a time limit, behind an LRU cache keyed by
(vocabulary hash, regex) that also remembers formats that failed. It returns a small spec
(`guided_spec`), not the index: the spec rides in the request's params to a target replica,
which fetches the index with `get_index` only when its own cache lacks it
(deployments/guided_client.py). Moving the index by reference keeps requests small; pickling
one is ~1 ms for the 0.6 MB json_object index of the default model (benchmarks/guided.py).

Every bad format raises `GuidedFormatError` (a ValueError): the ingress answers 400 with the
message, and this replica keeps serving. Limits come from Serve's `user_config`
(`compile_timeout_s`, `max_cached_indexes`).
"""

from __future__ import annotations

import asyncio
import hashlib

from outlines_core import Index
from ray import serve

from app.guided.compiler import (CompilerBusy, CompileTimeout, GuidedFormatError, IndexCache,
                                 regex_for_format)
from app.guided.vocabulary import load_guided_vocabulary
from deployments.constraint_metrics import ConstraintMetrics

DEFAULT_COMPILE_TIMEOUT_S = 10.0
DEFAULT_MAX_CACHED_INDEXES = 64


def guided_spec(vocab_hash: str, regex: str) -> dict:
    """What the ingress puts in `params["guided"]`: enough to find or fetch the index."""
    key = hashlib.sha256(f"{vocab_hash}\n{regex}".encode()).hexdigest()[:32]
    return {"vocab_hash": vocab_hash, "regex": regex, "key": key}


@serve.deployment(ray_actor_options={"num_cpus": 0})
class ConstraintService:
    async def __init__(self, model_path: str, metrics_hub=None, model_name: str = "",
                       compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
                       max_cached_indexes: int = DEFAULT_MAX_CACHED_INDEXES):
        # Async so that the metrics reporter starts on this replica's event loop.
        self.vocab = load_guided_vocabulary(model_path)
        self.compile_timeout_s = compile_timeout_s
        self.cache = IndexCache(max_entries=max_cached_indexes)
        self.metrics = ConstraintMetrics(metrics_hub, model_name, self.cache)
        self.metrics.start()

    def reconfigure(self, config: dict) -> None:
        """Serve `user_config`: {"compile_timeout_s": float, "max_cached_indexes": int}."""
        self.compile_timeout_s = float(config.get("compile_timeout_s", self.compile_timeout_s))
        self.cache.max_entries = int(config.get("max_cached_indexes", self.cache.max_entries))

    def _compile(self, fmt: dict) -> tuple[str, Index]:
        regex = regex_for_format(fmt)
        return regex, self.cache.get_or_compile(regex, self.vocab, self.compile_timeout_s)

    async def _run(self, fmt_or_regex: dict | str) -> tuple[str, Index]:
        try:
            if isinstance(fmt_or_regex, str):
                regex = fmt_or_regex
                index = await asyncio.to_thread(self.cache.get_or_compile, regex, self.vocab,
                                                self.compile_timeout_s)
                return regex, index
            return await asyncio.to_thread(self._compile, fmt_or_regex)
        except GuidedFormatError as exc:
            reason = ("busy" if isinstance(exc, CompilerBusy) else
                      "timeout" if isinstance(exc, CompileTimeout) or "longer than" in str(exc)
                      else "invalid")
            self.metrics.errors[reason].inc()
            raise

    async def compile(self, fmt: dict) -> dict:
        """Compile (or find) the index of a format; returns its `guided_spec`."""
        regex, _ = await self._run(fmt)
        return guided_spec(self.vocab.vocab_hash, regex)

    async def get_index(self, vocab_hash: str, regex: str) -> Index:
        """The index a target replica needs for a spec (compiled again if it was evicted)."""
        if vocab_hash != self.vocab.vocab_hash:
            raise GuidedFormatError("the format was compiled for another vocabulary than this "
                                    "service's; the target and constraint models must share a "
                                    "tokenizer")
        _, index = await self._run(regex)
        return index

    def __del__(self):
        if getattr(self, "metrics", None) is not None:
            self.metrics.stop()
