"""Batch 1, sampled (temperature 0.8, top_p 0.95), the served default speculation (n-gram from 3
tokens, adaptive), random 128-token prompts (serving.py's) and grounded ones: how many steps
draft, and the time in selection."""
import sys, time, random
sys.path.insert(0, sys.argv[1])
from pathlib import Path  # noqa: E402
CHECKPOINT = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-target"  # this repository's
import torch
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from app.engine.selection import selector as sel
from benchmarks.grounded_prompts import input_grounded_texts
torch.set_num_threads(1)
model = str(CHECKPOINT)
tok = AutoTokenizer.from_pretrained(model)
engine = LLMEngine(EngineConfig(model=model, speculative_method=(sys.argv[2] if len(sys.argv) > 2 else None), prompt_lookup_min=3))
spent = [0.0]
orig = sel.choose
def timed(*a, **k):
    t0 = time.perf_counter(); r = orig(*a, **k); spent[0] += time.perf_counter() - t0; return r
sel.choose = timed
params = SamplingParams(max_tokens=64, temperature=0.8, top_p=0.95, ignore_eos=True)
rng = random.Random(0)
for name, prompts in (("random", [[rng.randrange(10, 4096) for _ in range(128)] for _ in range(12)]),
                      ("grounded", [tok.encode(t) for t in input_grounded_texts(12, 3)])):
    spent[0] = 0.0
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"{name}{i}", p, params)
        while engine.has_unfinished_requests():
            engine.step()
    wall = time.perf_counter() - t0
    after = {}
    print(sys.argv[1], name, f"wall {wall:.2f} s, choose {spent[0]:.3f} s ({100*spent[0]/wall:.1f}%)")
