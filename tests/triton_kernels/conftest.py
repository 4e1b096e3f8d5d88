"""Kernel tests run under the Triton interpreter where there is no GPU. The variable must be
set before any `kernels` module is imported: `triton.jit` picks interpreter or compiler when
it decorates a function."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer checkpoint for engine tests under the interpreter, in the shape of
    `tests.checkpoints.write_random_qwen2` (QKV bias, GQA 4:1, head_dim 8, tied embeddings),
    written without importing transformers, which costs more than the test itself on a 2-core
    machine. The model classes are imported inside: `kernels` must not be imported before the
    interpreter is switched on above."""
    raw = dict(model_type="qwen2", vocab_size=128, hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
               max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
               eos_token_id=1, bos_token_id=1, rms_norm_eps=1e-6)
    from app.models.config import ModelConfig
    from app.models.llama import LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(ModelConfig.from_dict(raw))
    state = {k: (v.normal_(0, 0.2) if v.dim() > 1 else v).contiguous()
             for k, v in model.state_dict().items() if k != "lm_head.weight"}
    path = tmp_path_factory.mktemp("qwen2")
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(raw))
    return path
