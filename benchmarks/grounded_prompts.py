"""Prompts where speculation has something to copy: a chunk of standard-library Python, then an
instruction to repeat it and its first line again, so the model continues by copying (the
"input-grounded" workload of `spec.py` and of `serving.py --dataset grounded`), and
open-ended ones (the first two lines of a chunk). Text only: no model code is imported."""

from __future__ import annotations

import json
import random
from pathlib import Path

STDLIB = Path(json.__file__).resolve().parent.parent


def code_snippets(n: int, seed: int) -> list[str]:
    """n chunks of 20 lines of standard-library Python, never the same file twice in a row."""
    rng = random.Random(seed)
    files = sorted(p for p in STDLIB.glob("*.py") if p.stat().st_size > 4000)
    out = []
    while len(out) < n:
        lines = rng.choice(files).read_text(errors="ignore").splitlines()
        start = rng.randrange(0, max(1, len(lines) - 20))
        chunk = "\n".join(lines[start:start + 20])
        if len(chunk) > 300:
            out.append(chunk[:700])
    return out


def input_grounded_texts(n: int, seed: int) -> list[str]:
    return [f"# Original:\n{s}\n\n# Copy of the code above:\n{s.splitlines()[0]}\n" for s in code_snippets(n, seed)]


def open_ended_texts(n: int, seed: int) -> list[str]:
    return ["\n".join(s.splitlines()[:2]) + "\n" for s in code_snippets(n, seed + 1)]
