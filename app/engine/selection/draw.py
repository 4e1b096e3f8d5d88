"""Each sampled row's own token, drawn from its filtered distribution without sorting the
vocabulary (a sort of every row was most of a sampled step's selection: 2.4 of 5.2 ms for 256
rows of a 128k vocabulary on an H200, and 13 of 23 ms for 64 rows of 4096 on one CPU thread).

- top-p by rejection, as FlashInfer samples: draw a token by inverse CDF from the tokens above
  a pivot; it is in the nucleus when the mass strictly above it is below top_p, and is kept;
  otherwise no token at or below it can be in the nucleus, so it becomes the pivot and the row
  draws again with its next uniform. Every round keeps the nucleus inside the tokens drawn
  from, so a kept token follows the nucleus's distribution exactly; a row keeps its first
  draw with probability >= top_p. After DRAW_ROUNDS - 2 redraws the nucleus is cut as the
  reference cuts it and drawn from with the last uniform. min-p is a floor against the maximum.
- rows with a top-k cut: on CUDA the cut is a floor too, the row's k-th largest logit (one
  batched `topk`), below which nothing is drawn, and top-p is cut on the mass above it, as
  the reference cuts it on the top-k distribution. Ties at the k-th value are all kept there,
  as vLLM's top-k keeps them (the reference keeps an arbitrary k of them; bf16 logits tie
  often). On the CPU, where picking rows costs nothing, such rows take the reference's cuts
  on their k largest logits, in vocabulary order (faster there than the rejection steps).

On CUDA this is one Triton program per row (`specserve_kernels/filtered_sampling.py`); on the CPU the same
steps in C++ (`specserve_kernels/cpu/draw.cpp`, fp32 logits), or in torch ops where it does not build.
Round 0 uses the row's SAMPLE uniform, so a row without top-p draws the reference's token for
it. Which steps a row takes depends on its own settings and the device alone, so a seeded
request draws the same tokens alone or in any batch.
"""

from __future__ import annotations

import numpy as np
import torch

from app.engine.selection.distribution import cpu_selection_ops, filter_logits, row_probs
from app.engine.selection.draws import RowUniforms
from app.engine.selection.verify import sample_inverse_cdf


def compile_draws(vocab_size: int, device: torch.device) -> None:
    """Run the draws a sampled step outside a CUDA graph takes (fp32 logits, with and without a
    top-k cut) once, so that Triton compiles their kernel at start-up: the decode graphs
    compile only their own variant (16-bit logits), and the first sampled request waited about
    1.8 s for the compiler on an H100 (2026-11-27, benchmarks/decode.py)."""
    logits = torch.zeros(1, vocab_size, device=device)
    one, zero = torch.ones(1, device=device), torch.zeros(1, device=device)
    u = RowUniforms.of(np.zeros(1, np.int64), np.zeros(1, np.int64), device).draw  # as a step lays them out
    for top_k in (0, 1):
        draw_with_uniforms(logits, one, torch.full((1,), top_k, device=device), one, zero, top_k, u)


def draw_with_uniforms(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor, min_p: torch.Tensor, max_top_k: int, u: torch.Tensor
                       ) -> torch.Tensor:
    """u: [R, rounds], independent uniforms, the first the row's own. A row of temperature 0
    is greedy and draws nothing: its token is undefined, for the caller's argmax (a CUDA graph
    that chooses for greedy and sampled rows alike)."""
    if not logits.is_cuda:
        return _draw_on_cpu(logits, temperature, top_k, top_p, min_p, max_top_k, u)
    from specserve_kernels.filtered_sampling import filtered_sample
    floor = top_k_floor(logits, top_k, max_top_k) if max_top_k else None
    return filtered_sample(logits.contiguous(), temperature, top_p, min_p, u, floor)


def _draw_on_cpu(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, max_top_k: int, u: torch.Tensor
                 ) -> torch.Tensor:
    """Picking rows costs nothing on the CPU, so each row is drawn one way only."""
    if not max_top_k:
        return draw_top_p_on_cpu(logits, temperature, top_p, min_p, u)
    if bool((top_k > 0).all()):  # no rows to pick: no copies of them
        return draw_top_k_on_cpu(logits, temperature, top_k, top_p, min_p, max_top_k, u[:, 0])
    tokens = torch.empty(logits.shape[0], dtype=torch.long)
    k, p = (top_k > 0).nonzero()[:, 0], (top_k == 0).nonzero()[:, 0]
    if len(k):
        tokens[k] = draw_top_k_on_cpu(logits[k], temperature[k], top_k[k], top_p[k], min_p[k], max_top_k, u[k, 0])
    if len(p):
        tokens[p] = draw_top_p_on_cpu(logits[p], temperature[p], top_p[p], min_p[p], u[p])
    return tokens


