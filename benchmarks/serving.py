#!/usr/bin/env python
"""Online serving benchmark for specserve (after vLLM's `benchmark_serving`).

Sends a workload to `/v1/completions` at a fixed request rate (Poisson arrivals, `inf` for
all at once) and/or a concurrency limit, streams every response, and reports TTFT, TPOT, ITL
and e2e latency (mean, p50, p90, p99), request and token throughput, and goodput under
`--goodput` objectives. Several `--concurrency` (or `--request-rate`) values run one after
the other as load levels; `--plot` draws latency against load. `--compare-engine CKPT` runs
the same requests through the engine alone, in this process, at each level and prints the
ratio of HTTP e2e latency to engine-alone e2e latency: the cost of Serve, HTTP and SSE.

    serve run serve_config.yaml &
    python benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 64 \\
        --concurrency 1 8 32 --input-len 128 --output-len 64 \\
        --result-json benchmarks/out/serving.json --plot benchmarks/out/serving.png \\
        --compare-engine checkpoints/tiny-target

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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

try:
    from tqdm.asyncio import tqdm
except ImportError:  # pragma: no cover - tqdm is in the `bench` extra
    tqdm = None

PERCENTILES = (50, 90, 99)


# -- workload ---------------------------------------------------------------------------------
@dataclass
class Request:
    prompt: str
    prompt_len: int  # as this client's tokenizer counts it
    output_len: int


def load_tokenizer(path: str | None):
    if path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def random_requests(tokenizer, num: int, input_len: int, output_len: int, range_ratio: float,
                    seed: int) -> list[Request]:
    """Prompts of random tokens from the vocabulary (special tokens left out), as text."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    vocab = np.array([i for i in range(len(tokenizer)) if i not in special])
    out = []
    for _ in range(num):
        n_in = max(1, int(rng.integers(int(input_len * (1 - range_ratio)), input_len + 1)))
        n_out = max(1, int(rng.integers(int(output_len * (1 - range_ratio)), output_len + 1)))
        ids = rng.choice(vocab, size=n_in).tolist()
        # Decoding then re-encoding can merge tokens: trim until the text is at most n_in long.
        text = tokenizer.decode(ids)
        for _ in range(4):
            re_ids = tokenizer.encode(text, add_special_tokens=False)
            if len(re_ids) <= n_in:
                break
            text = tokenizer.decode(re_ids[:n_in])
        out.append(Request(text, len(tokenizer.encode(text, add_special_tokens=False)), n_out))
    return out


