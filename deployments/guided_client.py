"""Target side of guided decoding: the compiled index of each output format this replica served.

A guided request reaches the target with `params["output_format"]`, an `OutputFormat`
(app/guided/output_format.py). `GuidedIndexStore.index(output_format)` returns its `Index` from
this replica's LRU, or fetches it once from the ConstraintService through the handle
`build_app` binds into the TargetModel (concurrent requests for one format share the fetch; a
failed fetch is not kept, the service remembers the failure). The engine front then sends each
index to its engine process once (app/engine/async_engine.py), where the vocabulary, built once
in that process, turns it into a `CompiledFormat` and each request's `GuidedDecoder`. The
replica itself holds no vocabulary or tokenizer for this; per-token work never leaves the engine.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from outlines_core import Index

from app.guided.output_format import OutputFormat
from deployments.errors import remote_cause


class GuidedIndexStore:
    """`constraint`: the ConstraintService handle."""

    def __init__(self, constraint: Any, max_entries: int = 32):
        self.constraint = constraint
        self.max_entries = max_entries
        self._items: OrderedDict[OutputFormat, Index] = OrderedDict()
        self._fetching: dict[OutputFormat, asyncio.Future] = {}
        self.fetches = self.hits = 0

    async def index(self, output_format: OutputFormat) -> Index:
        """The format's index; raises the service's GuidedFormatError (a ValueError) if it cannot
        be compiled, which the target reports as a refused request."""
        item = self._items.get(output_format)
        if item is not None:
            self._items.move_to_end(output_format)
            self.hits += 1
            return item
        pending = self._fetching.get(output_format)
        if pending is None:
            pending = self._fetching[output_format] = asyncio.ensure_future(self._fetch(output_format))
            pending.add_done_callback(lambda _: self._fetching.pop(output_format, None))
        return await asyncio.shield(pending)

    async def _fetch(self, output_format: OutputFormat) -> Index:
        self.fetches += 1
        try:
            index = await self.constraint.index.remote(output_format)
        except ValueError as exc:  # raised in the service: hand on the GuidedFormatError itself
            raise remote_cause(exc) from None
        self._items[output_format] = index
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)
        return index
