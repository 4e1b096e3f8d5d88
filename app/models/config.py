"""The architecture settings specserve reads from a checkpoint's config.json (and the EOS
tokens generation_config.json and the tokenizer add).

Read as plain JSON (not through transformers) so that any transformers version's spelling
works: `rope_scaling` + `rope_theta` (4.x) and `rope_parameters` (5.x) alike.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from app.models.generation_config import GenerationDefaults, token_ids
from app.models.tokenizer_eos import tokenizer_eos_token_id

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        """config.json's settings; the model's EOS tokens are config.json's, then those only
        generation_config.json names (app/models/generation_config.py), then the tokenizer's
        (app/models/tokenizer_eos.py)."""
        config = cls.from_dict(json.loads((Path(path) / "config.json").read_text()))
        tokenizer_eos = tokenizer_eos_token_id(path)
        eos = (*config.eos_token_ids, *GenerationDefaults.from_dir(path).eos_token_ids,
               *(() if tokenizer_eos is None else (tokenizer_eos,)))
        return dataclasses.replace(config, eos_token_ids=tuple(dict.fromkeys(eos)))

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        model_type = raw.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not supported; "
                             f"specserve runs {', '.join(SUPPORTED_MODEL_TYPES)}")
        heads = raw["num_attention_heads"]
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rope_theta=float(rope_theta),
            rope_scaling=dict(rope) if rope_type != "default" else None,
            attention_bias=raw.get("attention_bias", model_type == "qwen2"),
            mlp_bias=raw.get("mlp_bias", False),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            eos_token_ids=token_ids(raw.get("eos_token_id")),
            sliding_window=window,
        )

    def max_model_len(self, requested: int | None = None) -> int:
        """The context a request may fill: `requested`, or the model's limit when None. With no
        sliding-window attention here, a windowed model is kept inside its window."""
        limit = self.max_position_embeddings
        if self.sliding_window:
            limit = min(limit, self.sliding_window)
        if requested is None:
            return limit
        if requested > limit:
            raise ValueError(f"max_model_len {requested} is over the model's limit {limit}")
        return requested
