"""benchmarks/step_gaps.py: GPU idle gaps put down to the host phase that launched late, and the
phase markers it wraps an engine in for a trace (which must leave the engine as it was)."""

from __future__ import annotations

import json

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.step_gaps import (LAUNCH_NOT_TRACED, LAUNCHED_IN_TIME, busy_by_kernel, find_gaps, load_trace,
                                  marked_engine_phases, summarize)
from tests.checkpoints import DEFAULT_TARGET


def x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_a_late_launch_is_charged_to_the_phase_around_it_and_an_early_one_is_not():
    events = [
        x("kernel", "step 1", 0, 100, correlation=1), x("cuda_runtime", "cudaGraphLaunch", -50, 5, correlation=1),
        # The host is in "execute" (its "prepare inputs" ended at 130) when it launches step 2
        # at 135, 35 us after the GPU ran dry at 100.
        x("user_annotation", "execute", 100, 60), x("user_annotation", "prepare inputs", 101, 29),
        x("cuda_driver", "cuLaunchKernel", 135, 4, correlation=2), x("kernel", "step 2", 140, 100, correlation=2),
        # Launched at 150, long before the GPU got to it: in time (it starts inside the next one).
        x("cuda_runtime", "cudaLaunchKernel", 150, 4, correlation=3), x("gpu_memcpy", "Memcpy HtoD", 250, 10, correlation=3),
        # 5 us after step 2, with no launch event in the trace: not put down to the host.
        x("kernel", "unlaunched", 245, 10, correlation=4),
        x("kernel", "short gap", 262, 5, correlation=5),  # 2 us after the copy: under the threshold
        # Launched at 200, before the GPU ran dry at 267: the GPU waited on something else.
        x("cuda_runtime", "cudaLaunchKernel", 200, 4, correlation=6), x("kernel", "waited", 280, 5, correlation=6),
    ]
    gaps = find_gaps(events, min_gap_us=5)
    assert [(g.start_us, g.end_us, g.before, g.after) for g in gaps] == [
        (100, 140, "step 1", "step 2"), (240, 245, "step 2", "unlaunched"), (267, 280, "short gap", "waited")]
    assert gaps[0].launch_late_us == 35 and gaps[0].host_phase == "execute"  # prepare had ended at 130
    assert gaps[1].launch_late_us is None and gaps[1].host_phase == LAUNCH_NOT_TRACED
    assert gaps[2].launch_late_us == -67 and gaps[2].host_phase == LAUNCHED_IN_TIME
    assert summarize(gaps) == {"execute": (1, 40.0), LAUNCHED_IN_TIME: (1, 13.0), LAUNCH_NOT_TRACED: (1, 5.0)}


def test_busy_time_is_summed_by_kernel_whatever_its_template_arguments():
    events = [x("kernel", "void cublasLt::splitKreduce_kernel<32, 16, int, float>(Params)", 0, 3),
              x("kernel", "_rms_norm_kernel", 3, 2), x("kernel", "void cublasLt::splitKreduce_kernel<8, float>", 5, 4),
              x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 9, 1),
              x("cuda_runtime", "cudaLaunchKernel", 0, 50)]  # host time: not the GPU's
    assert busy_by_kernel(events) == [("void cublasLt::splitKreduce_kernel", 7, 2), ("_rms_norm_kernel", 2, 1),
                                      ("Memcpy HtoD", 1, 1)]


def test_traces_load_plain_or_gzipped(tmp_path):
    import gzip
    events = [x("kernel", "k", 0, 1)]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert load_trace(tmp_path / "t.json") == load_trace(tmp_path / "t.json.gz") == events


def test_marked_phases_show_in_the_trace_and_leave_the_engine_unchanged():
    from torch.profiler import ProfilerActivity, profile

    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    plain = engine.generate([[1, 2, 3, 4]], params)
    with marked_engine_phases(engine), profile(activities=[ProfilerActivity.CPU]) as prof:
        marked = engine.generate([[1, 2, 3, 4]], params)
    assert marked == plain
    seen = {e.name for e in prof.events()}
    assert {"schedule", "execute", "prepare inputs", "select (launch)", "update"} <= seen
    assert not {"_schedule", "_update", "_advance_ahead", "_finish_ahead", "_to_host"} & set(vars(engine))
    assert not {"prepare", "execute"} & set(vars(engine.runner)) and "on_device" not in vars(engine.selector)
