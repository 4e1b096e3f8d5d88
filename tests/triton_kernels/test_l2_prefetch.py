"""Weights asked into L2 by programs of their own (specserve_kernels/l2_prefetch.py), under the
interpreter: their ranges cover the bytes asked for once, in the bulk prefetch's 16-byte
units, and the kernels that take such programs write what they wrote without them. (Whether
it pays is timed on a GPU; the instruction itself is compiled for sm_90 in
test_hopper_compile.py, and the engine's tokens with it on are checked in test_gpu.py.)"""

import pytest
import torch
import triton
import triton.language as tl

from specserve_kernels.l2_prefetch import ALIGN, NO_PREFETCH, Prefetch, prefetch_for, prefetch_ranges
from specserve_kernels.reference import rms_norm_ref
from specserve_kernels.rmsnorm import rms_norm
from specserve_kernels.rotary_kv_write import rotary_write_kv


@triton.jit
def _ranges_kernel(offsets_ptr, sizes_ptr, nbytes, LANES: tl.constexpr):
    share = tl.program_id(0)
    offsets, sizes = prefetch_ranges(nbytes, share, tl.num_programs(0), LANES)
    lanes = share * LANES + tl.arange(0, LANES)
    tl.store(offsets_ptr + lanes, offsets)
    tl.store(sizes_ptr + lanes, sizes)


@pytest.mark.parametrize("nbytes", [16, 4096, 65536 + 48, 1 << 20, (32 << 20) - 16])
@pytest.mark.parametrize("shares,lanes", [(1, 32), (3, 128), (64, 256)])
def test_ranges_cover_the_bytes_once_in_16_byte_units(nbytes, shares, lanes):
    offsets = torch.full((shares * lanes,), -1, dtype=torch.int64)
    sizes = torch.full((shares * lanes,), -1, dtype=torch.int32)
    _ranges_kernel[(shares,)](offsets, sizes, nbytes, LANES=lanes)
    asked = sizes > 0
    assert (sizes >= 0).all() and (offsets[asked] % ALIGN == 0).all() and (sizes % ALIGN == 0).all()
    starts, ends = offsets[asked], offsets[asked] + sizes[asked].long()
    order = starts.argsort()
    starts, ends = starts[order], ends[order]
    assert starts[0] == 0 and ends[-1] == nbytes
    assert torch.equal(starts[1:], ends[:-1]), "gaps or overlaps between ranges"


def test_prefetching_needs_it_on_and_a_cuda_weight():
    assert prefetch_for(None, "norm") == NO_PREFETCH
    assert prefetch_for(torch.zeros(64, 64, dtype=torch.bfloat16), "attention") == NO_PREFETCH  # off, on the CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_with_prefetching_programs_writes_what_it_wrote_without(dtype):
    gen = torch.Generator().manual_seed(3)
    x, res = (torch.randn(5, 200, generator=gen).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(200, generator=gen)).to(dtype)
    weight = torch.zeros(48, 64, dtype=dtype)
    prefetch = Prefetch(weight, weight.numel() * weight.element_size(), 3)
    y, h = rms_norm(x, w, 1e-6, residual=res)
    y_p, h_p = rms_norm(x, w, 1e-6, residual=res, prefetch=prefetch)
    assert torch.equal(y_p, y) and torch.equal(h_p, h)
    assert torch.equal(rms_norm(x, w, 1e-6, prefetch=prefetch), rms_norm(x, w, 1e-6))
    torch.testing.assert_close(y, rms_norm_ref(x, w, 1e-6, residual=res)[0], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_write_kv_with_prefetching_programs_writes_what_it_wrote_without(dtype):
    gen = torch.Generator().manual_seed(4)
    tokens, heads, kv_heads, head_dim, block = 3, 4, 2, 16, 4
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    cos, sin = (torch.randn(tokens, head_dim, generator=gen).to(dtype) for _ in range(2))
    slots = torch.tensor([1, -1, 6])  # a padding row writes no K/V
    weight = torch.zeros(32, 64, dtype=dtype)
    results = []
    for prefetch in (NO_PREFETCH, Prefetch(weight, weight.numel() * weight.element_size(), 2)):
        caches = torch.full((2, 3, block, kv_heads, head_dim), float("nan"), dtype=dtype)  # unused slots stay NaN
        q, k, v = qkv.clone().split([heads, kv_heads, kv_heads], dim=1)
        rotary_write_kv(q, k, v, cos, sin, caches[0], caches[1], slots, prefetch=prefetch)
        results.append((q.clone(), caches))
    (q, caches), (q_p, caches_p) = results
    assert torch.equal(q_p, q)
    assert torch.equal(caches_p.isnan(), caches.isnan()) and torch.equal(caches_p.nan_to_num(), caches.nan_to_num())
    assert caches.isnan().sum() == caches.numel() - 2 * 2 * kv_heads * head_dim  # two tokens' K and V written


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_attention_with_kv_evicted_first_gives_the_same_output(dtype):
    """While weights are prefetched, decode attention's K/V loads carry L2's evict-first policy
    (an sm_90 hint, in test_hopper_compile.py): nothing else changes."""
    from specserve_kernels.decode_attention import decode_attention
    gen = torch.Generator().manual_seed(6)
    batch, heads, kv_heads, head_dim, block = 2, 4, 2, 16, 4
    caches = torch.randn(2, 8, block, kv_heads, head_dim, generator=gen).to(dtype)
    caches[:, 6:] = float("nan")  # blocks no table names
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    seq_lens = torch.tensor([9, 12], dtype=torch.int32)
    query = torch.randn(batch, heads, head_dim, generator=gen).to(dtype)
    outs = [decode_attention(query, caches[0], caches[1], tables, seq_lens, 0.25, 12, partition_size=8,
                             split_size=4, kv_evict_first=evict) for evict in (False, True)]
    assert not outs[0].isnan().any() and torch.equal(outs[1], outs[0])
