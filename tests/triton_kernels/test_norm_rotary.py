"""Fused RMSNorm (+ residual) and in-place rotary against the model's own arithmetic."""

import pytest
import torch

from app.models.rope import RotaryEmbedding
from specserve_kernels.reference import rms_norm_ref, rotary_ref
from specserve_kernels.rmsnorm import rms_norm
from specserve_kernels.rotary import apply_rotary_

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden", [1, 64, 200, 333])  # odd sizes: the tile is masked
def test_rms_norm(dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(7, hidden, generator=gen).to(dtype)
    res = torch.randn(7, hidden, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **TOL[dtype])
    y, h = rms_norm(x, w, 1e-6, residual=res)
    y_ref, h_ref = rms_norm_ref(x, w, 1e-6, residual=res)
    assert torch.equal(h, h_ref)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (5, 1, 24)])
def test_rotary_in_place(dtype, heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    rope = RotaryEmbedding(head_dim, 10000.0, None)
    positions = torch.tensor([0, 1, 5, 17, 300, 1023])
    cos, sin = rope.cos_sin(positions, dtype)
    qkv = torch.randn(6, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    q, k = qkv[:, :heads], qkv[:, heads:heads + kv_heads]  # views of one projection, as in a model
    q_ref, k_ref = rotary_ref(q.clone(), k.clone(), cos, sin)
    v_before = qkv[:, heads + kv_heads:].clone()
    apply_rotary_(q, k, cos, sin)
    torch.testing.assert_close(q, q_ref, **TOL[dtype])
    torch.testing.assert_close(k, k_ref, **TOL[dtype])
    assert torch.equal(qkv[:, heads + kv_heads:], v_before), "rotary wrote outside q and k"
