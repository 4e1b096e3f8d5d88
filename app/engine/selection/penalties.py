"""Allowed tokens, logit bias, bad words, repetition, frequency and presence penalties, and
`min_tokens`, batched on the logits' device.

vLLM's semantics, in its order: a request with `allowed_token_ids` has every other token's
logit set to -inf; the bias is added (and a row before `min_tokens` are out gets -inf on every
stop token, EOS included, as vLLM's min-tokens processor does, and -inf on the token that would
complete one of its `bad_words`); then a token seen in the
prompt or the output has a positive logit divided by the repetition penalty and a negative one
multiplied by it; then the frequency penalty times the token's count in the output, and the
presence penalty once if it is there at all, are subtracted. Temperature and the filters come
after.

Speculation: the rows of a request verifying k drafts are the distributions at k + 1 successive
positions, so row j counts the output so far plus the drafts before it. The target's
distribution at every verified position is then exactly the penalised one plain decoding would
use, which keeps greedy requests exact and sampled ones lossless.

Only the rows of penalised requests are touched, out of place (the raw logits stay for
logprobs), and nothing is built for a step without such a request.

The bars of `min_tokens` and `bad_words` give way to the request's other rules: a row they would
leave with no token (every allowed token a stop token, or the end of a bad word) is drawn as if
they were not there (-inf stays -inf under the penalties, so they can be applied last).

An output format comes first: a request that follows one gets these on its masked logits, and a
row where even `allowed_token_ids` leaves no token the format allows keeps the format's mask
alone, so the output still parses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.engine.request import Request

PAD = -1  # no token: padding in the token tensors below


@dataclass
class Penalties:
    """Per penalised row (P of them) of a step, on the device."""
    rows: torch.Tensor  # [P] int64: the logits row
    request: torch.Tensor  # [P] int64: index into `outputs` / `prompts`
    presence: torch.Tensor  # [P] float32
    frequency: torch.Tensor  # [P] float32
    repetition: torch.Tensor  # [P] float32
    outputs: torch.Tensor  # [n, L] int64: each penalised request's output so far, PAD-padded
    drafts_before: torch.Tensor  # [P, K] int64: the drafts before the row, PAD-padded
    prompts: torch.Tensor | None  # [n, Lp] int64 prompts, when some request has a repetition penalty
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (index into rows, token, value)
    barred: tuple[torch.Tensor, torch.Tensor] | None  # (index into rows, token): min_tokens' stops, bad words' ends
    # Whether the bars may leave a row empty: they meet a row that allows few tokens (allowed
    # tokens, a format), or bar this many in one row (a row of the whole vocabulary, all finite,
    # is emptied only by barring every token).
    bars_meet_narrow_rows: bool
    most_bars_in_a_row: int
    # (the indices into rows restricted to allowed tokens, and per allowed token: index, token)
    allowed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    follows_format: torch.Tensor | None  # [P] bool: the row's request has an output format, when some has

    @classmethod
    def build(cls, penalised: list[tuple[Request, int]], device: torch.device) -> Penalties:
        """`penalised`: (request, first row) of each penalised request; its rows are the 1 + k
        from there (k = its drafts)."""
        rows, request, presence, frequency, repetition = [], [], [], [], []
        outputs, drafts_before, prompts = [], [], []
        bias_row, bias_token, bias_value = [], [], []
        barred_row, barred_token = [], []
        bars_meet_narrow_rows, most_bars_in_a_row = False, 0
        restricted, allowed_row, allowed_token = [], [], []
        max_k = max(len(req.spec_token_ids) for req, _ in penalised)
        any_repetition = any(req.params.repetition_penalty != 1 for req, _ in penalised)
        any_format = any(req.guide is not None for req, _ in penalised)
        follows_format = []
        for i, (req, first) in enumerate(penalised):
            p = req.params
            drafts = req.spec_token_ids
            stops = sorted(req.stop_token_ids) if req.num_output_tokens < p.min_tokens else []
            outputs.append(req.output_token_ids)
            if any_repetition:
                prompts.append(req.prompt_token_ids)
            for j in range(len(drafts) + 1):
                if p.logit_bias:
                    bias_row += [len(rows)] * len(p.logit_bias)
                    bias_token += p.logit_bias.keys()
                    bias_value += p.logit_bias.values()
                if p.allowed_token_ids is not None:
                    restricted.append(len(rows))
                    allowed_row += [len(rows)] * len(p.allowed_token_ids)
                    allowed_token += p.allowed_token_ids
                never = stops if req.num_output_tokens + j < p.min_tokens else []
                if p.bad_words_token_ids:
                    never = never + bad_word_ends(p.bad_words_token_ids, req.output_token_ids, drafts[:j])
                barred_row += [len(rows)] * len(never)
                barred_token += never
                if never:
                    bars_meet_narrow_rows |= p.allowed_token_ids is not None or req.guide is not None
                    most_bars_in_a_row = max(most_bars_in_a_row, len(never))
                rows.append(first + j)
                drafts_before.append(drafts[:j] + [PAD] * (max_k - j))
            request += [i] * (len(drafts) + 1)
            presence += [p.presence_penalty] * (len(drafts) + 1)
            frequency += [p.frequency_penalty] * (len(drafts) + 1)
            repetition += [p.repetition_penalty] * (len(drafts) + 1)
            if any_format:
                follows_format += [req.guide is not None] * (len(drafts) + 1)
        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.long, device=device)
        return cls(
            rows=torch.tensor(rows, **i64), request=torch.tensor(request, **i64),
            presence=torch.tensor(presence, **f32), frequency=torch.tensor(frequency, **f32),
            repetition=torch.tensor(repetition, **f32), outputs=_padded(outputs, device),
            drafts_before=torch.tensor(drafts_before, **i64).view(len(rows), max_k),
            prompts=_padded(prompts, device) if any_repetition else None,
            bias=((torch.tensor(bias_row, **i64), torch.tensor(bias_token, **i64),
                   torch.tensor(bias_value, **f32)) if bias_row else None),
            barred=(torch.tensor(barred_row, **i64), torch.tensor(barred_token, **i64)) if barred_row else None,
            bars_meet_narrow_rows=bars_meet_narrow_rows, most_bars_in_a_row=most_bars_in_a_row,
            allowed=((torch.tensor(restricted, **i64), torch.tensor(allowed_row, **i64),
                      torch.tensor(allowed_token, **i64)) if restricted else None),
            follows_format=torch.tensor(follows_format, dtype=torch.bool, device=device) if any_format else None)


def bad_word_ends(words: list[list[int]], output: list[int], drafts: list[int]) -> list[int]:
    """The tokens that would complete one of `words` after `output` + `drafts` (vLLM's rule:
    a word's last token where the text so far ends with the rest of it)."""
    ends = []
    for word in words:
        head = len(word) - 1
        if head == 0:
            ends.append(word[0])
            continue
        tail = (output[-head:] + drafts)[-head:] if len(drafts) < head else drafts[-head:]
        if tail == word[:-1]:
            ends.append(word[-1])
    return ends


def _emptied(rows: torch.Tensor) -> torch.Tensor:
    """[P] bool: the rows with no token left to draw."""
    return rows.amax(-1) == -torch.inf


def _padded(lists: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(x) for x in lists)
    return torch.tensor([x + [PAD] * (width - len(x)) for x in lists], dtype=torch.long,
                        device=device).view(len(lists), width)


def token_counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[P, vocab] float32 count of each id in each row of PAD-padded `tokens` [P, L]."""
    index = torch.where(tokens >= 0, tokens, vocab)  # padding lands in a spare column
    counts = torch.zeros(tokens.shape[0], vocab + 1, dtype=torch.float32, device=tokens.device)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=torch.float32))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, pen: Penalties) -> torch.Tensor:
    """`logits` with the penalised rows replaced (a new tensor; `logits` is left as it is)."""
    vocab = logits.shape[-1]
    rows = logits[pen.rows].float()
    if pen.allowed is not None:
        restricted, row, token = pen.allowed
        kept = torch.ones_like(rows, dtype=torch.bool)
        kept[restricted] = False
        kept[row, token] = True
        rows = rows.masked_fill(~kept, -torch.inf)
    if pen.bias is not None:
        row, token, value = pen.bias
        rows.index_put_((row, token), value, accumulate=True)
    counts = token_counts(torch.cat([pen.outputs[pen.request], pen.drafts_before], dim=1), vocab)
    in_output = counts > 0
    if pen.prompts is not None:
        seen = in_output | (token_counts(pen.prompts, vocab)[pen.request] > 0)
        scale = torch.where(seen, pen.repetition[:, None], 1.0)
        rows = torch.where(rows > 0, rows / scale, rows * scale)
    rows = rows - pen.frequency[:, None] * counts - pen.presence[:, None] * in_output.float()
    if pen.barred is not None:
        row, token = pen.barred
        may_empty = pen.bars_meet_narrow_rows or pen.most_bars_in_a_row >= vocab
        unbarred = rows[row, token] if may_empty else None
        rows.index_put_((row, token), rows.new_full((), -torch.inf))
        if may_empty:  # put back in the rows they left with nothing
            rows.index_put_((row, token), torch.where(_emptied(rows)[row], unbarred, -torch.inf))
    if pen.follows_format is not None:  # the format's mask alone where nothing it allows is left
        rows = torch.where((pen.follows_format & _emptied(rows))[:, None], logits[pen.rows].float(), rows)
    return logits.index_copy(0, pen.rows, rows.to(logits.dtype))
