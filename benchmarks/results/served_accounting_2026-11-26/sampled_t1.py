"""Engine alone, 1 torch thread (as the served replica), batch 1, copying prompts, sampled 0.8/0.95:
ngram3 against off, alternated, 3 rounds; the adaptive state at the end."""
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, ".")
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
prompts = [tok.encode(t) for t in input_grounded_texts(16, 0)]
common = dict(model="checkpoints/tiny-target", num_kv_blocks=2048, max_num_seqs=8)
engines = {"off": LLMEngine(EngineConfig(**common)),
           "ngram3": LLMEngine(EngineConfig(**common, speculative_method="ngram", prompt_lookup_min=3))}
params = SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.8, top_p=0.95)
res = {k: [] for k in engines}
for r in range(3):
    for name, eng in (engines.items() if r % 2 == 0 else reversed(engines.items())):
        t = time.perf_counter()
        for p in prompts:
            eng.generate([p], params)
        res[name].append(time.perf_counter() - t)
e = engines["ngram3"]
st = e.stats().spec
print({k: [round(x, 2) for x in v] for k, v in res.items()}, "ngram3/off", round(sum(res["ngram3"]) / sum(res["off"]), 3),
      "acc", round(st.acceptance_rate, 2), "steps_by_k", st.steps_by_k, "drafts", st.num_drafts)
ad = e.speculator.adaptive
for b, bucket in ad.buckets.items():
    print("  best", bucket.best, {k: (bucket.num_timed(k), round(bucket.seconds(k) * 1e3, 3)) for k in range(5) if bucket.num_timed(k)},
          "expected", {k: round(ad.acceptance.expected_tokens(k), 2) for k in range(5)})
