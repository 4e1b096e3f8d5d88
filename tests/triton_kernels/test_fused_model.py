"""The whole model's fused paths (Triton layer ops + Triton attention under the interpreter, and
the CPU's C++ layer ops + C++ attention) in fp32, against the unfused path (PyTorch ops +
PyTorch attention) on tiny random checkpoints:
prefill, decode past a block boundary and a chunked prefill over a cached prefix, with NaN in
every cache slot no sequence owns."""

import json

import pytest
import torch
from safetensors.torch import save_file

from specserve_kernels.torch_attention import TorchAttentionBackend
from app.models.config import ModelConfig
from app.models.layer_ops import TORCH_OPS, CpuLayerOps, TorchLayerOps, TritonLayerOps, select_layer_ops
from app.models.llama import LlamaForCausalLM
from app.models.loader import load_model
from specserve_kernels.backend import TritonAttentionBackend
from specserve_kernels.cpu.backend import CpuAttentionBackend
from specserve_kernels.reference import make_meta
from tests.cpu_kernels import require_cpu_kernels

BLOCK = 16
# The shapes of tests.checkpoints.write_random_qwen2 / write_random_llama3 (QKV bias, tied
# embeddings / untied, llama3 RoPE scaling), written without importing transformers, which
# costs more than the test on a 2-core machine. Odd vocab and intermediate sizes on purpose.
CONFIGS = {
    "qwen2": dict(model_type="qwen2", vocab_size=131, hidden_size=64, intermediate_size=100,
                  num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                  max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
                  eos_token_id=1, bos_token_id=1, rms_norm_eps=1e-6),
    "llama3": dict(model_type="llama", vocab_size=128, hidden_size=48, intermediate_size=72,
                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=1024, tie_word_embeddings=False, rope_theta=500000.0,
                   eos_token_id=1, bos_token_id=1, rms_norm_eps=1e-5,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    raw = CONFIGS[request.param]
    torch.manual_seed(0)
    model = LlamaForCausalLM(ModelConfig.from_dict(raw))
    state = {k: (v.normal_(0, 0.2) if v.dim() > 1 else v.normal_(1, 0.1)).contiguous()
             for k, v in model.state_dict().items()
             if not (raw["tie_word_embeddings"] and k == "lm_head.weight")}
    state = {k.replace("qkv_proj", "qkv"): v for k, v in state.items()}
    cfg = ModelConfig.from_dict(raw)
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    for key in [k for k in state if ".qkv." in k]:  # back to the checkpoint's q/k/v names
        for name, part in zip("qkv", state.pop(key).split([q, kv, kv])):
            state[key.replace(".qkv.", f".{name}_proj.")] = part.contiguous()
    for key in [k for k in state if "gate_up_proj" in k]:
        gate, up = state.pop(key).chunk(2)
        state[key.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
        state[key.replace("gate_up_proj", "up_proj")] = up.contiguous()
    path = tmp_path_factory.mktemp(request.param)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(raw))
    return path


def _steps():
    """(query_lens, context_lens) per step for three sequences whose blocks are 0-2, 3-5, 6-8."""
    return [([5, 17, 1], [0, 0, 0]),        # prefill (17 crosses a block)
            ([1, 1, 1], [5, 17, 1]),        # decode
            ([1, 1, 1], [6, 18, 2]),        # decode
            ([3, 1, 14], [7, 19, 3])]       # mixed: chunked prefill over a cached prefix


def _run(model, ops, backend, num_layers, kv_heads, head_dim, vocab):
    model.ops = ops
    caches = [torch.full((2, 10, BLOCK, kv_heads, head_dim), float("nan")) for _ in range(num_layers)]
    tables = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]], dtype=torch.int32)
    gen = torch.Generator().manual_seed(5)
    logits = []
    with torch.inference_mode():
        for query_lens, context_lens in _steps():
            meta = make_meta(query_lens, context_lens, tables, BLOCK)
            ids = torch.randint(0, vocab, (sum(query_lens),), generator=gen)
            positions = torch.cat([torch.arange(c, c + q) for q, c in zip(query_lens, context_lens)])
            hidden = model(ids, positions, caches, meta, backend)
            logits.append(model.compute_logits(hidden))
    return logits, caches


def fused(path: str):
    if path == "cpu":
        return CpuLayerOps(require_cpu_kernels()), CpuAttentionBackend(require_cpu_kernels().paged_attention_short)
    return TritonLayerOps(), TritonAttentionBackend(partition_size=16, split_size=16,
                                                    prefill_block_n=16, prefill_rows=16)


@pytest.mark.parametrize("path", ["triton", "cpu"])
def test_fused_path_matches_unfused(checkpoint, path):
    model = load_model(checkpoint, torch.float32, torch.device("cpu"))
    cfg = model.config
    dims = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size)
    want, want_caches = _run(model, TORCH_OPS, TorchAttentionBackend(batch_decodes=False), *dims)
    got, got_caches = _run(model, *fused(path), *dims)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    for g, w in zip(got_caches, want_caches):
        assert torch.equal(g.isnan(), w.isnan()), "the fused path wrote other slots"
        torch.testing.assert_close(g.nan_to_num(), w.nan_to_num(), atol=1e-5, rtol=1e-5)


def test_ops_selection():
    """Triton kernels only on CUDA with the Triton backend, C++ ones with the CPU backend;
    plain PyTorch with the PyTorch backend."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert select_layer_ops(cpu, TorchAttentionBackend()) is TORCH_OPS
    assert select_layer_ops(cpu, TritonAttentionBackend()) is TORCH_OPS
    assert select_layer_ops(cuda, TorchAttentionBackend()) is TORCH_OPS
    assert isinstance(select_layer_ops(cuda, TritonAttentionBackend()), TritonLayerOps)
    assert isinstance(select_layer_ops(cpu, CpuAttentionBackend(require_cpu_kernels().paged_attention_short)), CpuLayerOps)
    assert isinstance(LlamaForCausalLM(ModelConfig.from_dict(CONFIGS["qwen2"])).ops, TorchLayerOps)


def test_launch_counter_plumbing(monkeypatch):
    """benchmarks/kernel_launches.py on the CPU, with top-level aten ops standing in for CUDA
    kernels: one layer's count is the same whichever layer count the model has, and the model
    gets its layers back."""
    import collections

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    import benchmarks.kernel_launches as kl

    def top_level_ops(fn):
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        return collections.Counter(e.name for e in prof.events()
                                   if e.device_type == DeviceType.CPU and e.cpu_parent is None)

    monkeypatch.setattr(kl, "_device_activities", top_level_ops)
    counts = []
    for layers in (2, 3):
        model = LlamaForCausalLM(ModelConfig.from_dict({**CONFIGS["llama3"], "num_hidden_layers": layers}))
        before = list(model.model.layers)
        counts.append(kl.launches_per_layer(model, batch_size=2, context_len=20))
        assert list(model.model.layers) == before
    assert counts[0] == counts[1] > 0
