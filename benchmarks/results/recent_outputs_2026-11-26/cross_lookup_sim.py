"""Would an n-gram table over other requests' tokens (suffix-decoding style) cover the steps
own-prompt lookup misses? Greedy outputs of the grounded workload, then simulated verification."""
import os, sys, json
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, ".")
import numpy as np
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from app.engine.spec.ngram_proposer import find_ngram_continuation
from benchmarks.serving_workload import grounded_requests
N, OUT, K = int(sys.argv[1]) if len(sys.argv) > 1 else 48, 64, 4
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
reqs = grounded_requests(tok, N, OUT, 0)
cache = "benchmarks/out/grounded_outputs.json"
if os.path.exists(cache):
    data = json.load(open(cache))
else:
    engine = LLMEngine(EngineConfig(model="checkpoints/tiny-target", dtype="float32", device="cpu", num_kv_blocks=2048))
    params = SamplingParams(max_tokens=OUT, temperature=0.0, ignore_eos=True)
    data = []
    for r in reqs:
        ids = tok(r.prompt)["input_ids"]
        out = engine.generate([ids], params)[0]
        data.append([ids, list(out)])
    json.dump(data, open(cache, "w"))

def steps_for(prompt, out, table, min_n, use_global):
    ctx = list(prompt); i = 0; steps = 0; own_hit = glob_hit = 0
    while i < len(out):
        prop = list(find_ngram_continuation(np.array(ctx), K, min_n=min_n, max_n=4))
        if prop: own_hit += 1
        elif use_global:
            for n in (4, 3, 2, 1)[: 5 - min_n]:
                p = table.get(tuple(ctx[-n:]))
                if p:
                    prop = p[:K]; glob_hit += 1; break
        acc = 0
        while acc < len(prop) and i + acc < len(out) and prop[acc] == out[i + acc]:
            acc += 1
        step_tokens = min(acc + 1, len(out) - i)
        ctx += out[i:i + step_tokens]; i += step_tokens; steps += 1
    return steps, own_hit, glob_hit

for min_n in (3, 1):
    for use_global in (False, True):
        table = {}
        tot = own = glob = 0
        for prompt, out in data:
            s, o, g = steps_for(prompt, out, table, min_n, use_global)
            tot += s; own += o; glob += g
            seq = prompt + out
            for n in range(1, 5):
                for j in range(n, len(seq)):
                    table[tuple(seq[j - n:j])] = seq[j:j + K]
        print(f"min_n {min_n} global {use_global}: steps {tot} for {len(data) * OUT} tokens "
              f"({len(data) * OUT / tot:.2f} tokens/step), own matches {own}, global matches {glob}")

print("outputs only in the table:")
for min_n in (3,):
    table = {}
    tot = 0
    for prompt, out in data:
        s, o, g = steps_for(prompt, out, table, min_n, True)
        tot += s
        seq = out
        for n in range(1, 5):
            for j in range(n, len(seq)):
                table[tuple(seq[j - n:j])] = seq[j:j + K]
    print(f"min_n {min_n}: {len(data) * OUT / tot:.2f} tokens/step")