def draw_top_p_on_cpu(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                      min_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`draw_top_p_by_rejection` in one C++ pass over each row a step (specserve_kernels/cpu/draw.cpp),
    where it builds and the logits are fp32; the rows whose every redraw fell outside the
    nucleus are cut and drawn here, as the torch steps do. A greedy row (temperature 0) draws
    as at temperature 1, for its caller's argmax."""
    ops = cpu_selection_ops(logits)
    if ops is None:
        return draw_top_p_by_rejection(logits, _positive(temperature), top_p, min_p, u)
    tokens = ops.draw_top_p_by_rejection(logits.contiguous(), temperature.float().contiguous(),
                                         top_p.float().contiguous(), min_p.float().contiguous(), u.double())
    cut = (tokens < 0).nonzero()[:, 0]
    if len(cut):
        x, _, drawable = scaled_weights(logits[cut], _positive(temperature[cut]), min_p[cut])
        tokens[cut] = draw_from_cut_nucleus(x, drawable, top_p[cut], u[cut, -1])
    return tokens


def draw_top_k_on_cpu(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor, min_p: torch.Tensor, max_top_k: int, u: torch.Tensor
                      ) -> torch.Tensor:
    """`draw_top_k` row by row in C++ (specserve_kernels/cpu/draw.cpp) where it builds and the logits are
    fp32: each row's own k largest, partially sorted, instead of a batched topk and sorts."""
    ops = cpu_selection_ops(logits)
    if ops is None:
        return draw_top_k(logits, _positive(temperature), top_k, top_p, min_p, max_top_k, u)
    return ops.draw_top_k(logits.contiguous(), temperature.float().contiguous(), top_k.long().contiguous(),
                          top_p.float().contiguous(), min_p.float().contiguous(), u.double())


def _positive(temperature: torch.Tensor) -> torch.Tensor:
    """A greedy row's temperature (0) as 1, so that its draw is defined; the C++ draws do the same."""
    return temperature.where(temperature > 0, 1.0)


def top_k_floor(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """[R] fp32: each row's k-th largest logit, -inf where it has no cut (top_k 0, or k at
    least the vocabulary). `max_top_k`, known on the host, fixes the shapes."""
    width = min(max_top_k, logits.shape[-1])
    largest = logits.topk(width, dim=-1).values.float()
    kth = largest.gather(1, (top_k.clamp(1, width) - 1)[:, None])[:, 0]
    cut = (top_k > 0) & (top_k < logits.shape[-1])  # top_k <= max_top_k, so then k <= width
    return torch.where(cut, kth, float("-inf"))


def draw_top_p_by_rejection(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                            min_p: torch.Tensor, u: torch.Tensor, floor: torch.Tensor | None = None
                            ) -> torch.Tensor:
    """The torch version of the kernel: the same rounds, uniforms and cuts. `floor`: [R] raw
    logits below which a row draws nothing (its top-k cut), or None."""
    x, weight, drawable = scaled_weights(logits, temperature, min_p, floor)
    goal = nucleus_goal(top_p, weight.sum(-1))
    token = sample_inverse_cdf(drawable, u[:, 0])
    pending = (top_p < 1).nonzero()[:, 0]  # rows whose last draw is not yet known to be kept
    rounds = u.shape[1]
    for r in range(1, rounds):  # checks the draw of uniform r - 1
        if not len(pending):
            return token
        xs = x[pending]
        drawn_x = xs.gather(1, token[pending, None])
        outside = (weight[pending] * (xs > drawn_x)).sum(-1) >= goal[pending]
        pending, pivot = pending[outside], drawn_x[outside]
        if r < rounds - 1 and len(pending):
            token[pending] = sample_inverse_cdf(drawable[pending].masked_fill(x[pending] <= pivot, 0.0),
                                                u[pending, r])
    if len(pending):
        token[pending] = draw_from_cut_nucleus(x[pending], drawable[pending], top_p[pending], u[pending, rounds - 1])
    return token


def scaled_weights(logits: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor,
                   floor: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, weight, drawable) of rows: the logits over temperature (-inf below `floor`), their
    weights exp(x - max), and those weights with min-p's cut."""
    x = logits.float() / temperature[:, None]
    if floor is not None:
        x = x.masked_fill(x < (floor / temperature)[:, None], float("-inf"))
    top = x.amax(-1, keepdim=True)
    weight = (x - top).exp()
    drawable = weight
    if bool((min_p > 0).any()):  # else a pass over every row that cuts nothing
        drawable = weight.masked_fill(x < top + min_p.log()[:, None], 0.0)
    return x, weight, drawable


def draw_from_cut_nucleus(x: torch.Tensor, drawable: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor
                          ) -> torch.Tensor:
    """The last round: the nucleus cut as the reference cuts it (a sort), drawn from with `u`."""
    nucleus = filter_logits(x, torch.zeros_like(top_p, dtype=torch.long), top_p, torch.zeros_like(top_p)).isfinite()
    return sample_inverse_cdf(drawable * nucleus, u)


def nucleus_goal(top_p: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """The mass strictly above a token must be below this for the token to be in the nucleus
    (top-p is cut before min-p, on every token's mass). The most likely token always is, as in
    the reference: the mass above it is 0 and above any other >= 1 (weights are exp(x - max)),
    so the goal never drops below the smallest normal float, even where top_p * mass underflows
    (top_p = 5e-324 is 0 in fp32)."""
    return (top_p * mass).clamp_min(torch.finfo(torch.float32).tiny)


def draw_top_k(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
               top_p: torch.Tensor, min_p: torch.Tensor, max_top_k: int, u: torch.Tensor
               ) -> torch.Tensor:
    """The reference's draw for rows with a top-k cut, on their `max_top_k` largest logits put
    back in vocabulary order instead of the whole row: the same token for the same uniform."""
    values, ids = logits.float().topk(min(max_top_k, logits.shape[-1]), dim=-1)
    ids, order = ids.sort(dim=-1)
    values = values.gather(1, order)
    probs = row_probs(values, temperature, top_k, top_p, min_p, needs_sort=True)
    return ids.gather(1, sample_inverse_cdf(probs, u)[:, None])[:, 0]
