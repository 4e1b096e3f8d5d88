"""An outlines-core `Vocabulary` built from a local Hugging Face tokenizer, and token bitmasks.

`Vocabulary.from_pretrained` only reaches the hub, so the token -> bytes map is rebuilt here by
mimicking the tokenizer's own decoder per token: the bytes a guide reasons about must be exactly
the bytes the detokenizer will emit, or guided text will not match its format.

- byte-level BPE (decoder `ByteLevel`): every char of the token is reversed through the GPT-2
  byte-to-unicode map ('Ġ' -> b' '); if any char is outside the map (an added token such as
  "ab cd") the token's UTF-8 is used as is, which is what the `ByteLevel` decoder does.
- SentencePiece style (decoder `Metaspace`, `Replace('▁', ' ')` or `ByteFallback`): '▁' -> ' ',
  `<0xXX>` -> that single byte (when the model has byte fallback).
- otherwise: the token's UTF-8.

Special tokens (all_special_ids and added tokens marked special) and EOS stay out of the map,
but for the app's markup tokens (deployments/markup_tokens.py: special tokens that spell its
tool-call markers), read as any added token is, since the detokenizer writes them out. EOS is
given to the `Vocabulary` separately and the caller must never `advance` a guide on it
(outlines-core #227: it raises). Ids that share one byte string are kept together in one list.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

import torch
from outlines_core import Guide, Vocabulary

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SP_SPACE = "\u2581"


@dataclass(frozen=True)
class GuidedVocabulary:
    """What guided decoding needs to know about one tokenizer."""
    vocabulary: Vocabulary
    eos_token_id: int
    vocab_hash: str
    # Bytes per id (index = token id); None for special/EOS/uninterpretable ids (never allowed).
    token_bytes: list[bytes | None] = field(repr=False)
    mode: str = "byte_level"

    @property
    def id_bound(self) -> int:
        """One past the largest id a guide can set in a mask (a mask must be at least this wide)."""
        return max(len(self.token_bytes), self.eos_token_id + 1)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map used by byte-level BPE."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def _component_types(obj: Any, out: list[dict]) -> list[dict]:
    """Flatten a tokenizers component JSON (Sequence nests others) into its parts."""
    if isinstance(obj, dict):
        if "type" in obj:
            out.append(obj)
        for v in obj.values():
            _component_types(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _component_types(v, out)
    return out


def _state(component: Any) -> Any:
    return json.loads(component.__getstate__()) if component is not None else None


def detect_mode(backend: Any) -> str:
    """'byte_level', 'sentencepiece' or 'plain', from the decoder (then pre-tokenizer/normalizer)."""
    for comp in (backend.decoder, backend.pre_tokenizer, backend.normalizer):
        parts = _component_types(_state(comp), [])
        types = {p["type"] for p in parts}
        if "ByteLevel" in types:
            return "byte_level"
        replaces_sp = any(p["type"] == "Replace" and _SP_SPACE in json.dumps(p, ensure_ascii=False)
                          for p in parts)
        if types & {"Metaspace", "ByteFallback"} or replaces_sp:
            return "sentencepiece"
    return "plain"


def token_to_bytes(token: str, mode: str, byte_fallback: bool = True) -> bytes | None:
    """Bytes the tokenizer's decoder emits for `token` on its own (sequence-level strips aside)."""
    if mode == "byte_level":
        try:
            return bytes(_UNICODE_TO_BYTE[c] for c in token)
        except KeyError:
            return token.encode("utf-8")
    if mode == "sentencepiece":
        m = _BYTE_TOKEN.fullmatch(token)
        if m and byte_fallback:
            return bytes([int(m.group(1), 16)])
        return token.replace(_SP_SPACE, " ").encode("utf-8")
    return token.encode("utf-8")


def _vocab_hash(mapping: dict[bytes, list[int]], eos: int, mode: str) -> str:
    h = hashlib.sha256(f"{mode}|eos={eos}|".encode())
    for key in sorted(mapping):
        h.update(len(key).to_bytes(4, "little") + key)
        h.update(b",".join(str(i).encode() for i in sorted(mapping[key])) + b";")
    return h.hexdigest()


