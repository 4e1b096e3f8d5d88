"""Logits to tokens for every sampled row of a step, where the logits are, with one copy back.

Grammar masks, logit bias and penalties, temperature and filters, draft verification (plain
decoding verifies zero drafts) and logprobs all run as batched tensor ops on the logits'
device; the chosen tokens, accepted counts and the logprobs requests asked for then cross to
the host in one tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.engine.guided_rows import mask_guided_rows
from app.engine.selection import transfer
from app.engine.selection.argmax import row_argmax
from app.engine.selection.distribution import filtered_probs
from app.engine.selection.draw import draw_with_uniforms
from app.engine.selection.draws import RowUniforms, step_key
from app.engine.selection.layout import RowLayout
from app.engine.selection.penalties import apply_penalties
from app.engine.selection.verify import verify, verify_by_argmax_on_host
from app.engine.to_device import to_device
from app.outputs import TokenLogprob


@dataclass
class Chosen:
    """What one request keeps from the step."""
    token_ids: list[int]  # its accepted drafts, then its own token
    num_accepted: int
    logprobs: list[TokenLogprob] | None  # one per token in token_ids, when the request asked


@dataclass
class Selection:
    """A step's choices: the payload on its way to the host, and each request's final token on
    the device, which the next step's inputs read where it is. `tokens_only`: the payload is
    the final tokens alone (chosen inside a CUDA graph: nothing accepted, no logprobs)."""
    host: transfer.HostCopy
    final: torch.Tensor
    tokens_only: bool = False


def choose(logits: torch.Tensor, layout: RowLayout, unseeded_key: int, argmax: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted [n], final token [n]) on the device; `logits` already masked. `argmax`:
    each row's, when it is already known (the step's CUDA graph took it, and nothing has changed
    the logits since)."""
    if layout.penalties is not None:
        logits = apply_penalties(logits, layout.penalties)
    drafts, some_greedy = layout.has_drafts, any(layout.host_rows.greedy)
    if argmax is None and (drafts or some_greedy):  # only draws read no argmax
        argmax = row_argmax(logits)
    if layout.all_greedy:  # no draws needed
        if not drafts:
            return torch.zeros_like(argmax), argmax
        return _verify_by_argmax(argmax, layout)
    s, u = layout.sampling, layout.uniforms(unseeded_key)
    if not drafts:  # each request draws its token, as is
        drawn = draw_with_uniforms(logits, s.temperature, s.top_k, s.top_p, s.min_p, layout.max_top_k, u.draw)
        if some_greedy:
            drawn = torch.where(to_device(layout.host_rows.greedy, logits.device, torch.bool), argmax, drawn)
        return torch.zeros_like(drawn), drawn
    if len(layout.verified_requests) == len(layout.requests):
        return _verify_drafted(logits, argmax, layout, u)
    # Greedy requests keep their drafts along the argmax chain; a sampled request without drafts
    # draws its token as in a batch without drafts (so it is the same either way).
    num_accepted, final = _verify_by_argmax(argmax, layout)
    final = _draw_undrafted(final, logits, layout, u)
    if layout.verified_requests:
        accepted, token = _verify_drafted(logits, argmax, layout, u)
        picked = to_device(layout.verified_requests, logits.device, torch.long)
        num_accepted, final = num_accepted.index_copy(0, picked, accepted), final.index_copy(0, picked, token)
    return num_accepted, final


def _verify_by_argmax(argmax: torch.Tensor, layout: RowLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted, final token) of every request kept along the argmax chain: greedy
    requests, and forced drafts. On the host where the argmax is there already."""
    if argmax.device.type != "cpu":
        return verify(layout.verify, None, argmax, None, None)
    host = layout.host_rows
    on_host = argmax.numpy().tolist()  # a view of the CPU's tensor: no copy, nothing to wait for
    accepted, final = verify_by_argmax_on_host(host.firsts, host.ks, host.forced, host.drafts, on_host)
    return torch.tensor(accepted), torch.tensor(final)


def _verify_drafted(logits: torch.Tensor, argmax: torch.Tensor, layout: RowLayout, u: RowUniforms
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted, final token) of each sampled request with drafts (`verified_requests`),
    verified on its own rows' distributions: the only ones a step computes (on a GPU a sort
    each, where top-p or top-k is set)."""
    s = layout.sampling
    rows = (logits, argmax, u.streams, s.temperature, s.top_k, s.top_p, s.min_p)
    if len(layout.verified_rows) < layout.num_rows:
        index = to_device(layout.verified_rows, logits.device, torch.long)
        rows = tuple(t[index] for t in rows)
    logits, argmax, streams, temperature, top_k, top_p, min_p = rows
    probs = filtered_probs(logits, temperature, top_k, top_p, min_p, layout.verified_rows_need_sort)
    u = RowUniforms(streams)
    return verify(layout.verified, probs, argmax, u.accept, u.draw[:, 0], layout.draft_q)


