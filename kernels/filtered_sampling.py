"""One token per row drawn from its temperature / top-p / min-p distribution, without sorting
the vocabulary: the reference is `app.engine.selection.distribution.row_probs` followed by
`app.engine.selection.verify.sample_inverse_cdf`. (Rows with a top-k cut are drawn from their
k largest logits, `distribution.sample_top_k`, not here.)

A sort of every row (what the reference does for top-p) is most of a sampled step's selection
on a GPU: 2.4 ms of 5.2 ms for 256 rows of a 128k vocabulary on an H200. Here top-p is drawn by
rejection, as FlashInfer samples: draw a token by inverse CDF from the tokens above a pivot; it
is in the nucleus when the mass strictly above it is below top_p, and then it is kept;
otherwise no token at or below it can be in the nucleus, so it becomes the pivot and the row
draws again with its next uniform. Every round keeps the nucleus inside the tokens drawn from,
so an accepted token follows the nucleus's distribution exactly. A row accepts in its first
round with probability >= top_p. After MAX_ROUNDS - 2 redraws the nucleus is found by a binary
search over the float32 bit patterns (ordered as the floats are) and drawn from directly, with
the last uniform. min-p is a floor against the row's maximum.

Round 0 uses the row's own uniform, so a row without top-p draws the reference's token for the
same uniform; later rounds take the next columns of `u`. One program per row. Differences from
the reference: ties at the top-p cut are all kept (a sort keeps an arbitrary subset), masses are
fp32 sums (the reference's CDF is a double cumsum), and with top-p the token for a given uniform
differs, not its distribution. Deterministic given the row, its settings and its uniforms, in
any batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROUNDS = 8  # uniforms per row: the first draw, up to 6 redraws, the fallback's draw
MAX_BLOCK = 4096


@triton.jit
def _order_key(x):
    """fp32 -> int64 whose order is x's order (negative floats' magnitude bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def _scaled_row(base, start, V, inv_t, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK)
    valid = offs < V
    x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32) * inv_t
    return x, valid, offs


@triton.jit
def _mass(base, V, inv_t, m, key_floor, x_floor, BLOCK: tl.constexpr):
    """The (unnormalised) mass of the tokens with key >= key_floor and x >= x_floor."""
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK):
        x, valid, _ = _scaled_row(base, start, V, inv_t, BLOCK)
        kept = valid & (_order_key(x) >= key_floor) & (x >= x_floor)
        total += tl.sum(tl.where(kept, tl.exp(x - m), 0.0), axis=0)
    return total


@triton.jit
def _top_p_key(base, V, inv_t, m, goal, lo, hi, BLOCK: tl.constexpr):
    """The smallest key K whose strictly-above mass is < goal, given mass(> lo) >= goal > mass(> hi)."""
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        if _mass(base, V, inv_t, m, mid + 1, float("-inf"), BLOCK) < goal:
            hi = mid
        else:
            lo = mid
    return hi


@triton.jit
def _draw(base, V, inv_t, m, key_floor, x_floor, u, BLOCK: tl.constexpr):
    """Inverse CDF, in vocabulary order, over the tokens with key >= key_floor and x >= x_floor."""
    target = u * _mass(base, V, inv_t, m, key_floor, x_floor, BLOCK)
    running = tl.zeros([], dtype=tl.float32)
    chosen = tl.full([], V, tl.int32)
    last_kept = tl.zeros([], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        x, valid, offs = _scaled_row(base, start, V, inv_t, BLOCK)
        kept = valid & (_order_key(x) >= key_floor) & (x >= x_floor)
        w = tl.where(kept, tl.exp(x - m), 0.0)
        cdf = running + tl.cumsum(w, axis=0)
        chosen = tl.minimum(chosen, tl.min(tl.where(kept & (cdf > target), offs, V), axis=0))
        last_kept = tl.maximum(last_kept, tl.max(tl.where(kept, offs, 0), axis=0))
        running += tl.sum(w, axis=0)
    # Rounding at the top end may leave no CDF value above the target: take the last kept token.
    return tl.where(chosen < V, chosen, last_kept)


@triton.jit
def _filtered_sample_kernel(logits_ptr, stride, temperature_ptr, top_p_ptr, min_p_ptr,
                            u_ptr, u_stride, out_ptr, V, BLOCK: tl.constexpr, MAX_ROUNDS: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    inv_t = 1.0 / tl.load(temperature_ptr + row).to(tl.float32)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    min_p = tl.load(min_p_ptr + row).to(tl.float32)
    u_row = u_ptr + row.to(tl.int64) * u_stride

    m = tl.full([], float("-inf"), tl.float32)
    lowest = tl.full([], float("inf"), tl.float32)
    for start in range(0, V, BLOCK):
        x, valid, _ = _scaled_row(base, start, V, inv_t, BLOCK)
        m = tl.maximum(m, tl.max(x, axis=0))
        lowest = tl.minimum(lowest, tl.min(tl.where(valid, x, float("inf")), axis=0))
    key_floor = _order_key(lowest)
    x_floor = m + tl.log(min_p)  # min_p 0: -inf, nothing cut

    token = _draw(base, V, inv_t, m, key_floor, x_floor, tl.load(u_row).to(tl.float32), BLOCK)
    if top_p < 1.0:
        goal = top_p * _mass(base, V, inv_t, m, key_floor, float("-inf"), BLOCK)
        pivot = key_floor - 1
        accepted = tl.zeros([], dtype=tl.int32)
        for r in range(1, MAX_ROUNDS):  # checks the draw of uniform r - 1
            if accepted == 0:
                token_key = _order_key(tl.load(base + token).to(tl.float32) * inv_t)
                if _mass(base, V, inv_t, m, token_key + 1, float("-inf"), BLOCK) < goal:
                    accepted = tl.full([], 1, tl.int32)
                else:
                    pivot = token_key
                    if r < MAX_ROUNDS - 1:
                        u = tl.load(u_row + r).to(tl.float32)
                        token = _draw(base, V, inv_t, m, pivot + 1, x_floor, u, BLOCK)
        if accepted == 0:  # the nucleus by search, then a draw from it with the last uniform
            nucleus = _top_p_key(base, V, inv_t, m, goal, pivot, _order_key(m), BLOCK)
            u = tl.load(u_row + MAX_ROUNDS - 1).to(tl.float32)
            token = _draw(base, V, inv_t, m, nucleus, x_floor, u, BLOCK)
    tl.store(out_ptr + row, token.to(tl.int64))


def filtered_sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                    min_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (any float dtype, last dim contiguous); per-row settings [R]; uniforms
    u [R, rounds], independent, the first the row's own (MAX_ROUNDS; with one, top-p goes
    straight to the search and every row draws the reference's token). -> [R] int64."""
    assert logits.dim() == 2 and logits.stride(-1) == 1 and u.dim() == 2 and u.shape[0] == logits.shape[0]
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows:
        _filtered_sample_kernel[(rows,)](
            logits, logits.stride(0), temperature, top_p, min_p, u, u.stride(0), out, vocab,
            BLOCK=min(triton.next_power_of_2(vocab), MAX_BLOCK), MAX_ROUNDS=u.shape[1], num_warps=8)
    return out
