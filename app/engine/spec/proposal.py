"""What a proposer is given and what it gives back, for one sequence of a step.

The draft deployment is stateless: each call carries the sequence's tokens and how to sample,
so any replica can answer and a lost replica loses nothing. Draft distributions travel as
`CompactProbs` (fp16, sparse when that is smaller); the draft samples from exactly the
distribution that decodes to, so acceptance by min(1, p/q) stays lossless.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from app.config import MAX_PROMPT_LOOKUP, EngineConfig


@dataclass
class DraftInput:
    request_id: str
    token_ids: list[int]  # prompt + output so far
    k: int  # propose at most this many tokens
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0  # the draft's random stream for this call (derived from the request's seed)
    cache_salt: str | None = None  # the request's: the draft's prefix cache is salted as the target's


@dataclass
class CompactProbs:
    """[rows, width] probabilities as fp16, dense or as (row, column, value) triples."""
    width: int
    rows: int
    values: np.ndarray  # float16: dense [rows * width], or the non-zero values
    indices: np.ndarray | None = None  # int32 flat positions (row * width + column) when sparse

    @classmethod
    def encode(cls, probs: torch.Tensor) -> CompactProbs:
        half = probs.detach().to(torch.float16).cpu().numpy()
        rows, width = half.shape
        flat = half.reshape(-1)
        nonzero = np.flatnonzero(flat)
        if nonzero.size * (2 + 4) < flat.size * 2 and flat.size < 2**31:
            return cls(width, rows, flat[nonzero], nonzero.astype(np.int32))
        return cls(width, rows, flat)

    def decode(self, width: int | None = None) -> torch.Tensor:
        """fp32 [rows, width] with each row normalised (padded with zeros to `width`)."""
        out = np.zeros(self.rows * self.width, dtype=np.float32)
        if self.indices is None:
            out[:] = self.values
        else:
            out[self.indices] = self.values
        probs = torch.from_numpy(out).view(self.rows, self.width)
        probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-30)
        if width is not None and width > self.width:
            probs = torch.nn.functional.pad(probs, (0, width - self.width))
        return probs

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (0 if self.indices is None else self.indices.nbytes)


@dataclass
class Proposal:
    token_ids: list[int]
    probs: CompactProbs | None = None  # None: a point mass (n-gram, greedy draft)


class Proposer(Protocol):
    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        """One proposal per input (possibly empty), in order."""

    def forget(self, request_id: str) -> None:
        """The request finished; drop whatever was kept for it."""


def build_proposer(config: EngineConfig) -> Proposer | None:
    """The in-process proposer the config names (the Serve graph passes a remote one instead)."""
    if config.speculative_method == "ngram":
        from app.engine.spec.ngram_proposer import NgramProposer
        return NgramProposer(k=config.num_speculative_tokens, min_n=config.prompt_lookup_min,
                             max_n=MAX_PROMPT_LOOKUP, recent_output_tokens=config.lookup_recent_output_tokens)
    if config.speculative_method == "draft" and config.draft_model:
        from app.engine.spec.draft_worker import DraftWorker
        return DraftWorker(dataclasses.replace(config, model=config.draft_model, speculative_method=None,
                                               draft_model=None))
    return None
