"""Where selection's time goes in the engine at batch 1 (the default n-gram speculation, 12
random 128-token prompts, 64 tokens each, one thread): each part's wall time per step, timed
in place (so with the caches as the forward leaves them).

    python selection_parts_probe.py TREE TEMPERATURE
"""
import sys, time, random, collections
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import torch
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
import app.engine.selection.selector as S, app.engine.selection.layout as L, app.engine.selection.draw as D
torch.set_num_threads(1)
spent = collections.Counter(); calls = collections.Counter()
def wrap(mod, name, label):
    orig = getattr(mod, name)
    def f(*a, **k):
        t0 = time.perf_counter(); r = orig(*a, **k); spent[label] += time.perf_counter() - t0; calls[label] += 1; return r
    setattr(mod, name, f)
wrap(S.Selector, "on_device", "on_device"); wrap(S, "choose", "choose"); wrap(S, "draw_with_uniforms", "draw")
wrap(L.RowLayout, "uniforms", "uniforms"); wrap(L.SamplingRows, "on", "sampling.on"); wrap(S, "_verify_drafted", "verify_drafted")
wrap(S, "logprob_payload", "logprob_payload"); wrap(S, "verify", "verify"); wrap(S, "row_argmax", "row_argmax"); wrap(S.transfer, "to_host", "to_host"); 
S.Selector.to_host = staticmethod(S.Selector.to_host)
model = str(Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-target")
engine = LLMEngine(EngineConfig(model=model, speculative_method="ngram", prompt_lookup_min=3))
params = SamplingParams(max_tokens=64, temperature=float(sys.argv[2]), top_p=0.95, ignore_eos=True)
rng = random.Random(0)
prompts = [[rng.randrange(10, 4096) for _ in range(128)] for _ in range(12)]
def run(tag):
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}{i}", p, params)
        while engine.has_unfinished_requests():
            engine.step()
run("w"); spent.clear(); calls.clear()
t0 = time.perf_counter(); run("r"); wall = time.perf_counter() - t0
steps = calls["on_device"]
print(f"wall {wall:.3f} s, {steps} selections, {wall/steps*1e3:.2f} ms a step")
for k, v in spent.most_common(): print(f"{k:18s} {v/steps*1e6:7.1f} us a step ({calls[k]} calls), {100*v/wall:.1f}%")
