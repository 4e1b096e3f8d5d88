"""Load a local Hugging Face checkpoint directory. Nothing is ever downloaded."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from app.models.config import ModelConfig
from app.models.llama import LlamaForCausalLM
from app.models.rope import RotaryEmbedding


FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def fuse_projections(state: dict[str, torch.Tensor]) -> None:
    """Concatenate each layer's q/k/v (and gate/up) weights and biases, in place."""
    layers = {key.split(".self_attn.q_proj.")[0] for key in state if ".self_attn.q_proj." in key}
    for layer in layers:
        for fused, parts in FUSED.items():
            for kind in ("weight", "bias"):
                names = [f"{layer}.{part}.{kind}" for part in parts]
                if names[0] in state:
                    state[f"{layer}.{fused}.{kind}"] = torch.cat([state.pop(n) for n in names])


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a local checkpoint directory (no config.json); "
                                "specserve loads models from local paths only")
    cfg = ModelConfig.from_dir(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file), device="cpu"))
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    fuse_projections(state)
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    del model.model.rotary_emb  # built on meta; rebuilt below in fp32 whatever the weights' dtype
    model = model.to(device=device, dtype=dtype).eval()
    model.model.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(device)
    return model
