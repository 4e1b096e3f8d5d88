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


def write_tokenizer_with_special_tokens(path: Path, tokenizer_dir: Path, special_tokens: list[str]) -> Path:
    """The tokenizer of `tokenizer_dir` with `special_tokens` added (ids after its own), as
    tokenizers that hold a model's tool-call markers as special tokens do (Mistral's, Kimi's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": special_tokens}, replace_extra_special_tokens=False)
    tokenizer.save_pretrained(path)
    return path


def write_successor_model(path: Path, tokenizer_dir: Path, successors: dict[int, int],
                          chat_template: str | None = None) -> Path:
    """A Llama model whose greedy next token depends on the current token alone: after `a` it
    writes `successors[a]`, so a test can make it write a known text, tags and all.

    Its one layer adds nothing to the residual stream (o_proj and down_proj are zero), so the
    final hidden state is the current token's embedding, normalized. Those of the tokens in
    `successors` are orthonormal, and each LM-head row sums the embeddings of the tokens it
    follows: after `a`, `successors[a]` scores 80 and every other token 0."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    hidden = 64
    assert len(successors) <= hidden
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                      bos_token_id=tokenizer.bos_token_id, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    basis = torch.linalg.qr(torch.randn(hidden, hidden))[0].t()  # orthonormal rows
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        for row, (token, successor) in zip(basis, successors.items()):
            model.model.embed_tokens.weight[token] = row
            model.lm_head.weight[successor] += 10 * row  # x 8, the RMSNorm of a unit row in 64 dims
    model.save_pretrained(path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    return path