def _draw_undrafted(final: torch.Tensor, logits: torch.Tensor, layout: RowLayout, u: RowUniforms
                    ) -> torch.Tensor:
    """`final` [n] with each sampled request without drafts (`undrafted_requests`) taking its own
    draw."""
    picked = layout.undrafted_requests
    if not picked:
        return final
    rows = to_device([layout.first_rows[i] for i in picked], logits.device, torch.long)
    s = layout.sampling
    tokens = draw_with_uniforms(logits[rows], s.temperature[rows], s.top_k[rows], s.top_p[rows], s.min_p[rows],
                                layout.max_top_k, u.rows(rows).draw)
    return final.index_copy(0, to_device(picked, logits.device, torch.long), tokens)


def logprob_payload(logits: torch.Tensor, layout: RowLayout, num_accepted: torch.Tensor,
                    final: torch.Tensor) -> list[torch.Tensor]:
    """Per asked-for row: the emitted token's logprob and the top-n alternatives, of the model's
    own distribution (raw logits: before masks, temperature and filters, as vLLM)."""
    if layout.logprob_index is None:
        return []
    rows, req, offset = layout.logprob_index
    logprobs = logits[rows].float().log_softmax(-1)
    token = final[req]
    if layout.has_drafts:
        drafts = layout.verify.drafts
        draft = drafts[req, offset.clamp(max=drafts.shape[1] - 1)]
        token = torch.where(offset < num_accepted[req], draft, token)
    chosen = logprobs.gather(1, token[:, None])[:, 0]
    top_values, top_ids = logprobs.topk(max(layout.num_top_logprobs, 1), dim=-1)
    return [chosen, top_ids.flatten(), top_values.flatten()]


class Selector:
    def __init__(self, seed: int = 0):
        self.seed = seed

    def __call__(self, logits: torch.Tensor, layout: RowLayout, step: int,
                 jump_forward_tokenizer=None) -> list[Chosen]:
        """One Chosen per sampled request, in layout order. `step` keys unseeded draws."""
        return self.to_host(self.on_device(logits, layout, step, jump_forward_tokenizer), layout)

    def unseeded_key(self, step: int) -> int:
        """The key of unseeded requests' draws in engine step `step`."""
        return step_key(self.seed, step)

    def on_device(self, logits: torch.Tensor, layout: RowLayout, step: int, jump_forward_tokenizer=None,
                  argmax: torch.Tensor | None = None, chosen: torch.Tensor | None = None) -> Selection:
        """The step's choices, their copy to the host started (a step in flight). `argmax`:
        each row's greedy token, and `chosen`: each request's token, when the step's CUDA graph
        took them (with `layout.graph_draws`, for `chosen`)."""
        if chosen is not None:
            return Selection(transfer.to_host(chosen), chosen, tokens_only=True)
        guided = layout.guided
        masked = mask_guided_rows(logits, guided, jump_forward_tokenizer)
        unchanged = not guided and layout.penalties is None  # the graph's argmax still holds
        num_accepted, final = choose(masked, layout, self.unseeded_key(step), argmax if unchanged else None)
        parts = [num_accepted, final] + logprob_payload(logits, layout, num_accepted, final)
        return Selection(transfer.to_host(torch.cat([p.double() for p in parts])), final)

    @staticmethod
    def to_host(selection: Selection, layout: RowLayout) -> list[Chosen]:
        """Wait for the copy (this step's work only) and unpack it."""
        values = selection.host.wait().tolist()
        if selection.tokens_only:
            return [Chosen([token], 0, None) for token in values]
        return unpack(values, layout)


def unpack(values: list[float], layout: RowLayout) -> list[Chosen]:
    n = len(layout.requests)
    accepted = [int(a) for a in values[:n]]
    finals = [int(t) for t in values[n:2 * n]]
    num_rows = len(layout.logprob_rows)
    m = max(layout.num_top_logprobs, 1)
    chosen_lp = values[2 * n:2 * n + num_rows]
    top_ids = values[2 * n + num_rows:2 * n + num_rows * (1 + m)]
    top_values = values[2 * n + num_rows * (1 + m):]
    out, lp_row = [], 0
    for req, a, final in zip(layout.requests, accepted, finals):
        tokens = req.spec_token_ids[:a] + [final]
        logprobs = None
        if req.params.logprobs is not None:
            top_n = req.params.logprobs
            logprobs = []
            for j, token in enumerate(tokens):
                r = lp_row + j
                top = {int(t): v for t, v in zip(top_ids[r * m:r * m + top_n], top_values[r * m:r * m + top_n])}
                logprobs.append(TokenLogprob(token, chosen_lp[r], top))
            lp_row += len(req.spec_token_ids) + 1
        out.append(Chosen(tokens, a, logprobs))
    return out
