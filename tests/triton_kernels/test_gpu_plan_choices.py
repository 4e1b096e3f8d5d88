"""A GPU session's A/B runs what `benchmarks/linears.py` chose, passed on as the arguments of
`benchmarks/ab_decode.py` (`scripts/gpu_owed.sh`): what the one prints, the other must read
back as the kernels' settings. Checked here, with made-up timings, so that no GPU minute is
lost to a mismatch between the two."""

import shlex

import pytest
import torch

import specserve_kernels.gate_up_silu as fused
import specserve_kernels.l2_prefetch as l2_prefetch
import specserve_kernels.skinny_linear as skinny
from benchmarks.ab_decode import parse_args, turn_choices
from benchmarks.linears import (CONFIGS, GATE_UP_SILU_CONFIGS, WIDE_CONFIGS, _name, choose_gate_up_silu,
                                choose_row_tiles, choose_skinny)


@pytest.fixture(autouse=True)
def _settings_restored(monkeypatch):
    """turn_choices sets module settings, as ab_decode does before building its engine."""
    for module, names in ((skinny, ("ENABLED", "ROW_CONFIGS")), (fused, ("ENABLED", "ROW_CONFIGS")),
                          (l2_prefetch, ("ENABLED", "MAX_BYTES"))):
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name))


def _turned(line: str, *flags: str) -> None:
    turn_choices(parse_args(["--label", "side", *flags, *shlex.split(line)]))


def test_the_small_batch_choice_sets_each_projections_own_tiles_or_cublas():
    """o_proj: the configuration that saves the most; qkv_proj loses at 4 rows, so cuBLAS; the
    lm_head wins too; gate_up_proj was not timed and keeps the tree's setting."""
    blas = {"o_proj": {1: 10.0, 4: 10.0, 16: 11.0}, "qkv_proj": {1: 10.0, 4: 10.0, 16: 10.0},
            "lm_head": {1: 100.0, 4: 100.0, 16: 100.0}}
    timed = {(_name(CONFIGS[3]), "o_proj"): {1: 9.0, 4: 9.0, 16: 9.5},
             (_name(CONFIGS[0]), "o_proj"): {1: 9.5, 4: 9.5, 16: 10.5},
             (_name(CONFIGS[0]), "qkv_proj"): {1: 9.0, 4: 11.0, 16: 9.0},
             (_name(CONFIGS[6]), "lm_head"): {1: 99.0, 4: 99.0, 16: 99.0}}
    gate_up_before = skinny.ROW_CONFIGS["gate_up_proj"]
    _turned(choose_skinny(timed, blas, skinny.MAX_ROWS), "--skinny-linear")
    assert skinny.ENABLED
    assert skinny.ROW_CONFIGS["o_proj"] == ((16, dict(CONFIGS[3], BLOCK_M=16, SPLIT_K=1)),)
    assert skinny.ROW_CONFIGS["qkv_proj"] == ((16, None),)
    assert skinny.ROW_CONFIGS["lm_head"] == ((16, dict(CONFIGS[6], BLOCK_M=16, SPLIT_K=1)),)
    assert skinny.ROW_CONFIGS["gate_up_proj"] == gate_up_before


def test_the_row_tiles_choice_adds_the_winning_tiles_past_the_small_batches():
    """down_proj wins at 256 rows only (split-K), the lm_head at 256, qkv_proj nowhere: cuBLAS
    up to 16 rows where the tree had nothing, cuBLAS at 64, the tiles at 256."""
    split, plain = WIDE_CONFIGS[256][4], WIDE_CONFIGS[256][0]
    assert split["SPLIT_K"] > 1
    blas = {"down_proj": {64: 10.0, 256: 30.0}, "qkv_proj": {64: 10.0, 256: 20.0}, "lm_head": {64: 200.0, 256: 400.0}}
    timed = {(_name(WIDE_CONFIGS[64][0]), "down_proj"): {64: 11.0}, (_name(split), "down_proj"): {256: 25.0},
             (_name(plain), "qkv_proj"): {256: 21.0}, (_name(plain), "lm_head"): {256: 380.0}}
    line = choose_row_tiles(timed, blas)
    assert "qkv_proj" not in line
    _turned(line)
    assert skinny.ENABLED
    assert skinny.ROW_CONFIGS["down_proj"] == ((16, None), (64, None), (256, split))
    assert skinny.ROW_CONFIGS["lm_head"] == ((16, None), (64, None), (256, plain))
    assert "qkv_proj" not in skinny.ROW_CONFIGS


def test_nothing_won_reads_as_no_arguments():
    assert choose_row_tiles({}, {"o_proj": {64: 1.0}}) == "none"
    assert choose_gate_up_silu({}) == "none"


def test_the_fused_choice_sets_the_tiles_of_each_row_configuration():
    fastest = {16: GATE_UP_SILU_CONFIGS[16][1], 256: GATE_UP_SILU_CONFIGS[256][2]}
    middle = dict(fused.ROW_CONFIGS)[64]
    _turned(choose_gate_up_silu(fastest), "--gate-up-silu")
    assert fused.ENABLED
    assert fused.ROW_CONFIGS == ((16, fastest[16]), (64, middle), (256, fastest[256]))


@pytest.mark.parametrize("flags,up_to", [(["--program-per-split", "--merge-by-last-program"], 1 << 30),
                                         (["--program-per-split", "16"], 16)])
