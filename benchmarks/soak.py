#!/usr/bin/env python
"""Soak test: a served specserve app under a mixed load for a set time, then idle.

Drives `--concurrency` clients that each send one request after another for `--duration-s`,
drawing each request's kind from `--mix` (weights):

    completion, completion_stream, chat, chat_stream   completed requests, checked
    guided, guided_stream                               chat with a JSON-schema response_format
    cancel_stream                                       a stream the client closes after 1-3 chunks
    cancel_unread                                       sent on a raw socket, closed unread

and reports requests done, outcomes (and errors) by kind, lost requests (sent but never
answered: no response, no error, no end within `--request-timeout-s`), the KV blocks still in
use once the app has idled (must be 0), and the target replicas' resident memory (RSS) after
warm-up and at the end. A guided request the app refuses with a 400 counts as `refused`, its
own outcome (guided decoding may not be served yet), not as an error.

    python benchmarks/soak.py --duration-s 600                       # starts the app itself
    python benchmarks/soak.py --duration-s 600 --app-arg speculative_method=ngram
    serve run serve_config.yaml & python benchmarks/soak.py --url http://127.0.0.1:8000 \\
        --ray-address auto --app-name specserve                     # an app already served

The app it starts itself is serve_config.yaml's (its `args`, one replica per stage) with
`--app-arg KEY=VALUE` on top (`device=cpu` by default). It prints a summary and writes
`--out` (JSON). Exit status 1 when a request was lost or failed, blocks leaked, or RSS grew
more than `--max-rss-growth`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import urlparse

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

KINDS = ("completion", "completion_stream", "chat", "chat_stream", "guided", "guided_stream",
         "cancel_stream", "cancel_unread")
DEFAULT_MIX = ("completion=3,completion_stream=3,chat=2,chat_stream=2,guided=1,guided_stream=1,"
               "cancel_stream=2,cancel_unread=1")
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly pack boxes of "
         "liquor near the old stone bridge where rivers meet and stories begin").split()
GUIDED_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                    "age": {"type": "integer"}},
                 "required": ["name", "age"], "additionalProperties": False}


# -- the app and its target replicas ------------------------------------------------------------
def start_app(app_args: dict, num_cpus: int) -> tuple[str, str]:
    """serve_config.yaml's app args + overrides, on a local Ray; returns (url, app name)."""
    import socket

    import ray
    import yaml
    from ray import serve

    from deployments.builder import build_app

    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    args = {**config["applications"][0]["args"], "device": "cpu", **app_args}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    os.chdir(REPO)  # relative checkpoint paths in serve_config.yaml
    serve.run(build_app(args), name="soak", route_prefix="/")
    return f"http://127.0.0.1:{port}", "soak"


def _rss_bytes(_replica) -> int:
    """Runs inside a replica's actor (via __ray_call__): its resident set size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Targets:
    """The TargetModel replicas of an app: their engine stats and their processes' RSS."""

    def __init__(self, app_name: str):
        from ray import serve

        self.app_name = app_name
        self.handle = serve.get_deployment_handle("TargetModel", app_name)

    def actors(self) -> dict:
        import ray

        prefix = f"SERVE_REPLICA::{self.app_name}#TargetModel#"
        return {a["name"][len(prefix):]: ray.get_actor(a["name"], namespace=a["namespace"])
                for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)}

    def rss(self) -> dict[str, int]:
        import ray

        actors = self.actors()
        return {rid: ray.get(actor.__ray_call__.remote(_rss_bytes), timeout=60) for rid, actor in actors.items()}

    def stats(self) -> dict[str, dict]:
        """Stats of every replica (the handle picks one at random: ask until each has answered)."""
        wanted = set(self.actors())
        seen: dict[str, dict] = {}
        for _ in range(20 * max(1, len(wanted))):
            s = self.handle.stats.remote().result(timeout_s=60)
            seen[s["replica_id"]] = s
            if wanted <= set(seen):
                break
        return {rid: s for rid, s in seen.items() if rid in wanted or not wanted}

    def wait_idle(self, timeout_s: float) -> tuple[dict[str, dict], float]:
        """Poll until no replica runs or queues a request; returns (stats, seconds waited)."""
        start = time.monotonic()
        while True:
            stats = self.stats()
            busy = sum(s["num_requests_running"] + s["num_requests_waiting"] for s in stats.values())
            if busy == 0 or time.monotonic() - start > timeout_s:
                return stats, time.monotonic() - start
            time.sleep(0.5)


