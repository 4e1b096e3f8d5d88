"""What a checkpoint's generation_config.json adds to config.json: more EOS tokens, and the
sampling defaults its authors chose.

Instruct checkpoints often name their end-of-turn token only here (Qwen2.5: `<|endoftext|>`
beside config.json's `<|im_end|>`; early Llama 3 Instruct: `<|eot_id|>` beside
`<|end_of_text|>`), and transformers' `generate` stops at these. Their sampling settings
(Llama 3.1 Instruct: temperature 0.6, top_p 0.9) are what vLLM's default `--generation-config
auto` applies to requests that leave those fields unset. Read as plain JSON, as config.json is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# generation_config.json's names of the request fields it may set (as vLLM reads them; vLLM,
# too, ignores `do_sample`).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    sampling: dict[str, float] = field(default_factory=dict)  # request field -> its default
    max_tokens: int | None = None  # `max_new_tokens`: the length of a request that gives none

    @classmethod
    def from_dir(cls, path: str | Path) -> "GenerationDefaults":
        file = Path(path) / "generation_config.json"
        return cls.from_dict(json.loads(file.read_text()) if file.is_file() else {})

    @classmethod
    def from_dict(cls, raw: dict) -> "GenerationDefaults":
        return cls(eos_token_ids=token_ids(raw.get("eos_token_id")),
                   sampling={name: raw[name] for name in SAMPLING_FIELDS if raw.get(name) is not None},
                   max_tokens=raw.get("max_new_tokens"))


def token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    """`eos_token_id` as config.json and generation_config.json write it: one id, a list, or none."""
    return tuple(value) if isinstance(value, list) else (() if value is None else (value,))
