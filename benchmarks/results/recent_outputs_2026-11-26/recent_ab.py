"""Engine alone, batch 1, 48 grounded prompts one after another (each seen once per engine):
speculation off / lookup in own tokens / and in recent outputs, alternated rounds, with n-gram
lookup from 3 tokens (`ngram`, the default) or the draft model looking up first (`draft`):
    python benchmarks/results/recent_outputs_2026-11-26/recent_ab.py ROUNDS [ngram|draft]  # from the repo root"""
import os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, ".")
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.serving_workload import grounded_requests
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
G = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
method = sys.argv[2] if len(sys.argv) > 2 else "ngram"
speculation = (dict(speculative_method="ngram", prompt_lookup_min=3) if method == "ngram"
               else dict(speculative_method="draft", draft_model="checkpoints/tiny-draft"))
sides = {"off": dict(speculative_method=None), "own": dict(**speculation, lookup_recent_output_tokens=0),
         "recent": dict(**speculation, lookup_recent_output_tokens=32768)}
times = {k: [] for k in sides}
outs = {}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    prompts = [tok(q.prompt)["input_ids"] for q in grounded_requests(tok, 48, 64, 100 + r)]
    for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
        e = LLMEngine(EngineConfig(model="checkpoints/tiny-target", num_kv_blocks=1024, **sides[name]))
        e.generate([prompts[0]], G)  # warm
        t = time.perf_counter()
        res = [e.generate([p], G)[0] for p in prompts[1:]]
        times[name].append(time.perf_counter() - t)
        outs.setdefault(r, []).append(res)
        st = e.stats().spec if e.speculator else None
        print(f"round {r} {name:>6}: {times[name][-1]:.2f} s" + (f"  drafts {st.num_drafts} accepted {st.num_accepted_tokens}/{st.num_draft_tokens}" if st else ""), flush=True)
    assert all(o == outs[r][0] for o in outs[r]), "outputs differ"
for name in sides:
    print(name, " ".join(f"{t:.2f}" for t in times[name]), f"speed-up over off {sum(times['off']) / sum(times[name]):.3f}")
