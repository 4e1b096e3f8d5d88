"""Predicted outputs (OpenAI's `prediction`): one engine as served (n-gram speculation from 3-token
matches, adaptive k), open-ended code prompts whose answers the prompt does not hold, greedy. Each
prompt is run without a prediction, with its own answer as the prediction (what a client editing a
file sends when few lines change) and with that answer edited (a span of it replaced every
--edit-every tokens: the output leaves the prediction and finds it again), the three alternated in
every round. Prints tokens/s, the ratio of each over no prediction per round and their medians,
the prediction tokens accepted (OpenAI's: those the output holds), and whether every output equals
the one without a prediction.

    python benchmarks/prediction.py --rounds 5 --output-len 128 --batch 1

The prediction goes in as token ids (the ingress tokenizes `prediction.content`), so this is the
engine, not the Serve hop.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from app.config import EngineConfig  # noqa: E402
from app.engine.engine import LLMEngine  # noqa: E402
from app.sampling_params import SamplingParams  # noqa: E402
from benchmarks.grounded_prompts import open_ended_texts  # noqa: E402


def edited(answer: list[int], every: int, replaced: int = 4) -> list[int]:
    """The answer with `replaced` tokens swapped for others every `every` tokens."""
    out = list(answer)
    for start in range(every // 2, len(out) - replaced, every):
        out[start:start + replaced] = [(t + 7) % 1000 for t in out[start:start + replaced]]
    return out


def timed(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], batch: int):
    """(tokens/s, outputs, prediction tokens accepted) over the prompts in groups of `batch`."""
    outputs, tokens, kept = [], 0, 0
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        ids = [f"p{i + j}-{time.monotonic_ns()}" for j in range(len(prompts[i:i + batch]))]
        for rid, prompt, p in zip(ids, prompts[i:i + batch], params[i:i + batch]):
            engine.add_request(rid, prompt, p)
        got, last = {rid: [] for rid in ids}, {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                got[out.request_id] += out.new_token_ids
                last[out.request_id] = out
        outputs += [got[rid] for rid in ids]
        tokens += sum(len(got[rid]) for rid in ids)
        kept += sum(last[rid].num_accepted_prediction_tokens for rid in ids)
    return tokens / (time.perf_counter() - start), outputs, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="checkpoints/tiny-target")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--edit-every", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [tokenizer.encode(t) for t in open_ended_texts(args.prompts, args.seed)]
    engine = LLMEngine(EngineConfig(model=args.model, num_kv_blocks=4096, max_num_seqs=max(args.batch, 8),
                                    speculative_method="ngram", prompt_lookup_min=3,
                                    lookup_recent_output_tokens=0))  # no answer replayed from an earlier round
    plain = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    timed(engine, prompts[:2], [dataclasses.replace(plain, max_tokens=8)] * 2, 2)  # warm up
    _, answers, _ = timed(engine, prompts, [plain] * len(prompts), args.batch)
    def predicting(predictions: list[list[int]]) -> list[SamplingParams]:
        return [dataclasses.replace(plain, prediction_token_ids=p) for p in predictions]

    kinds = {"none": [plain] * len(prompts), "right": predicting(answers),
             f"edited every {args.edit_every}": predicting([edited(a, args.edit_every) for a in answers])}
    print(f"batch {args.batch}, {len(prompts)} prompts x {args.output_len} tokens, threads {torch.get_num_threads()}")
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds if kind != "none"}
    for round_ in range(args.rounds):
        order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
        speed = {}
        for kind in order:
            speed[kind], outputs, kept = timed(engine, prompts, kinds[kind], args.batch)
            same = outputs == answers
            print(f"round {round_} {kind:16s} {speed[kind]:7.1f} tok/s  prediction tokens accepted {kept:5d}  "
                  f"outputs {'the same' if same else 'DIFFERENT'}", flush=True)
        for kind in ratios:
            ratios[kind].append(speed[kind] / speed["none"])
    for kind, values in ratios.items():
        rounds = " ".join(f"{r:.2f}" for r in values)
        print(f"{kind}: over none {rounds}  median {statistics.median(values):.2f}x")


if __name__ == "__main__":
    main()
