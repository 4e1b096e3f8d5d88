"""Packed oneDNN linears on the fp32 CPU path: the same product as `F.linear` at any row
count (the weight is packed for a typical one), and the model keeps its tied embedding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from app.models.config import ModelConfig
from app.models.llama import LlamaForCausalLM
from specserve_kernels.cpu.packed_linear import PackedLinear, pack_linears, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 64, 333])
@pytest.mark.parametrize("bias", [False, True])
def test_same_product_as_linear(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)
    x = torch.randn(rows, 96)
    torch.testing.assert_close(PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias),
                               atol=1e-5, rtol=1e-5)


def test_model_linears_packed_and_embedding_kept():
    cfg = ModelConfig.from_dict(dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     tie_word_embeddings=True))
    model = LlamaForCausalLM(cfg)
    torch.manual_seed(0)
    with torch.no_grad():  # the model is built to be loaded: its embedding starts as torch.empty, NaN at times
        for p in model.parameters():
            p.normal_(0, 0.2)
    hidden = torch.randn(5, 32)
    want = model.compute_logits(hidden)
    assert want.isfinite().all()
    assert pack_linears(model) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the LM head
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.model.embed_tokens, nn.Embedding)
    torch.testing.assert_close(model.compute_logits(hidden), want, atol=1e-5, rtol=1e-5)
