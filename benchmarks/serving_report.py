"""Figures of one request (`Result`) and of one load level of `benchmarks/serving.py`: the summary (TTFT, TPOT, ITL, e2e
latency percentiles, throughput, goodput), its printout in vLLM's layout, and the plot of
latency and throughput against load."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

@dataclass
class Result:
    """One request's figures, as the client saw them."""
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    output_len: int = 0
    error: str = ""
    text: str = ""  # what was streamed (a session's next turn sends it back)


PERCENTILES = (50, 90, 99)


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
