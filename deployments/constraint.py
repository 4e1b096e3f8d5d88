"""ConstraintService: compiles output formats into token indexes, once per (vocabulary, regex).

A TargetModel replica calls `index(output_format)` (through the handle `build_app` binds into
it) when its own store lacks the format (deployments/guided_client.py); the ingress does not
call this service: it has already turned the request's format into its canonical `OutputFormat`
(app/guided/output_format.py) and refused formats that cannot be one. Here the regex becomes an
outlines-core `Index` over the served model's vocabulary, in a worker thread (outlines-core
releases the GIL) under a time limit, behind an LRU cache keyed by (vocabulary hash, regex)
that also remembers formats that failed (`IndexCache`, app/guided/compiler.py). The index
travels to the target by Ray's object transfer (pickled: ~1 ms and 0.6 MB for the json_object
index of the default model; benchmarks/guided.py), once per target replica and format.

A regex that cannot be compiled raises `GuidedFormatError` (a ValueError): the target raises
it from `generate` before its first output and the ingress answers 400 with the message
(`CompilerBusy`: 503); this replica keeps serving. The vocabulary is the checkpoint's that
`build_app` gives both this service and the target, with the same markup tokens
(deployments/markup_tokens.py), and so are the limits (the app arguments
`guided_compile_timeout_s` and `guided_max_cached_indexes`).
"""

from __future__ import annotations

import asyncio

from outlines_core import Index
from ray import serve

from app.guided.compiler import CompilerBusy, CompileTimeout, GuidedFormatError, IndexCache
from app.guided.output_format import OutputFormat
from app.guided.vocabulary import load_guided_vocabulary
from deployments.constraint_metrics import ConstraintMetrics

DEFAULT_COMPILE_TIMEOUT_S = 10.0
DEFAULT_MAX_CACHED_INDEXES = 64


@serve.deployment(ray_actor_options={"num_cpus": 0})
class ConstraintService:
    async def __init__(self, model_path: str, metrics_hub=None, model_name: str = "",
                       compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
                       max_cached_indexes: int = DEFAULT_MAX_CACHED_INDEXES, markup_tokens: tuple[str, ...] = ()):
        # Async so that the metrics reporter starts on this replica's event loop.
        self.vocab = load_guided_vocabulary(model_path, markup_tokens=markup_tokens)
        self.compile_timeout_s = compile_timeout_s
        self.cache = IndexCache(max_entries=max_cached_indexes)
        self.metrics = ConstraintMetrics(metrics_hub, model_name, self.cache)
        self.metrics.start()

    async def index(self, output_format: OutputFormat) -> Index:
        """The compiled index of `output_format` (from the cache, or compiled now)."""
        try:
            return await asyncio.to_thread(self.cache.get_or_compile, output_format.regex,
                                           self.vocab, self.compile_timeout_s)
        except GuidedFormatError as exc:
            reason = ("busy" if isinstance(exc, CompilerBusy) else
                      "timeout" if isinstance(exc, CompileTimeout) or "longer than" in str(exc)
                      else "invalid")
            self.metrics.errors[reason].inc()
            raise

    def stats(self) -> dict:
        """Cache lookups and compiles so far (tests; the metrics report the same figures)."""
        return {"hits": self.cache.hits, "misses": self.cache.misses,
                "compiles": self.cache.compiles, "cached": len(self.cache)}

    def __del__(self):
        if getattr(self, "metrics", None) is not None:
            self.metrics.stop()
