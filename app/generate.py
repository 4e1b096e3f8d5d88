"""Try the engine by hand: `python -m app.generate --model checkpoints/tiny-target "def add("`."""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402

from app.config import EngineConfig  # noqa: E402
from app.engine.engine import LLMEngine  # noqa: E402
from app.sampling_params import SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("prompts", nargs="+", help="one or more prompts, run as one batch")
    parser.add_argument("--model", default="checkpoints/tiny-target", help="local checkpoint directory")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=1024)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, device=args.device,
                                    num_kv_blocks=args.num_kv_blocks))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in args.prompts]
    start = time.perf_counter()
    outputs = engine.generate(prompt_ids, params)
    elapsed = time.perf_counter() - start
    for prompt, output in zip(args.prompts, outputs):
        print(f"--- {prompt!r}\n{prompt}{tokenizer.decode(output)}")
    total = sum(map(len, outputs))
    print(f"--- {total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tokens/s)")


if __name__ == "__main__":
    main()
