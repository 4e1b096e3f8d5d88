#!/usr/bin/env python
"""A decoder layer's projections at decode batch sizes: torch's default BLAS choice (F.linear),
cuBLASLt preferred (`torch.backends.cuda.preferred_blas_library`), and up to 16 rows the
skinny linear kernel (`specserve_kernels/skinny_linear.py`) in a few configurations. Each is timed in a
CUDA graph with a cold L2 as the engine runs it (`benchmarks/decode_attention_sweep.py`'s `time_in_graph`),
as the rate the weights are read at and its share of the card's device-to-device copy, and
as TFLOP/s (what bounds 256 rows: on an H100 the engine's GEMMs ran at ~500 TFLOP/s at batch
256, 2026-11-27). Llama-3-8B's shapes in bf16; every output is checked against F.linear's.
At 64 and 256 rows the same kernel in tiles of rows (`WIDE_CONFIGS`) is timed against cuBLAS:
the engine does not take it there, so this says whether it could. The lm_head is timed and
chosen as the layer's projections are (the decode graphs write its logits through the same
kernel where `ROW_CONFIGS` names it: `SkinnyLinear.forward_into`). At every row count it times
gate_up_proj with SiLU x up in one kernel (`specserve_kernels/gate_up_silu.py`) against the engine's way
(the projection, then the SiLU kernel).

    python benchmarks/linears.py                 # rows 1, 4, 16, 64, 256; the four projections, the lm_head
    python benchmarks/linears.py --rows 1 --projections qkv_proj o_proj

What to do with it: a projection where a skinny configuration beats the default at every row
count up to 16 goes in `specserve_kernels.skinny_linear.ROW_CONFIGS`, with that configuration; tiles of
rows that beat it at 64 or 256 rows go there too; each once `benchmarks/ab_decode.py` has timed
the whole step against the same tree without. If cuBLASLt wins at 64 and 256 rows, the engine
could prefer it at start-up. The last three lines are those rules applied, as `ab_decode.py`
arguments (`scripts/gpu_owed.sh` passes them on to the A/B): `skinny choice: ...`, for each
projection the configuration that wins at every row count up to 16 and saves the most time, or
cuBLAS; `skinny rows choice: ...`, the tiles of rows that beat cuBLAS at 64 or 256 rows, by
projection; `gate_up_silu choice: ...`, the fastest fused configuration of each of its row
configurations (`ROW_CONFIGS`), timed at that configuration's largest batch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.decode_attention_sweep import copy_bandwidth, time_in_graph  # noqa: E402
from specserve_kernels.skinny_linear import TILE_KEYS  # noqa: E402

LLAMA3_8B_PROJECTIONS = {  # name: (in_features, out_features)
    "qkv_proj": (4096, 6144), "o_proj": (4096, 4096), "gate_up_proj": (4096, 28672), "down_proj": (14336, 4096),
    "lm_head": (4096, 128256)}
CONFIGS = [dict(BLOCK_N=n, BLOCK_K=k, NUM_STAGES=s, num_warps=w)
           for n, k, s, w in ((16, 256, 4, 4), (16, 512, 3, 4), (16, 128, 6, 4), (32, 256, 4, 4),
                              (32, 256, 3, 8), (64, 128, 4, 4), (16, 256, 4, 2))]


def _configs(*values: tuple[int, ...]) -> list[dict]:
    return [dict(zip(TILE_KEYS, v)) for v in values]


# Tiles of rows for 64 and 256 rows, some with K in parts (SPLIT_K): o_proj and down_proj have
# 4,096 features, 32 tiles of 128 x 256 rows for 132 SMs. Each compiles for sm_90 with wgmma
# and no spills (tests/triton_kernels/hopper_compile.py's harness, 2026-11-27).
WIDE_CONFIGS = {64: _configs((64, 128, 64, 4, 4, 1), (64, 64, 128, 4, 4, 1), (64, 256, 64, 3, 8, 1),
                             (64, 128, 64, 4, 4, 2), (64, 64, 128, 4, 4, 2)),
                256: _configs((128, 256, 64, 3, 8, 1), (128, 128, 64, 4, 8, 1), (256, 128, 64, 3, 8, 1),
                              (64, 256, 64, 3, 8, 1), (256, 128, 64, 3, 8, 4), (128, 128, 64, 4, 8, 2),
                              (256, 64, 64, 3, 8, 2))}
# gate_up with SiLU x up, by the largest batch of each of its row configurations; BLOCK_N is
# of each half, so a program computes twice as many products as its BLOCK_N says
GATE_UP_SILU_CONFIGS = {
    16: _configs(*((16, 16, k, s, w) for k, s, w in ((256, 3, 4), (256, 3, 2), (128, 4, 4), (256, 2, 4), (512, 2, 4)))),
    64: _configs((64, 64, 64, 4, 4), (64, 32, 128, 4, 4), (64, 64, 128, 3, 4), (64, 128, 64, 3, 8)),
    256: _configs((128, 128, 64, 3, 8), (128, 64, 64, 4, 4), (128, 64, 64, 4, 8), (256, 64, 64, 3, 8),
                  (64, 128, 64, 4, 4)),
}


def _name(config: dict) -> str:
    rows = f"m{config['BLOCK_M']} " if "BLOCK_M" in config else ""
    split = f" split{config['SPLIT_K']}" if config.get("SPLIT_K", 1) > 1 else ""
    return f"{rows}n{config['BLOCK_N']} k{config['BLOCK_K']} s{config['NUM_STAGES']} w{config['num_warps']}{split}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--projections", nargs="+", default=list(LLAMA3_8B_PROJECTIONS),
                        choices=list(LLAMA3_8B_PROJECTIONS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    from specserve_kernels.skinny_linear import MAX_ROWS, skinny_linear, tile_count
    copy = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device-to-device copy: {copy / 1e9:.0f} GB/s; bf16; % of copy = weight bytes / time / copy")
    default_library = torch.backends.cuda.preferred_blas_library()

    def time_blas(library, x, weight) -> float:
        torch.backends.cuda.preferred_blas_library(library)  # read when the graph is captured
        try:
            return time_in_graph(lambda: F.linear(x, weight))
        finally:
            torch.backends.cuda.preferred_blas_library(default_library)

    gate_up_silu_choice = time_gate_up_silu(args.rows, copy) if "gate_up_proj" in args.projections else {}
    skinny_seconds: dict[tuple[str, str], dict[int, float]] = {}  # (config, projection): rows -> s
    blas_seconds: dict[str, dict[int, float]] = {}
    for projection in args.projections:
        in_features, out_features = LLAMA3_8B_PROJECTIONS[projection]
        weight = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) / in_features ** 0.5
        nbytes = weight.numel() * weight.element_size()
        for rows in args.rows:
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            want = F.linear(x, weight)
            timed = [("torch's choice", time_blas(default_library, x, weight)),
                     ("cuBLASLt", time_blas("cublaslt", x, weight))]
            for config in CONFIGS if rows <= MAX_ROWS else WIDE_CONFIGS.get(rows, []):
                if config.get("SPLIT_K", 1) > 1 and tile_count(rows, out_features, config) >= sms:
                    continue  # split-K is for products whose tiles leave SMs idle, not the lm_head's
                timed += _timed_if_right(f"{projection} rows {rows}", _name(config),
                                         lambda c=config: skinny_linear(x, weight, None, c), want)
            base = timed[0][1]
            blas_seconds.setdefault(projection, {})[rows] = base
            for name, seconds in timed[2:]:
                skinny_seconds.setdefault((name, projection), {})[rows] = seconds
            for name, seconds in timed:
                print(f"{projection:12s} rows {rows:3d} {name:27s} {seconds * 1e6:7.1f} us  "
                      f"{nbytes / seconds / 1e9:6.0f} GB/s  {100 * nbytes / seconds / copy:5.1f}% of copy  "
                      f"{2 * rows * weight.numel() / seconds / 1e12:6.1f} TFLOP/s  "
                      f"{base / seconds:5.3f}x torch's choice", flush=True)
    print("skinny choice:", choose_skinny(skinny_seconds, blas_seconds, MAX_ROWS))
    print("skinny rows choice:", choose_row_tiles(skinny_seconds, blas_seconds))
    print("gate_up_silu choice:", choose_gate_up_silu(gate_up_silu_choice))
    return 0


def _timed_if_right(case: str, name: str, run, want: torch.Tensor) -> list[tuple[str, float]]:
    """[(name, seconds in a graph)] where `run()` gives `want` to bf16 rounding; else none
    (a launch that fails, e.g. out of shared memory, too: the other timings still run)."""
    try:
        right = torch.allclose(run().float(), want.float(), atol=3e-2, rtol=3e-2)
    except Exception as exc:  # noqa: BLE001 - reported, and the sweep goes on
        print(f"  {case} {name}: FAILED, not timed: {exc!r}"[:300])
        return []
    if not right:
        print(f"  {case} {name}: WRONG OUTPUT, not timed")
        return []
    return [(name, time_in_graph(run))]


def time_gate_up_silu(rows_list: list[int], copy: float) -> dict[int, dict]:
    """gate_up_proj and SiLU x up: the engine's way (the skinny projection up to 16 rows, else
    torch's choice, then the SiLU kernel; 2026-11-27), torch's choice then the SiLU kernel, and
    `specserve_kernels/gate_up_silu.py` in one kernel in the configurations of the row configuration
    that takes the batch. Returns the fastest fused configuration by row configuration, timed
    at its largest batch."""
    from specserve_kernels.gate_up_silu import ROW_CONFIGS, gate_up_silu
    from specserve_kernels.silu_mul import silu_and_mul
    from specserve_kernels.skinny_linear import MAX_ROWS, skinny_linear
    in_features, out_features = LLAMA3_8B_PROJECTIONS["gate_up_proj"]
    weight = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) / in_features ** 0.5
    nbytes = weight.numel() * weight.element_size()
    fastest: dict[int, dict] = {}
    for rows in rows_list:
        bucket = next((max_rows for max_rows, _ in ROW_CONFIGS if rows <= max_rows), None)
        if bucket is None:
            continue
        x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
        want = silu_and_mul(F.linear(x, weight))
        project = (lambda: skinny_linear(x, weight)) if rows <= MAX_ROWS else (lambda: F.linear(x, weight))
        timed = [("the engine's (+ SiLU)", time_in_graph(lambda: silu_and_mul(project())))]
        if rows <= MAX_ROWS:
            timed.append(("torch's + SiLU", time_in_graph(lambda: silu_and_mul(F.linear(x, weight)))))
        configs = {_name(c): c for c in GATE_UP_SILU_CONFIGS.get(bucket, [])}
        for name, config in configs.items():
            timed += _timed_if_right(f"gate_up+SiLU rows {rows}", f"fused {name}",
                                     lambda c=config: gate_up_silu(x, weight, None, c), want)
        fused = [(seconds, name[len("fused "):]) for name, seconds in timed if name.startswith("fused ")]
        if rows == bucket and fused:
            fastest[bucket] = configs[min(fused)[1]]
        for name, seconds in timed:
            print(f"gate_up+SiLU rows {rows:3d} {name:28s} {seconds * 1e6:7.1f} us  "
                  f"{100 * nbytes / seconds / copy:5.1f}% of copy  {timed[0][1] / seconds:5.3f}x the engine's",
                  flush=True)
    return fastest


def choose_gate_up_silu(fastest: dict[int, dict]) -> str:
    """The fastest fused configuration of each row configuration (`time_gate_up_silu`), as
    `ab_decode.py --gate-up-silu-config` arguments; `none` if none was timed."""
    return " ".join(f"--gate-up-silu-config {rows} {' '.join(str(c[k]) for k in TILE_KEYS[:5])}"
                    for rows, c in sorted(fastest.items())) or "none"


def choose_row_tiles(skinny_seconds: dict, blas_seconds: dict) -> str:
    """For each projection that some tiles of rows beat torch's choice at, at 64 or 256 rows:
    the fastest tiles at each of those row counts, or cuBLAS where none won, as
    `ab_decode.py --skinny-rows-config` arguments (a batch takes the first row count that
    holds it); `none` if no projection."""
    by_name = {_name(c): c for configs in WIDE_CONFIGS.values() for c in configs}
    chosen = []
    for projection, by_rows in blas_seconds.items():
        choice = []
        for rows in sorted(r for r in WIDE_CONFIGS if r in by_rows):
            mine = [(by_config[rows], name) for (name, p), by_config in skinny_seconds.items()
                    if p == projection and name in by_name and rows in by_config]
            best = min(mine, default=None)
            won = best is not None and best[0] < by_rows[rows]
            tiles = " ".join(str(by_name[best[1]].get(k, 1)) for k in TILE_KEYS) if won else "cublas"
            choice.append((won, f"--skinny-rows-config {projection} {rows} {tiles}"))
        if any(won for won, _ in choice):
            chosen += [arguments for _, arguments in choice]
    return " ".join(chosen) or "none"


def choose_skinny(skinny_seconds: dict, blas_seconds: dict, max_rows: int) -> str:
    """For each projection, the configuration that beats torch's choice at
    every row count up to `max_rows` and saves the most time over them (a wrong output counts
    as a loss), or cuBLAS where none does, as `ab_decode.py --skinny-rows-config` arguments
    for batches of up to `max_rows`: each projection its own (o_proj read 1.07-1.09x with 32
    features a program, gate_up_proj won with 16 and 2 warps only, 2026-11-27)."""
    chosen = []
    for projection, by_rows in blas_seconds.items():
        rows = [r for r in by_rows if r <= max_rows]
        if not rows:
            continue
        best, best_saved = "cublas", 0.0
        for config in CONFIGS:
            mine = skinny_seconds.get((_name(config), projection), {})
            if all(r in mine and mine[r] < by_rows[r] for r in rows):
                saved = sum(by_rows[r] - mine[r] for r in rows)
                if saved > best_saved:
                    tiles = dict(config, BLOCK_M=max_rows, SPLIT_K=1)
                    best, best_saved = " ".join(str(tiles[k]) for k in TILE_KEYS), saved
        chosen.append(f"--skinny-rows-config {projection} {max_rows} {best}")
    return " ".join(chosen) or "none"

if __name__ == "__main__":
    sys.exit(main())
