#!/usr/bin/env python
"""Online serving benchmark for specserve (after vLLM's `benchmark_serving`).

Sends a workload to `/v1/completions` (or, with `--endpoint /v1/chat/completions`, each
prompt as one user message to chat) at a fixed request rate (Poisson arrivals, `inf` for
all at once) and/or a concurrency limit, streams every response, and reports TTFT, TPOT, ITL
and e2e latency (mean, p50, p90, p99), request and token throughput, and goodput under
`--goodput` objectives. Several `--concurrency` (or `--request-rate`) values run one after
the other as load levels; `--plot` draws latency against load. `--compare-engine CKPT` runs
the same requests through the engine alone, in this process, at each level and prints the
ratio of HTTP e2e latency to engine-alone e2e latency: the cost of Serve, HTTP and SSE.
`--rounds N` runs each level N times, HTTP and engine alone alternating, and pools them (on a
shared machine a single pair of runs gives ratios ±0.1 apart: benchmarks/RESULTS.md).

    serve run serve_config.yaml &
    python benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 64 \\
        --concurrency 1 8 32 --input-len 128 --output-len 64 \\
        --result-json benchmarks/out/serving.json --plot benchmarks/out/serving.png \\
        --compare-engine checkpoints/tiny-target

Against vLLM's OpenAI server with this same client and workload, alternated with specserve's
app and printed as ratios: `benchmarks/serving_compare.py --servers specserve vllm`.

ITL is measured per streamed chunk (a chunk can carry several tokens when speculation
accepts them); TPOT per request is (e2e - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp
import numpy as np

try:
    from tqdm.asyncio import tqdm
except ImportError:  # pragma: no cover - tqdm is in the `bench` extra
    tqdm = None

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks`, and `app` for --compare-engine

from benchmarks.engine_alone import EngineAlone  # noqa: E402
from benchmarks.serving_report import Result, plot, print_summary, summarize  # noqa: E402
from benchmarks.serving_sessions import run_session_levels  # noqa: E402
from benchmarks.serving_workload import (Request, file_requests, grounded_requests, load_tokenizer,  # noqa: E402
                                         random_requests, start_at_rate)

# -- one streamed request ---------------------------------------------------------------------
async def send_http(session: aiohttp.ClientSession, url: str, model: str, req: Request,
                    args) -> Result:
    chat = url.endswith("/chat/completions")
    prompt = {"messages": [{"role": "user", "content": req.prompt}]} if chat else {"prompt": req.prompt}
    payload = {"model": model, **prompt, "max_tokens": req.output_len,
               "temperature": args.temperature, "stream": True,
               "stream_options": {"include_usage": True}}
    if args.top_p < 1:
        payload["top_p"] = args.top_p
    if args.ignore_eos:
        payload["ignore_eos"] = True
    res = Result(prompt_len=req.prompt_len)
    start = time.perf_counter()
    last = start
    chunks = 0
    try:
        async with session.post(url, json=payload) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return res
            async for raw in resp.content:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                body = json.loads(data)
                if "error" in body:
                    res.error = str(body["error"])[:300]
                    return res
                now = time.perf_counter()
                texts = [streamed_text(c, chat) for c in body.get("choices") or []]
                res.text += "".join(texts)
                if any(texts):
                    if chunks == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += 1
                usage = body.get("usage")
                if usage:
                    res.prompt_len = usage.get("prompt_tokens", res.prompt_len)
                    res.output_len = usage.get("completion_tokens", 0)
        res.latency = time.perf_counter() - start
        res.output_len = res.output_len or chunks  # a server without usage: count chunks
        res.success = chunks > 0
        if not res.success:
            res.error = "no tokens streamed"
    except Exception as exc:  # noqa: BLE001 - any failure is one failed request
        res.error = f"{type(exc).__name__}: {exc}"
    return res


# -- running a load level ---------------------------------------------------------------------
def streamed_text(choice: dict, chat: bool) -> str:
    """A streamed chunk's new text: a completion's, or a chat delta's answer and reasoning."""
    if not chat:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("reasoning") or "") + (delta.get("content") or "")


