"""The MLP's gate_up projection and SiLU(gate) * up in one kernel, for decode batches of up to
256 rows (ROW_CONFIGS), on CUDA in 16-bit.

At batch 1 on an H100 (2026-11-27, the decode_b1 trace) the SiLU x up kernel took 1.5 us a
layer after the projection, plus the idle at a kernel boundary (~0.4 us) and the write and
read of the [rows, 2 x intermediate] product between them: ~60 us of a 6 ms step. At batch 256
(the decode_b256 trace) it took 7.1 us a layer, 0.23 ms of a 10.5 ms step; 25,000 tok/s needs
~0.5 ms less. Here each program takes BLOCK_M rows and BLOCK_N features of the gate half and
the same features of the up half, streams both weight blocks through one pipelined loop over
K, and writes SiLU(gate) * up.

The numbers are those of `skinny_linear` at the same tiles followed by `silu_and_mul`: each
half is summed as the skinny kernel sums it (the same tiles, in the same order) and rounded to
the activation dtype, as the projection's output is, before SiLU and the product, rounded as
that kernel rounds them. Past 16 rows the unfused path is cuBLAS, whose order is its own.

Off (`ENABLED`) until timed on a GPU: `benchmarks/linears.py` times it against the projection
then the SiLU kernel at 1-256 rows, `benchmarks/ab_decode.py --gate-up-silu` the whole step
(`--gate-up-silu-max-rows 16` for the small batches alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve_kernels.dependent_launch import wait_for_predecessor
from specserve_kernels.skinny_linear import (SIXTEEN_BIT, launch_skinny, row_and_feature_offsets, row_config_batches,
                                             tiles_for, tiles_for_product)

ENABLED = False
# (up to this many rows, the tiles): untuned. A batch of up to 16 rows is one tile, and its
# weights are read at the memory's rate; 256 rows are two tiles of 128, a product as much
# bound by the tensor cores as by the memory, where the kernel must match cuBLAS's GEMM for
# the SiLU kernel it saves (7.1 us a layer at batch 256, 2026-11-27) to pay.
ROW_CONFIGS = (
    (16, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, NUM_STAGES=3, num_warps=4)),
    (64, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, NUM_STAGES=4, num_warps=4)),
    (256, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_STAGES=3, num_warps=8)),
)


@triton.jit(do_not_specialize=["M"])  # as the skinny kernel: a compile a row configuration (two past one row tile)
def _gate_up_silu_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, I, K, stride_xm, stride_wn, stride_om,
                         HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, ONE_ROW_TILE: tl.constexpr,
                         DEPENDENT_LAUNCH: tl.constexpr):
    wait_for_predecessor(DEPENDENT_LAUNCH)
    offs_m, offs_n = row_and_feature_offsets(tl.program_id(0), M, BLOCK_M, BLOCK_N, ONE_ROW_TILE)  # features of each half
    offs_k = tl.arange(0, BLOCK_K)
    n_mask, m_mask = offs_n < I, offs_m < M
    gate_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    up_ptrs = gate_ptrs + I.to(tl.int64) * stride_wn
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        k_mask = (k + offs_k) < K
        w_mask = n_mask[:, None] & k_mask[None, :]
        w_gate = tl.load(gate_ptrs + k, mask=w_mask, other=0.0)
        w_up = tl.load(up_ptrs + k, mask=w_mask, other=0.0)
        x = tl.load(x_ptrs + k, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        gate = tl.dot(x, tl.trans(w_gate), gate)
        up = tl.dot(x, tl.trans(w_up), up)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        up += tl.load(bias_ptr + I + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)  # the projection's output, as it would be stored
    up = up.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, (silu * up).to(dtype), mask=m_mask[:, None] & n_mask[None, :])


def config_for(rows: int) -> dict | None:
    """The tiles for a product of `rows` rows (ROW_CONFIGS), None past the last."""
    return tiles_for(ROW_CONFIGS, rows)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 config: dict | None = None) -> torch.Tensor:
    """x [M, K] (16-bit, last dim contiguous), weight [2 * I, K] (gate rows, then up rows, as
    `gate_up_proj` holds them) -> SiLU(gate) * up [M, I]. `config`: BLOCK_M (rows a program
    takes), BLOCK_N (features of each half), BLOCK_K, NUM_STAGES, num_warps (`config_for(M)`;
    past ROW_CONFIGS, the last)."""
    rows, in_features = x.shape
    assert weight.shape[0] % 2 == 0 and weight.shape[1] == in_features
    assert x.stride(-1) == 1 and weight.stride(-1) == 1
    features = weight.shape[0] // 2
    out = torch.empty(rows, features, dtype=x.dtype, device=x.device)
    config = config or config_for(rows) or ROW_CONFIGS[-1][1]
    launch_skinny(_gate_up_silu_kernel, x, weight, bias, out, features, config)
    return out


def tiles_taking(x: torch.Tensor, weight: torch.Tensor) -> dict | None:
    """The tiles `gate_up_silu` takes this product with, or None where it does not take it
    (off, rows past ROW_CONFIGS, weights not 16-bit)."""
    return tiles_for_product(ROW_CONFIGS, x) if ENABLED and weight.dtype in SIXTEEN_BIT else None


def warm_up_batches() -> set[int]:
    """Batches that compile every variant the engine can take (`row_config_batches`), where on."""
    return row_config_batches(ROW_CONFIGS) if ENABLED else set()
