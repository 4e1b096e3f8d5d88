"""The CPU's C++ layer ops (specserve_kernels/cpu/layer_ops.cpp) against the model's PyTorch arithmetic
(app/models/layer_ops.py TorchLayerOps) at odd sizes: RMSNorm with and without the residual
add, rotary on strided views of the qkv projection with the KV write (padding slots write
nothing), SiLU times up."""

from __future__ import annotations

import pytest
import torch

from app.models.layer_ops import TORCH_OPS, CpuLayerOps
from app.models.llama import RMSNorm
from app.models.rope import RotaryEmbedding
from specserve_kernels.reference import make_meta
from tests.cpu_kernels import require_cpu_kernels

torch.manual_seed(0)


@pytest.fixture(scope="module")
def ops():
    return CpuLayerOps(require_cpu_kernels())


@pytest.mark.parametrize("tokens,hidden", [(1, 64), (37, 333), (300, 256)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(ops, tokens, hidden, with_residual):
    norm = RMSNorm(hidden, 1e-5)
    norm.weight.data.normal_(1, 0.2)
    x = torch.randn(tokens, hidden) * 3
    residual = torch.randn(tokens, hidden) if with_residual else None
    got, got_h = ops.add_rms_norm(x, residual, norm)
    want, want_h = TORCH_OPS.add_rms_norm(x, residual, norm)
    torch.testing.assert_close(got_h, want_h, atol=0, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 4, 32), (5, 1, 24), (4, 4, 64)])
def test_rotary_write_kv(ops, heads, kv_heads, head_dim):
    query_lens, context_lens, block = [3, 1, 20], [0, 16, 5], 16
    tables = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    meta = make_meta(query_lens, context_lens, tables, block)
    meta.slot_mapping[1] = -1  # a padding row: rotated q, no write
    tokens = sum(query_lens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (x.view(tokens, -1, head_dim) for x in (q, k, v))  # strided views, as in the model
    positions = torch.cat([torch.arange(c, c + n) for n, c in zip(query_lens, context_lens)])
    rope = RotaryEmbedding(head_dim, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    cos, sin = rope.cos_sin(positions, torch.float32)
    caches = [torch.full((2, 6, block, kv_heads, head_dim), float("nan")) for _ in range(2)]
    got = ops.rotary_write_kv(q, k, v, cos, sin, caches[0], meta, None)
    from specserve_kernels.torch_attention import TorchAttentionBackend
    want = TORCH_OPS.rotary_write_kv(q, k, v, cos, sin, caches[1], meta, TorchAttentionBackend())
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert torch.equal(caches[0].isnan(), caches[1].isnan()), "other slots were written"
    torch.testing.assert_close(caches[0].nan_to_num(), caches[1].nan_to_num(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("tokens,inner", [(1, 100), (33, 384), (129, 7)])
def test_silu_and_mul(ops, tokens, inner):
    x = torch.randn(tokens, 2 * inner) * 4
    torch.testing.assert_close(ops.silu_and_mul(x), TORCH_OPS.silu_and_mul(x), atol=1e-6, rtol=1e-5)


def test_a_dead_builders_lock_is_cleared_and_a_live_one_kept(tmp_path):
    """torch's build lock has no owner: one left by a process killed mid-build would make
    every later engine start wait forever."""
    import os
    import time

    from specserve_kernels.cpu import clear_stale_lock

    lock = tmp_path / "lock"
    lock.touch()
    clear_stale_lock(tmp_path, max_age_s=600)
    assert lock.exists()  # a build may be running
    old = time.time() - 601
    os.utime(lock, (old, old))
    clear_stale_lock(tmp_path, max_age_s=600)
    assert not lock.exists()
    clear_stale_lock(tmp_path)  # no lock: nothing to do
