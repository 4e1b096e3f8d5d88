"""Llama-family models over the paged KV cache, loaded from local Hugging Face checkpoints."""
