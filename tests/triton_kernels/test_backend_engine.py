"""The Triton backend behind the engine's interface: same caches and outputs as the PyTorch
backend, and the same greedy tokens from the whole engine on a tiny checkpoint."""

import json

import pytest
import torch
from safetensors.torch import save_file

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from kernels.torch_attention import TorchAttentionBackend
from app.models.config import ModelConfig
from app.models.llama import LlamaForCausalLM
from app.sampling_params import SamplingParams
from kernels.backend import TritonAttentionBackend
from kernels.reference import make_paged_case


@pytest.mark.parametrize("query_lens,context_lens", [([1, 1, 1], [0, 16, 40]),  # decode kernel
                                                     ([1, 6, 20], [30, 11, 0])],  # prefill kernel
                         ids=["decode", "mixed"])
def test_backend_matches_torch_backend(query_lens, context_lens):
    case = make_paged_case(query_lens, context_lens, 8, 2, 16, 16, torch.float32, seed=11)
    n = case.query.shape[0]
    key, value = torch.randn(n, 2, 16), torch.randn(n, 2, 16)
    ours, theirs = case.kv_cache.clone(), case.kv_cache.clone()
    triton_backend = TritonAttentionBackend(partition_size=16, decode_block_n=16,
                                            prefill_block_n=16, prefill_rows=16)
    triton_backend.write_kv(key, value, ours, case.meta)
    TorchAttentionBackend().write_kv(key, value, theirs, case.meta)
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    out = triton_backend.attend(case.query, ours, case.meta, 0.25)
    # The exact per-sequence path: unused blocks hold NaN here.
    ref = TorchAttentionBackend(batch_decodes=False).attend(case.query, theirs, case.meta, 0.25)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """The shape of `tests.checkpoints.write_random_qwen2` (QKV bias, GQA 4:1, head_dim 8,
    tied embeddings), written without importing transformers, which costs more than the test
    itself on a 2-core machine."""
    raw = dict(model_type="qwen2", vocab_size=128, hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
               max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
               eos_token_id=1, bos_token_id=1, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    model = LlamaForCausalLM(ModelConfig.from_dict(raw))
    state = {k: (v.normal_(0, 0.2) if v.dim() > 1 else v).contiguous()
             for k, v in model.state_dict().items() if k != "lm_head.weight"}
    path = tmp_path_factory.mktemp("qwen2")
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(raw))
    return path


def test_engine_greedy_tokens_match_torch_backend(tiny_checkpoint):
    """Chunked prefill (budget 24 tokens), a shared 16-token prefix (prefix-cache hit) and
    decodes past a block boundary, through the engine with either backend."""
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(2, 128, (16,), generator=gen).tolist()
    prompts = [shared + [5, 6, 7], torch.randint(2, 128, (37,), generator=gen).tolist(), shared + [9]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        engine = LLMEngine(EngineConfig(model=str(tiny_checkpoint), attention_backend=backend,
                                        device="cpu", num_kv_blocks=32, max_num_batched_tokens=24,
                                        max_model_len=256))
        assert engine.runner.backend.name == backend
        outputs[backend] = engine.generate(prompts, params)
        assert engine.stats().prefix_cache_hits > 0
    assert outputs["triton"] == outputs["torch"]
