"""Rejection sampler: exact for greedy, lossless for sampling (chi-square against the target
distribution, with and without a grammar mask, and a wrong rule shown to fail the same check),
batch-independent for seeded requests."""

import functools

import pytest
import torch

from app.engine.selection.verify import VerifyRows, verify, verify_by_argmax_on_host
from tests.spec.rejection_sampling import RejectionSampler, rejection_sample

V, K, N = 6, 3, 20000
P_THRESHOLD = 1e-3


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny; on a shared 2-core machine intra-op threads only add contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def greedy_reference(rows: torch.Tensor, drafts: list[int]) -> list[int]:
    """Plain greedy decoding cut at the first mismatch (what non-speculative decoding emits)."""
    out = []
    for j, x in enumerate(drafts):
        best = int(rows[j].argmax())
        out.append(best)
        if best != x:
            return out
    return out + [int(rows[len(drafts)].argmax())]


def test_greedy_equals_argmax_chain_cut_at_first_mismatch():
    g = torch.Generator().manual_seed(1)
    ks = [0, 1, 3, 4, 4, 2, 0]
    rows = [torch.randn(k + 1, 50, generator=g) for k in ks]
    drafts = []
    for i, (k, r) in enumerate(zip(ks, rows)):
        chain = r[:k].argmax(-1).tolist()
        if i % 2 and k:  # every other request: a mismatch at a varying position
            j = i % k
            chain[j] = (chain[j] + 1) % 50
        drafts.append(chain)
    res = rejection_sample(torch.cat(rows), sum(drafts, []), ks, [True] * len(ks))
    for r, d, out, acc in zip(rows, drafts, res.token_ids, res.num_accepted):
        assert out == greedy_reference(r, d)
        assert len(out) == acc + 1 and out[:acc] == d[:acc]
    assert res.num_accepted[4] == 4 and len(res.token_ids[4]) == 5  # all accepted: + bonus


@pytest.mark.parametrize("seed", range(5))
def test_the_hosts_argmax_chain_is_verifys(seed):
    """The CPU keeps greedy requests and forced drafts along the argmax chain in Python
    (`verify_by_argmax_on_host`); `verify` with no distributions is what the device does."""
    g = torch.Generator().manual_seed(seed)
    ks = torch.randint(0, 5, (9,), generator=g).tolist()
    forced = (torch.rand(9, generator=g) < 0.2).tolist()
    firsts = [sum(k + 1 for k in ks[:i]) for i in range(len(ks))]
    argmax = torch.randint(0, 3, (sum(k + 1 for k in ks),), generator=g)  # 3 tokens: drafts often match
    max_k = max(ks)
    drafts = [torch.randint(0, 3, (k,), generator=g).tolist() + [0] * (max_k - k) for k in ks]
    rows = VerifyRows(first=torch.tensor(firsts), num_drafts=torch.tensor(ks), greedy=torch.ones(9, dtype=torch.bool),
                      forced=torch.tensor(forced), drafts=torch.tensor(drafts).view(9, max_k))
    accepted, final = verify(rows, None, argmax, None, None)
    assert verify_by_argmax_on_host(firsts, ks, forced, drafts, argmax.tolist()) == (accepted.tolist(), final.tolist())
    assert 0 < sum(accepted.tolist()) < sum(ks)  # some drafts kept, some not


def test_greedy_rows_unaffected_by_sampled_rows_in_the_batch():
    g = torch.Generator().manual_seed(3)
    ks, greedy = [2, 3, 1, 4], [True, False, True, False]
    rows = [torch.randn(k + 1, 40, generator=g) for k in ks]
    rows = [r if gr else r.softmax(-1) for r, gr in zip(rows, greedy)]  # logits for greedy
    drafts = [torch.randint(0, 40, (k,), generator=g).tolist() for k in ks]
    drafts[0] = rows[0][:2].argmax(-1).tolist()  # all accepted
    q = torch.full((sum(ks), 40), 1 / 40)
    res = rejection_sample(torch.cat(rows), sum(drafts, []), ks, greedy, draft_probs=q,
                           default_generator=g)
    assert res.token_ids[0] == greedy_reference(rows[0], drafts[0]) and res.num_accepted[0] == 2
    assert res.token_ids[2] == greedy_reference(rows[2], drafts[2])
    assert all(len(t) == a + 1 for t, a in zip(res.token_ids, res.num_accepted))


