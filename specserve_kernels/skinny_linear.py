"""Linear layers for the few rows of a small decode batch (up to MAX_ROWS tokens), on CUDA in
16-bit: a product that only has to read its weights once, at the memory's rate; and, to be
timed against cuBLAS, the same kernel in tiles of rows for larger batches.

At batch 1 on an H100 (2026-11-27, the decode_b1 trace, Llama-3-8B shape), cuBLAS read the
gate_up and down weights at 2.86 and 2.70 TB/s, but qkv's at 2.36 (79% of copy: 96 CTAs on 132
SMs) and o_proj's at 2.16 (72%: split-K, then its reduce kernel). Here each program takes
BLOCK_N output features of every row and streams their weights through a pipelined loop over K,
one kernel with the bias added, no split-K: 384 programs for qkv's 6,144 features.

Timed on an H100 (2026-11-27, benchmarks/results/gpu_h100_2026-11-27_s24), in CUDA graphs with a
cold L2, against torch's choice at 1, 4 and 16 rows (`benchmarks/linears.py`): qkv_proj lost at
4 and 16 rows in every configuration (0.93-0.98x); o_proj won in most (1.03-1.09x), gate_up_proj
only with 2 warps (1.01-1.03x), down_proj by at most 1.5%. So the kernel takes o_proj and
gate_up_proj with the configuration best over both, and the whole batch-1 step ran 1.040, 1.043
and 1.017x faster than without it, alternated over three rounds (`benchmarks/ab_decode.py
--skinny-linear`; 168.6-168.8 against 161.7-165.9 tok/s greedy).

Larger batches go in tiles of BLOCK_M rows (a program each per block of features, the row
tiles of one block neighbours in launch order, so that they share its weights in L2): in a
batch-256 decode step on an H100 (2026-11-27, the decode_b256 trace) cuBLAS read o_proj's
weights at 43% of copy (26.0 us) and down_proj's at 61% (64.8 us), against ~84% for qkv's.
o_proj and down_proj have 4,096 features, 32 tiles of 128 x 256 rows for 132 SMs, so a tile's
K can be cut into SPLIT_K parts, each a program that writes its fp32 sums; the tile's last
part to arrive adds them up in the parts' order (`specserve_kernels/arrival_counts.py`). Which
projections take which tiles at which batch is `ROW_CONFIGS`; past 16 rows it names none until
`benchmarks/linears.py` times the tiles and `benchmarks/ab_decode.py --skinny-rows-config` the
step. The lm_head can be named too: the decode graphs write their logits into their one buffer
through it (`SkinnyLinear.forward_into`); at batch 256 cuBLAS took 455.5 us for it in that
trace, against ~350 us at the copy's rate.

Only the 16-bit products are replaced: in fp32 the engine equals transformers token for token,
which a different summation order would not promise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from specserve_kernels.arrival_counts import arrival_counts
from specserve_kernels.dependent_launch import dependent_launch_args, wait_for_predecessor
from specserve_kernels.replace_linears import replace_linears

ENABLED = True
MAX_ROWS = 16  # one tensor-core tile of rows: a program's rows unless its tiles say (BLOCK_M)
CONFIG = dict(BLOCK_N=16, BLOCK_K=256, NUM_STAGES=4, num_warps=2)
# The projections that take the kernel, each with its row configurations: (up to this many
# rows, the tiles, or None for cuBLAS), the first that holds a batch; past the last, cuBLAS.
# o_proj and gate_up_proj beat cuBLAS at every row count up to 16 (2026-11-27); larger batches
# keep cuBLAS until benchmarks/linears.py times the tiles of rows (WIDE_CONFIGS) against it.
ROW_CONFIGS = {"o_proj": ((MAX_ROWS, CONFIG),), "gate_up_proj": ((MAX_ROWS, CONFIG),)}
SIXTEEN_BIT = (torch.float16, torch.bfloat16)
# A configuration's keys in the order benchmarks/linears.py writes them and
# benchmarks/ab_decode.py reads them back (the fused gate_up kernel's: the first five)
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_STAGES", "num_warps", "SPLIT_K")


def tiles_for(row_configs, rows: int) -> dict | None:
    """The tiles of the first (max rows, tiles) in `row_configs` that holds `rows` rows; None
    (cuBLAS) past the last or where it says so."""
    return next((tiles for max_rows, tiles in row_configs if rows <= max_rows), None)


def tiles_for_product(row_configs, x: torch.Tensor) -> dict | None:
    """`tiles_for` a product of x: rows of a 2-D x whose last dim is contiguous, else None."""
    return tiles_for(row_configs, x.shape[0]) if x.dim() == 2 and x.stride(-1) == 1 else None


def row_config_batches(row_configs) -> set[int]:
    """Batches that compile every variant a kernel can take under `row_configs`: each
    configuration's largest, and its one-row-tile batch where one falls inside it."""
    batches, previous = set(), 0
    for rows, tiles in row_configs:
        if tiles is not None:
            batches.add(rows)
            one_tile = tiles.get("BLOCK_M", MAX_ROWS)
            if previous < one_tile < rows:
                batches.add(one_tile)
        previous = rows
    return batches


