"""Target side of guided decoding: the compiled formats this replica received.

A guided request reaches the target with `params["guided"] = {"vocab_hash", "regex", "key"}`
(deployments/constraint.py: `guided_spec`). `resolve(spec)` returns the compiled format from this
replica's LRU, or fetches the `Index` once from the ConstraintService (concurrent requests for
one key share the fetch); the index travels by Ray's object transfer (pickled: ~1 ms and 0.6 MB
for the json_object index of the default model). The replica builds its own `GuidedVocabulary`
from its checkpoint (and refuses a spec made for another vocabulary) and keeps the tokenizer
jump-forward tokenizes with. The engine builds each request's `GuidedDecoder` from the
compiled format (in the engine process, which receives each index once: app/engine/engine_process.py).
Per-token work never leaves the replica.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from outlines_core import Index
# Imported here, not in the loading thread: transformers' lazy module is not safe to import
# from two threads at once (seen as "cannot import name" in a replica).
from transformers import PreTrainedTokenizerFast

from app.guided.compiler import GuidedFormatError
from app.guided.guide import CompiledFormat
from app.guided.vocabulary import GuidedVocabulary, build_guided_vocabulary


class GuidedIndexStore:
    """`constraint`: the ConstraintService handle; None looks it up by name in this replica's
    Serve application (so the target needs no extra constructor argument)."""

    def __init__(self, model_path: str, constraint: Any = None, max_entries: int = 32):
        self.model_path = model_path
        self.max_entries = max_entries
        self._constraint = constraint
        self._tokenizer: Any = None
        self._vocab: GuidedVocabulary | None = None
        self._items: OrderedDict[str, CompiledFormat] = OrderedDict()
        self._fetching: dict[str, asyncio.Future] = {}
        self.fetches = self.hits = 0

    def _load(self) -> None:
        tok = PreTrainedTokenizerFast.from_pretrained(self.model_path, local_files_only=True)
        self._vocab, self._tokenizer = build_guided_vocabulary(tok), tok

    async def vocabulary(self) -> GuidedVocabulary:
        if self._vocab is None:
            await asyncio.to_thread(self._load)
        return self._vocab

    @property
    def tokenizer(self) -> Any:
        """The tokenizer `GuidedDecoder.forced_token_ids` wants (after the first `resolve`)."""
        return self._tokenizer

    def _handle(self) -> Any:
        if self._constraint is None:
            from ray import serve
            app = serve.get_replica_context().app_name
            self._constraint = serve.get_deployment_handle("ConstraintService", app)
        return self._constraint

    async def resolve(self, spec: dict) -> CompiledFormat:
        """The compiled format of `spec`; raises GuidedFormatError (a ValueError) if it cannot
        be had, which the target reports as a refused request."""
        vocab = await self.vocabulary()
        if spec.get("vocab_hash") != vocab.vocab_hash:
            raise GuidedFormatError("the format was compiled for another vocabulary than this "
                                    "model's; the ConstraintService must serve the same tokenizer")
        key = spec["key"]
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return item
        pending = self._fetching.get(key)
        if pending is None:
            pending = self._fetching[key] = asyncio.ensure_future(self._fetch(spec, vocab))
            pending.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(pending)

    async def _fetch(self, spec: dict, vocab: GuidedVocabulary) -> CompiledFormat:
        self.fetches += 1
        index = await self._handle().get_index.remote(spec["vocab_hash"], spec["regex"])
        item = CompiledFormat(spec["key"], index, vocab)
        self._items[item.key] = item
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)
        return item
