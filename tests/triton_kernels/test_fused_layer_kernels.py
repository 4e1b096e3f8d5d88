"""The fused-layer kernels against their PyTorch references under the interpreter (fp32 and
fp16): SiLU-and-multiply and rotary fused with the KV-cache write, at sizes that are not a power
of two or a multiple of the tile. RMSNorm with the residual add is tested in test_norm_rotary.py."""

import pytest
import torch

from app.models.rope import RotaryEmbedding
from specserve_kernels.reference import rotary_write_kv_ref, silu_and_mul_ref
from specserve_kernels.rotary_kv_write import rotary_write_kv
from specserve_kernels.silu_mul import silu_and_mul

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}
DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter,block", [(1, 64, None), (3, 37, None), (5, 100, 32),
                                              (2, 130, 64)])
def test_silu_and_mul(dtype, rows, inter, block):
    """`block` smaller than the row: several programs per row, the last one partly masked."""
    gen = torch.Generator().manual_seed(inter)
    x = (3 * torch.randn(rows, 2 * inter, generator=gen)).to(dtype)
    torch.testing.assert_close(silu_and_mul(x, block), silu_and_mul_ref(x), **TOL[dtype])


def test_silu_and_mul_strided_rows():
    """A row stride wider than the row (a view of a larger buffer) is read correctly."""
    wide = torch.randn(4, 2 * 24 + 8)
    x = wide[:, :48]
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), **TOL[torch.float32])


def _qkv(tokens, heads, kv_heads, head_dim, dtype, gen):
    """q, k, v as views of one fused projection output, as the model makes them."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return (qkv, q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim),
            v.view(tokens, kv_heads, head_dim))


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32),
                                               (torch.float16, torch.float16),
                                               (torch.float32, torch.float16)])
@pytest.mark.parametrize("heads,kv_heads,head_dim,scaling", [
    (4, 2, 16, None), (5, 1, 24, None), (6, 3, 12, "llama3"), (3, 3, 8, "linear")])
def test_rotary_write_kv(dtype, cache_dtype, heads, kv_heads, head_dim, scaling):
    """Odd head counts and head dims (masked tiles), slots across block boundaries, padding
    rows (-1) that write nothing but still rotate their q, NaN in every unused cache slot."""
    gen = torch.Generator().manual_seed(heads * head_dim)
    rope_scaling = {"llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                    "linear": {"rope_type": "linear", "factor": 2.0}, None: None}[scaling]
    rope = RotaryEmbedding(head_dim, 10000.0, rope_scaling)
    tokens, num_blocks, block_size = 9, 5, 16
    positions = torch.tensor([0, 1, 15, 16, 17, 300, 1023, 2, 4000])
    cos, sin = rope.cos_sin(positions, dtype)
    qkv, q, k, v = _qkv(tokens, heads, kv_heads, head_dim, dtype, gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens].long()
    slots[[2, 8]] = -1
    cache = torch.full((2, num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=cache_dtype)
    want_cache = cache.clone()
    k_before, v_before = k.clone(), v.clone()
    want_q = rotary_write_kv_ref(q.clone(), k.clone(), v.clone(), cos, sin, want_cache, slots)
    got_q = rotary_write_kv(q, k, v, cos, sin, cache[0], cache[1], slots)
    assert got_q.data_ptr() == q.data_ptr(), "q is rotated in place"
    torch.testing.assert_close(q, want_q, **TOL[dtype])
    assert torch.equal(k, k_before) and torch.equal(v, v_before), "k and v are only read"
    assert torch.equal(cache.isnan(), want_cache.isnan()), "written slots differ"
    tol = TOL[torch.float16 if torch.float16 in (dtype, cache_dtype) else torch.float32]
    torch.testing.assert_close(cache.nan_to_num(), want_cache.nan_to_num(), **tol)


def test_rotary_write_kv_matches_separate_kernels_exactly():
    """In fp32 the fused kernel writes what the rotary kernel then the KV write kernel do."""
    from specserve_kernels.kv_cache_write import write_kv_cache
    from specserve_kernels.rotary import apply_rotary_
    gen = torch.Generator().manual_seed(3)
    cos, sin = RotaryEmbedding(16, 10000.0, None).cos_sin(torch.arange(7) * 13, torch.float32)
    qkv, q, k, v = _qkv(7, 4, 2, 16, torch.float32, gen)
    slots = torch.tensor([5, 6, 31, -1, 32, 0, 47])
    ours = torch.full((2, 3, 16, 2, 16), float("nan"))
    theirs = ours.clone()
    q2, k2 = q.clone(), k.clone()
    rotary_write_kv(q, k, v, cos, sin, ours[0], ours[1], slots)
    apply_rotary_(q2, k2, cos, sin)
    write_kv_cache(k2, v, theirs[0], theirs[1], slots)
    assert torch.equal(q, q2)
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    assert torch.equal(ours.isnan(), theirs.isnan())


def test_rotary_write_kv_reads_cos_sin_gathered_from_the_table():
    """On CUDA a step's cos/sin are rows gathered from `RotaryEmbedding.table`: views with a
    row stride of two head dims. The kernel writes what it writes from contiguous copies."""
    rope = RotaryEmbedding(16, 10000.0, None)
    rope.tabulate(64, torch.float32)
    positions = torch.tensor([0, 63, 5, 17, 17, 40, 2])
    cos, sin = rope.cos_sin(positions, torch.float32)
    assert cos.stride(0) == 32, "views of the table's rows"
    gen = torch.Generator().manual_seed(4)
    _, q, k, v = _qkv(7, 4, 2, 16, torch.float32, gen)
    q2 = q.clone()
    slots = torch.tensor([5, 6, 31, -1, 32, 0, 47])
    ours = torch.full((2, 3, 16, 2, 16), float("nan"))
    theirs = ours.clone()
    rotary_write_kv(q, k, v, cos, sin, ours[0], ours[1], slots)
    rotary_write_kv(q2, k, v, cos.contiguous(), sin.contiguous(), theirs[0], theirs[1], slots)
    assert torch.equal(q, q2)
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num()) and torch.equal(ours.isnan(), theirs.isnan())
    computed = RotaryEmbedding(16, 10000.0, None).cos_sin(positions, torch.float32)
    torch.testing.assert_close((cos, sin), computed, atol=1e-6, rtol=0)  # bit for bit on CUDA: test_gpu_kernels.py
