"""Attention over new tokens with a paged prefix, against the engine's PyTorch attention."""

import pytest
import torch

from specserve_kernels.prefill_attention import prefill_attention, query_tile, query_tile_lengths
from specserve_kernels.reference import attention_ref, make_paged_case

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}
GQA = [(2, 2), (4, 1), (8, 1), (10, 2)]  # (heads, kv_heads): ratios 1, 4, 8 and 5:1


def run_prefill(case, scale=0.25, **kw):
    kv, m = case.kv_cache, case.meta
    return prefill_attention(case.query, kv[0], kv[1], m.block_tables, m.query_start_loc,
                             m.context_lens, scale, m.max_query_len, **kw)


def check(out, case, scale=0.25):
    ref = attention_ref(case, scale)
    assert not out.isnan().any(), "NaN in the output: a stray read of an unused slot"
    tol = TOL[case.query.dtype]
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads", GQA)
def test_prefill_block_boundaries(dtype, heads, kv_heads):
    """Fresh prompts of 1, 15, 16, 17 and 33 tokens in one flattened batch."""
    case = make_paged_case([1, 15, 16, 17, 33], [0] * 5, heads, kv_heads, 16, 16, dtype, seed=heads)
    check(run_prefill(case, block_n=16, target_rows=16), case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mixed_query_and_context(dtype):
    """(query, context) = (1, 1328), (5, 18), (129, 463): a decode row, a verify step and a
    chunked-prefill chunk together; head_dim 32, block size 32, GQA 4:1."""
    case = make_paged_case([1, 5, 129], [1327, 13, 334], 4, 1, 32, 32, dtype, seed=7)
    check(run_prefill(case, block_n=64, target_rows=64), case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefix_cached_extend(dtype):
    """Prompts whose prefix is already cached (whole blocks, or a partial last block) extend
    by a few tokens, and a speculative 1 + 4 verify beside them; GQA 5:1, head_dim 24."""
    case = make_paged_case([3, 16, 5, 2], [16, 32, 17, 47], 10, 2, 24, 16, dtype, seed=8)
    check(run_prefill(case, block_n=16, target_rows=16), case)


@pytest.mark.parametrize("target_rows", [16, 32, 64])
def test_the_warm_up_lengths_meet_every_query_tile(target_rows):
    """Each query tile is a compile of its own: the lengths a start-up warms must reach every
    tile a prompt of any length (a mixed step's longest query, 2 tokens up) can choose."""
    for group in (1, 2, 4, 8, 16):
        tiles = {query_tile(group, length, target_rows) for length in range(2, 4 * target_rows)}
        warmed = {query_tile(group, length, target_rows) for length in query_tile_lengths(target_rows)}
        assert warmed == tiles, group


def test_rows_agree_across_query_tiles():
    """A verify step's rows are the same numbers whatever the query tile height (the extra
    key tiles a taller tile walks are fully masked). Under the interpreter `tl.dot` is numpy's
    matmul, whose summation order follows the BLAS build and the tile's shape, so this asserts
    agreement to fp32 rounding. (Bitwise equality does not hold on an H100 either: 16- and
    64-row tiles gave different bf16 outputs there, 2026-11-23.)"""
    case = make_paged_case([5, 40], [18, 3], 4, 1, 16, 16, torch.float32, seed=9)
    small = run_prefill(case, block_n=16, target_rows=16)
    big = run_prefill(case, block_n=16, target_rows=64)
    torch.testing.assert_close(small, big, atol=1e-6, rtol=1e-6)
    check(small, case)


def test_zero_length_query_is_skipped():
    """A sequence scheduled with no tokens this step leaves its neighbours intact."""
    case = make_paged_case([4, 0, 3], [5, 9, 0], 4, 2, 16, 16, torch.float32, seed=10)
    check(run_prefill(case, block_n=16, target_rows=16), case)
