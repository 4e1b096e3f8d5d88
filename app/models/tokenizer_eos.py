"""The tokenizer's EOS token id, read from a checkpoint's tokenizer files as plain JSON.

vLLM stops at the tokenizer's EOS first of all. Fine-tunes that switch to another chat format
often change `eos_token` in tokenizer_config.json and leave config.json's `eos_token_id` as it
was. Reading the files keeps the engine free of a tokenizer load at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path


def tokenizer_eos_token_id(path: str | Path) -> int | None:
    """None when the files name no EOS token, or only a SentencePiece model (tokenizer.model)
    could map it to an id."""
    path = Path(path)
    content = next(filter(None, (_eos_content(_read(path / name))
                                 for name in ("tokenizer_config.json", "special_tokens_map.json"))), None)
    if content is None:
        return None
    decoder = _read(path / "tokenizer_config.json").get("added_tokens_decoder") or {}
    for token_id, token in decoder.items():
        if token.get("content") == content:
            return int(token_id)
    tokenizer = _read(path / "tokenizer.json")
    for token in tokenizer.get("added_tokens") or ():
        if token.get("content") == content:
            return token["id"]
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        return vocab.get(content)
    if isinstance(vocab, list):  # Unigram: [piece, score] pairs, the index is the id
        return next((i for i, (piece, _) in enumerate(vocab) if piece == content), None)
    return None


def _read(file: Path) -> dict:
    return json.loads(file.read_text()) if file.is_file() else {}


def _eos_content(raw: dict) -> str | None:
    eos = raw.get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos
