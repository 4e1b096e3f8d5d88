"""Which logits rows belong to which request in a step, and how each is to be chosen.

Built once per step from the scheduled batch (the runner, which lays out the rows) and read by
selection and by the engine's update. A request whose known tokens are all computed after the
step is *sampled*: it owns 1 + k consecutive rows, its last known token and its k drafts
(forced by the grammar, or proposed). Everything selection on the device needs is sent in a
few tensors when it first reads them; a step whose CUDA graph chooses its tokens reads the
host's lists instead (`graph_draws`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import numpy as np
import torch

from app.engine.request import Request
from app.engine.selection.draws import DRAW_ROUNDS, DRAW_STREAMS, RowUniforms, host_uniforms, request_key
from app.engine.selection.penalties import Penalties
from app.engine.selection.verify import VerifyRows
from app.engine.step_inputs import GraphDraws
from app.engine.to_device import to_device


@dataclass
class SamplingRows:
    """Per row: sampling settings and the random key/position of its draws. Built as lists on
    the host (`_sampling_lists`); `on(device)` gives the settings as the tensors selection
    reads. Keys and positions stay on the host, where the step's uniforms are computed
    (`RowLayout.uniforms`)."""
    temperature: list[float] | torch.Tensor  # 1.0 on greedy rows
    top_k: list[int] | torch.Tensor
    top_p: list[float] | torch.Tensor
    min_p: list[float] | torch.Tensor
    key: list[int]  # int64: the request's seed, or 0 for unseeded rows
    position: list[int]  # int64: the token's position (seeded), or the row (unseeded)
    seeded: list[bool]

    DTYPES = dict(temperature=np.float32, top_k=np.int64, top_p=np.float32, min_p=np.float32)

    def on(self, device: torch.device) -> SamplingRows:
        """Through numpy arrays: a few times faster than torch.tensor of a list for a step's rows.
        A temperature past fp32's range (the API takes any) is infinite there, as torch makes it."""
        with np.errstate(over="ignore"):
            return dataclasses.replace(self, **{name: to_device(np.array(getattr(self, name), dtype), device)
                                                for name, dtype in self.DTYPES.items()})


@dataclass
class HostRows:
    """What the device tensors of a layout are made of, kept on the host until selection there
    reads them: a step whose CUDA graph chooses its tokens sends none of them."""
    firsts: list[int]
    ks: list[int]
    greedy: list[bool]
    forced: list[bool]
    drafts: list[list[int]]  # padded to the largest k with 0
    draft_q_rows: list[list[int]] | None  # padded with -1; None without draft distributions
    sampling: SamplingRows | None  # of lists; None when every request is greedy