def test_greedy_accepts_logits_or_probs_alike():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 30, generator=g)
    drafts = logits[:4].argmax(-1).tolist()
    a = rejection_sample(logits, drafts, [4], [True])
    b = rejection_sample(logits.softmax(-1), drafts, [4], [True])
    assert a == b and a.num_accepted == [4]


def test_k_zero_everywhere_samples_one_token():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [5.0, 1.0, 0.0]])
    res = rejection_sample(p, [], [0, 0, 0], [False, False, True])
    assert res.token_ids == [[1], [2], [0]] and res.num_accepted == [0, 0, 0]
    assert rejection_sample(p[:0], [], [], []).token_ids == []


def test_point_mass_accepts_certain_and_rejects_impossible_tokens():
    one_hot = torch.eye(V)[[2, 4, 1, 3, 3]]  # request 0: rows 0-2 (k=2); request 1: rows 3-4
    res = rejection_sample(one_hot, [2, 4, 0], [2, 1], [False, False])
    assert res.token_ids == [[2, 4, 1], [3]] and res.num_accepted == [2, 0]


def test_grammar_mask_rejects_disallowed_greedy_draft():
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0], [1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False, True], [True] * 4])
    res = rejection_sample(logits, [2], [1], [True], allowed_mask=mask)
    assert res.token_ids == [[3]]  # draft 2 is the unmasked argmax but not allowed
    res = rejection_sample(logits.softmax(-1), [2], [1], [False], allowed_mask=mask)
    assert res.token_ids[0][0] != 2 and res.num_accepted == [0]


@pytest.mark.parametrize("drafts, greedy, kwargs", [
    ([1, 2, 3], [False], {}),  # 3 drafts for k = 2
    ([1, 2], [False, True], {}),
    ([1, 2], [False], dict(draft_probs=torch.ones(3, V))),
    ([1, 2], [False], dict(allowed_mask=torch.ones(2, V, dtype=torch.bool))),
    ([1, 2], [False], dict(generators=[None, None])),
])
def test_shape_errors(drafts, greedy, kwargs):
    with pytest.raises(ValueError):
        rejection_sample(torch.full((3, V), 1 / V), drafts, [2], greedy, **kwargs)


# ---- statistics -------------------------------------------------------------------------

def random_dists(rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, V, generator=g) * 1.2).softmax(-1)


