"""`Sampler`: one token per row of logits, through the engine's selection step
(app/engine/selection/), for tests that hold logits and requests rather than a step's layout.

Each seeded request draws at (its seed, how many rows this sampler drew for it), so its tokens
do not depend on the batch; unseeded rows draw keys from the sampler's generator."""

from __future__ import annotations

from dataclasses import replace

import torch

from app.engine.request import Request
from app.engine.selection.draws import request_key
from app.engine.selection.layout import RowLayout
from app.engine.selection.selector import Selector
from app.outputs import TokenLogprob


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)
        self.selector = Selector(seed)
        self.draws: dict[str, int] = {}  # seeded request id -> rows drawn for it so far

    def __call__(self, logits: torch.Tensor, requests: list[Request]
                 ) -> tuple[list[int], list[TokenLogprob | None]]:
        layout = RowLayout.build({r: r.num_tokens - r.num_computed_tokens for r in requests}, logits.device)
        keys = torch.randint(2**62, (len(requests),), generator=self.generator).tolist()
        positions = []
        for i, req in enumerate(requests):
            if req.params.seed is not None:
                keys[i] = request_key(req.params.seed)
                positions.append(self.draws.get(req.request_id, 0))
                self.draws[req.request_id] = positions[-1] + 1
            else:
                positions.append(0)
        if layout.host_rows.sampling is not None:  # one row per request
            layout.host_rows.sampling = replace(layout.host_rows.sampling, key=keys, position=positions,
                                                seeded=[True] * len(requests))
        chosen = self.selector(logits.float(), layout, step=0)
        return ([c.token_ids[0] for c in chosen],
                [c.logprobs[0] if c.logprobs is not None else None for c in chosen])
