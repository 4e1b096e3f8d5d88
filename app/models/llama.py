"""Llama-architecture decoder (Llama 2/3, Mistral, Qwen2) over the paged KV cache.

Module names follow transformers', except that q/k/v and gate/up projections are fused into
`qkv_proj` and `gate_up_proj` (one matmul instead of three or two: at small batches a step is
mostly per-op overhead); `app.models.loader.fuse_projections` maps a checkpoint onto them.

Layers take and return (hidden, residual), the residual stream kept apart so that its add is
fused with the next RMSNorm, and do their elementwise work through `self.ops`
(`app.models.layer_ops`): eager PyTorch by default, fused Triton kernels on CUDA with the
Triton backend (the model runner sets it once, with `select_layer_ops`).
"""

from __future__ import annotations

import torch
from torch import nn

from app.models.config import ModelConfig
from app.models.layer_ops import TORCH_OPS
from app.models.rope import RotaryEmbedding
from specserve_kernels.attention_interface import AttentionBackend, AttentionMetadata


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim ** -0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=cfg.attention_bias and cfg.model_type != "qwen2")

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata, backend: AttentionBackend, ops) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split_with_sizes(self.split_sizes, -1)  # not Tensor.split's Python wrapper
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        q = ops.rotary_write_kv(q, k, v, cos, sin, kv_cache, meta, backend, self.o_proj)
        out = backend.attend(q, kv_cache, meta, self.scale)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        return self.down_proj(ops.gate_up_silu(x, self.gate_up_proj))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden, residual, cos, sin, kv_cache, meta, backend, ops
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) -> (this layer's MLP output, the residual stream before it);
        residual is None in the first layer. Their sum is the layer's output."""
        hidden, residual = ops.add_rms_norm(hidden, residual, self.input_layernorm, self.self_attn.qkv_proj)
        hidden = self.self_attn(hidden, cos, sin, kv_cache, meta, backend, ops)
        hidden, residual = ops.add_rms_norm(hidden, residual, self.post_attention_layernorm, self.mlp.gate_up_proj)
        return self.mlp(hidden, ops), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # Given its weight, Embedding skips reset_parameters, whose init imports torch._dynamo
        # (~1 s of an engine's start-up); the loader assigns the checkpoint's anyway.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


class LlamaForCausalLM(nn.Module):
    """forward() returns final hidden states for every new token; compute_logits() is called
    only on the rows that are sampled, so a long prefill never builds a [T, vocab] tensor."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.ops = TORCH_OPS  # `app.models.layer_ops.select_layer_ops` picks the fused kernels
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], meta: AttentionMetadata, backend: AttentionBackend) -> torch.Tensor:
        ops = self.ops
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary_emb.cos_sin(positions, hidden.dtype)
        residual = None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, meta, backend, ops)
        return ops.add_rms_norm(hidden, residual, self.model.norm, self.lm_head)[0]

    def compute_logits(self, hidden: torch.Tensor, fp32: bool = True, out: torch.Tensor | None = None
                       ) -> torch.Tensor:
        """fp32=False: in the model's dtype, for a caller that casts only when it needs to.
        `out` (model dtype): where to write them (a CUDA graph's one buffer for every size)."""
        if out is None:
            logits = self.lm_head(hidden)
        elif hasattr(self.lm_head, "forward_into"):  # a replacement that writes where it is told
            logits = self.lm_head.forward_into(hidden, out)
        else:
            logits = torch.matmul(hidden, self.lm_head.weight.t(), out=out)
        return logits.float() if fp32 else logits
