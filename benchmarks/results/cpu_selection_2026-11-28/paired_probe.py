"""One change of selection against the way before it, in ONE engine process: passes alternate
the two ways (so both see the same machine), batch 1, the default n-gram speculation, 12
prompts x 64 tokens, one torch thread; each pair's tok/s ratio, and their median.

    python paired_probe.py drafted_probs [PAIRS]   # filtered_probs (C++) against row_probs (the sort);
                                                   # sampled (0.8, top_p 0.95), grounded prompts
    python paired_probe.py argmax_chain [PAIRS]    # the argmax chain on the host against verify's
                                                   # tensor ops; greedy, 6 random + 6 grounded prompts
"""
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from app.config import EngineConfig  # noqa: E402
from app.engine.engine import LLMEngine  # noqa: E402
from app.engine.selection import selector  # noqa: E402
from app.engine.selection.distribution import row_probs  # noqa: E402
from app.engine.selection.verify import verify  # noqa: E402
from app.sampling_params import SamplingParams  # noqa: E402
from benchmarks.grounded_prompts import input_grounded_texts  # noqa: E402

torch.set_num_threads(1)
which = sys.argv[1]
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
model = str(ROOT / "checkpoints" / "tiny-target")
tok = AutoTokenizer.from_pretrained(model)
engine = LLMEngine(EngineConfig(model=model, speculative_method="ngram", prompt_lookup_min=3))
rng = random.Random(0)
if which == "drafted_probs":
    params = SamplingParams(max_tokens=64, temperature=0.8, top_p=0.95, ignore_eos=True)
    prompts = [tok.encode(t) for t in input_grounded_texts(12, 3)]
    name, ways = "filtered_probs", {"new": selector.filtered_probs, "before": row_probs}
else:
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    prompts = ([[rng.randrange(10, 4096) for _ in range(128)] for _ in range(6)]
               + [tok.encode(t) for t in input_grounded_texts(6, 3)])
    name, ways = "_verify_by_argmax", {"new": selector._verify_by_argmax,
                                       "before": lambda argmax, layout: verify(layout.verify, None, argmax, None, None)}


def run(tag: str) -> float:
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}{i}", p, params)
        while engine.has_unfinished_requests():
            engine.step()
    return len(prompts) * 64 / (time.perf_counter() - t0)


run("warm")
rates = {way: [] for way in ways}
for pair in range(pairs):
    for way in (list(ways) if pair % 2 else list(ways)[::-1]):
        setattr(selector, name, ways[way])
        rates[way].append(run(f"{way}{pair}"))
ratios = [a / b for a, b in zip(rates["new"], rates["before"])]
for way, r in rates.items():
    print(f"{way:6s} tok/s median {statistics.median(r):.1f}: {', '.join(f'{x:.0f}' for x in r)}")
print(f"new / before per pair: median {statistics.median(ratios):.3f}, {', '.join(f'{x:.3f}' for x in ratios)}")
print("steps by k:", dict(engine.speculator.stats.steps_by_k))
