"""Selection's seeded draws: uniform, following the filtered distribution (chi-square), and the
same for a seeded request alone or in any batch, with or without drafts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engine.request import Request
from app.engine.selection.distribution import filter_logits, row_probs
from app.engine.selection.draws import ROW_STREAMS, host_uniforms
from app.engine.selection.layout import RowLayout
from app.engine.selection.selector import Selector, choose
from app.engine.selection.verify import verify
from app.sampling_params import SamplingParams

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
V = len(LOGITS)
P_THRESHOLD = 1e-3
# On CUDA a row without drafts draws through the sort-free kernel (specserve_kernels/filtered_sampling.py).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    support = expected > 0
    assert observed[~support].sum() == 0, "a token outside the filtered set was drawn"
    stat = ((observed[support] - expected[support]) ** 2 / expected[support]).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat.double() / 2))


def layout_of(requests: list[Request], device: torch.device) -> RowLayout:
    """The step that computes each request's known tokens (its drafts too), rows in order."""
    return RowLayout.build({r: r.num_tokens - r.num_computed_tokens for r in requests}, device)


def select(requests: list[Request], logits: torch.Tensor, step: int = 0, seed: int = 0) -> list[list[int]]:
    """Each request's chosen tokens (accepted drafts + its own) from rows laid out in order."""
    layout = layout_of(requests, logits.device)
    return [c.token_ids for c in Selector(seed)(logits, layout, step)]


def decoding(request_id: str, params: SamplingParams, prompt_len: int = 3) -> Request:
    req = Request(request_id, list(range(prompt_len)), params)
    req.num_computed_tokens = prompt_len - 1
    return req


@pytest.mark.parametrize("key_varies", [True, False], ids=["across-seeds", "across-positions"])
def test_uniforms_are_uniform(key_varies):
    n, bins = 50000, 20
    index = np.arange(n)
    key = index if key_varies else np.full(n, 7)
    position = np.full(n, 3) if key_varies else index
    u = torch.from_numpy(host_uniforms(key, position))
    for stream in range(len(ROW_STREAMS)):
        assert ((u[:, stream] >= 0) & (u[:, stream] < 1)).all()
        observed = torch.bincount((u[:, stream] * bins).long(), minlength=bins).double()
        assert chi2_pvalue(observed, torch.full((bins,), n / bins, dtype=torch.float64)) > P_THRESHOLD
    # No two streams of one row are the same numbers.
    assert all((u[:, a] != u[:, b]).double().mean() > 0.99 for a in range(u.shape[1]) for b in range(a))


@pytest.mark.parametrize("params", [
    dict(temperature=0.8, top_p=0.9),
    dict(temperature=1.3, top_k=5, min_p=0.05),
    dict(temperature=1.0),
])
@pytest.mark.parametrize("device", DEVICES)
def test_seeded_draws_follow_the_filtered_distribution(params, device):
    n = 12000
    requests = [decoding(f"r{i}", SamplingParams(seed=i, **params)) for i in range(n)]
    tokens = torch.tensor([t[0] for t in select(requests, LOGITS.repeat(n, 1).to(device))])
    sp = SamplingParams(**params)
    filtered = filter_logits(LOGITS[None] / sp.temperature, torch.tensor([sp.top_k]),
                             torch.tensor([sp.top_p]), torch.tensor([sp.min_p]))[0]
    expected = filtered.softmax(-1).double() * n
    assert chi2_pvalue(torch.bincount(tokens, minlength=V).double(), expected) > P_THRESHOLD


def with_drafts(req: Request, drafts: list[int], probs: torch.Tensor | None = None) -> Request:
    req.set_spec(drafts, probs)
    return req


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_request_same_alone_and_in_any_batch(device):
    g = torch.Generator().manual_seed(0)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    alone = []
    for step in range(40):
        q = torch.rand(3, V, generator=g).softmax(-1)
        drafts = torch.randint(0, V, (3,), generator=g).tolist()
        rows = torch.randn(4, V, generator=g) * 2
        target = with_drafts(decoding("seeded", seeded, prompt_len=5 + step), drafts, q)
        alone.append(select([target], rows.to(device))[0])
        others = [  # greedy, n-gram drafts, unseeded, another seed with drafts
            decoding("greedy", SamplingParams(temperature=0)),
            with_drafts(decoding("ngram", SamplingParams(temperature=0.7)), [1, 2]),
            decoding("unseeded", SamplingParams(temperature=1.0, top_k=4), prompt_len=9),
            with_drafts(decoding("other-seed", SamplingParams(temperature=0.9, seed=5)), [3]),
        ]
        for order in ([0, 1], [3, 2, 1, 0], [2]):
            reqs = [others[order[0]], target] + [others[i] for i in order[1:]]
            logits = torch.cat([rows if r is target else torch.randn(1 + len(r.spec_token_ids), V, generator=g)
                                for r in reqs])
            assert select(reqs, logits.to(device), step=step, seed=99)[1] == alone[-1]
    assert len({tuple(t) for t in alone}) > 10  # really sampled
    assert {len(t) for t in alone} >= {1, 4}  # drafts rejected at once, and all accepted


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_request_without_drafts_draws_alike_beside_drafted_requests(device):
    """Alone, its row is drawn as plain decoding; beside drafts, inside verification. Integer
    logits tie at the top-k threshold, where a sort and a threshold keep different tokens."""
    g = torch.Generator().manual_seed(2)
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=3, seed=77)
    drawn = []
    for step in range(60):
        row = torch.randint(-2, 3, (1, V), generator=g).float()
        target = decoding("seeded", params, prompt_len=4 + step)
        drawn.append(select([target], row.to(device))[0])
        drafted = with_drafts(decoding("drafted", SamplingParams(temperature=0.8)), [1, 2])
        logits = torch.cat([torch.randn(3, V, generator=g), row])
        assert select([drafted, target], logits.to(device), step=step)[1] == drawn[-1]
    assert len({tuple(t) for t in drawn}) > 3


