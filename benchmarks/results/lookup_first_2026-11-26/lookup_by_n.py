"""Acceptance of prompt lookup by match length, on greedy outputs of the tiny target."""
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import numpy as np
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from app.engine.spec.ngram_proposer import find_ngram_continuation
from benchmarks.grounded_prompts import input_grounded_texts, open_ended_texts

tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
eng = LLMEngine(EngineConfig(model="checkpoints/tiny-target", num_kv_blocks=2048))
for name, texts in [("grounded", input_grounded_texts(16, 0)), ("open", open_ended_texts(16, 0))]:
    prompts = [tok.encode(t) for t in texts]
    outs = eng.generate(prompts, SamplingParams(max_tokens=128, temperature=0, ignore_eos=True))
    stats = {}
    for p, o in zip(prompts, outs):
        seq = np.array(p + list(o))
        for t in range(len(p), len(seq) - 4):
            ctx = seq[:t]
            for n in (4, 3, 2, 1):
                prop = find_ngram_continuation(ctx, 4, n, n)
                if len(prop):
                    break
            else:
                n = 0
            if n == 0:
                stats.setdefault(0, [0, 0, 0])[0] += 1
                continue
            truth = seq[t:t + len(prop)]
            acc = 0
            while acc < len(prop) and prop[acc] == truth[acc]:
                acc += 1
            s = stats.setdefault(n, [0, 0, 0]); s[0] += 1; s[1] += len(prop); s[2] += acc
    print(name, {n: (c, f"proposed {pr/c:.2f} accepted/step {a/c:.2f} rate {a/max(pr,1):.2f}") for n, (c, pr, a) in sorted(stats.items())})