def warm_up_batches() -> set[int]:
    """`row_config_batches` of every projection that takes the kernel, where it is on."""
    return set().union(*map(row_config_batches, ROW_CONFIGS.values())) if ENABLED else set()


def tile_count(rows: int, features: int, config: dict) -> int:
    """Tiles of BLOCK_M rows (config's, or MAX_ROWS) by BLOCK_N features."""
    return triton.cdiv(features, config["BLOCK_N"]) * triton.cdiv(rows, config.get("BLOCK_M", MAX_ROWS))


@triton.jit
def row_and_feature_offsets(tile, M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_ROW_TILE: tl.constexpr):
    """A tile's rows and output features. The row tiles of one block of features are
    neighbours in launch order, so that they find its weights in L2; with one row tile (up to
    BLOCK_M rows, a small decode batch: no division) a tile is a block of features."""
    if ONE_ROW_TILE:
        return tl.arange(0, BLOCK_M), tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_tiles = tl.cdiv(M, BLOCK_M)
    return ((tile % row_tiles) * BLOCK_M + tl.arange(0, BLOCK_M),
            (tile // row_tiles) * BLOCK_N + tl.arange(0, BLOCK_N))


@triton.jit
def _bias_rounded_store(acc, bias_ptr, out_ptr, offs_m, offs_n, m_mask, n_mask, stride_om, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


# The row count is not specialised on: 1 and 16 would each be a compile of their own.
@triton.jit(do_not_specialize=["M"])
def _skinny_linear_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, partial_ptr, arrivals_ptr, M, N, K,
                          stride_xm, stride_wn, stride_om,
                          HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, ONE_ROW_TILE: tl.constexpr,
                          SPLIT_K: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr):
    wait_for_predecessor(DEPENDENT_LAUNCH)
    tile, part = tl.program_id(0) // SPLIT_K, tl.program_id(0) % SPLIT_K  # a tile's parts are neighbours
    offs_m, offs_n = row_and_feature_offsets(tile, M, BLOCK_M, BLOCK_N, ONE_ROW_TILE)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask, m_mask = offs_n < N, offs_m < M
    k_start, k_end = 0, K
    if SPLIT_K > 1:
        part_len = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K  # whole BLOCK_Ks of K in each part
        k_start = part * part_len
        k_end = tl.minimum(k_start + part_len, K)
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        k_mask = (k + offs_k) < k_end
        w = tl.load(w_ptrs + k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptrs + k, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    if SPLIT_K == 1:
        _bias_rounded_store(acc, bias_ptr, out_ptr, offs_m, offs_n, m_mask, n_mask, stride_om, HAS_BIAS)
    else:
        # Each part writes its fp32 sums; the tile's last part to arrive adds them up in the
        # parts' order (so the bits do not depend on which came last), then the bias, rounds
        # and stores, and resets the tile's count for the next launch (graph replays).
        mn_mask = m_mask[:, None] & n_mask[None, :]
        partial = partial_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(partial + part * M * N, acc, mask=mn_mask)
        tl.debug_barrier()  # every thread's sums written before the count says so
        if tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for p in tl.static_range(SPLIT_K):  # from L2 (.cg): another SM's writes, not this one's L1
                total += tl.load(partial + p * M * N, mask=mn_mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(arrivals_ptr + tile, 0)
            _bias_rounded_store(total, bias_ptr, out_ptr, offs_m, offs_n, m_mask, n_mask, stride_om, HAS_BIAS)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (16-bit, last dim contiguous) @ weight [N, K].T + bias -> [M, N], fp32 sums
    rounded once, into `out` where given (rows of x's dtype, last dim contiguous: a CUDA
    graph's logits buffer). `config`: BLOCK_N, BLOCK_K, NUM_STAGES, num_warps (CONFIG);
    BLOCK_M, rows a tile takes (MAX_ROWS unless given: larger batches go in tiles of BLOCK_M
    rows); SPLIT_K, parts of K summed by programs of their own (1 unless given: for products
    with too few tiles to fill the GPU, whose sums then go through an fp32 buffer)."""
    rows, in_features = x.shape
    out_features = weight.shape[0]
    assert weight.shape[1] == in_features and x.stride(-1) == 1 and weight.stride(-1) == 1
    if out is None:
        out = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    assert out.shape == (rows, out_features) and out.dtype == x.dtype and out.stride(-1) == 1
    config = CONFIG if config is None else config
    split_k = config.get("SPLIT_K", 1)
    workspace = (out, out)  # unread in one part: a decode step's eager launch allocates nothing more
    if split_k > 1:
        workspace = (torch.empty(split_k, rows, out_features, dtype=torch.float32, device=x.device),
                     arrival_counts(x.device, tile_count(rows, out_features, config)))
    launch_skinny(_skinny_linear_kernel, x, weight, bias, out, out_features, config, workspace, SPLIT_K=split_k)
    return out


def launch_skinny(kernel, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  features: int, config: dict, workspace: tuple = (), **constexprs) -> None:
    """Launch a kernel of this one's signature (also `specserve_kernels/gate_up_silu.py`'s, which has no
    split-K): SPLIT_K programs (a constexpr, 1 unless given) for each BLOCK_M rows (config's, or
    MAX_ROWS) of each BLOCK_N of `features`. `workspace`: the kernel's arguments between `out`
    and the row count."""
    rows, block_m = x.shape[0], config.get("BLOCK_M", MAX_ROWS)
    if rows:
        kernel[(tile_count(rows, features, config) * constexprs.get("SPLIT_K", 1),)](
            x, weight, weight if bias is None else bias, out, *workspace, rows, features, x.shape[1],
            x.stride(0), weight.stride(0), out.stride(0), HAS_BIAS=bias is not None, BLOCK_M=block_m,
            BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], NUM_STAGES=config["NUM_STAGES"],
            ONE_ROW_TILE=rows <= block_m, num_warps=config["num_warps"], **constexprs,
            **dependent_launch_args(x.device))


class SkinnyLinear(nn.Module):
    """An `nn.Linear` whose products run `skinny_linear` at the tiles its row configurations
    give for their number of rows, and cuBLAS (F.linear) where they give none."""

    def __init__(self, linear: nn.Linear, row_configs=((MAX_ROWS, CONFIG),)):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.row_configs = row_configs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_into(x, None)

    def forward_into(self, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """The product, written into `out` where given: how a CUDA graph computes its logits
        into its one buffer where ROW_CONFIGS names the lm_head (`LlamaForCausalLM.compute_logits`)."""
        tiles = tiles_for_product(self.row_configs, x)
        if tiles is not None:
            return skinny_linear(x, self.weight, self.bias, tiles, out)
        if out is None:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return torch.matmul(x, self.weight.t(), out=out)
        return torch.addmm(self.bias, x, self.weight.t(), out=out)


def use_skinny_linears(model: nn.Module, row_configs: dict | None = None) -> int:
    """Replace the 16-bit `nn.Linear`s named in `row_configs` (projection: its row
    configurations; None: ROW_CONFIGS as it is now) with `SkinnyLinear`s; returns how many."""
    row_configs = ROW_CONFIGS if row_configs is None else row_configs
    return replace_linears(model, lambda name, linear: SkinnyLinear(linear, row_configs[name]),
                           lambda name, linear: name in row_configs and linear.weight.dtype in SIXTEEN_BIT)
