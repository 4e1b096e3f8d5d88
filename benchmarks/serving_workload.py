"""The requests `benchmarks/serving.py` sends, and when: random-token prompts of a given length,
windows of a local text file, prompts that ask to repeat the code they contain, or chat-like sessions (`Session`): many users sharing a few long
system prompts, each in a conversation whose prompt grows by the last answer and a new
question; started at a given rate (`start_at_rate`)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.grounded_prompts import input_grounded_texts


@dataclass
class Request:
    prompt: str
    prompt_len: int  # as this client's tokenizer counts it
    output_len: int


def load_tokenizer(path: str | None):
    if path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@dataclass
class Session:
    """One user's conversation: turn i's prompt is `system` + every earlier question and the
    answer the server gave to it + `questions[i]` (sent in turn, each after the last answer)."""
    system: str
    questions: list[str]
    output_len: int


def random_text(tokenizer, rng, vocab, num_tokens: int) -> str:
    """About `num_tokens` random tokens as text (decoding then re-encoding can merge a few)."""
    return tokenizer.decode(rng.choice(vocab, size=num_tokens).tolist())


def shared_prefix_sessions(tokenizer, num_sessions: int, num_system_prompts: int, system_len: int,
                           turns: int, question_len: int, output_len: int, seed: int) -> list[Session]:
    """`num_sessions` conversations of `turns` turns, each opening with one of
    `num_system_prompts` system prompts of `system_len` tokens (the users of a few apps)."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    vocab = np.array([i for i in range(len(tokenizer)) if i not in special])
    systems = [random_text(tokenizer, rng, vocab, system_len) for _ in range(num_system_prompts)]
    return [Session(systems[int(rng.integers(num_system_prompts))],
                    [" " + random_text(tokenizer, rng, vocab, question_len) for _ in range(turns)], output_len)
            for _ in range(num_sessions)]


def random_requests(tokenizer, num: int, input_len: int, output_len: int, range_ratio: float,
                    seed: int) -> list[Request]:
    """Prompts of random tokens from the vocabulary (special tokens left out), as text."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    vocab = np.array([i for i in range(len(tokenizer)) if i not in special])
    out = []
    for _ in range(num):
        n_in = max(1, int(rng.integers(int(input_len * (1 - range_ratio)), input_len + 1)))
        n_out = max(1, int(rng.integers(int(output_len * (1 - range_ratio)), output_len + 1)))
        ids = rng.choice(vocab, size=n_in).tolist()
        # Decoding then re-encoding can merge tokens: trim until the text is at most n_in long.
        text = tokenizer.decode(ids)
        for _ in range(4):
            re_ids = tokenizer.encode(text, add_special_tokens=False)
            if len(re_ids) <= n_in:
                break
            text = tokenizer.decode(re_ids[:n_in])
        out.append(Request(text, len(tokenizer.encode(text, add_special_tokens=False)), n_out))
    return out


def file_requests(tokenizer, path: str, num: int, input_len: int, output_len: int,
                  seed: int) -> list[Request]:
    """Windows of `input_len` tokens (words, without a tokenizer) from a local text file."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    rng = np.random.default_rng(seed)
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces = lambda a, b: tokenizer.decode(ids[a:b])  # noqa: E731
    else:
        ids = text.split()
        pieces = lambda a, b: " ".join(ids[a:b])  # noqa: E731
    if len(ids) <= input_len:
        raise SystemExit(f"{path} holds only {len(ids)} tokens; need more than --input-len {input_len}")
    starts = rng.integers(0, len(ids) - input_len, size=num)
    return [Request(pieces(s, s + input_len), input_len, output_len) for s in starts]


def grounded_requests(tokenizer, num: int, output_len: int, seed: int) -> list[Request]:
    """Prompts that ask to repeat the code they contain (`grounded_prompts.py`), where drafts
    are mostly accepted: the workload on which speculation has to pay when served."""
    texts = input_grounded_texts(num, seed)
    return [Request(t, len(tokenizer.encode(t, add_special_tokens=False)) if tokenizer is not None else 0,
                    output_len) for t in texts]


async def start_at_rate(items: list, start_one, rate: float, rng) -> tuple[list, float]:
    """`start_one(item)` for every item, started at `rate` per second (Poisson arrivals; inf:
    all at once); their results, in order, and the wall time until the last one ended."""
    tasks = []
    start = time.perf_counter()
    for item in items:
        tasks.append(asyncio.create_task(start_one(item)))
        if math.isfinite(rate):
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start
