"""A step launched on the device whose choices have not reached the host (overlapped
scheduling, `LLMEngine.step`), and what the step launched after it reads from it."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.request import Request
from app.engine.selection.layout import RowLayout
from app.engine.selection.selector import Selection
from app.engine.step_inputs import DeviceInputs


@dataclass
class StepInFlight:
    batch: dict[Request, int]  # request -> tokens computed, in batch order
    layout: RowLayout | None
    selection: Selection | None

    @property
    def plain(self) -> bool:
        """Every request it samples takes exactly one token, which the next step can read on
        the device: no drafts, grammar, beams or penalties (their next step needs this one's
        tokens on the host)."""
        return self.layout is None or all(
            not r.spec_token_ids and r.guide is None and r.beam_search is None and not r.penalised
            for r in self.layout.requests)

    def device_inputs(self, batch: dict[Request, int]) -> DeviceInputs | None:
        """The input rows of `batch` whose token this step is still choosing: each such
        request's last input."""
        index = {req: i for i, req in enumerate(self.layout.requests)} if self.layout else {}
        rows, indices, end = [], [], 0
        for req, num_new in batch.items():
            end += num_new
            if req in index and req.has_pending_token:
                rows.append(end - 1)
                indices.append(index[req])
        if not rows:
            return None
        return DeviceInputs(rows, self.selection.final, indices)
