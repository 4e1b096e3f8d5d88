#!/usr/bin/env python
"""One side of a decode A/B on a GPU: the engine of the tree this runs from (its own
`app/` and `benchmarks/decode.py`, so run it with the other tree's copy from that tree's root),
Llama-3-8B shape from a checkpoint `benchmarks/decode.py` wrote, bf16, prompt 128 (`--prompt-len`),
128 new tokens, overlapped scheduling. Prints decode tok/s per batch size, the best of `--repeats`,
and its MBU as `benchmarks/decode.py` computes it (against the copy bandwidth measured at start),
so that a side's figure can be held against issue 17's goals as it is.

    python benchmarks/ab_decode.py --label new --model-dir /tmp/l3
    (cd gpu_run/base && python ../../benchmarks/ab_decode.py --label base --model-dir /tmp/l3)

`scripts/gpu_owed.sh` alternates the two sides over rounds; the ratio goes in the note. Flags
run the same tree with one choice turned the other way, for the A/B of that choice alone:
`--program-per-split [UP_TO]`, decode attention with a program per split at every batch size
or up to UP_TO sequences (see `specserve_kernels/decode_attention.py`), and `--merge-by-last-program`, its
states merged by each sequence's last program instead of a merge kernel; `--plain-launch`, the decode step's
Triton kernels launched without programmatic dependent launch (`specserve_kernels/dependent_launch.py`);
`--skinny-linear`, the projections of up to 16 rows through `specserve_kernels/skinny_linear.py` instead
of cuBLAS, with `--skinny-projections`/`--skinny-config` to try others than its defaults
(the first two from 2026-11-27 on, the last from the commit that added that kernel), and
`--skinny-rows-config` for its tiles of rows at larger batches (the lm_head's too);
`--cublas-linear`, that kernel off (it is on by default from the commit that turned it on);
`--gate-up-silu`, the gate_up projection and SiLU x up in one kernel for up to 256 rows
(`--gate-up-silu-max-rows` fewer; `--gate-up-silu-config` other tiles); `--prefetch-weights
[MIB [NORM_MIB]]`, the rotary kernel and the norms asking the next projection's first MIB (the
norms NORM_MIB) of weights into L2 (`specserve_kernels/l2_prefetch.py`).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.getcwd())  # the tree under test: the working directory's, not this file's

from app.config import EngineConfig  # noqa: E402
from app.engine.engine import LLMEngine  # noqa: E402
from benchmarks.decode import run_engine, step_bytes  # noqa: E402
from benchmarks.decode_attention_sweep import copy_bandwidth  # noqa: E402

KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # Llama-3-8B in bf16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True)
    parser.add_argument("--model-dir", default="/tmp/l3")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--sampled-batch-sizes", type=int, nargs="*", default=[1, 256])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt (128 new tokens follow)")
    parser.add_argument("--program-per-split", type=int, nargs="?", const=1 << 30, default=0, metavar="UP_TO",
                        help="decode steps of up to UP_TO sequences (without it, every batch size) take a "
                             "program per split in decode attention")
    parser.add_argument("--merge-by-last-program", action="store_true",
                        help="decode attention's states merged by each sequence's last program, not a merge kernel")
    parser.add_argument("--plain-launch", action="store_true",
                        help="launch the decode step's Triton kernels without programmatic dependent launch")
    parser.add_argument("--skinny-linear", action="store_true",
                        help="the projections in specserve_kernels.skinny_linear.ROW_CONFIGS take its kernel up to "
                             "16 rows (on by default in trees from 2026-11-27 on; for the overrides below, or older trees)")
    parser.add_argument("--skinny-projections", nargs="+", help="with --skinny-linear: these projections instead")
    parser.add_argument("--skinny-config", type=int, nargs=4, metavar=("BLOCK_N", "BLOCK_K", "NUM_STAGES", "WARPS"),
                        help="with --skinny-linear: this configuration instead of CONFIG "
                             "(benchmarks/linears.py's best)")
    parser.add_argument("--cublas-linear", action="store_true",
                        help="every projection through torch's BLAS: the skinny linear kernel off")
    parser.add_argument("--gate-up-silu", action="store_true",
                        help="gate_up_proj and SiLU x up in one kernel (specserve_kernels/gate_up_silu.py), "
                             "up to 256 rows")
    parser.add_argument("--gate-up-silu-max-rows", type=int,
                        help="with --gate-up-silu: only the row configurations up to this many rows")
    parser.add_argument("--gate-up-silu-config", type=int, nargs=6, action="append", default=[],
                        metavar=("ROWS", "BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_STAGES", "WARPS"),
                        help="with --gate-up-silu: these tiles for the row configuration of up to ROWS rows "
                             "(benchmarks/linears.py's choice); repeatable")
    parser.add_argument("--prefetch-weights", type=float, nargs="*", metavar="MIB",
                        help="the kernels before each projection prefetch its first MIB of weights into L2: "
                             "rotary (o_proj's, over attention) and the norms (qkv_proj's, gate_up_proj's, the "
                             "lm_head's); a second MIB for the norms; none: 32, o_proj's whole")
    parser.add_argument("--skinny-rows-config", nargs="+", action="append", default=[],
                        metavar="PROJECTION ROWS BLOCK_M BLOCK_N BLOCK_K NUM_STAGES WARPS SPLIT_K | PROJECTION ROWS cublas",
                        help="the skinny kernel for PROJECTION at batches up to ROWS (past the row configuration "
                             "before) in these tiles, or cuBLAS there (benchmarks/linears.py's choice); repeatable")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    turn_choices(args)
    copy_bw = copy_bandwidth()
    most = max(args.batch_sizes + args.sampled_batch_sizes)
    kv_gib = most * (args.prompt_len + 144) * KV_BYTES_PER_TOKEN / 2**30 * 1.2 + 1
    engine = LLMEngine(EngineConfig(model=args.model_dir, dtype="bfloat16", device="cuda", kv_cache_memory_gib=kv_gib,
                                    max_num_seqs=most, max_num_batched_tokens=8192, max_model_len=args.max_model_len))
    run_engine(engine, 2, 16, 8, "warmup")
    cells = [(b, False) for b in args.batch_sizes] + [(b, True) for b in args.sampled_batch_sizes]
    for batch, sampled in cells:
        best = max((run_engine(engine, batch, args.prompt_len, 128, f"{args.label}-{batch}-{sampled}-{r}", sampled)
                    for r in range(args.repeats)), key=lambda run: run["decode_tok_s"])
        mbu = step_bytes(engine.runner.model, batch, args.prompt_len + 128 / 2) * best["steps_s"] / copy_bw
        print(result_line(args.label, args.max_model_len, args.prompt_len, batch, sampled, best["decode_tok_s"],
                          mbu, copy_bw), flush=True)


def result_line(label: str, max_model_len: int, prompt_len: int, batch: int, sampled: bool, tok_s: float,
                mbu: float, copy_bw: float) -> str:
    """One side's figure for a cell, as `benchmarks/ab_table.py` reads it back."""
    return (f"{label} max_model_len {max_model_len} prompt {prompt_len} batch {batch:3d} "
            f"{'sampled' if sampled else 'greedy '}: decode {tok_s:9.1f} tok/s  MBU {100 * mbu:5.1f}% "
            f"(copy {copy_bw / 1e9:.0f} GB/s)")


