"""GPU checks of the fused decoder layer (`pytest -m gpu`; skipped without CUDA): the fused
kernels in bf16 at Llama-3-8B shapes against their fp32 references, the fused model against the
unfused one, and issue 17's budget of <= 12 kernel launches per decoder layer per decode step,
counted with torch.profiler (benchmarks/kernel_launches.py)."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

MAX_LAUNCHES_PER_LAYER = 12
BF16_TOL = dict(atol=2e-2, rtol=2e-2)


def test_fused_kernels_bf16():
    from app.models.rope import RotaryEmbedding
    from specserve_kernels.reference import rotary_write_kv_ref, silu_and_mul_ref
    from specserve_kernels.rotary_kv_write import rotary_write_kv
    from specserve_kernels.silu_mul import silu_and_mul
    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(33, 2 * 14336, device=dev, dtype=bf16) * 3
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), **BF16_TOL)
    t, heads, kv_heads, d = 37, 32, 8, 128
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, device=dev, dtype=bf16)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = q.view(t, heads, d), k.view(t, kv_heads, d), v.view(t, kv_heads, d)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cos, sin = RotaryEmbedding(d, 500000.0, scaling).to(dev).cos_sin(
        torch.arange(t, device=dev) * 211, bf16)
    slots = torch.randperm(64 * 16, device=dev)[:t]
    slots[::5] = -1
    cache = torch.full((2, 64, 16, kv_heads, d), float("nan"), device=dev, dtype=bf16)
    want_cache = cache.clone()
    want_q = rotary_write_kv_ref(q.float(), k.float(), v.float(), cos.float(), sin.float(),
                                 want_cache, slots)
    rotary_write_kv(q, k, v, cos, sin, cache[0], cache[1], slots)
    torch.testing.assert_close(q.float(), want_q, **BF16_TOL)
    assert torch.equal(cache.isnan(), want_cache.isnan())
    torch.testing.assert_close(cache.nan_to_num().float(), want_cache.nan_to_num().float(), **BF16_TOL)


@pytest.fixture(scope="module")
def llama3_8b_layers():
    """Two Llama-3-8B-shaped decoder layers (random bf16 weights), fused ops selected."""
    from benchmarks.kernel_launches import llama3_8b_shaped
    model, backend = llama3_8b_shaped(layers=2)
    yield model, backend
    del model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("batch", [1, 64])
def test_decode_launches_per_layer(llama3_8b_layers, batch):
    from benchmarks.kernel_launches import format_kernels, kernels_per_layer
    model, backend = llama3_8b_layers
    assert model.ops.name == "triton"
    counts = kernels_per_layer(model, batch_size=batch, context_len=300, backend=backend)
    total = sum(counts.values())
    print(f"batch {batch}: {total} launches per decoder layer\n{format_kernels(counts)}")
    assert total <= MAX_LAUNCHES_PER_LAYER, format_kernels(counts)


def test_fused_model_close_to_unfused_bf16(llama3_8b_layers):
    """Same decode step through the fused and the eager layer ops: bf16 rounding apart."""
    from app.models.layer_ops import TORCH_OPS
    from benchmarks.kernel_launches import _decode_step
    model, backend = llama3_8b_layers
    fused_ops = model.ops
    try:
        torch.manual_seed(0)
        fused = _decode_step(model, backend, 8, 40, 16)()
        model.ops = TORCH_OPS
        torch.manual_seed(0)
        eager = _decode_step(model, backend, 8, 40, 16)()
    finally:
        model.ops = fused_ops
    torch.testing.assert_close(fused.float(), eager.float(), atol=5e-2, rtol=5e-2)


def test_engine_uses_fused_layers(tmp_path):
    """The engine on CUDA picks the fused ops and stays within the launch budget."""
    from app.config import EngineConfig
    from app.engine.engine import LLMEngine
    from benchmarks.kernel_launches import launches_per_layer
    from tests.checkpoints import write_random_llama3
    path = write_random_llama3(tmp_path / "llama3")
    engine = LLMEngine(EngineConfig(model=str(path), dtype="bfloat16", device="cuda",
                                    num_kv_blocks=64, enable_cuda_graphs=False))
    assert engine.runner.model.ops.name == "triton"
    assert launches_per_layer(engine) <= MAX_LAUNCHES_PER_LAYER