@pytest.mark.parametrize("device", DEVICES)
def test_drafted_requests_are_verified_on_their_own_rows_alone(device):
    """Only the rows of sampled requests with drafts get a distribution (a sort each). Their
    choices are those of verifying every row of the batch at once: beside a greedy request with
    drafts and an undrafted one, with drafts from n-gram lookup, a draft model and the grammar
    (forced: only its last row draws)."""
    g = torch.Generator().manual_seed(5)
    counts = set()
    for step in range(30):
        cut = dict(top_k=5) if step % 2 else dict(top_p=0.85)
        reqs = [
            with_drafts(decoding("greedy", SamplingParams(temperature=0)), [1, 2]),
            decoding("undrafted", SamplingParams(temperature=0.9, top_p=0.8)),
            with_drafts(decoding("ngram", SamplingParams(temperature=0.7, **cut)), [3, 1]),
            with_drafts(decoding("draft", SamplingParams(temperature=1.1, min_p=0.1)), [0, 4, 2],
                        torch.rand(3, V, generator=g).softmax(-1)),
            decoding("forced", SamplingParams(temperature=1.0, top_p=0.9)),
        ]
        reqs[-1].set_spec([5], forced=True)
        logits = (torch.randn(13, V, generator=g) * 2).to(device)
        layout = layout_of(reqs, logits.device)
        assert layout.verified_requests == [2, 3, 4] and layout.verified_rows == list(range(4, 13))
        s, u = layout.sampling, layout.uniforms(step)
        every_row = row_probs(logits, s.temperature, s.top_k, s.top_p, s.min_p, needs_sort=True)
        accepted, final = verify(layout.verify, every_row, logits.argmax(-1), u.accept, u.draw[:, 0], layout.draft_q)
        chosen_accepted, chosen_final = choose(logits, layout, step)
        drafted = [0, 2, 3, 4]  # the undrafted request draws its own token (the test above)
        assert torch.equal(chosen_accepted, accepted) and torch.equal(chosen_final[drafted], final[drafted])
        counts.update(zip(range(2, 5), accepted[2:].tolist()))
    assert {(2, 0), (2, 2), (3, 0), (3, 1), (4, 1)} <= counts  # drafts rejected and accepted


def test_unseeded_draws_change_with_the_step_and_the_engine_seed():
    n = 64
    requests = [decoding(f"u{i}", SamplingParams(temperature=1.0)) for i in range(n)]
    logits = torch.zeros(n, V)
    first = select(requests, logits, step=1)
    assert select(requests, logits, step=1) == first
    assert select(requests, logits, step=2) != first
    assert select(requests, logits, step=1, seed=3) != first


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_rows_choose_alike_from_16_bit_logits_and_only_such_steps_skip_the_fp32_cast(device):
    """The runner hands an all-greedy step the model's bf16 logits (no [rows, vocab] cast): the
    argmax, ties included, must be the one of their fp32 copy."""
    torch.manual_seed(0)
    logits = (torch.randn(32, 1000) * 4).to(torch.bfloat16)
    logits[::2, 10] = logits[::2, 900] = logits.max() + 1  # ties at the top: the lower id wins
    greedy = [decoding(f"g{i}", SamplingParams(temperature=0)) for i in range(32)]
    chosen = select(greedy, logits.to(device))
    assert chosen == select(greedy, logits.float().to(device))
    assert all(c == [10] for c in chosen[::2])
    assert not RowLayout.build({r: 1 for r in greedy}, torch.device(device)).needs_fp32_logits

    sampled = decoding("s", SamplingParams(temperature=0.8))
    penalised = decoding("p", SamplingParams(temperature=0, repetition_penalty=1.2))
    guided = decoding("j", SamplingParams(temperature=0))
    guided.guide = object()
    for other in (sampled, penalised, guided):
        assert RowLayout.build({greedy[0]: 1, other: 1}, torch.device(device)).needs_fp32_logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_argmax_is_each_rows_first_largest_logit(dtype):
    """The CPU's greedy choice goes through `max` (faster there than `argmax`): it must still be
    the first of tied largest logits (bf16 logits tie often), and NaN where a row has one."""
    import numpy as np

    from app.engine.selection.argmax import row_argmax
    gen = torch.Generator().manual_seed(2)
    logits = torch.randint(-3, 4, (300, 1000), generator=gen).to(dtype)  # every row ties at its max
    logits[5, :] = float("-inf")
    logits[5, 700] = 2.0
    logits[7, 40] = float("nan")
    want = np.argmax(np.where(np.isnan(logits.float().numpy()), np.inf, logits.float().numpy()), axis=-1)
    assert row_argmax(logits).tolist() == want.tolist()
