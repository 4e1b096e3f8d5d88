"""Each row's argmax over the vocabulary in two kernels, and a plain decode step's chosen tokens
with it: the greedy rows' argmax, the sampled rows' draw.

A CUDA graph's decode step took `torch.argmax` and then `torch.where(temperature > 0, drawn,
argmax)`: three kernels, the argmax 37 us of a 6.3 ms batch-1 step on an H100 (2026-11-27,
the decode_b1 trace), one block walking a 128k-token row alone; 55-64 us at batch 256.
Here the row is cut into chunks, one program each, that write their maximum and its first
index; then one program per row folds the chunks (the first chunk holding the maximum wins)
and writes the argmax and, given draws, the chosen token.

The argmax is torch's: the first index of the maximum, compared in fp32 (a 16-bit logit
converts exactly, so the order is the logits' own), and the first NaN where a row has one (an
index out of the vocabulary would take the engine down at the next step's embedding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve_kernels.dependent_launch import dependent_launch_args, wait_for_predecessor

CHUNK = 2048  # tokens per program: 63 programs a row for a 128k vocabulary


@triton.jit
def _first_maximum(x, index, valid, NONE):
    """(maximum, the first index holding it) as torch.argmax orders: NaN above every number."""
    is_nan = x != x
    first_nan = tl.min(tl.where(valid & is_nan, index, NONE), axis=0)
    top = tl.max(tl.where(is_nan, float("-inf"), x), axis=0)
    first_top = tl.min(tl.where(valid & (x == top), index, NONE), axis=0)
    has_nan = first_nan < NONE
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, first_nan, first_top)


@triton.jit
def _chunk_max_kernel(logits_ptr, stride, chunk_max_ptr, chunk_index_ptr, V, num_chunks,
                      CHUNK: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr):
    wait_for_predecessor(DEPENDENT_LAUNCH)
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = offs < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    top, first = _first_maximum(x, offs, valid, V)
    tl.store(chunk_max_ptr + row * num_chunks + chunk, top)
    tl.store(chunk_index_ptr + row * num_chunks + chunk, first)


@triton.jit
def _fold_chunks_kernel(chunk_max_ptr, chunk_index_ptr, num_chunks, argmax_ptr,
                        temperature_ptr, drawn_ptr, chosen_ptr,
                        CHUNKS: tl.constexpr, HAS_DRAWS: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr):
    wait_for_predecessor(DEPENDENT_LAUNCH)
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS)
    valid = chunks < num_chunks
    chunk_max = tl.load(chunk_max_ptr + row * num_chunks + chunks, mask=valid, other=float("-inf"))
    _, first_chunk = _first_maximum(chunk_max, chunks, valid, num_chunks)
    argmax = tl.load(chunk_index_ptr + row * num_chunks + first_chunk).to(tl.int64)
    tl.store(argmax_ptr + row, argmax)
    if HAS_DRAWS:  # a row of temperature 0 is greedy; the others keep their draw
        if tl.load(temperature_ptr + row) > 0:
            tl.store(chosen_ptr + row, tl.load(drawn_ptr + row))
        else:
            tl.store(chosen_ptr + row, argmax)


def argmax_rows(logits: torch.Tensor, argmax: torch.Tensor, temperature: torch.Tensor | None = None,
                drawn: torch.Tensor | None = None, chosen: torch.Tensor | None = None) -> None:
    """logits [R, V] (any float dtype, last dim contiguous) -> argmax [R] int64. Given the
    rows' temperature [R] and drawn tokens [R], also chosen [R] int64: the draw where the
    temperature is above 0, else the argmax (`drawn` is read for those rows only)."""
    assert logits.dim() == 2 and logits.stride(-1) == 1
    rows, vocab = logits.shape
    if not rows:
        return
    num_chunks = triton.cdiv(vocab, CHUNK)
    chunk_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    chunk_index = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    launch = dependent_launch_args(logits.device)
    _chunk_max_kernel[(rows, num_chunks)](logits, logits.stride(0), chunk_max, chunk_index, vocab,
                                          num_chunks, CHUNK=CHUNK, num_warps=4, **launch)
    has_draws = drawn is not None
    _fold_chunks_kernel[(rows,)](chunk_max, chunk_index, num_chunks, argmax,
                                 temperature if has_draws else argmax, drawn if has_draws else argmax,
                                 chosen if has_draws else argmax,  # pointers never read without draws
                                 CHUNKS=triton.next_power_of_2(num_chunks), HAS_DRAWS=has_draws,
                                 num_warps=1, **launch)