def unwritten_special_ids(tokenizer: Any, markup_tokens: Collection[str] = ()) -> frozenset[int]:
    """The special tokens left out of text: the named ones and the added ones marked special, as
    `skip_special_tokens` leaves them out, but for `markup_tokens` (by their text)."""
    special = frozenset(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return special - {i for i, t in tokenizer.added_tokens_decoder.items() if t.content in markup_tokens}


def build_guided_vocabulary(tokenizer: Any, eos_token_id: int | None = None,
                            markup_tokens: Collection[str] = ()) -> GuidedVocabulary:
    """Build from a loaded HF fast tokenizer (anything with `backend_tokenizer`); `markup_tokens`:
    the special tokens, by their text, that formats may write as that text."""
    backend = tokenizer.backend_tokenizer
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise ValueError("tokenizer has no eos_token_id; pass eos_token_id explicitly")
    mode = detect_mode(backend)
    byte_fallback = bool(getattr(backend.model, "byte_fallback", True))
    special = unwritten_special_ids(tokenizer, markup_tokens) | {eos}
    vocab = backend.get_vocab(with_added_tokens=True)
    size = max(len(tokenizer), max(vocab.values(), default=-1) + 1)
    token_bytes: list[bytes | None] = [None] * size
    mapping: dict[bytes, list[int]] = {}
    for token, tid in vocab.items():
        if tid in special:
            continue
        b = token_to_bytes(token, mode, byte_fallback)
        if not b:
            continue  # an empty token could be emitted forever without progress
        token_bytes[tid] = b
        mapping.setdefault(b, []).append(tid)
    for ids in mapping.values():
        ids.sort()
    return GuidedVocabulary(Vocabulary(eos, mapping), eos, _vocab_hash(mapping, eos, mode),
                            token_bytes, mode)


def load_guided_vocabulary(path: str | Path, eos_token_id: int | None = None,
                           markup_tokens: Collection[str] = ()) -> GuidedVocabulary:
    """Load tokenizer.json from a local directory (never the hub) and build its vocabulary.
    PreTrainedTokenizerFast, not AutoTokenizer: same backend, and ~10 s less of first-call
    imports. A caller holding the tokenizer it detokenizes with should pass that instead."""
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    return build_guided_vocabulary(tok, eos_token_id, markup_tokens)


# --- bitmasks -----------------------------------------------------------------------------------
# Layout (outlines-core `write_mask_into`): int32 words, bit (id % 32) of word (id // 32) set when
# the id is allowed; it zeroes the whole row first. It only checks that the buffer holds at least
# ceil(len(vocabulary) / 32) words, not that it covers the largest id: a too-narrow row is written
# past its end (0.2.14), hence the width check in `fill_token_bitmask`.

def allocate_token_bitmask(batch: int, logits_width: int) -> torch.Tensor:
    """(batch, ceil(width/32)) int32 on the CPU, all bits set: a row left as is masks nothing.
    Size it to the logits width (model vocab, often padded past the tokenizer's)."""
    return torch.full((batch, (logits_width + 31) // 32), -1, dtype=torch.int32,
                      pin_memory=torch.cuda.is_available())


def allow_only_token(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    """Set `bitmask[row]` to allow `token_id` alone."""
    bitmask[row].zero_()
    word, bit = divmod(token_id, 32)
    bitmask[row, word] = (1 << bit) - (1 << 32) if bit == 31 else 1 << bit  # as int32


def fill_token_bitmask(guide: Guide, bitmask: torch.Tensor, row: int,
                       vocab: GuidedVocabulary) -> None:
    """Write `guide`'s allowed ids into `bitmask[row]`; every other bit (ids past the tokenizer's
    vocabulary included) is cleared. EOS is set only in a final state."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.device.type != "cpu":
        raise ValueError("bitmask must be a 2-D int32 CPU tensor")
    if bitmask.shape[1] * 32 < vocab.id_bound:
        raise ValueError(f"bitmask row holds {bitmask.shape[1] * 32} ids, vocabulary needs "
                         f"{vocab.id_bound}")
    target = bitmask[row]
    if not target.is_contiguous():
        raise ValueError("bitmask rows must be contiguous")
    guide.write_mask_into(target.data_ptr(), target.numel(), target.element_size())


def unpack_token_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """(batch, width) bool, True where allowed."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.bool().view(bitmask.shape[0], -1)[:, :width]


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed logits to -inf in place (rows of `logits` and `bitmask` correspond).
    Plain torch, no torch.compile: works on CPU and CUDA without a warm-up."""
    if logits.dim() != 2 or bitmask.dim() != 2 or logits.shape[0] != bitmask.shape[0]:
        raise ValueError(f"shape mismatch: logits {tuple(logits.shape)}, "
                         f"bitmask {tuple(bitmask.shape)}")
    if bitmask.shape[1] * 32 < logits.shape[1]:
        raise ValueError("bitmask is narrower than the logits")
    allowed = unpack_token_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[1])
    return logits.masked_fill_(~allowed, float("-inf"))