def file_requests(tokenizer, path: str, num: int, input_len: int, output_len: int,
                  seed: int) -> list[Request]:
    """Windows of `input_len` tokens (words, without a tokenizer) from a local text file."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    rng = np.random.default_rng(seed)
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces = lambda a, b: tokenizer.decode(ids[a:b])  # noqa: E731
    else:
        ids = text.split()
        pieces = lambda a, b: " ".join(ids[a:b])  # noqa: E731
    if len(ids) <= input_len:
        raise SystemExit(f"{path} holds only {len(ids)} tokens; need more than --input-len {input_len}")
    starts = rng.integers(0, len(ids) - input_len, size=num)
    return [Request(pieces(s, s + input_len), input_len, output_len) for s in starts]


# -- one streamed request ---------------------------------------------------------------------
@dataclass
class Result:
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    output_len: int = 0
    error: str = ""


async def send_http(session: aiohttp.ClientSession, url: str, model: str, req: Request,
                    args) -> Result:
    payload = {"model": model, "prompt": req.prompt, "max_tokens": req.output_len,
               "temperature": args.temperature, "stream": True,
               "stream_options": {"include_usage": True}}
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
                if any(c.get("text") for c in body.get("choices") or []):
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


# -- the same request through the engine alone ------------------------------------------------
class EngineAlone:
    def __init__(self, checkpoint: str, tokenizer, engine_args: dict, threads: int | None):
        import torch

        from app.config import EngineConfig
        from app.engine.async_engine import AsyncLLMEngine

        if threads:
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        self.engine = AsyncLLMEngine(EngineConfig(model=checkpoint, **engine_args))
        self.tokenizer = tokenizer
        self.ids = 0

    async def send(self, req: Request, args) -> Result:
        from app.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=req.output_len, temperature=args.temperature,
                                ignore_eos=args.ignore_eos)
        prompt = self.tokenizer.encode(req.prompt)
        res = Result(prompt_len=len(prompt))
        self.ids += 1
        start = last = time.perf_counter()
        try:
            async for out in self.engine.generate(f"bench-{self.ids}", prompt, params):
                now = time.perf_counter()
                if out.new_token_ids:
                    if res.output_len == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.output_len += len(out.new_token_ids)
            res.latency = time.perf_counter() - start
            res.success = res.output_len > 0
        except Exception as exc:  # noqa: BLE001
            res.error = f"{type(exc).__name__}: {exc}"
        return res

    def shutdown(self) -> None:
        self.engine.shutdown()


# -- running a load level ---------------------------------------------------------------------
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

    tasks = []
    start = time.perf_counter()
    for req in requests:
        tasks.append(asyncio.create_task(one(req)))
        if math.isfinite(rate):
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return list(results), duration


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


def summarize(results: list[Result], duration: float, goodput: dict[str, float]) -> dict:
    ok = [r for r in results if r.success]
    ms = lambda xs: [x * 1000 for x in xs]  # noqa: E731
    ttft = ms(r.ttft for r in ok)
    tpot = ms((r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1)
    itl = ms(x for r in ok for x in r.itl)
    e2el = ms(r.latency for r in ok)
    out = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "total_input_tokens": sum(r.prompt_len for r in ok),
        "total_output_tokens": sum(r.output_len for r in ok),
        "request_throughput": len(ok) / duration,
        "output_throughput": sum(r.output_len for r in ok) / duration,
        "total_token_throughput": sum(r.prompt_len + r.output_len for r in ok) / duration,
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        arr = np.array(xs) if xs else np.array([float("nan")])
        out[f"mean_{name}_ms"] = float(np.mean(arr))
        out[f"std_{name}_ms"] = float(np.std(arr))
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = float(np.percentile(arr, p))
    if goodput:
        good = 0
        for r in ok:
            tpot_ms = (r.latency - r.ttft) / (r.output_len - 1) * 1000 if r.output_len > 1 else 0.0
            seen = {"ttft": r.ttft * 1000, "tpot": tpot_ms, "e2el": r.latency * 1000}
            good += all(seen[k] <= v for k, v in goodput.items())
        out["goodput"] = good / duration
        out["goodput_fraction"] = good / max(1, len(results))
    errors = [r.error for r in results if not r.success]
    if errors:
        out["first_error"] = errors[0]
    return out


def print_summary(title: str, s: dict) -> None:
    print(f"{'=' * 18} {title} {'=' * max(0, 30 - len(title))}")
    rows = [("Successful requests", s["completed"]), ("Failed requests", s["failed"]),
            ("Benchmark duration (s)", s["duration_s"]),
            ("Total input tokens", s["total_input_tokens"]),
            ("Total generated tokens", s["total_output_tokens"]),
            ("Request throughput (req/s)", s["request_throughput"]),
            ("Output token throughput (tok/s)", s["output_throughput"]),
            ("Total token throughput (tok/s)", s["total_token_throughput"])]
    if "goodput" in s:
        rows.append(("Request goodput (req/s)", s["goodput"]))
    for name, label in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        rows.append((f"-- {label} --", None))
        rows.append((f"Mean {name.upper()} (ms)", s[f"mean_{name}_ms"]))
        rows += [(f"P{p} {name.upper()} (ms)", s[f"p{p}_{name}_ms"]) for p in PERCENTILES]
    for label, value in rows:
        if value is None:
            print(label)
        elif isinstance(value, float):
            print(f"{label:<40}{value:>12.2f}")
        else:
            print(f"{label:<40}{value:>12}")
    if "first_error" in s:
        print(f"first error: {s['first_error']}")


def plot(levels: list[dict], x_key: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(lv[x_key]) for lv in levels]
    xs = list(range(len(levels)))  # one slot per level: concurrency 1, 8, 32 evenly spaced
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, label, style in (("p50_ttft_ms", "TTFT p50", "o-"), ("p99_ttft_ms", "TTFT p99", "o--"),
                              ("p50_tpot_ms", "TPOT p50", "s-"), ("p99_tpot_ms", "TPOT p99", "s--"),
                              ("p50_e2el_ms", "e2e p50", "^-"), ("p99_e2el_ms", "e2e p99", "^--")):
        ax1.plot(xs, [lv["http"][key] for lv in levels], style, label=label)
    if all("engine" in lv for lv in levels):
        ax1.plot(xs, [lv["engine"]["p50_e2el_ms"] for lv in levels], "k:", label="engine alone e2e p50")
    ax1.set_xlabel(x_key.replace("_", " "))
    ax1.set_ylabel("latency (ms)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=7, ncol=2, loc="upper left")
    ax1.grid(True, which="both", alpha=0.3)
    ax2.plot(xs, [lv["http"]["output_throughput"] for lv in levels], "o-", label="output tok/s (HTTP)")
    if all("engine" in lv for lv in levels):
        ax2.plot(xs, [lv["engine"]["output_throughput"] for lv in levels], "k:", label="engine alone")
    ax2.set_xlabel(x_key.replace("_", " "))
    ax2.set_ylabel("tokens / s")
    ax2.legend(fontsize=8)
    ax2.grid(True, alpha=0.3)
    for ax in (ax1, ax2):
        ax.set_xticks(xs, labels)
    fig.suptitle("specserve serving benchmark: latency and throughput against load")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


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


async def run_all(args, session, url: str, model: str, tokenizer, goodput: dict) -> dict:
    if args.dataset == "random":
        if tokenizer is None:
            raise SystemExit("random prompts need a tokenizer: give --tokenizer (a local checkpoint dir)")
        requests = random_requests(tokenizer, args.num_prompts, args.input_len, args.output_len,
                                   args.range_ratio, args.seed)
    else:
        requests = file_requests(tokenizer, args.text_file, args.num_prompts, args.input_len,
                                 args.output_len, args.seed)
    rates = args.request_rate or [float("inf")]
    concurrencies = args.concurrency or [None]
    levels = [(r, c) for c in concurrencies for r in rates]
    x_key = "request_rate" if len(rates) > 1 and len(concurrencies) == 1 else "concurrency"

    show = not args.disable_tqdm
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "model": model,
                    "levels": []}
    send = lambda req: send_http(session, url, model, req, args)  # noqa: E731
    for rate, conc in levels:
        for warm in await warm_up(send, requests, args.num_warmups, conc):
            if not warm.success:
                raise SystemExit(f"warm-up request failed: {warm.error}")
        results, duration = await run_level(send, requests, rate, conc, args.seed,
                                            f"HTTP c={conc} rate={rate}", show)
        s = summarize(results, duration, goodput)
        title = f"HTTP concurrency={conc} rate={rate}"
        print_summary(title, s)
        level = {"concurrency": conc, "request_rate": rate, "http": s}
        if args.save_detailed:
            level["http_requests"] = [asdict(r) for r in results]
        report["levels"].append(level)

    if args.compare_engine:
        engine = EngineAlone(args.compare_engine, tokenizer or load_tokenizer(args.compare_engine),
                             parse_engine_args(args.engine_arg), args.engine_torch_threads)
        report["engine_torch_threads"] = engine.threads
        try:
            send_engine = lambda req: engine.send(req, args)  # noqa: E731
            for level in report["levels"]:
                rate, conc = level["request_rate"], level["concurrency"]
                await warm_up(send_engine, requests, args.num_warmups, conc)
                results, duration = await run_level(send_engine, requests, rate, conc, args.seed,
                                                    f"engine c={conc} rate={rate}", show)
                s = summarize(results, duration, goodput)
                print_summary(f"engine alone concurrency={conc} rate={rate}", s)
                level["engine"] = s
                level["serve_overhead_e2e_mean"] = level["http"]["mean_e2el_ms"] / s["mean_e2el_ms"]
                level["serve_overhead_e2e_p50"] = level["http"]["p50_e2el_ms"] / s["p50_e2el_ms"]
                level["serve_overhead_ttft_mean"] = level["http"]["mean_ttft_ms"] / s["mean_ttft_ms"]
                http_in, engine_in = level["http"]["total_input_tokens"], s["total_input_tokens"]
                if http_in != engine_in:
                    print(f"note: the server counted {http_in} prompt tokens, the engine-alone run "
                          f"{engine_in}: the ingress tokenizes differently (special tokens?)")
        finally:
            engine.shutdown()
        print("=" * 18 + " Serve overhead (HTTP / engine alone) " + "=" * 10)
        print(f"{'concurrency':>12}{'rate':>8}{'e2e mean':>12}{'e2e p50':>12}{'TTFT mean':>12}")
        for lv in report["levels"]:
            print(f"{str(lv['concurrency']):>12}{lv['request_rate']:>8}"
                  f"{lv['serve_overhead_e2e_mean']:>12.3f}{lv['serve_overhead_e2e_p50']:>12.3f}"
                  f"{lv['serve_overhead_ttft_mean']:>12.3f}")

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
    p.add_argument("--dataset", choices=["random", "file"], default="random")
    p.add_argument("--text-file", help="local text file for --dataset file")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths drawn from [len * (1 - ratio), len]")
    p.add_argument("--request-rate", type=float, nargs="+",
                   help="requests/s, Poisson arrivals; inf sends all at once (default)")
    p.add_argument("--concurrency", type=int, nargs="+",
                   help="most requests in flight; several values run as several load levels")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let EOS end a request early (by default every request runs to --output-len)")
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="service-level objectives, e.g. ttft:500 tpot:50 (e2el too)")
    p.add_argument("--num-warmups", type=int,
                   help="untimed requests before each level (default: one batch of its concurrency)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json")
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
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `app` for --compare-engine
    main()
