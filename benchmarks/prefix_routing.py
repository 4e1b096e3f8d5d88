#!/usr/bin/env python
"""Prefix-aware routing against Serve's default router, on the workload where blind routing
hurts: many users sharing a few long system prompts, each in a conversation that grows turn by
turn (`benchmarks/serving.py --dataset sessions`), sent to an app with 2 target replicas
(each with its own engine process) whose KV pools are sized so that the live prefixes fit in
two pools but not in one (by default 8 system prompts of 768 tokens, 6144 tokens, against
pools of 256 blocks of 16, 4096 tokens, each). Each run prints the live prefix set it sent, in
pools: the blocks some prompt used before and some prompt will use again, at each moment a
prompt is sent (`live_prefix_blocks`); by default about 1.8. Users think between turns (2 s on average, by
default): with turns back to back, the replica that served a turn has just freed a slot when
the next turn comes, so Serve's default router, which picks the shorter queue, sends it back
there by accident of timing (benchmarks/RESULTS.md).

Each round deploys the app afresh (cold caches) once per router, the order alternating, runs
the same sessions against it, and reads the engines' prefix-cache counters from one `/metrics`
scrape before and after: the hit rate is hit tokens / looked-up tokens over both replicas.
Printed per round, then as means with the ratio prefix_aware / power_of_two.

    python benchmarks/prefix_routing.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import local_serve, serving  # noqa: E402

APP = "specserve"
ROUTERS = ["power_of_two", "prefix_aware"]
PREFIX_CACHE = ("specserve:prefix_cache_queries_total", "specserve:prefix_cache_hits_total")
ROUTER_REQUESTS = "specserve:router_requests_total"  # by reason: prefix, load, no_prefix


def start_ray_serve(num_cpus: int, port: int) -> None:
    """A local Ray and Serve on `port` as `serve run serve_config.yaml` would start them
    (local_serve.py: HAProxy, with a short Ingress drain between the rounds' redeploys)."""
    import ray
    from ray import serve

    env = {**local_serve.app_env_vars(), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, runtime_env={"env_vars": env})
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                controller_options=local_serve.controller_options())


def deploy(args, router: str) -> None:
    """The app with `args.replicas` target replicas routed by `router` (the builder's
    TargetModel, with its replica count set as serve_config.yaml's `num_replicas` would)."""
    from ray import serve

    import deployments.builder as builder
    from deployments.target import TargetModel

    original = builder.TargetModel
    builder.TargetModel = TargetModel.options(num_replicas=args.replicas)
    try:
        serve.run(builder.build_app({
            "model": str(ROOT / args.model), "device": "cpu", "num_kv_blocks": args.num_kv_blocks,
            "speculative_method": None, "request_router": router}), name=APP, route_prefix="/")
    finally:
        builder.TargetModel = original


def prefix_cache_counts(url: str) -> dict[str, float]:
    """The prefix-cache counters over all replicas, and the routers' decisions by reason."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(PREFIX_CACHE, 0.0)
    for fam in text_string_to_metric_families(requests.get(f"{url}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name in PREFIX_CACHE:
                totals[s.name] += s.value
            elif s.name == ROUTER_REQUESTS:
                key = f"routed_{s.labels['reason']}"
                totals[key] = totals.get(key, 0.0) + s.value
    return totals


def settled_counts(url: str, seconds: float = 3.0) -> dict[str, float]:
    """The counters once the engines' last reports (every ~1 s) are in."""
    time.sleep(seconds)
    return prefix_cache_counts(url)


def one_run(args, router: str, url: str, out_dir: Path, tag: str) -> dict:
    from ray import serve

    deploy(args, router)
    try:
        before = settled_counts(url)
        report = serving.main([
            "--base-url", url, "--model", str(ROOT / args.model), "--served-model-name", Path(args.model).name,
            "--dataset", "sessions", "--num-prompts", str(args.sessions), "--num-system-prompts",
            str(args.system_prompts), "--system-len", str(args.system_len), "--turns", str(args.turns),
            "--think-time", str(args.think_time),
            "--input-len", str(args.question_len), "--output-len", str(args.output_len),
            "--request-rate", str(args.rate), "--seed", str(args.seed), "--disable-tqdm",
            "--result-json", str(out_dir / f"client_{tag}.json")])
        after = settled_counts(url)
    finally:
        serve.delete(APP)
    queries = after[PREFIX_CACHE[0]] - before[PREFIX_CACHE[0]]
    hits = after[PREFIX_CACHE[1]] - before[PREFIX_CACHE[1]]
    http = report["levels"][0]["http"]
    routed = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith("routed_")}
    return {"router": router, "hit_rate": hits / queries if queries else 0.0, "queried_tokens": queries,
            **routed,
            "ttft_p50_ms": http["p50_ttft_ms"], "ttft_p90_ms": http["p90_ttft_ms"],
            "e2el_mean_ms": http["mean_e2el_ms"], "output_tok_s": http["output_throughput"],
            "live_prefix_pools": report["levels"][0]["live_prefix_blocks"]["mean"] / args.num_kv_blocks,
            "request_s": http["request_throughput"], "failed": http["failed"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/tiny-target")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--num-kv-blocks", type=int, default=256, help="per replica (block 16)")
    p.add_argument("--sessions", type=int, default=48)
    p.add_argument("--system-prompts", type=int, default=8)
    p.add_argument("--system-len", type=int, default=768)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--think-time", type=float, default=2.0, help="mean seconds between a user's turns")
    p.add_argument("--question-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--rate", type=float, default=2.0, help="sessions started per second")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-cpus", type=int, default=4, help="Ray's CPU count (replicas ask for 1 each)")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--out", default="benchmarks/out/prefix_routing")
    args = p.parse_args(argv)
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import ray
    from ray import serve

    start_ray_serve(args.num_cpus, args.port)
    url = f"http://127.0.0.1:{args.port}"
    runs: list[dict] = []
    try:
        for r in range(args.rounds):
            for router in (ROUTERS if r % 2 == 0 else ROUTERS[::-1]):
                run = one_run(args, router, url, out_dir, f"{router}_{r + 1}")
                runs.append({"round": r + 1, **run})
                print(f"round {r + 1} {router:>13}: hit rate {run['hit_rate']:.3f}  TTFT p50 "
                      f"{run['ttft_p50_ms']:.1f} ms  p90 {run['ttft_p90_ms']:.1f} ms  output "
                      f"{run['output_tok_s']:.1f} tok/s  failed {run['failed']}  live prefixes "
                      f"{run['live_prefix_pools']:.2f} pools  routed "
                      + " ".join(f"{k.removeprefix('routed_')}={v:.0f}" for k, v in run.items() if k.startswith("routed_")), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()

    keys = ["hit_rate", "ttft_p50_ms", "ttft_p90_ms", "e2el_mean_ms", "output_tok_s", "request_s",
            "live_prefix_pools"]
    means = {router: {k: statistics.mean(x[k] for x in runs if x["router"] == router) for k in keys}
             for router in ROUTERS}
    print("=" * 20 + f" {args.rounds} rounds, means " + "=" * 20)
    print(f"{'':>14}" + "".join(f"{k:>14}" for k in keys))
    for router in ROUTERS:
        print(f"{router:>14}" + "".join(f"{means[router][k]:>14.3f}" for k in keys))
    ratios = {k: means["prefix_aware"][k] / means["power_of_two"][k] for k in keys}
    print(f"{'ratio':>14}" + "".join(f"{ratios[k]:>14.3f}" for k in keys))
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "runs": runs, "means": means,
              "ratios": ratios}
    (out_dir / "summary.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