def chi2(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Chi-square statistic and p-value of tokens against probs (over tokens with p > 0)."""
    support = probs > 0
    observed = torch.bincount(tokens, minlength=V).double()
    assert observed[~support].sum() == 0, "a token with zero target probability was emitted"
    expected = probs.double()[support] * len(tokens)
    stat = float(((observed[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    return stat, float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def per_position_stats(token_ids: list[list[int]], p: torch.Tensor) -> list[tuple[float, float]]:
    """Token j among requests that emitted more than j tokens; given that, it must follow p[j]
    (emitting more than j tokens depends only on positions < j). Positions reached too rarely
    for the chi-square approximation (an expected count below 5) are left out; 0 and 1 never."""
    stats = []
    for j in range(K + 1):
        tokens = torch.tensor([t[j] for t in token_ids if len(t) > j], dtype=torch.long)
        if len(tokens) * float(p[j][p[j] > 0].min()) < 5:
            assert j >= 2, f"too few samples at position {j}"
            break
        stats.append(chi2(tokens, p[j]))
    return stats


P_TARGET, Q_DRAFT = random_dists(K + 1, seed=10), random_dists(K, seed=11)
# A different pair of tokens forbidden at every position.
MASK = torch.ones(K + 1, V, dtype=torch.bool)
for _j in range(K + 1):
    MASK[_j, [_j, (_j + 2) % V]] = False


@functools.cache
def run_batch(dense_q: bool, masked: bool):
    """N identical requests, k = 3 drafts drawn from Q_DRAFT, verified against P_TARGET;
    without dense_q the sampler is not told q (the n-gram case: point mass)."""
    g = torch.Generator().manual_seed(12)
    drafts = torch.multinomial(Q_DRAFT, N, replacement=True, generator=g).T.reshape(-1)
    res = rejection_sample(P_TARGET.repeat(N, 1), drafts, [K] * N, [False] * N,
                           draft_probs=Q_DRAFT.repeat(N, 1) if dense_q else None,
                           allowed_mask=MASK.repeat(N, 1) if masked else None,
                           default_generator=g)
    return res, drafts.view(N, K)


@pytest.mark.parametrize("dense_q", [True, False], ids=["draft-probs", "point-mass"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "grammar-mask"])
def test_emitted_tokens_follow_the_target_distribution(dense_q, masked):
    expected = P_TARGET
    if masked:
        expected = P_TARGET * MASK / (P_TARGET * MASK).sum(-1, keepdim=True)
    res, _ = run_batch(dense_q, masked)
    stats = per_position_stats(res.token_ids, expected)
    print(f"\n  chi2 / p-value per position: {[(round(s, 1), f'{pv:.3f}') for s, pv in stats]}")
    for j, (stat, pvalue) in enumerate(stats):
        assert pvalue > P_THRESHOLD, f"position {j}: chi2 {stat:.1f}, p-value {pvalue:.2e}"
    acceptance = sum(res.num_accepted) / (N * K)
    assert 0.05 < acceptance < 0.95  # both branches (accept and resample) were exercised


def test_wrong_acceptance_rules_fail_the_same_check():
    p, q = P_TARGET, Q_DRAFT
    res, drafts = run_batch(True, False)
    stat_ok, pvalue_ok = per_position_stats(res.token_ids, p)[0]
    assert pvalue_ok > P_THRESHOLD
    # Always accept: the first token is the draft, distributed as q, not p.
    always = [d + [0] for d in drafts.tolist()]
    stat_bad, pvalue_bad = per_position_stats(always, p)[0]
    assert stat_bad > 100 * max(stat_ok, 1.0) and pvalue_bad < 1e-12
    # Subtler: accept with min(1, p/q) but resample a rejection from p instead of p - q.
    g = torch.Generator().manual_seed(13)
    x0 = drafts[:, 0]
    accept = torch.rand(N, generator=g) < (p[0, x0] / q[0, x0])
    resampled = torch.multinomial(p[0], N, replacement=True, generator=g)
    first = torch.where(accept, x0, resampled)
    stat_sub, pvalue_sub = chi2(first, p[0])
    assert pvalue_sub < P_THRESHOLD, f"chi2 {stat_sub:.1f}"


# ---- seeding ------------------------------------------------------------------------------

def seeded_request(seed: int, k: int, dense: bool):
    g = torch.Generator().manual_seed(100 + seed)
    p = random_dists(k + 1, seed=200 + seed)
    q = random_dists(k, seed=300 + seed) if dense else torch.full((k, V), 1 / V)
    drafts = torch.multinomial(q, 1, generator=g).reshape(-1) if k else torch.zeros(0, dtype=torch.long)
    return p, q, drafts, dense


def run_requests(reqs, seeds, order):
    """Requests (in `order`) through one call; seeds[i] None means the shared generator."""
    reqs = [reqs[i] for i in order]
    gens = [None if seeds[i] is None else torch.Generator().manual_seed(seeds[i]) for i in order]
    out = []
    for _ in range(3):  # several steps: each seeded generator advances the same way
        res = rejection_sample(torch.cat([r[0] for r in reqs]), torch.cat([r[2] for r in reqs]),
                               [len(r[2]) for r in reqs], [False] * len(reqs),
                               draft_probs=torch.cat([r[1] for r in reqs]),
                               has_draft_probs=[r[3] for r in reqs], generators=gens,
                               default_generator=torch.Generator().manual_seed(len(out)))
        out.append(res)
    return out


def test_seeded_requests_do_not_depend_on_the_batch():
    reqs = [seeded_request(i, k, dense) for i, (k, dense) in
            enumerate([(3, True), (0, True), (4, False), (2, True), (1, False), (3, True)])]
    seeds = [7, 8, None, 9, None, 10]
    batched = run_requests(reqs, seeds, list(range(6)))
    shuffled = run_requests(reqs, seeds, [5, 3, 1, 0, 4, 2])
    position_in_shuffled = {i: pos for pos, i in enumerate([5, 3, 1, 0, 4, 2])}
    for i, seed in enumerate(seeds):
        if seed is None:
            continue
        alone = run_requests(reqs, seeds, [i])
        for step in range(3):
            expected = (alone[step].token_ids[0], alone[step].num_accepted[0])
            assert (batched[step].token_ids[i], batched[step].num_accepted[i]) == expected
            pos = position_in_shuffled[i]
            assert (shuffled[step].token_ids[pos], shuffled[step].num_accepted[pos]) == expected


def test_rejection_sampler_class_uses_its_own_default_generator():
    p = random_dists(4, seed=1)
    args = (p.repeat(50, 1), torch.zeros(150, dtype=torch.long), [3] * 50, [False] * 50)
    assert RejectionSampler(seed=5)(*args) == RejectionSampler(seed=5)(*args)
    assert RejectionSampler(seed=5)(*args) != RejectionSampler(seed=6)(*args)
