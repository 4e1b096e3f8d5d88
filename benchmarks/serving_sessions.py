"""`benchmarks/serving.py --dataset sessions`: conversations sent turn by turn, each prompt
carrying the answers streamed so far, one load level per `--request-rate`."""

from __future__ import annotations

import asyncio

import numpy as np

from benchmarks.serving_report import Result, print_summary, summarize
from benchmarks.serving_workload import Request, Session, shared_prefix_sessions, start_at_rate


async def run_sessions(send, sessions: list[Session], rate: float, think_time_s: float, seed: int
                       ) -> tuple[list[Result], float]:
    """Sessions start at `rate` per second (Poisson); each sends its turns one after another,
    the user thinking for a while (exponential, mean `think_time_s`) before each question after
    the first, every prompt carrying the answers streamed so far. A failed turn ends its session."""

    async def one(numbered: tuple[int, Session]) -> list[Result]:
        number, session = numbered
        thinking = np.random.default_rng((seed, number))  # the same pauses in every run
        history, results = session.system, []
        for turn, question in enumerate(session.questions):
            if turn and think_time_s > 0:
                await asyncio.sleep(float(thinking.exponential(think_time_s)))
            prompt = history + question
            res = await send(Request(prompt, 0, session.output_len))
            results.append(res)
            if not res.success:
                break
            history = prompt + res.text
        return results

    per_session, duration = await start_at_rate(list(enumerate(sessions)), one, rate, np.random.default_rng(seed))
    return [r for rs in per_session for r in rs], duration


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
        pooled, duration = [], 0.0
        for _ in range(args.rounds):
            results, seconds = await run_sessions(send, sessions, rate, args.think_time, args.seed)
            pooled, duration = pooled + results, duration + seconds
        level = {"concurrency": None, "request_rate": rate, "http": summarize(pooled, duration, goodput)}
        print_summary(f"sessions, {rate} per second ({args.rounds} round{'s' if args.rounds > 1 else ''})",
                      level["http"])
        levels.append(level)
    return levels
