"""Speculative decoding: target alone vs target + draft model (prompt lookup first, and without
it) vs target + n-gram lookup (from 1-token matches, and from 3-token ones as served by
default, with and without the lookup in recent outputs), at several batch sizes, on an
input-grounded workload (repeat a code snippet given in the prompt) and on open-ended prompts,
in one run. Greedy, so all of them produce the same tokens; prints
output tokens/s, mean request latency, the speed-up over the target alone, the median time of
an `engine.step` call that launched a plain step and of one that launched a drafting step (what
a verification costs against a plain step, on this device), the acceptance rate and the mean
accepted length (tokens per speculative step). Each cell runs
`--prompts-per-cell` prompts (16), its own (no cell or repeat runs a prompt another ran), in
groups of its batch size, one group after another: the
grounded prompts differ in how well the model copies them (benchmarks/RESULTS.md, 2026-11-26).

    python benchmarks/spec.py --batch-sizes 1 4 16 64 --output-len 64

The draft model runs in-process (`DraftWorker`, the code the DraftModel deployment runs), so
this measures the engine, not the Serve hop. k is the engine's default: chosen per batch size
by adaptive speculation, up to --num-speculative-tokens (or within `--schedule`);
`--compare-fixed` adds the draft model with k by the schedule alone (`adaptive_speculation:
false`, the device's default schedule unless `--schedule` is given). The engines are reused
across cells, as a server's engine is across requests, so what adaptive speculation learned
in one cell carries into the next.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The repository on sys.path: run as a script, only this folder is.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from app.config import EngineConfig  # noqa: E402
from app.engine.engine import LLMEngine  # noqa: E402
from app.sampling_params import SamplingParams  # noqa: E402
from benchmarks.grounded_prompts import input_grounded_texts, open_ended_texts  # noqa: E402


def workloads(tokenizer, n: int, seed: int) -> dict[str, list[list[int]]]:
    """input-grounded: the snippet, then an instruction to repeat it and its first line again
    (the model continues by copying); open-ended: the first two lines of a snippet."""
    return {"input-grounded": [tokenizer.encode(t) for t in input_grounded_texts(n, seed)],
            "open-ended": [tokenizer.encode(t) for t in open_ended_texts(n, seed)]}


def run(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> dict:
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    before = engine.stats().spec
    before_drafts, before_tokens, before_accepted = before.num_drafts, before.num_draft_tokens, before.num_accepted_tokens
    start = time.perf_counter()
    finish: dict[str, float] = {}
    ids = [f"r{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    tokens = 0
    steps_by_k = engine.speculator.stats.steps_by_k if engine.speculator is not None else {}
    call_ms: dict[str, list[float]] = {"plain": [], "drafting": []}  # by the step each call launched
    while engine.has_unfinished_requests():
        drafted_before, called = drafting_steps(steps_by_k), time.perf_counter()
        for out in engine.step():
            tokens += len(out.new_token_ids)
            if out.finished:
                finish[out.request_id] = time.perf_counter() - start
        kind = "drafting" if drafting_steps(steps_by_k) > drafted_before else "plain"
        call_ms[kind].append(1000 * (time.perf_counter() - called))
    elapsed = time.perf_counter() - start
    spec = engine.stats().spec
    return summary(seconds=elapsed, tokens=tokens, latencies=list(finish.values()),
                   drafts=spec.num_drafts - before_drafts, draft_tokens=spec.num_draft_tokens - before_tokens,
                   accepted=spec.num_accepted_tokens - before_accepted,
                   steps_by_k={k: n - before.steps_by_k.get(k, 0) for k, n in spec.steps_by_k.items()
                               if n > before.steps_by_k.get(k, 0)}, call_ms=call_ms)


def drafting_steps(steps_by_k: dict[int, int]) -> int:
    return sum(n for k, n in steps_by_k.items() if k > 0)


def run_cell(engine: LLMEngine, prompts: list[list[int]], batch: int, output_len: int) -> dict:
    """`prompts` in groups of `batch`, one group after another, pooled: a cell measures them all,
    not only the first `batch` (one prompt can copy far better than the workload does)."""
    parts = [run(engine, prompts[i:i + batch], output_len) for i in range(0, len(prompts) - batch + 1, batch)]
    steps_by_k = sum((Counter(p["steps_by_k"]) for p in parts), Counter())
    return summary(seconds=sum(p["seconds"] for p in parts), tokens=sum(p["tokens"] for p in parts),
                   latencies=[t for p in parts for t in p["latencies"]],
                   drafts=sum(p["drafts"] for p in parts), draft_tokens=sum(p["draft_tokens"] for p in parts),
                   accepted=sum(p["accepted"] for p in parts), steps_by_k=dict(steps_by_k),
                   call_ms={kind: [ms for p in parts for ms in p["call_ms"][kind]] for kind in ("plain", "drafting")})


def summary(seconds: float, tokens: int, latencies: list[float], drafts: int, draft_tokens: int,
            accepted: int, steps_by_k: dict[int, int], call_ms: dict[str, list[float]]) -> dict:
    """`call_ms`: the wall time of each `engine.step` call, by whether the step it launched
    drafted (with overlapped scheduling a call also finishes the step before)."""
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "call_ms": call_ms, "median_call_ms": {kind: statistics.median(ms) for kind, ms in call_ms.items() if ms},
            "latencies": latencies, "mean_latency_s": sum(latencies) / len(latencies),
            "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "mean_accepted_length": 1 + accepted / drafts if drafts else None, "steps_by_k": steps_by_k}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="checkpoints/tiny-target")
    parser.add_argument("--draft-model", default="checkpoints/tiny-draft")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--schedule", default=None, help="batch:k thresholds, e.g. 1:4,8:2,32:0")
    parser.add_argument("--compare-fixed", action="store_true",
                        help="also run the draft model with k by the schedule alone (no adaptation)")
    parser.add_argument("--prompts-per-cell", type=int, default=16,
                        help="prompts each cell runs, in groups of its batch size (at least one group; "
                             "1: only the first batch, as before 2026-11-26)")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per cell")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    schedule = None
    if args.schedule:
        schedule = {int(b): int(k) for b, k in (x.split(":") for x in args.schedule.split(","))}

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    num_prompts = max(*args.batch_sizes, args.prompts_per_cell)

    def prompts_for(workload: str, batch: int, repeat: int) -> list[list[int]]:
        """Each cell and repeat its own prompts (every method the same ones): the engines are
        reused, and n-gram lookup's recent outputs would replay the answer to a prompt run twice."""
        return workloads(tokenizer, num_prompts, hash((args.seed, batch, repeat)) & 0x7FFFFFFF)[workload]

    work = workloads(tokenizer, num_prompts, args.seed)
    common = dict(model=args.model, num_kv_blocks=4096, max_num_seqs=max(args.batch_sizes),
                  num_speculative_tokens=args.num_speculative_tokens, speculation_schedule=schedule)
    engines = {"target alone": LLMEngine(EngineConfig(**common)),
               "target + draft": LLMEngine(EngineConfig(**common, speculative_method="draft",
                                                        draft_model=args.draft_model)),
               "draft, no lookup": LLMEngine(EngineConfig(**common, speculative_method="draft",
                                                          draft_model=args.draft_model, prompt_lookup_first=False)),
               "target + n-gram": LLMEngine(EngineConfig(**common, speculative_method="ngram")),
               "n-gram, 3-token matches": LLMEngine(EngineConfig(**common, speculative_method="ngram",
                                                                 prompt_lookup_min=3)),  # as served
               "n-gram 3, own tokens": LLMEngine(EngineConfig(**common, speculative_method="ngram",
                                                              prompt_lookup_min=3, lookup_recent_output_tokens=0))}
    if args.compare_fixed:
        engines["draft, fixed k"] = LLMEngine(EngineConfig(**common, speculative_method="draft",
                                                           draft_model=args.draft_model, adaptive_speculation=False))
    for engine in engines.values():  # warm up (first-call allocations, thread pools)
        run(engine, work["open-ended"][:2], 8)

    results = []
    print(f"output_len={args.output_len} k={args.num_speculative_tokens} schedule="
          f"{engines['target + draft'].speculator.schedule.as_dict()} (adaptive) threads={torch.get_num_threads()} "
          f"prompts per cell={args.prompts_per_cell}")
    for workload in work:
        for batch in args.batch_sizes:
            cells = {}
            for repeat in range(args.repeats):  # methods interleaved, so drift hits all alike
                prompts = prompts_for(workload, batch, repeat)
                for name, engine in engines.items():
                    r = run_cell(engine, prompts[:max(batch, args.prompts_per_cell)], batch, args.output_len)
                    if name not in cells or r["seconds"] < cells[name]["seconds"]:
                        cells[name] = r
            base = cells["target alone"]["tokens_per_s"]
            for name, r in cells.items():
                del r["latencies"], r["call_ms"]
                r.update(workload=workload, batch=batch, method=name, speedup=r["tokens_per_s"] / base)
                results.append(r)
                calls = " ".join(f"{kind} {ms:.2f}" for kind, ms in r["median_call_ms"].items())
                acc = f"  median call ms: {calls}" + ("" if r["acceptance_rate"] is None else (
                    f" acceptance {r['acceptance_rate']:.2f} mean accepted length {r['mean_accepted_length']:.2f}"
                    f" steps by k {dict(sorted(r['steps_by_k'].items()))}"))
                print(f"{workload:15s} batch {batch:3d} {name:16s} {r['tokens_per_s']:8.1f} tok/s "
                      f"latency {r['mean_latency_s'] * 1000:8.1f} ms  {r['speedup']:.2f}x{acc}", flush=True)
    if args.result_json:
        Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.result_json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