async def run_level(send, requests: list[Request], rate: float, concurrency: int | None,
                    seed: int, desc: str, show_progress: bool) -> tuple[list[Result], float]:
    rng = np.random.default_rng(seed)
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    bar = tqdm(total=len(requests), desc=desc, leave=False) if show_progress and tqdm else None

    async def one(req: Request) -> Result:
        if limit is None:
            res = await send(req)
        else:
            async with limit:
                res = await send(req)
        if bar is not None:
            bar.update(1)
        return res

    results, duration = await start_at_rate(requests, one, rate, rng)
    if bar is not None:
        bar.close()
    return results, duration


async def warm_up(send, requests: list[Request], num: int | None, concurrency: int | None
                  ) -> list[Result]:
    """Requests sent before a level is timed, `concurrency` at a time: by default one batch of
    the level's size, so that neither side meets its first batch of that size while timed (the
    engine-alone side is built moments before its first level; see RESULTS.md)."""
    num = num if num is not None else (concurrency or 1)
    limit = asyncio.Semaphore(concurrency or 1)

    async def one(req: Request) -> Result:
        async with limit:
            return await send(req)

    return list(await asyncio.gather(*(one(req) for req in requests[:num])))


# -- main -------------------------------------------------------------------------------------
def parse_goodput(items: list[str] | None) -> dict[str, float]:
    out = {}
    for item in items or []:
        key, _, value = item.partition(":")
        if key not in ("ttft", "tpot", "e2el") or not value:
            raise SystemExit(f"--goodput takes ttft:MS, tpot:MS or e2el:MS, got {item!r}")
        out[key] = float(value)
    return out


def parse_engine_args(items: list[str] | None) -> dict:
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


async def model_card(session: aiohttp.ClientSession, base_url: str) -> dict:
    async with session.get(f"{base_url}/v1/models") as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]


async def main_async(args) -> dict:
    goodput = parse_goodput(args.goodput)
    base_url = args.base_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=6 * 3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        model_is_dir = bool(args.model) and os.path.isdir(args.model)
        card = None
        if args.served_model_name is None and (not args.model or model_is_dir):
            card = await model_card(session, base_url)
        model = args.served_model_name or (card["id"] if card else args.model)
        # A tokenizer for the prompts: given, the --model dir, the engine checkpoint, or the
        # directory the server says it loaded (when this client runs on the same machine).
        tokenizer_path = args.tokenizer or (args.model if model_is_dir else None) or args.compare_engine
        if tokenizer_path is None and card and card.get("root") and os.path.isdir(card["root"]):
            tokenizer_path = card["root"]
        return await run_all(args, session, f"{base_url}{args.endpoint}", model,
                             load_tokenizer(tokenizer_path), goodput)


def requests_for(args, tokenizer, level: int, run: int) -> list[Request]:
    """The prompts of one run of one level (`run` -1: its warm-up). Each run gets prompts no
    earlier run had, so that no cache has seen them: neither the prefix cache nor the recent
    outputs n-gram lookup drafts from, which would replay a repeated greedy prompt's answer
    (`--repeat-prompts`: the same prompts in every run, as before 2026-11-26)."""
    seed = args.seed if args.repeat_prompts else hash((args.seed, level, run)) & 0x7FFFFFFF
    if args.dataset == "random":
        return random_requests(tokenizer, args.num_prompts, args.input_len, args.output_len,
                               args.range_ratio, seed)
    if args.dataset == "grounded":
        return grounded_requests(tokenizer, args.num_prompts, args.output_len, seed)
    return file_requests(tokenizer, args.text_file, args.num_prompts, args.input_len, args.output_len, seed)


