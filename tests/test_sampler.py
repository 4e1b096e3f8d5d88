"""Sampler: filters never emit a token outside their set; sampled frequencies follow the
distribution; seeded rows are independent of the batch."""

import math

import pytest
import torch

from app.engine.request import Request
from app.engine.selection.distribution import filter_logits
from app.sampling_params import SamplingParams
from tests.sampling import Sampler

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
PROBS = LOGITS.softmax(-1)


def draw(params: SamplingParams, n: int = 4000, seed: int = 0) -> torch.Tensor:
    sampler = Sampler(seed)
    reqs = [Request(f"r{i}", [0], params) for i in range(n)]
    tokens, _ = sampler(LOGITS.repeat(n, 1), reqs)
    return torch.tensor(tokens)


@pytest.mark.parametrize("params, allowed", [
    (SamplingParams(top_k=3), {0, 1, 2}),
    (SamplingParams(top_p=0.5), {0, 1}),  # p0 = 0.35, p0 + p1 = 0.56 >= 0.5
    (SamplingParams(min_p=0.3), {0, 1, 2}),  # p / p_max: 1, .61, .37, .22, ...
    (SamplingParams(top_k=5, top_p=0.9, min_p=0.25), {0, 1, 2}),
])
def test_filters_never_emit_outside_their_set(params, allowed):
    tokens = draw(params)
    assert set(tokens.tolist()) == allowed  # never outside, and every allowed token appears


def test_top_p_set_is_computed_from_mass():
    assert PROBS[0] < 0.5 < PROBS[0] + PROBS[1]


def test_temperature_sampling_follows_the_distribution():
    n = 20000
    temperature = 0.7
    tokens = draw(SamplingParams(temperature=temperature), n=n)
    expected = (LOGITS / temperature).softmax(-1) * n
    observed = torch.bincount(tokens, minlength=len(LOGITS)).float()
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 24.3  # chi-square, 7 degrees of freedom, p = 0.001


def test_filter_renormalises_top_p_within_top_k():
    out = filter_logits(LOGITS[None], torch.tensor([2]), torch.tensor([0.6]), torch.tensor([0.0]))
    kept = torch.isfinite(out[0]).nonzero().flatten().tolist()
    # Within the top 2, token 0 has 0.62 >= 0.6 of the mass (of all 8 it would have 0.35).
    assert kept == [0]


def test_greedy_and_logprobs():
    sampler = Sampler()
    req = Request("g", [0], SamplingParams(temperature=0, logprobs=3))
    tokens, logprobs = sampler(LOGITS[None], [req])
    assert tokens == [0]
    lp = logprobs[0]
    assert lp.token_id == 0 and math.isclose(lp.logprob, math.log(PROBS[0]), rel_tol=1e-5)
    assert list(lp.top) == [0, 1, 2]


def test_seeded_rows_do_not_depend_on_the_batch():
    params = SamplingParams(temperature=1.0, seed=1234)
    alone_req, batched_req = Request("a", [0], params), Request("a", [0], params)
    others = [Request(f"o{i}", [0], SamplingParams(temperature=1.0)) for i in range(5)]
    alone_sampler, batch_sampler = Sampler(0), Sampler(99)
    alone, batched = [], []
    for _ in range(30):
        alone += alone_sampler(LOGITS[None], [alone_req])[0]
        batched.append(batch_sampler(LOGITS.repeat(6, 1), others[:3] + [batched_req] + others[3:])[0][3])
    assert alone == batched
    assert len(set(alone)) > 2  # really sampled
