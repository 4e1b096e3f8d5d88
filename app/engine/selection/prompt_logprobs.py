"""Logprobs of the prompt's own tokens (OpenAI's `echo` with `logprobs`, vLLM's `prompt_logprobs`),
scored while the prompt's chunks run, for log-likelihood evaluation.

The logits at position p score prompt token p + 1, so a request's first prompt token has no
logprob (None). Requests that ask skip the prefix cache (scheduler): a cached block has no
logits. A recomputed chunk after preemption skips the positions already scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.engine.request import Request
from app.engine.selection import transfer
from app.outputs import TokenLogprob


@dataclass
class PromptRows:
    """The rows of a step's flattened input whose logits score prompt tokens."""
    rows: list[int]
    targets: list[int]  # the prompt token each row scores
    spans: list[tuple[Request, int]]  # (request, how many of the rows are its), in row order
    num_top: int  # the most alternatives any of the requests asked for

    @classmethod
    def build(cls, scheduled: dict[Request, int]) -> PromptRows | None:
        """Before the step moves num_computed_tokens; None when no scheduled chunk is scored."""
        rows, targets, spans = [], [], []
        num_top = offset = 0
        for req, num_new in scheduled.items():
            if req.prompt_logprobs is not None:
                start = req.num_computed_tokens
                first = max(start, len(req.prompt_logprobs) - 1)  # the first position not scored
                end = min(start + num_new, req.num_prompt_tokens - 1)
                if first < end:
                    rows += range(offset + first - start, offset + end - start)
                    targets += req.prompt_token_ids[first + 1:end + 1]
                    spans.append((req, end - first))
                    num_top = max(num_top, req.params.prompt_logprobs)
            offset += num_new
        return cls(rows, targets, spans, num_top) if rows else None


def score_prompt_rows(logits: torch.Tensor, prompt: PromptRows) -> None:
    """Append each scored token's logprob and top alternatives (the model's raw distribution)
    to its request's `prompt_logprobs`; one copy to the host."""
    logprobs = logits.float().log_softmax(-1)
    targets = torch.tensor(prompt.targets, device=logits.device)
    chosen = logprobs.gather(1, targets[:, None])
    parts = [chosen[:, 0], (logprobs > chosen).sum(-1) + 1]
    m = prompt.num_top
    if m:
        top_values, top_ids = logprobs.topk(m, dim=-1)
        parts += [top_ids.flatten(), top_values.flatten()]
    values = transfer.to_host(torch.cat([p.double() for p in parts])).wait().tolist()
    n = len(prompt.rows)
    chosen, ranks = values[:n], values[n:2 * n]
    top_ids, top_values = values[2 * n:2 * n + n * m], values[2 * n + n * m:]
    row = 0
    for req, count in prompt.spans:
        top_n = req.params.prompt_logprobs
        for r in range(row, row + count):
            top = {int(t): v for t, v in zip(top_ids[r * m:r * m + top_n], top_values[r * m:r * m + top_n])}
            req.prompt_logprobs.append(TokenLogprob(prompt.targets[r], chosen[r], top, int(ranks[r])))
        row += count