async def run_sides(sides: dict, requests_for_run, rate: float, conc: int | None, args,
                    goodput: dict, show: bool) -> dict:
    """One load level on every side ("http", and "engine" with --compare-engine), `--rounds`
    times, the sides alternating (ABBA) so that a noisy machine's slow minutes fall on both;
    each side's figures pool its rounds, and the Serve overhead is their ratio. Both sides
    get the same prompts in a round (`requests_for_run(round)`, -1 for the warm-up)."""
    level: dict = {"concurrency": conc, "request_rate": rate}
    pooled: dict[str, tuple[list[Result], float]] = {name: ([], 0.0) for name in sides}
    per_round = []
    warm_ups = requests_for_run(-1)
    for r in range(args.rounds):
        means = {}
        requests = requests_for_run(r)
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            if r == 0:
                for warm in await warm_up(sides[name], warm_ups, args.num_warmups, conc):
                    if not warm.success:
                        raise SystemExit(f"{name} warm-up request failed: {warm.error}")
            results, duration = await run_level(sides[name], requests, rate, conc, args.seed,
                                                f"{name} c={conc} rate={rate} round {r + 1}", show)
            pooled[name] = (pooled[name][0] + results, pooled[name][1] + duration)
            means[name] = float(np.mean([x.latency for x in results if x.success] or [math.nan]))
        if "engine" in means:
            per_round.append(means["http"] / means["engine"])
    for name, (results, duration) in pooled.items():
        level[name] = summarize(results, duration, goodput)
        print_summary(f"{'HTTP' if name == 'http' else 'engine alone'} concurrency={conc} rate={rate}"
                      f" ({args.rounds} round{'s' if args.rounds > 1 else ''})", level[name])
        if args.save_detailed:
            level[f"{name}_requests"] = [asdict(x) for x in results]
    if "engine" in level:
        http, eng = level["http"], level["engine"]
        level["serve_overhead_e2e_mean"] = http["mean_e2el_ms"] / eng["mean_e2el_ms"]
        level["serve_overhead_e2e_p50"] = http["p50_e2el_ms"] / eng["p50_e2el_ms"]
        level["serve_overhead_ttft_mean"] = http["mean_ttft_ms"] / eng["mean_ttft_ms"]
        level["serve_overhead_e2e_mean_per_round"] = per_round
        if http["total_input_tokens"] != eng["total_input_tokens"]:
            print(f"note: the server counted {http['total_input_tokens']} prompt tokens, the engine-alone "
                  f"run {eng['total_input_tokens']}: the ingress tokenizes differently (special tokens?)")
    return level


