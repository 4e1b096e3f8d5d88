"""Offline throughput: the same 200 requests through specserve's engine, through transformers
`generate` in static batches of 32, and through transformers' continuous batching
(`generate_batch`), in one run. Prints useful output tokens/s of each and the ratios.

    python benchmarks/offline_throughput.py --model checkpoints/tiny-target
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402

from app.config import EngineConfig  # noqa: E402
from app.engine.engine import LLMEngine  # noqa: E402
from app.sampling_params import SamplingParams  # noqa: E402


def make_workload(n: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """Random-token prompts of 16-512 tokens with 16-256 output tokens each (vLLM's random set)."""
    rng = random.Random(seed)
    return [([rng.randrange(10, vocab) for _ in range(rng.randint(16, 512))], rng.randint(16, 256))
            for _ in range(n)]


def run_engine(model: str, workload, max_num_seqs: int, max_num_batched_tokens: int) -> float:
    engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=4096, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens))
    params = [SamplingParams(max_tokens=out, temperature=0, ignore_eos=True) for _, out in workload]
    start = time.perf_counter()
    outputs = engine.generate([p for p, _ in workload], params)
    elapsed = time.perf_counter() - start
    assert [len(o) for o in outputs] == [out for _, out in workload]
    return elapsed


@torch.inference_mode()
def run_static_generate(model, workload, batch_size: int) -> float:
    """Left-padded static batches: each batch runs until its longest output; only each
    request's own tokens count as useful."""
    start = time.perf_counter()
    for i in range(0, len(workload), batch_size):
        batch = workload[i:i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        longest = max(out for _, out in batch)
        model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                       do_sample=False, pad_token_id=0, eos_token_id=None)
    return time.perf_counter() - start


def run_transformers_continuous(model, workload) -> float | None:
    """transformers' own continuous batching. It takes one max_new_tokens for all requests, so
    every request runs to the longest output; only each request's own tokens count."""
    longest = max(out for _, out in workload)
    config = GenerationConfig(max_new_tokens=longest, do_sample=False, eos_token_id=None, pad_token_id=0)
    try:
        start = time.perf_counter()
        outputs = model.generate_batch([p for p, _ in workload], generation_config=config, progress_bar=False)
        elapsed = time.perf_counter() - start
        done = [len(o.generated_tokens) for o in outputs.values()]
        if len(done) != len(workload) or min(done) < longest:
            raise RuntimeError(f"{len(done)} of {len(workload)} requests came back complete")
        return elapsed
    except Exception as exc:  # not every transformers version runs it on the CPU
        print(f"transformers generate_batch did not run here: {type(exc).__name__}: {exc}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="checkpoints/tiny-target")
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="static batch size for generate")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-continuous", action="store_true", help="skip transformers generate_batch")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    workload = make_workload(args.num_requests, hf.config.vocab_size, args.seed)
    useful = sum(out for _, out in workload)
    print(f"{len(workload)} requests, {sum(len(p) for p, _ in workload)} prompt tokens, "
          f"{useful} output tokens, torch threads {torch.get_num_threads()}")

    results = {"specserve engine": run_engine(args.model, workload, args.max_num_seqs,
                                              args.max_num_batched_tokens),
               f"transformers generate, static batches of {args.batch_size}":
                   run_static_generate(hf, workload, args.batch_size)}
    if not args.skip_continuous:
        cb = run_transformers_continuous(hf, workload)
        if cb is not None:
            results["transformers generate_batch (continuous)"] = cb
    base = results[f"transformers generate, static batches of {args.batch_size}"]
    print(f"\n{'system':<48} {'seconds':>8} {'useful tok/s':>13} {'vs static':>10}")
    for name, seconds in results.items():
        print(f"{name:<48} {seconds:8.1f} {useful / seconds:13.1f} {base / seconds:9.2f}x")


if __name__ == "__main__":
    main()