# -- one request of each kind -------------------------------------------------------------------
def request_body(kind: str, model: str, rng: random.Random, max_tokens: int) -> tuple[str, dict]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
    n_tokens = rng.randint(4, max_tokens)
    common = {"model": model, "max_tokens": n_tokens, "temperature": rng.choice([0.0, 0.7, 1.0]),
              "seed": rng.randrange(1 << 30)}
    stream = kind.endswith("_stream") or kind.startswith("cancel")
    if kind.startswith("guided"):
        return "/v1/chat/completions", {
            **common, "max_tokens": max(n_tokens, 48), "stream": stream,
            "messages": [{"role": "user", "content": f"Describe a person as JSON: {words}"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": GUIDED_SCHEMA}}}
    if kind.startswith("chat"):
        return "/v1/chat/completions", {**common, "stream": stream, "ignore_eos": True,
                                        "messages": [{"role": "user", "content": words}]}
    return "/v1/completions", {**common, "prompt": words, "stream": stream, "ignore_eos": True,
                               **({"stream_options": {"include_usage": True}} if stream else {})}


def check_complete(kind: str, body: dict, choices_text: str, finish: str | None, usage: dict | None) -> str:
    """'ok', or 'bad_response:<why>' for an answer that ended but is wrong."""
    if finish is None:
        return "bad_response:no_finish_reason"
    if kind.startswith("guided"):
        try:
            value = json.loads(choices_text)
        except ValueError:
            return "ok_truncated" if finish == "length" else "bad_response:guided_not_json"
        return "ok" if isinstance(value, dict) and set(value) == {"name", "age"} else "bad_response:guided_schema"
    if usage is not None and body.get("ignore_eos") and usage.get("completion_tokens") != body["max_tokens"]:
        return "bad_response:token_count"
    return "ok"


async def sse_events(resp: aiohttp.ClientResponse):
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    data = line[6:].decode()
                    yield data if data == "[DONE]" else json.loads(data)


async def send(session: aiohttp.ClientSession, url: str, kind: str, path: str, body: dict,
               rng: random.Random, timeout_s: float) -> str:
    if kind == "cancel_unread":
        return await send_unread(url, path, body, rng)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.post(url + path, json=body, timeout=timeout) as resp:
        if resp.status != 200:
            await resp.read()
            if resp.status == 400 and kind.startswith("guided"):
                return "refused"
            return f"http_{resp.status}"
        if not body.get("stream"):
            data = await resp.json()
            choice = data["choices"][0]
            text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content") or ""
            return check_complete(kind, body, text, choice.get("finish_reason"), data.get("usage"))
        stop_after = rng.randint(1, 3) if kind == "cancel_stream" else None
        texts, finish, usage, done, seen = [], None, None, False, 0
        async for event in sse_events(resp):
            if event == "[DONE]":
                done = True
                break
            if "error" in event:
                return "in_band_error"
            usage = event.get("usage") or usage
            for c in event.get("choices", []):
                texts.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
                finish = c.get("finish_reason") or finish
            seen += 1
            if stop_after is not None and seen >= stop_after:
                resp.close()  # the client goes away mid-stream
                return "cancelled"
        if not done:
            return "bad_response:no_done"
        if stop_after is not None:
            return "finished_before_cancel"
        return check_complete(kind, body, "".join(texts), finish, usage)


async def send_unread(url: str, path: str, body: dict, rng: random.Random) -> str:
    """A client that sends its request and closes the connection without reading anything."""
    u = urlparse(url)
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    await asyncio.sleep(rng.uniform(0.05, 1.0))
    writer.close()
    return "cancelled"


# -- the run ------------------------------------------------------------------------------------
class Tally:
    def __init__(self):
        self.by_kind: dict[str, Counter] = defaultdict(Counter)
        self.sent = 0
        self.outstanding = 0

    def record(self, kind: str, outcome: str) -> None:
        self.by_kind[kind][outcome] += 1


async def client_loop(i: int, session, url: str, model: str, mix: dict[str, float], end: float,
                      tally: Tally, args) -> None:
    rng = random.Random(args.seed * 1000 + i)
    kinds, weights = zip(*mix.items())
    while time.monotonic() < end:
        kind = rng.choices(kinds, weights)[0]
        path, body = request_body(kind, model, rng, args.max_tokens)
        tally.sent += 1
        tally.outstanding += 1
        try:
            outcome = await asyncio.wait_for(send(session, url, kind, path, body, rng, args.request_timeout_s),
                                             args.request_timeout_s + 5)
        except (asyncio.TimeoutError, TimeoutError):
            outcome = "lost"  # sent, and neither answered nor failed in time
        except aiohttp.ClientError as exc:
            outcome = f"client_error:{type(exc).__name__}"
        finally:
            tally.outstanding -= 1
        tally.record(kind, outcome)


async def drive(url: str, model: str, mix: dict[str, float], seconds: float, args) -> Tally:
    tally = Tally()
    end = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(client_loop(i, session, url, model, mix, end, tally, args))
                 for i in range(args.concurrency)]
        await asyncio.gather(*tasks)
    return tally


def parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for item in text.split(","):
        kind, _, weight = item.partition("=")
        if kind.strip() not in KINDS:
            raise SystemExit(f"unknown kind {kind!r} in --mix; kinds: {', '.join(KINDS)}")
        mix[kind.strip()] = float(weight or 1)
    return {k: w for k, w in mix.items() if w > 0}


def parse_app_args(items: list[str]) -> dict:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--app-arg wants KEY=VALUE, got {item!r}")
        out[key] = value
    return out


ERROR_OUTCOMES = ("ok", "ok_truncated", "cancelled", "refused", "finished_before_cancel")


def summarize(tally: Tally, warmup: Tally, duration: float, rss_start: dict, rss_end: dict,
              rss_before_warmup: dict, idle_stats: dict, idle_wait: float, args) -> dict:
    outcomes = Counter()
    for c in tally.by_kind.values():
        outcomes.update(c)
    errors = {k: v for k, v in outcomes.items() if k not in ERROR_OUTCOMES}
    lost = outcomes.get("lost", 0) + tally.outstanding
    start_total, end_total = sum(rss_start.values()), sum(rss_end.values())
    growth = (end_total - start_total) / start_total if start_total else None
    kv_end = sum(s["num_blocks_used"] for s in idle_stats.values())
    return {
        "duration_s": round(duration, 1), "concurrency": args.concurrency, "mix": parse_mix(args.mix),
        "max_tokens": args.max_tokens,
        "requests_sent": tally.sent, "requests_done": sum(outcomes.values()) - outcomes.get("lost", 0),
        "requests_per_s": round(tally.sent / duration, 2) if duration else None,
        "outcomes": dict(outcomes), "errors": errors,
        "by_kind": {k: dict(v) for k, v in sorted(tally.by_kind.items())},
        "lost_requests": lost,
        "kv_blocks_in_use_after_idle": kv_end, "idle_wait_s": round(idle_wait, 1),
        "target_replicas": {rid: {k: s[k] for k in ("num_blocks_total", "num_blocks_used", "num_requests_running",
                                                     "num_requests_waiting", "num_preemptions", "generation_tokens")}
                            for rid, s in idle_stats.items()},
        "rss_bytes": {"before_warmup": rss_before_warmup, "start": rss_start, "end": rss_end},
        "rss_growth": round(growth, 4) if growth is not None else None,
        "warmup": {"seconds": args.warmup_s, "requests": warmup.sent},
        "pass": (lost == 0 and not errors and kv_end == 0 and growth is not None
                 and growth < args.max_rss_growth),
    }


def print_summary(s: dict) -> None:
    mib = lambda d: ", ".join(f"{v / 2**20:.1f}" for v in d.values()) or "?"  # noqa: E731
    print(f"\n== soak: {s['duration_s']} s, {s['concurrency']} clients ==")
    print(f"requests sent {s['requests_sent']}, done {s['requests_done']} ({s['requests_per_s']}/s), "
          f"lost {s['lost_requests']}")
    print("outcomes:", ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items())))
    print("errors:  ", ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "none")
    for kind, c in s["by_kind"].items():
        print(f"  {kind:18s}", ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    print(f"KV blocks in use after idling {s['idle_wait_s']} s: {s['kv_blocks_in_use_after_idle']}")
    print(f"target RSS MiB: before warm-up [{mib(s['rss_bytes']['before_warmup'])}], "
          f"start [{mib(s['rss_bytes']['start'])}], end [{mib(s['rss_bytes']['end'])}], growth "
          f"{s['rss_growth'] * 100 if s['rss_growth'] is not None else float('nan'):.2f}%")
    print("PASS" if s["pass"] else "FAIL")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=60)
    p.add_argument("--warmup-s", type=float, default=10, help="load before the start RSS is taken")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--mix", default=DEFAULT_MIX, help=f"KIND=WEIGHT,... of {', '.join(KINDS)}")
    p.add_argument("--max-tokens", type=int, default=64, help="each request asks for 4..this many")
    p.add_argument("--request-timeout-s", type=float, default=300)
    p.add_argument("--idle-timeout-s", type=float, default=120, help="wait for the engine to empty")
    p.add_argument("--max-rss-growth", type=float, default=0.05)
    p.add_argument("--url", help="a served app (default: start one here)")
    p.add_argument("--ray-address", default="auto", help="with --url: the app's Ray cluster")
    p.add_argument("--app-name", default="specserve", help="with --url: its Serve app name")
    p.add_argument("--app-arg", action="append", metavar="KEY=VALUE", help="build_app argument (own app)")
    p.add_argument("--num-cpus", type=int, default=4, help="Ray's CPUs (own app)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "out" / "soak.json"))
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    mix = parse_mix(args.mix)

    import ray

    if args.url:
        ray.init(address=args.ray_address, namespace="serve", log_to_driver=False)
        url, app_name = args.url.rstrip("/"), args.app_name
    else:
        url, app_name = start_app(parse_app_args(args.app_arg), args.num_cpus)
    targets = Targets(app_name)
    import requests

    model = requests.get(url + "/v1/models", timeout=60).json()["data"][0]["id"]
    rss_before_warmup = targets.rss()
    warmup = asyncio.run(drive(url, model, mix, args.warmup_s, args)) if args.warmup_s > 0 else Tally()
    targets.wait_idle(args.idle_timeout_s)
    rss_start = targets.rss()
    t0 = time.monotonic()
    tally = asyncio.run(drive(url, model, mix, args.duration_s, args))
    duration = time.monotonic() - t0
    idle_stats, idle_wait = targets.wait_idle(args.idle_timeout_s)
    rss_end = targets.rss()
    summary = summarize(tally, warmup, duration, rss_start, rss_end, rss_before_warmup, idle_stats,
                        idle_wait, args)
    summary["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    print_summary(summary)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    if not args.url:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
