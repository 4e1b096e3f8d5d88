"""The sampled selection's draw, on the logits' device: the reference (sort every row, softmax,
inverse CDF) against the draw the engine uses (`draw_with_uniforms`: top-p by rejection without
a sort, top-k rows from their k largest). Ratios are reference / engine, measured in one run.
On the CPU the engine draws in C++ (`specserve_kernels/cpu/draw.cpp`); its torch steps, which it draws
with where those do not build (`draw_top_p_by_rejection`, `draw_top_k`), are timed beside it.

    python benchmarks/select_speed.py                    # CUDA when there is one: [R, 128256]
    python benchmarks/select_speed.py --vocab 4096       # the CPU's default model's vocabulary
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.engine.selection.distribution import row_probs  # noqa: E402
from app.engine.selection.draw import draw_top_k, draw_top_p_by_rejection, draw_with_uniforms  # noqa: E402
from app.engine.selection.draws import DRAW_ROUNDS  # noqa: E402
from app.engine.selection.verify import sample_inverse_cdf  # noqa: E402

SETTINGS = {"top_p 0.95": (0, 0.95, 0.0), "top_k 50 top_p 0.9 min_p 0.05": (50, 0.9, 0.05),
            "temperature only": (0, 1.0, 0.0)}


def median_ms(fn, device: str, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--vocab", type=int, default=None, help="default: 128256 on CUDA, 4096 on the CPU")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = args.vocab or (128256 if device == "cuda" else 4096)
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, vocabulary {vocab}, "
          f"temperature 0.8, median of {args.repeats}")
    for rows in args.rows:
        g = torch.Generator(device=device).manual_seed(rows)
        # Distinct rows (a sort of one row repeated trains the CPU's branch predictor).
        logits = torch.randn(rows, vocab, device=device, generator=g) * 3
        for label, (k, p, min_p) in SETTINGS.items():
            full = dict(device=device)
            temperature, top_k = torch.full((rows,), 0.8, **full), torch.full((rows,), k, dtype=torch.long, **full)
            top_p, min_p_rows = torch.full((rows,), p, **full), torch.full((rows,), min_p, **full)
            u = torch.rand(rows, DRAW_ROUNDS, dtype=torch.float64, generator=g, **full)
            reference = median_ms(lambda: sample_inverse_cdf(
                row_probs(logits, temperature, top_k, top_p, min_p_rows, True), u[:, 0]), device, args.repeats)
            engine = median_ms(lambda: draw_with_uniforms(logits, temperature, top_k, top_p, min_p_rows, k, u),
                               device, args.repeats)
            torch_steps = ""
            if device == "cpu":
                steps = median_ms(lambda: draw_top_k(logits, temperature, top_k, top_p, min_p_rows, k, u[:, 0])
                                  if k else draw_top_p_by_rejection(logits, temperature, top_p, min_p_rows, u),
                                  device, args.repeats)
                torch_steps = f"  torch steps {steps:7.3f} ms ({steps / engine:5.2f}x the engine's)"
            print(f"rows {rows:4d}  {label:30s}: sort {reference:7.3f} ms  engine's draw {engine:7.3f} ms  "
                  f"{reference / engine:5.2f}x" + torch_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
