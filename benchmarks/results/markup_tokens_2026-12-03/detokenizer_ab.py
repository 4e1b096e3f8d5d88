"""The detokenizer's cost per token, one token at a time, at REF against the work tree,
alternated in rounds (who goes first swaps each round).

    python benchmarks/results/markup_tokens_2026-12-03/detokenizer_ab.py 6ae6668
"""

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from deployments import detokenizer as tree  # noqa: E402


def module_at(ref: str):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:deployments/detokenizer.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "detokenizer_at_ref.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("detokenizer_at_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def us_per_token(module, tokenizer, ids) -> float:
    start = time.perf_counter()
    for _ in range(5):
        detokenizer = module.IncrementalDetokenizer(tokenizer, stop_token_ids={0})
        for i in ids:
            detokenizer.add_tokens([i])
        detokenizer.finish()
    return (time.perf_counter() - start) / (5 * len(ids)) * 1e6


def main(ref: str) -> None:
    old = module_at(ref)
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "tiny-target")
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 40)[:512]
    ratios = []
    for r in range(8):
        if r % 2 == 0:
            a = us_per_token(old, tokenizer, ids)
            b = us_per_token(tree, tokenizer, ids)
        else:
            b = us_per_token(tree, tokenizer, ids)
            a = us_per_token(old, tokenizer, ids)
        ratios.append(a / b)
        print(f"round {r}: {ref} {a:.2f} us/token, work tree {b:.2f} us/token, {ref}/tree {a / b:.3f}")
    print(f"median {ref}/tree {statistics.median(ratios):.3f} (above 1: the tree is faster)")


if __name__ == "__main__":
    main(sys.argv[1])
