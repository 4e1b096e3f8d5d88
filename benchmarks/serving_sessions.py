"""`benchmarks/serving.py --dataset sessions`: conversations sent turn by turn, each prompt
carrying the answers streamed so far, one load level per `--request-rate`."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from benchmarks.serving_report import Result, print_summary, summarize
from benchmarks.serving_workload import Request, Session, shared_prefix_sessions, start_at_rate


async def run_sessions(send, sessions: list[Session], rate: float, think_time_s: float, seed: int,
                       sent: list[tuple[float, str]] | None = None) -> tuple[list[Result], float]:
    """Sessions start at `rate` per second (Poisson); each sends its turns one after another,
    the user thinking for a while (exponential, mean `think_time_s`) before each question after
    the first, every prompt carrying the answers streamed so far. A failed turn ends its session.
    `sent`, when given, collects (time sent, prompt) of every turn."""

    async def one(numbered: tuple[int, Session]) -> list[Result]:
        number, session = numbered
        thinking = np.random.default_rng((seed, number))  # the same pauses in every run
        history, results = session.system, []
        for turn, question in enumerate(session.questions):
            if turn and think_time_s > 0:
                await asyncio.sleep(float(thinking.exponential(think_time_s)))
            prompt = history + question
            if sent is not None:
                sent.append((time.perf_counter(), prompt))
            res = await send(Request(prompt, 0, session.output_len))
            results.append(res)
            if not res.success:
                break
            history = prompt + res.text
        return results

    per_session, duration = await start_at_rate(list(enumerate(sessions)), one, rate, np.random.default_rng(seed))
    return [r for rs in per_session for r in rs], duration


def live_prefix_blocks(sent: list[tuple[float, str]], tokenizer, block_size: int = 16) -> dict[str, float]:
    """The live prefix set of a run, in full blocks: at each moment a prompt was sent, the
    blocks (each keyed by the whole prefix it ends, as the engine's block hashes are) that
    some prompt had used before and some prompt will use again. A cache that held them all
    would miss only first uses; the issue-20 workload wants this between one pool and two.
    Mean and peak over the middle three fifths of the run (the start and end are ramps)."""
    spans: dict[bytes, list[float]] = {}
    for at, prompt in sent:
        ids = np.asarray(tokenizer.encode(prompt), dtype=np.int64)
        for end in range(block_size, len(ids) + 1, block_size):
            key = ids[:end].tobytes()
            first_last = spans.setdefault(key, [at, at])
            first_last[0], first_last[1] = min(first_last[0], at), max(first_last[1], at)
    reused = np.array([fl for fl in spans.values() if fl[1] > fl[0]]).reshape(-1, 2)
    times = sorted(at for at, _ in sent)
    middle = times[len(times) // 5: 4 * len(times) // 5] or times
    live = [int(((reused[:, 0] <= t) & (t < reused[:, 1])).sum()) for t in middle]
    return {"mean": float(np.mean(live)) if live else 0.0, "peak": float(max(live, default=0))}


async def run_session_levels(args, send, tokenizer, goodput: dict) -> list[dict]:
    """`--dataset sessions`: one level per `--request-rate` (sessions started per second), no
    warm-up (the caches start cold, as after a deployment) and no engine-alone side."""
    if tokenizer is None:
        raise SystemExit("sessions need a tokenizer: give --tokenizer (a local checkpoint dir)")
    if args.compare_engine:
        raise SystemExit("--dataset sessions has no engine-alone side (--compare-engine)")
    sessions = shared_prefix_sessions(tokenizer, args.num_prompts, args.num_system_prompts, args.system_len,
                                      args.turns, args.input_len, args.output_len, args.seed)
    levels = []
    for rate in args.request_rate or [float("inf")]:
        pooled, duration, live = [], 0.0, []
        for _ in range(args.rounds):
            sent: list[tuple[float, str]] = []
            results, seconds = await run_sessions(send, sessions, rate, args.think_time, args.seed, sent)
            pooled, duration = pooled + results, duration + seconds
            live.append(live_prefix_blocks(sent, tokenizer))
        level = {"concurrency": None, "request_rate": rate, "http": summarize(pooled, duration, goodput),
                 "live_prefix_blocks": {k: float(np.mean([x[k] for x in live])) for k in ("mean", "peak")}}
        print_summary(f"sessions, {rate} per second ({args.rounds} round{'s' if args.rounds > 1 else ''})",
                      level["http"])
        print(f"live prefix set (blocks of 16): mean {level['live_prefix_blocks']['mean']:.0f}, "
              f"peak {level['live_prefix_blocks']['peak']:.0f}")
        levels.append(level)
    return levels
