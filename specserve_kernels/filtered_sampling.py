"""Top-p by rejection, min-p and a top-k floor, one Triton program per row, without sorting
the vocabulary: the CUDA half of `app.engine.selection.draw` (whose docstring gives the method,
and whose `draw_top_p_by_rejection` is the same steps in torch ops, used on the CPU and as this
kernel's reference). After the redraws the nucleus is found by a binary search over the float32 bit
patterns, ordered as the floats are. Masses are fp32 sums in a fixed order, so a uniform within
rounding of a CDF boundary may pick the neighbouring token; ties at the cut are all kept.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve_kernels.dependent_launch import dependent_launch_args, wait_for_predecessor

MAX_BLOCK = 4096
# Blocks of the row in flight while one is reduced. Triton software-pipelines only the loads of a
# loop that asks for it (or that feed a dot): without it each block waits out a full memory
# round trip, one after another, in a program that walks a 128k vocabulary several times.
# 110 registers a thread on sm_90 (80 without): two programs of 8 warps per SM, 264 rows at once
# on an H100 (tests/triton_kernels/hopper_compile.py).
PIPELINE_STAGES = tl.constexpr(3)


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
    for start in tl.range(0, V, BLOCK, num_stages=PIPELINE_STAGES):
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
    for start in range(0, V, BLOCK):  # not pipelined: with its scan, 3 stages took 213 registers a thread
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
def _filtered_sample_kernel(logits_ptr, stride, temperature_ptr, top_p_ptr, min_p_ptr, floor_ptr,
                            u_ptr, u_stride, out_ptr, V, BLOCK: tl.constexpr, ROUNDS: tl.constexpr,
                            HAS_FLOOR: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr):
    wait_for_predecessor(DEPENDENT_LAUNCH)
    row = tl.program_id(0)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    if temperature > 0:  # a row of temperature 0 is greedy: it draws nothing
        base = logits_ptr + row.to(tl.int64) * stride
        inv_t = 1.0 / temperature
        top_p = tl.load(top_p_ptr + row).to(tl.float32)
        min_p = tl.load(min_p_ptr + row).to(tl.float32)
        u_row = u_ptr + row.to(tl.int64) * u_stride

        m = tl.full([], float("-inf"), tl.float32)
        lowest = tl.full([], float("inf"), tl.float32)
        for start in tl.range(0, V, BLOCK, num_stages=PIPELINE_STAGES):
            x, valid, _ = _scaled_row(base, start, V, inv_t, BLOCK)
            m = tl.maximum(m, tl.max(x, axis=0))
            lowest = tl.minimum(lowest, tl.min(tl.where(valid, x, float("inf")), axis=0))
        key_floor = _order_key(lowest)
        if HAS_FLOOR:  # the row's top-k cut: its k-th largest logit
            key_floor = tl.maximum(key_floor, _order_key(tl.load(floor_ptr + row).to(tl.float32) * inv_t))
        x_floor = m + tl.log(min_p)  # min_p 0: -inf, nothing cut

        token = _draw(base, V, inv_t, m, key_floor, x_floor, tl.load(u_row).to(tl.float32), BLOCK)
        if top_p < 1.0:
            # The most likely token is always in the nucleus (draw.nucleus_goal says why).
            goal = tl.maximum(top_p * _mass(base, V, inv_t, m, key_floor, float("-inf"), BLOCK), 1.1754944e-38)
            pivot = key_floor - 1
            accepted = tl.zeros([], dtype=tl.int32)
            for r in range(1, ROUNDS):  # checks the draw of uniform r - 1
                if accepted == 0:
                    token_key = _order_key(tl.load(base + token).to(tl.float32) * inv_t)
                    if _mass(base, V, inv_t, m, token_key + 1, float("-inf"), BLOCK) < goal:
                        accepted = tl.full([], 1, tl.int32)
                    else:
                        pivot = token_key
                        if r < ROUNDS - 1:
                            u = tl.load(u_row + r).to(tl.float32)
                            token = _draw(base, V, inv_t, m, pivot + 1, x_floor, u, BLOCK)
            if accepted == 0:  # the nucleus by search, then a draw from it with the last uniform
                nucleus = _top_p_key(base, V, inv_t, m, goal, pivot, _order_key(m), BLOCK)
                u = tl.load(u_row + ROUNDS - 1).to(tl.float32)
                token = _draw(base, V, inv_t, m, nucleus, x_floor, u, BLOCK)
        tl.store(out_ptr + row, token.to(tl.int64))


def filtered_sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                    min_p: torch.Tensor, u: torch.Tensor, floor: torch.Tensor | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """logits [R, V] (any float dtype, last dim contiguous); per-row settings [R] (a row of
    temperature 0 draws nothing: its token is left unwritten, for the caller's argmax); uniforms
    u [R, rounds], independent, the first the row's own (with one, top-p goes straight to the
    search, and every row draws the reference's token); floor [R] fp32 or None: raw logits
    below which a row draws nothing (its top-k cut). -> [R] int64 (`out`, when given)."""
    assert logits.dim() == 2 and logits.stride(-1) == 1 and u.dim() == 2 and u.shape[0] == logits.shape[0]
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device) if out is None else out
    if rows:
        _filtered_sample_kernel[(rows,)](
            logits, logits.stride(0), temperature, top_p, min_p,
            temperature if floor is None else floor,  # without a floor, a pointer never read
            u, u.stride(0), out, vocab, BLOCK=min(triton.next_power_of_2(vocab), MAX_BLOCK),
            ROUNDS=u.shape[1], HAS_FLOOR=floor is not None, num_warps=8,
            **dependent_launch_args(logits.device))
    return out
