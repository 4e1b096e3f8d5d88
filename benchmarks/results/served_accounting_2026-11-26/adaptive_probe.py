import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, ".")
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
prompts = [tok.encode(t) for t in input_grounded_texts(16, 0)]
eng = LLMEngine(EngineConfig(model="checkpoints/tiny-target", num_kv_blocks=2048, max_num_seqs=8,
                             speculative_method="ngram", prompt_lookup_min=3))
params = SamplingParams(max_tokens=64, ignore_eos=True, **(dict(temperature=0) if "greedy" in sys.argv else dict(temperature=0.8, top_p=0.95)))
for p in prompts:
    eng.generate([p], params)
ad = eng.speculator.adaptive
st = eng.stats().spec
print("steps_by_k", st.steps_by_k, "acc per pos", st.accepted_per_position, "drafts", st.num_drafts)
for b, bucket in ad.buckets.items():
    print("bucket", b, "best", bucket.best, {k: (bucket.num_timed(k), round(bucket.seconds(k) * 1e3, 3)) for k in range(5) if bucket.num_timed(k)})
print("expected tokens", {k: round(ad.acceptance.expected_tokens(k), 3) for k in range(5)})
print("total tokens", eng.generation_tokens, "steps", eng.num_steps)