def turn_choices(args: argparse.Namespace) -> None:
    """Set the kernels' module settings as the flags say, before the engine is built."""
    if args.gate_up_silu:
        import specserve_kernels.gate_up_silu as fused
        from specserve_kernels.skinny_linear import TILE_KEYS
        fused.ENABLED = True
        chosen = {rows: dict(zip(TILE_KEYS[:5], tiles)) for rows, *tiles in args.gate_up_silu_config}
        fused.ROW_CONFIGS = tuple((rows, chosen.get(rows, config)) for rows, config in fused.ROW_CONFIGS
                                  if rows <= (args.gate_up_silu_max_rows or rows))
    if args.skinny_linear or args.cublas_linear or args.skinny_rows_config:
        import specserve_kernels.skinny_linear as skinny
        skinny.ENABLED = not args.cublas_linear
        if args.skinny_projections or args.skinny_config:
            small = dict(zip(skinny.TILE_KEYS[1:5], args.skinny_config)) if args.skinny_config else skinny.CONFIG
            skinny.ROW_CONFIGS = {projection: ((skinny.MAX_ROWS, small),)
                                  for projection in args.skinny_projections or skinny.ROW_CONFIGS}
        for projection, rows, *tiles in args.skinny_rows_config:
            assert tiles == ["cublas"] or len(tiles) == len(skinny.TILE_KEYS), f"--skinny-rows-config {projection} {rows} {tiles}"
            configs = dict(skinny.ROW_CONFIGS.get(projection, ((skinny.MAX_ROWS, None),)))  # new: cuBLAS up to 16
            configs[int(rows)] = None if tiles == ["cublas"] else dict(zip(skinny.TILE_KEYS, map(int, tiles)))
            skinny.ROW_CONFIGS = {**skinny.ROW_CONFIGS, projection: tuple(sorted(configs.items()))}
    if args.prefetch_weights is not None:
        import specserve_kernels.l2_prefetch as l2_prefetch
        assert len(args.prefetch_weights) <= 2, "--prefetch-weights [MIB [NORM_MIB]]"
        mib = args.prefetch_weights or [32.0]
        attention, norm = mib[0], mib[-1]
        l2_prefetch.ENABLED = True
        l2_prefetch.MAX_BYTES = {"attention": int(attention * 2**20), "norm": int(norm * 2**20)}
    if args.plain_launch:
        import specserve_kernels.dependent_launch
        specserve_kernels.dependent_launch.ENABLED = False
    from specserve_kernels.backend import TUNED_16BIT_DECODE
    if args.program_per_split:
        TUNED_16BIT_DECODE["program_per_split_up_to"] = args.program_per_split
    if args.merge_by_last_program:
        TUNED_16BIT_DECODE["decode_options"]["merge_by_last_program"] = True


if __name__ == "__main__":
    main()
