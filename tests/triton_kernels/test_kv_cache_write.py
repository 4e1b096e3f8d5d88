"""KV-cache write against the engine's PyTorch write."""

import pytest
import torch

from specserve_kernels.torch_attention import write_kv_cache as write_ref
from specserve_kernels.kv_cache_write import write_kv_cache


@pytest.mark.parametrize("src,cache", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                       (torch.float32, torch.float16)])
@pytest.mark.parametrize("kv_heads,head_dim", [(1, 16), (3, 24)])
def test_write_matches_reference(src, cache, kv_heads, head_dim):
    """Random slots across block boundaries, with padding rows (-1) that must write nothing."""
    gen = torch.Generator().manual_seed(kv_heads)
    num_blocks, block_size, n = 6, 16, 40
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n].long()
    slots[[0, 7, 39]] = -1
    key = torch.randn(n, kv_heads, head_dim, generator=gen).to(src)
    value = torch.randn(n, kv_heads, head_dim, generator=gen).to(src)
    got = torch.full((2, num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=cache)
    want = got.clone()
    write_kv_cache(key, value, got[0], got[1], slots)
    write_ref(key, value, want, slots)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_strided_key_and_value():
    """K and V as views into one fused projection output (non-contiguous token stride)."""
    kv = torch.randn(5, 2, 2, 16)
    key, value = kv[:, 0], kv[:, 1]
    slots = torch.tensor([3, 17, -1, 0, 31])
    got = torch.zeros(2, 2, 16, 2, 16)
    want = got.clone()
    write_kv_cache(key, value, got[0], got[1], slots)
    write_ref(key, value, want, slots)
    assert torch.equal(got, want)
