"""Per-step guided host work at batch 32: plan_guided_drafts + mask_guided_rows, one tree."""
import sys, time, statistics
root = sys.argv[1]
sys.path.insert(0, root)
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from app.engine.guided_rows import mask_guided_rows, plan_guided_drafts
from app.engine.request import Request
from app.guided.compiler import compile_regex, regex_for_format
from app.guided.guide import GuidedDecoder
from app.guided.vocabulary import load_guided_vocabulary
from app.sampling_params import SamplingParams
model = f"{root}/checkpoints/tiny-target"
tok = AutoTokenizer.from_pretrained(model)
vocab = load_guided_vocabulary(model)
index = compile_regex(r"\{\"a\":[0-9]{1,3},\"b\":\"[a-z]{1,5}\"\}", vocab)
reqs = []
for i in range(32):
    r = Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=100, temperature=0))
    r.num_computed_tokens = 3
    r.guide = GuidedDecoder(index, vocab, 4096)
    reqs.append(r)
logits = torch.randn(32, 4096)
sampled = [(r, i) for i, r in enumerate(reqs)]
def step():
    plan_guided_drafts(reqs, tok, 2048, True)
    for r in reqs:
        r.set_spec([])
    mask_guided_rows(logits, sampled, tok)
for _ in range(50):
    step()
times = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(200):
        step()
    times.append((time.perf_counter() - t) / 200 * 1e6)
print(f"{root}: {statistics.median(times):.1f} us per step")
