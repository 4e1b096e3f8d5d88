"""The default pair's shared tokenizer: byte-level BPE trained on stdlib sources, its special
tokens and chat template, saved in the layout transformers 4.x and 5.x both read.

Used by `train_default_models.py` (which trains it) and `finetune_copy.py` (which reuses it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
VOCAB_SIZE = 4096
MAX_POSITIONS = 2048

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(docs: list[str]) -> Tokenizer:
    """Byte-level BPE, so any UTF-8 string encodes and decodes back exactly (no UNK, no
    normalisation, no prefix space)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    assert tok.token_to_id(EOS) == 0, "the EOS/pad token must be id 0"
    return tok


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap for transformers: EOS doubles as pad, no BOS is ever added, chat template set.

    clean_up_tokenization_spaces=False matters: the default would rewrite " ." to "." on decode
    and break exact round-trips of source code.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(hf_tok: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save tokenizer files in the layout both transformers 4.x and 5.x read.

    transformers 5 writes the chat template to chat_template.jinja, names the class
    "TokenizersBackend" and skips special_tokens_map.json; older readers (and other serving
    stacks) look for the template in tokenizer_config.json and for PreTrainedTokenizerFast.
    """
    hf_tok.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["additional_special_tokens"] = SPECIAL_TOKENS[1:]
    cfg.pop("extra_special_tokens", None)
    special_map = {"eos_token": EOS, "pad_token": EOS, "additional_special_tokens": SPECIAL_TOKENS[1:]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    jinja = out_dir / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()


def check_round_trip(tok_dir: Path, samples: list[str]) -> None:
    """Fail loudly if the saved tokenizer cannot reproduce text exactly or lacks the template."""
    hf_tok = AutoTokenizer.from_pretrained(tok_dir)
    hf_tok.model_max_length = 10**9  # only silences the long-input warning for this check
    for text in samples:
        ids = hf_tok.encode(text, add_special_tokens=True)
        back = hf_tok.decode(ids, skip_special_tokens=False)
        assert back == text, f"round-trip failed for {text[:60]!r}"
    ids = hf_tok.encode("x", add_special_tokens=True)
    assert len(ids) == 1, "tokenizer must not add BOS/EOS automatically"
    prompt = hf_tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt == "<|system|>\nBe brief.<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n", prompt


def encode_stream(tok: Tokenizer, docs: list[str]) -> torch.Tensor:
    """Concatenate documents as `doc <|endoftext|> doc <|endoftext|> ...` into one id tensor."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)
