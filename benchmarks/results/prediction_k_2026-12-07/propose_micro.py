"""Speculator.propose at 32 decoding requests (n-gram proposer, as served), a commit's speculator.py
(argv[1]: `git show REF:app/engine/spec/speculator.py > F`) against the work tree's, at k 0 (a CPU's
schedule from 4 running requests) and k 4; best of 5 x 300 calls each, the two alternated."""
import importlib.util
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from app.engine.request import Request  # noqa: E402
from app.engine.spec.ngram_proposer import NgramProposer  # noqa: E402
from app.engine.spec.schedule import SpeculationSchedule  # noqa: E402
from app.sampling_params import SamplingParams  # noqa: E402
import app.engine.spec.speculator as new  # noqa: E402


def load(path):
    spec = importlib.util.spec_from_file_location("old_speculator", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_speculator"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def rows(n=32, length=300):
    rng = random.Random(0)
    out = []
    for i in range(n):
        req = Request(f"r{i}", [rng.randrange(4000) for _ in range(length)],
                      SamplingParams(max_tokens=512, temperature=0.0))
        req.num_computed_tokens = req.num_tokens - 1
        out.append(req)
    return out


def timed(module, k):
    speculator = module.Speculator(NgramProposer(4, 3, 4), SpeculationSchedule({1: 4}), max_model_len=4096,
                                   vocab_width=4096, adaptive=False)
    running = rows()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(300):
            speculator.propose(running, 0, k)
        best = min(best, (time.perf_counter() - started) / 300)
    return best


old = load(sys.argv[1])
for k in (0, 4):
    a, b = [], []
    for _ in range(3):
        a.append(timed(old, k))
        b.append(timed(new, k))
    print(f"k {k}: old {min(a) * 1e6:.1f} us, new {min(b) * 1e6:.1f} us a call of 32 rows, old/new {min(a) / min(b):.3f}")
