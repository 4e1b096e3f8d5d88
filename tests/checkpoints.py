"""Small random checkpoints written to disk in Hugging Face format, for tests."""

from __future__ import annotations

from pathlib import Path

import torch

DEFAULT_TARGET = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny-target"
DEFAULT_DRAFT = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny-draft"


def write_random_qwen2(path: Path, vocab_size: int = 512, seed: int = 0) -> Path:
    """Qwen2-style: QKV bias, GQA 4:1, tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=1024, tie_word_embeddings=True,
                      rope_theta=10000.0, eos_token_id=1, bos_token_id=1)
    model = Qwen2ForCausalLM(cfg)
    # Larger-than-init weights so the random model's argmax is not a near-tie everywhere.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else None
    model.save_pretrained(path)
    return path


def write_random_llama3(path: Path, vocab_size: int = 512, seed: int = 0) -> Path:
    """Llama-3-style: GQA 2:1, untied embeddings, llama3 rope scaling."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, tie_word_embeddings=False,
                      rope_theta=500000.0, eos_token_id=1, bos_token_id=1,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 128})
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else None
    model.save_pretrained(path)
    return path
