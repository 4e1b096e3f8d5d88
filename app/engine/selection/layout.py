"""Which logits rows belong to which request in a step, and how each is to be chosen.

Built once per step from the scheduled batch (the runner, which lays out the rows) and read by
selection and by the engine's update. A request whose known tokens are all computed after the
step is *sampled*: it owns 1 + k consecutive rows, its last known token and its k drafts
(forced by the grammar, or proposed). Everything the device needs is sent in a few tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.engine.request import Request
from app.engine.selection.draws import request_key
from app.engine.selection.penalties import Penalties
from app.engine.selection.verify import VerifyRows
from app.engine.to_device import to_device


@dataclass
class RowLayout:
    requests: list[Request]  # sampled requests, in batch order
    first_rows: list[int]  # each one's first row
    num_rows: int
    verify: VerifyRows
    # Per row, on the device: sampling settings and the random key/position of its draws
    # (None when every request is greedy).
    temperature: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    key: torch.Tensor | None  # int64: the request's seed, or 0 for unseeded rows
    position: torch.Tensor | None  # int64: the token's position (seeded), or the row (unseeded)
    seeded: torch.Tensor | None  # bool
    all_greedy: bool
    needs_sort: bool  # some sampled row has top-k or top-p
    max_top_k: int  # the largest top-k of a sampled row (0: none)
    draft_q: torch.Tensor | None  # [D, V] the proposed drafts' distributions, on the device
    logprob_rows: list[int]  # rows whose logprobs are returned (requests that asked)
    logprob_index: torch.Tensor | None  # [3, L] int64 on the device: row, request, offset in it
    num_top_logprobs: int  # the most alternatives any request asked for
    penalties: Penalties | None = None  # None when no request has a penalty or a logit bias

    @property
    def needs_fp32_logits(self) -> bool:
        """A greedy choice is an argmax: the same on 16-bit logits as on their exact fp32 copy,
        so an all-greedy step skips the cast (0.1 ms for [256, 128k] on an H100). Draws,
        penalties and grammar masks read fp32; logprobs cast the rows they read."""
        return not self.all_greedy or self.penalties is not None or bool(self.guided)

    @property
    def plain_greedy(self) -> bool:
        """Every request takes its argmax, one row each, and asks for nothing more: the step's
        tokens are its choice."""
        return (self.all_greedy and self.num_rows == len(self.requests) and self.penalties is None
                and self.logprob_index is None and not self.guided)

    @property
    def guided(self) -> list[tuple[Request, int]]:
        return [(r, row) for r, row in zip(self.requests, self.first_rows) if r.guide is not None]

    @classmethod
    def build(cls, scheduled: dict[Request, int], device: torch.device) -> RowLayout | None:
        """None when no request is sampled this step (prompt chunks only)."""
        requests, firsts, ks, greedy, forced, drafts = [], [], [], [], [], []
        q_rows, q_parts, logprob_rows, logprob_req, logprob_offset = [], [], [], [], []
        penalised = []
        num_top = num_q = 0
        row = 0
        for req, num_new in scheduled.items():
            if req.num_computed_tokens + num_new < req.num_tokens:
                continue
            p = req.params
            k = len(req.spec_token_ids)
            rows = k + 1
            requests.append(req)
            firsts.append(row)
            ks.append(k)
            greedy.append(p.greedy)
            forced.append(req.spec_forced)
            drafts.append(req.spec_token_ids)
            if req.draft_probs is not None and not req.spec_forced and not p.greedy:
                q_rows.append(list(range(num_q, num_q + k)))
                q_parts.append(req.draft_probs)
                num_q += k
            else:
                q_rows.append([-1] * k)
            if p.logprobs is not None:
                logprob_rows += range(row, row + rows)
                logprob_req += [len(requests) - 1] * rows
                logprob_offset += range(rows)
                num_top = max(num_top, p.logprobs)
            if p.penalised:
                penalised.append((req, row))
            row += rows
        if not requests:
            return None
        max_k = max(ks)
        pad = lambda lists, fill: [x + [fill] * (max_k - len(x)) for x in lists]  # noqa: E731
        dev = device
        draft_q = torch.cat(q_parts).to(dev) if q_parts else None
        verify = VerifyRows(
            first=to_device(firsts, dev, torch.long), num_drafts=to_device(ks, dev, torch.long),
            greedy=to_device(greedy, dev, torch.bool), forced=to_device(forced, dev, torch.bool),
            drafts=to_device(pad(drafts, 0), dev, torch.long).view(len(ks), max_k),
            draft_q_row=(to_device(pad(q_rows, -1), dev, torch.long).view(len(ks), max_k)
                         if q_parts else None))
        all_greedy = all(greedy)
        sampling = None if all_greedy else _sampling_rows(requests, firsts, ks, dev)  # greedy draws nothing
        temperature, top_k, top_p, min_p, key, position, seeded = sampling or (None,) * 7
        return cls(
            requests=requests, first_rows=firsts, num_rows=row, verify=verify,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, key=key,
            position=position, seeded=seeded, all_greedy=all_greedy,
            needs_sort=any(not g and (r.params.top_k > 0 or r.params.top_p < 1)
                           for r, g in zip(requests, greedy)),
            max_top_k=max((r.params.top_k for r, g in zip(requests, greedy) if not g), default=0),
            draft_q=draft_q, logprob_rows=logprob_rows,
            logprob_index=(to_device([logprob_rows, logprob_req, logprob_offset], dev, torch.long)
                           if logprob_rows else None),
            num_top_logprobs=num_top,
            penalties=Penalties.build(penalised, dev) if penalised else None)


def _sampling_rows(requests: list[Request], firsts: list[int], ks: list[int], dev: torch.device
                   ) -> tuple[torch.Tensor, ...]:
    """Per row: temperature, top-k, top-p, min-p, and the key, position and seededness of its draws."""
    temperature, top_k, top_p, min_p, key, position, seeded = [], [], [], [], [], [], []
    for req, row, k in zip(requests, firsts, ks):
        p = req.params
        rows = k + 1
        temperature += [p.temperature if not p.greedy else 1.0] * rows
        top_k += [p.top_k] * rows
        top_p += [p.top_p] * rows
        min_p += [p.min_p] * rows
        if p.seed is not None:
            key += [request_key(p.seed)] * rows
            position += range(req.num_tokens, req.num_tokens + rows)
            seeded += [True] * rows
        else:
            key += [0] * rows
            position += range(row, row + rows)
            seeded += [False] * rows
    return (to_device(temperature, dev, torch.float32), to_device(top_k, dev, torch.long),
            to_device(top_p, dev, torch.float32), to_device(min_p, dev, torch.float32),
            to_device(key, dev, torch.long), to_device(position, dev, torch.long),
            to_device(seeded, dev, torch.bool))