def test_the_per_split_side_sets_the_batches_that_take_it(monkeypatch, flags, up_to):
    """`--program-per-split` alone: every batch (gpu_owed.sh's sides); with a count, up to it."""
    from specserve_kernels.backend import TUNED_16BIT_DECODE, TritonAttentionBackend
    monkeypatch.setitem(TUNED_16BIT_DECODE, "decode_options", dict(TUNED_16BIT_DECODE["decode_options"]))
    monkeypatch.setitem(TUNED_16BIT_DECODE, "program_per_split_up_to", 0)
    _turned("", *flags)
    backend = TritonAttentionBackend.for_dtype(torch.bfloat16)
    assert backend.program_per_split_up_to == up_to
    assert backend.decode_options.get("merge_by_last_program", False) == ("--merge-by-last-program" in flags)


@pytest.mark.parametrize("flags,attention,norm", [([], 32, 32), (["8"], 8, 8), (["32", "8"], 32, 8)])
def test_the_prefetch_sides_turn_it_on_at_their_sizes(flags, attention, norm):
    """gpu_owed.sh's prefetch sides: `--prefetch-weights [MIB [NORM_MIB]]` (32 MiB, o_proj's
    whole, unless said; the norms' windows as rotary's unless said)."""
    assert not l2_prefetch.ENABLED
    _turned("", "--prefetch-weights", *flags)
    assert l2_prefetch.ENABLED and l2_prefetch.MAX_BYTES == {"attention": attention << 20, "norm": norm << 20}


@pytest.mark.parametrize("tied", [False, True], ids=["llama3", "qwen2-tied"])
def test_ab_decode_counts_a_steps_bytes_as_decode_py_does(tmp_path, tied):
    """ab_decode's MBU takes the engine's own model (fused projections) where decode.py takes
    transformers' on the same checkpoint: the same bytes a step, so the sides' MBU can be held
    against issue 17's goal as decode.py's is."""
    from transformers import AutoModelForCausalLM

    from app.models.loader import load_model
    from benchmarks.decode import step_bytes
    from tests.checkpoints import write_random_llama3, write_random_qwen2
    path = (write_random_qwen2 if tied else write_random_llama3)(tmp_path)
    ours = load_model(path, torch.float32, torch.device("cpu"))
    theirs = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    for batch, context in ((1, 192.0), (256, 192.0)):
        assert step_bytes(ours, batch, context) == step_bytes(theirs, batch, context)


def _ab_decode_commands() -> list[list[str]]:
    """Every ab_decode.py command line in scripts/gpu_owed.sh, continuation lines joined, with
    the shell's variables as the script sets them in round 1 (batches 1 and 256 where linears.py
    chose tiles of rows) and those of the environment unset (linears.py's choices: none)."""
    import re
    from pathlib import Path
    script = (Path(__file__).resolve().parents[2] / "scripts" / "gpu_owed.sh").read_text().replace("\\\n", " ")
    commands = []
    for line in script.splitlines():
        if "ab_decode.py" not in line or line.lstrip().startswith("#"):
            continue
        set_by_the_script = {"round": "1", "skinny_batches": "1 256"}
        line = re.sub(r"\$\{?(\w+)\}?", lambda m: set_by_the_script.get(m.group(1), ""), line)
        words = shlex.split(line.split("ab_decode.py", 1)[1].split("2>&1")[0])
        commands.append(words)
    return commands


def test_every_ab_decode_command_of_the_gpu_plan_parses():
    """A flag misspelt in gpu_owed.sh would cost a GPU session a side (argparse exits); each
    of its ab_decode.py lines must parse and set the kernels' settings here first."""
    commands = _ab_decode_commands()
    assert len(commands) >= 8
    for words in commands:
        turn_choices(parse_args(words))


def test_the_ab_table_reads_back_what_each_side_printed():
    """`gpu_owed.sh` ends its A/B with `benchmarks/ab_table.py` over the sides' lines: each side's
    ratio to the baseline's run of the same round, and issue 17's goals on the best round."""
    from benchmarks.ab_decode import result_line
    from benchmarks.ab_table import parse, table
    copy = 3.0e12
    figures = {("new", 1): (160.0, 0.80), ("new", 2): (170.0, 0.85), ("prefetch-32", 1): (168.0, 0.84),
               ("prefetch-32", 2): (171.7, 0.858)}
    lines = [result_line(f"{side}-{r}", 8192, 128, 1, False, tok_s, mbu, copy)
             for (side, r), (tok_s, mbu) in figures.items()]
    lines += [result_line(f"{side}-1", 8192, 128, 256, False, tok_s, 0.5, copy)
              for side, tok_s in (("new", 24000.0), ("prefetch-32", 25200.0))]
    runs = parse(["skinny: (the defaults)", *lines])
    assert len(runs) == 6 and {run.cell for run in runs} == {(128, 1, "greedy"), (128, 256, "greedy")}
    rows = {tuple(row.split()[:3]): row for row in table(runs, "new")[1:]}
    assert "1.030x (1.010-1.050)" in rows["prefetch-32", "128", "1"]  # 168/160 and 171.7/170
    assert rows["prefetch-32", "128", "1"].endswith("MBU >= 85%: met (best round)")
    assert rows["new", "128", "1"].endswith("MBU >= 85%: met (best round)")  # its round 2, 85.0%
    assert rows["new", "128", "256"].endswith("25,000 tok/s: not met (best round)")
    assert "1.050x" in rows["prefetch-32", "128", "256"] and rows["prefetch-32", "128", "256"].endswith(": met (best round)")
