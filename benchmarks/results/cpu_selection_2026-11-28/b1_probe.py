"""Batch 1, greedy or sampled (temperature T, top_p 0.95), the default n-gram speculation: random
128-token prompts and grounded ones (drafts), 12 requests x 64 tokens each; tok/s of the best of
2 passes (PASSES), one process per side and round, sides alternated (ab_run.sh), one torch
thread; prints tok/s by wall and by process CPU time.

    python b1_probe.py TREE TEMPERATURE     (PASSES=3 for the best of 3; ab_run.sh alternates two trees)
"""
import os, sys, time, random
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts
model = str(Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-target")
tok = AutoTokenizer.from_pretrained(model)
engine = LLMEngine(EngineConfig(model=model, speculative_method="ngram", prompt_lookup_min=3))
temp = float(sys.argv[2])
params = SamplingParams(max_tokens=64, temperature=temp, top_p=0.95, ignore_eos=True)
rng = random.Random(0)
sets = {"random": [[rng.randrange(10, 4096) for _ in range(128)] for _ in range(12)],
        "grounded": [tok.encode(t) for t in input_grounded_texts(12, 3)]}
def run(tag, prompts):
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}{i}", p, params)
        while engine.has_unfinished_requests():
            engine.step()
run("w", sets["random"][:3])
out = []
for name, prompts in sets.items():
    best = cpu = 1e9
    for r in range(int(os.environ.get("PASSES", "2"))):
        t0, c0 = time.perf_counter(), time.process_time(); run(f"{name}{r}", prompts)
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    out.append(f"{name} wall {12 * 64 / best:.1f} cpu {12 * 64 / cpu:.1f}")
print(" ".join(out))