@dataclass
class RowLayout:
    requests: list[Request]  # sampled requests, in batch order
    first_rows: list[int]  # each one's first row
    num_rows: int
    device: torch.device
    host_rows: HostRows
    all_greedy: bool
    verified_requests: list[int]  # the sampled requests with drafts (their index): verified by draws
    verified_rows: list[int]  # their rows, in order: the only distributions verification reads
    verified_rows_need_sort: bool  # one of them has top-k or top-p
    undrafted_requests: list[int]  # the sampled requests without drafts: each draws its own token
    max_top_k: int  # the largest top-k of a sampled row (0: none)
    draft_q: torch.Tensor | None  # [D, V] the proposed drafts' distributions, on the device
    logprob_rows: list[int]  # rows whose logprobs are returned (requests that asked)
    logprob_index: torch.Tensor | None  # [3, L] int64 on the device: row, request, offset in it
    num_top_logprobs: int  # the most alternatives any request asked for
    penalties: Penalties | None = None  # None when no request has a penalty, a bias or min_tokens to go

    @functools.cached_property
    def verify(self) -> VerifyRows:
        """Every request's rows: greedy requests and forced drafts are verified by the argmax."""
        host = self.host_rows
        return _verify_rows(host.firsts, host.ks, host.greedy, host.forced, host.drafts, host.draft_q_rows,
                            self.device)

    @functools.cached_property
    def verified(self) -> VerifyRows:
        """The sampled requests with drafts alone (`verified_requests`), their rows numbered as
        they come in `verified_rows`."""
        host, picked = self.host_rows, self.verified_requests
        if len(picked) == len(host.ks):
            return self.verify
        ks = [host.ks[i] for i in picked]
        max_k = max(ks)
        firsts = list(itertools.accumulate((k + 1 for k in ks[:-1]), initial=0))
        q_rows = None if host.draft_q_rows is None else [host.draft_q_rows[i][:max_k] for i in picked]
        return _verify_rows(firsts, ks, [False] * len(picked), [host.forced[i] for i in picked],
                            [host.drafts[i][:max_k] for i in picked], q_rows, self.device)

    @functools.cached_property
    def sampling(self) -> SamplingRows | None:
        """None when every request is greedy: greedy rows draw nothing."""
        lists = self.host_rows.sampling
        return None if lists is None else lists.on(self.device)

    @property
    def has_drafts(self) -> bool:
        """Some request verifies drafts this step (it owns more than one row)."""
        return self.num_rows > len(self.requests)

    @property
    def needs_fp32_logits(self) -> bool:
        """A greedy choice is an argmax: the same on 16-bit logits as on their exact fp32 copy,
        so an all-greedy step skips the cast (0.1 ms for [256, 128k] on an H100). Draws,
        penalties and grammar masks read fp32; logprobs cast the rows they read."""
        return not self.all_greedy or self.penalties is not None or bool(self.guided)

    def graph_draws(self, unseeded_key: int) -> GraphDraws | None:
        """What a CUDA graph needs to choose this step's tokens itself, or None where it cannot:
        drafts to verify, grammar masks, penalties, logprobs, or a top-k cut (whose width the
        graph cannot know). The keys and positions are those `selector.choose` draws with;
        greedy rows get temperature 0."""
        plain = (not self.has_drafts and self.penalties is None
                 and self.logprob_index is None and not self.guided)
        if not plain or self.max_top_k:
            return None
        n = len(self.requests)
        if self.all_greedy:
            return GraphDraws(np.zeros(n, np.float32), np.ones(n, np.float32), np.zeros(n, np.float32),
                              np.zeros((n, DRAW_ROUNDS)))
        rows = self.host_rows.sampling
        return GraphDraws(np.where(self.host_rows.greedy, 0.0, rows.temperature).astype(np.float32),
                          np.array(rows.top_p, np.float32), np.array(rows.min_p, np.float32),
                          host_uniforms(self._draw_keys(unseeded_key), np.array(rows.position, np.int64),
                                        DRAW_STREAMS))

    def uniforms(self, unseeded_key: int) -> RowUniforms:
        """Every row's uniforms this step, on the logits' device: `graph_draws`' keys and
        positions."""
        return RowUniforms.of(self._draw_keys(unseeded_key), np.array(self.host_rows.sampling.position, np.int64),
                              self.device)

    def _draw_keys(self, unseeded_key: int) -> np.ndarray:
        """Each row's key: its request's seed, or this step's key for unseeded requests."""
        rows = self.host_rows.sampling
        return np.array([key if seeded else unseeded_key for key, seeded in zip(rows.key, rows.seeded)], np.int64)

    @property
    def guided(self) -> list[tuple[Request, int]]:
        return [(r, row) for r, row in zip(self.requests, self.first_rows) if r.guide is not None]

    @classmethod
    def build(cls, scheduled: dict[Request, int], device: torch.device) -> RowLayout | None:
        """None when no request is sampled this step (prompt chunks only)."""
        requests, firsts, ks, greedy, forced, drafts = [], [], [], [], [], []
        q_rows, q_parts, logprob_rows, logprob_req, logprob_offset = [], [], [], [], []
        penalised, verified_requests, verified_rows, undrafted_requests = [], [], [], []
        verified_rows_need_sort = False
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
            if k and not p.greedy:
                verified_requests.append(len(requests) - 1)
                verified_rows += range(row, row + rows)
                verified_rows_need_sort |= p.top_k > 0 or p.top_p < 1
            elif not p.greedy:
                undrafted_requests.append(len(requests) - 1)
            if p.logprobs is not None:
                logprob_rows += range(row, row + rows)
                logprob_req += [len(requests) - 1] * rows
                logprob_offset += range(rows)
                num_top = max(num_top, p.logprobs)
            if req.penalised:
                penalised.append((req, row))
            row += rows
        if not requests:
            return None
        max_k = max(ks)
        pad = lambda lists, fill: [x + [fill] * (max_k - len(x)) for x in lists]  # noqa: E731
        all_greedy = all(greedy)
        host_rows = HostRows(firsts, ks, greedy, forced, pad(drafts, 0), pad(q_rows, -1) if q_parts else None,
                             None if all_greedy else _sampling_lists(requests, firsts, ks))
        return cls(
            requests=requests, first_rows=firsts, num_rows=row, device=device, host_rows=host_rows,
            all_greedy=all_greedy, verified_requests=verified_requests, verified_rows=verified_rows,
            verified_rows_need_sort=verified_rows_need_sort, undrafted_requests=undrafted_requests,
            max_top_k=max((r.params.top_k for r, g in zip(requests, greedy) if not g), default=0),
            draft_q=torch.cat(q_parts).to(device) if q_parts else None, logprob_rows=logprob_rows,
            logprob_index=(to_device([logprob_rows, logprob_req, logprob_offset], device, torch.long)
                           if logprob_rows else None),
            num_top_logprobs=num_top,
            penalties=Penalties.build(penalised, device) if penalised else None)


def _verify_rows(firsts: list[int], ks: list[int], greedy: list[bool], forced: list[bool], drafts: list[list[int]],
                 draft_q_rows: list[list[int]] | None, device: torch.device) -> VerifyRows:
    """Through numpy arrays, as `SamplingRows.on` says why."""
    n, max_k = len(ks), max(ks)
    return VerifyRows(
        first=to_device(np.array(firsts, np.int64), device), num_drafts=to_device(np.array(ks, np.int64), device),
        greedy=to_device(np.array(greedy, bool), device), forced=to_device(np.array(forced, bool), device),
        drafts=to_device(np.array(drafts, np.int64).reshape(n, max_k), device),
        draft_q_row=(to_device(np.array(draft_q_rows, np.int64).reshape(n, max_k), device)
                     if draft_q_rows is not None else None))


def _sampling_lists(requests: list[Request], firsts: list[int], ks: list[int]) -> SamplingRows:
    """Per row: temperature, top-k, top-p, min-p, and the key, position and seededness of its
    draws (read now: the positions move with the step's update)."""
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
    return SamplingRows(temperature, top_k, top_p, min_p, key, position, seeded)