async def run_all(args, session, url: str, model: str, tokenizer, goodput: dict) -> dict:
    if args.dataset == "sessions":
        report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "model": model,
                  "levels": await run_session_levels(args, lambda req: send_http(session, url, model, req, args),
                                                     tokenizer, goodput)}
        if args.result_json:
            Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.result_json).write_text(json.dumps(report, indent=2, default=str))
        return report
    if args.dataset == "random" and tokenizer is None:
        raise SystemExit("random prompts need a tokenizer: give --tokenizer (a local checkpoint dir)")
    rates = args.request_rate or [float("inf")]
    concurrencies = args.concurrency or [None]
    levels = [(r, c) for c in concurrencies for r in rates]
    x_key = "request_rate" if len(rates) > 1 and len(concurrencies) == 1 else "concurrency"

    show = not args.disable_tqdm
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "model": model,
                    "levels": []}
    sides = {"http": lambda req: send_http(session, url, model, req, args)}
    engine = None
    if args.compare_engine:
        engine = EngineAlone(args.compare_engine, tokenizer or load_tokenizer(args.compare_engine),
                             parse_engine_args(args.engine_arg), args.engine_torch_threads)
        report["engine_torch_threads"] = engine.threads
        sides["engine"] = lambda req: engine.send(req, args)
    try:
        for number, (rate, conc) in enumerate(levels):
            report["levels"].append(await run_sides(
                sides, lambda run, level=number: requests_for(args, tokenizer, level, run), rate, conc, args,
                goodput, show))
    finally:
        if engine is not None:
            engine.shutdown()
    if engine is not None:
        print("=" * 18 + " Serve overhead (HTTP / engine alone) " + "=" * 10)
        print(f"{'concurrency':>12}{'rate':>8}{'e2e mean':>12}{'e2e p50':>12}{'TTFT mean':>12}"
              f"  per round (e2e mean)")
        for lv in report["levels"]:
            print(f"{str(lv['concurrency']):>12}{lv['request_rate']:>8}"
                  f"{lv['serve_overhead_e2e_mean']:>12.3f}{lv['serve_overhead_e2e_p50']:>12.3f}"
                  f"{lv['serve_overhead_ttft_mean']:>12.3f}  "
                  + " ".join(f"{r:.3f}" for r in lv["serve_overhead_e2e_mean_per_round"]))

    if args.result_json:
        Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.result_json, "w") as f:
            json.dump(report, f, indent=2, default=str)
        print(f"results written to {args.result_json}")
    if args.plot:
        plot(report["levels"], x_key, args.plot)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", help="model name sent in requests, or a local checkpoint dir "
                   "(then also the tokenizer); default: the first id of /v1/models")
    p.add_argument("--served-model-name", help="name to send when --model is a directory")
    p.add_argument("--tokenizer", help="local tokenizer dir (default: --model or --compare-engine)")
    p.add_argument("--dataset", choices=["random", "file", "grounded", "sessions"], default="random",
                   help="grounded: prompts that ask to repeat the code they contain (speculation's best "
                        "case; of their own lengths, not --input-len); "
                        "sessions: --num-prompts conversations of --turns turns, each opening with one of "
                        "--num-system-prompts system prompts of --system-len tokens; a turn asks "
                        "--input-len new tokens and gets --output-len")
    p.add_argument("--text-file", help="local text file for --dataset file")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--num-system-prompts", type=int, default=4)
    p.add_argument("--system-len", type=int, default=1024)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--think-time", type=float, default=0.0,
                   help="sessions: mean seconds a user takes before the next question (exponential)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths drawn from [len * (1 - ratio), len]")
    p.add_argument("--request-rate", type=float, nargs="+",
                   help="requests/s, Poisson arrivals; inf sends all at once (default)")
    p.add_argument("--concurrency", type=int, nargs="+",
                   help="most requests in flight; several values run as several load levels")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let EOS end a request early (by default every request runs to --output-len)")
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="service-level objectives, e.g. ttft:500 tpot:50 (e2el too)")
    p.add_argument("--num-warmups", type=int,
                   help="untimed requests before each level (default: one batch of its concurrency)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat-prompts", action="store_true",
                   help="send the same prompts in every round, level and warm-up (by default each "
                        "gets its own, seeded by --seed, the level and the round)")
    p.add_argument("--result-json")
    p.add_argument("--rounds", type=int, default=1,
                   help="run each level this many times, alternating HTTP and --compare-engine (ABBA), "
                        "and pool the rounds: on a noisy machine the ratio is then less at the mercy of "
                        "when each side ran")
    p.add_argument("--save-detailed", action="store_true", help="per-request figures in the JSON")
    p.add_argument("--plot", help="PNG of latency and throughput against load")
    p.add_argument("--compare-engine", metavar="CHECKPOINT",
                   help="also run the requests through app.engine in this process")
    p.add_argument("--engine-arg", action="append", metavar="KEY=VALUE",
                   help="EngineConfig field for --compare-engine (repeatable), e.g. num_kv_blocks=512; "
                   "match the served replica's settings")
    p.add_argument("--engine-torch-threads", type=int,
                   help="torch threads for the engine-alone run (match the replica's)")
    p.add_argument("--disable-tqdm", action="store_true")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.dataset == "file" and not args.text_file:
        raise SystemExit("--dataset file needs --text-file")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
