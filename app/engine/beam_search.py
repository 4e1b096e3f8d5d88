"""Which beams live on after each step of one beam search, and which hypotheses are finished.

The rule is transformers' `generate(num_beams=B, do_sample=False)`, so that the two agree token
for token: each step keeps the (1 + number of stop tokens) x B likeliest continuations of all live
beams by cumulative logprob; those among the first B that end in a stop token (or reach
max_tokens) become finished hypotheses, scored cumulative logprob / generated length **
length_penalty, and the B best that do not end continue. `early_stopping` decides when the
search ends: True once B hypotheses are finished; False when the best live beam, at its current
length, can no longer beat the worst of B finished ones; "never" as False, but judged at
max_tokens when the length penalty favours long outputs.

This module only decides. The engine runs each live beam as a request of its own whose KV
blocks are shared with the beam it came from (app/engine/block_manager.py: fork, copy on write).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from app.outputs import BeamHypothesis
from app.sampling_params import SamplingParams


@dataclass
class LiveBeam:
    handle: Hashable  # the engine's request for this beam
    token_ids: list[int]  # output tokens so far
    cumulative_logprob: float


@dataclass
class Continuation:
    """One beam of the next step: `parent`'s tokens plus `token_id`."""
    parent: Hashable
    token_id: int
    cumulative_logprob: float


class BeamSearch:
    def __init__(self, request_id: str, params: SamplingParams, stop_token_ids: frozenset[int],
                 eos_token_ids: frozenset[int] = frozenset()):
        """`eos_token_ids`: those of `stop_token_ids` that are the model's EOS, which end a beam
        but are no stop reason (vLLM's rule, as for a plain request)."""
        self.request_id = request_id
        self.width = params.beam_width
        self.max_tokens = params.max_tokens
        self.length_penalty = params.length_penalty
        self.early_stopping = params.early_stopping
        self.stop_token_ids = stop_token_ids
        self.eos_token_ids = eos_token_ids
        # As transformers: enough candidates that B survive even if every beam's likeliest
        # continuations include each stop token.
        self.num_candidates = max(2, 1 + len(self.stop_token_ids)) * self.width
        self.live: list[LiveBeam] = []
        self.finished: list[BeamHypothesis] = []  # at most `width`, best first
        self.improvement_possible = True
        self.done = False
        self._reports: dict[Hashable, dict[int, float]] = {}

    def start(self, handle: Hashable) -> None:
        self.live = [LiveBeam(handle, [], 0.0)]

    # -- one step ------------------------------------------------------------------------------
    def report(self, handle: Hashable, top_logprobs: dict[int, float]) -> None:
        """A live beam's `num_candidates` likeliest next tokens, id -> logprob."""
        self._reports[handle] = top_logprobs

    @property
    def ready(self) -> bool:
        """Every live beam has reported for its current length."""
        return all(beam.handle in self._reports for beam in self.live)

    def advance(self) -> list[Continuation]:
        """Decide the step: the next live beams, best first (none once the search is done)."""
        generated = len(self.live[0].token_ids) + 1  # output length after this step
        candidates = []
        for rank, beam in enumerate(self.live):
            for token_id, logprob in self._reports[beam.handle].items():
                candidates.append((beam.cumulative_logprob + logprob, rank, token_id))
        self._reports.clear()
        # Likeliest first; ties in the order of the flattened (beam, token) index, as topk.
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        candidates = candidates[:self.num_candidates]
        ends = [token_id in self.stop_token_ids or generated >= self.max_tokens
                for _, _, token_id in candidates]
        self._finish_hypotheses(candidates[:self.width], ends, generated)
        continuations = [Continuation(self.live[rank].handle, token_id, score)
                         for (score, rank, token_id), end in zip(candidates, ends) if not end][:self.width]
        self._update_improvement_possible(continuations, generated)
        if (not self.improvement_possible or all(ends)
                or (self.early_stopping is True and len(self.finished) == self.width)):
            self.done = True
            return []
        by_handle = {beam.handle: beam for beam in self.live}
        self.live = [LiveBeam(None, by_handle[c.parent].token_ids + [c.token_id], c.cumulative_logprob)
                     for c in continuations]
        return continuations

    def bind(self, handles: list[Hashable]) -> None:
        """The requests that now run the beams `advance` returned, in the same order."""
        for beam, handle in zip(self.live, handles):
            beam.handle = handle

    def _finish_hypotheses(self, top: list[tuple[float, int, int]], ends: list[bool], generated: int) -> None:
        if not self.improvement_possible or (self.early_stopping is True and len(self.finished) == self.width):
            return
        for (logprob, rank, token_id), end in zip(top, ends):
            if not end:
                continue
            stopped = token_id in self.stop_token_ids
            self.finished.append(BeamHypothesis(
                self.live[rank].token_ids + [token_id], logprob, logprob / generated ** self.length_penalty,
                "stop" if stopped else "length",
                token_id if stopped and token_id not in self.eos_token_ids else None))
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.width:]

    def _update_improvement_possible(self, continuations: list[Continuation], generated: int) -> None:
        """Can the best live beam still beat the worst of `width` finished hypotheses?"""
        if len(self.finished) < self.width or not continuations:
            return
        length = generated
        if self.early_stopping == "never" and self.length_penalty > 0:
            length = self.max_tokens
        best_possible = continuations[0].cumulative_logprob / length ** self.length_penalty
        if best_possible <= self.finished[-1].score:
            self.improvement_possible = False

    def best(self, n: int) -> list[BeamHypothesis]:
        return self.finished[:n]
