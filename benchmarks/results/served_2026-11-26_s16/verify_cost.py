"""Where a drafting step's extra time goes on the CPU (batch 1, grounded prompts, n-gram)."""
import os, sys, time, statistics, collections, functools
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts
import app.engine.model_runner as mr
import app.engine.selection.selector as sel
import app.engine.selection.layout as lay

tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
prompts = [tok.encode(t) for t in input_grounded_texts(16, 0)]
min_n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
engine = LLMEngine(EngineConfig(model="checkpoints/tiny-target", speculative_method="ngram", prompt_lookup_min=min_n))
cur = collections.defaultdict(float)
def _t(label, f, *a, **k):
    t = time.perf_counter()
    try:
        return f(*a, **k)
    finally:
        cur[label] += time.perf_counter() - t
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            cur[label] += time.perf_counter() - t
    setattr(obj, name, w)
wrap(mr.ModelRunner, "prepare", "prepare")
wrap(mr.ModelRunner, "execute", "execute(all)")
wrap(engine.runner.model, "forward", "model.forward")
wrap(engine.runner.model, "compute_logits", "logits")
_b = lay.RowLayout.build
lay.RowLayout.build = classmethod(lambda cls, *a, **k: _t("layout.build", _b, *a, **k))
wrap(engine.selector, "on_device", "select.on_device")
wrap(engine.selector, "to_host", "select.to_host")
wrap(engine.speculator, "propose", "spec.propose")
wrap(engine.scheduler, "schedule", "schedule")
wrap(engine, "_update", "update")
params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
acc = {"plain": collections.defaultdict(list), "drafting": collections.defaultdict(list)}
steps_by_k = engine.speculator.stats.steps_by_k
for rep in range(2):
    for i, p in enumerate(prompts):
        engine.add_request(f"r{rep}-{i}", p, params)
        while engine.has_unfinished_requests():
            before = sum(n for k, n in steps_by_k.items() if k > 0)
            cur.clear(); t = time.perf_counter()
            engine.step()
            total = time.perf_counter() - t
            kind = "drafting" if sum(n for k, n in steps_by_k.items() if k > 0) > before else "plain"
            if rep == 1:
                acc[kind]["step"].append(total)
                for k, v in cur.items(): acc[kind][k].append(v)
for kind in ("plain", "drafting"):
    n = len(acc[kind]["step"])
    print(f"{kind}: {n} steps")
    for k, v in sorted(acc[kind].items(), key=lambda kv: -sum(kv[1])):
        print(f"   {k:<18} median {1000*statistics.median(v):7.3f} ms  mean {1000*sum(v)/n:7.3f} ms/step")
