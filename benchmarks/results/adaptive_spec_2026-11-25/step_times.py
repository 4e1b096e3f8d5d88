# Step times of the engine with the in-process draft at a fixed k (1 and 4), batch 1, on
# spec.py's input-grounded prompts (ms per LLMEngine.step, first 25 steps of each request).
# Run from the repository root: PYTHONPATH=. python benchmarks/results/adaptive_spec_2026-11-25/step_times.py
import sys; sys.path.insert(0, "/work/main")
import time
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
sys.path.insert(0, "/work/main/benchmarks")
from spec import workloads
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
work = workloads(tok, 4, 0)
for k in (1, 4):
    e = LLMEngine(EngineConfig(model="checkpoints/tiny-target", num_kv_blocks=4096, max_num_seqs=16, speculative_method="draft", draft_model="checkpoints/tiny-draft", adaptive_speculation=False, speculation_schedule={1: k}))
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    for p in work["input-grounded"][:3]:
        e.add_request("x", p, params)
        times = []
        while e.has_unfinished_requests():
            t = time.perf_counter(); e.step(); times.append(round((time.perf_counter() - t) * 1000, 1))
        print(k, times[:25])
        e.requests.clear()
