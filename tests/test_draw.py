"""A sampled row's own token without a sort (app/engine/selection/draw.py, torch steps): the
reference's token (sort, softmax, inverse CDF of the same uniform) where the row draws once or
has top-k, and the nucleus's distribution where top-p draws by rejection."""

import pytest
import torch

from app.engine.selection.distribution import filter_logits, row_probs
from app.engine.selection.draw import (draw_top_k, draw_top_k_on_cpu, draw_top_p_by_rejection, draw_top_p_on_cpu,
                                       draw_with_uniforms, top_k_floor)
from app.engine.selection.draws import DRAW_ROUNDS
from app.engine.selection.verify import sample_inverse_cdf
from tests.cpu_kernels import require_cpu_kernels

P_THRESHOLD = 1e-3


def _cpu_kernel(draw=draw_top_p_on_cpu):
    require_cpu_kernels()
    return draw


# The torch steps, and the same steps in C++ (specserve_kernels/cpu/draw.cpp, what the CPU draws with)
TOP_P_DRAWS = [pytest.param(lambda: draw_top_p_by_rejection, id="torch"), pytest.param(_cpu_kernel, id="cpp")]
TOP_K_DRAWS = [pytest.param(lambda: draw_top_k, id="torch"),
               pytest.param(lambda: _cpu_kernel(draw_top_k_on_cpu), id="cpp"),
               pytest.param(lambda: lambda *args: draw_with_uniforms(*args[:-1], args[-1][:, None]),
                            id="engine")]  # every row with a top-k cut: draw.py's way for such steps


def settings(rows: int, rounds: int, seed: int = 1):
    """Per-row settings cycling through no cut, each cut alone, and cuts together."""
    g = torch.Generator().manual_seed(seed)
    temperature = torch.rand(rows, generator=g) * 1.5 + 0.3
    top_k = torch.tensor([0, 5, 0, 40, 2, 0, 3, 0])[torch.arange(rows) % 8]
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 0.99, 0.3, 0.7])[torch.arange(rows) % 8]
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0, 0.2, 0.0, 0.01])[torch.arange(rows) % 8]
    u = torch.rand(rows, rounds, generator=g, dtype=torch.float64)
    return temperature, top_k, top_p, min_p, u


def reference(logits, temperature, top_k, top_p, min_p, u):
    return sample_inverse_cdf(row_probs(logits.float(), temperature, top_k, top_p, min_p, True), u[:, 0])


def random_logits(rows, vocab, seed=0):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    logits[:3, 200:] = float("-inf")  # tokens a grammar masked
    return logits


def test_one_round_draws_the_reference_token():
    """With one uniform, top-p goes straight to the reference's cut."""
    logits = random_logits(64, 700)
    args = settings(64, rounds=1)
    assert draw_with_uniforms(logits, *args[:4], int(args[1].max()), args[4]).tolist() == \
        reference(logits, *args).tolist()


@pytest.mark.parametrize("draw", TOP_P_DRAWS)
def test_one_round_of_top_p_draws_the_reference_token(draw):
    logits = random_logits(64, 700, seed=6)
    temperature, _, top_p, min_p, u = settings(64, rounds=1)
    no_k = torch.zeros(64, dtype=torch.long)
    assert draw()(logits, temperature, top_p, min_p, u).tolist() == \
        reference(logits, temperature, no_k, top_p, min_p, u).tolist()


@pytest.mark.parametrize("rounds", [1, 2, DRAW_ROUNDS])
def test_the_cpu_kernel_draws_the_torch_steps_tokens(rounds):
    """The same uniforms, the same tokens, for rows of every setting, masked tokens (a grammar's
    -inf) included, and flat rows that redraw until the last round's cut."""
    cpu_draw = _cpu_kernel()
    logits = random_logits(512, 900, seed=8)
    logits[100:140] *= 0.02  # flat: most draws fall outside a small nucleus
    logits[200:210, ::2] = float("-inf")
    temperature, _, top_p, min_p, u = settings(512, rounds, seed=3)
    top_p[100:140] = 0.05
    got = cpu_draw(logits, temperature, top_p, min_p, u)
    assert got.tolist() == draw_top_p_by_rejection(logits, temperature, top_p, min_p, u).tolist()
    assert not bool(torch.isinf(logits.gather(1, got[:, None])).any()), "a masked token was drawn"


def test_rows_without_top_p_draw_the_reference_token():
    logits = random_logits(64, 700, seed=4)
    temperature, top_k, _, min_p, u = settings(64, rounds=DRAW_ROUNDS)
    top_p = torch.ones(64)
    got = draw_with_uniforms(logits, temperature, top_k, top_p, min_p, int(top_k.max()), u)
    assert got.tolist() == reference(logits, temperature, top_k, top_p, min_p, u).tolist()


@pytest.mark.parametrize("draw", TOP_K_DRAWS)
def test_top_k_rows_draw_the_reference_token_from_their_k_largest(draw):
    """k from 2 to past the vocabulary, with top-p and min-p after it."""
    rows, vocab = 400, 300
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(rows, vocab, generator=g) * 2
    logits[:50, 10:] = float("-inf")  # fewer allowed tokens than k
    top_k = torch.randint(2, 60, (rows,), generator=g)
    top_k[::7] = vocab + 5
    top_p = torch.where(torch.rand(rows, generator=g) < 0.5, 1.0, torch.rand(rows, generator=g) * 0.9 + 0.05)
    min_p = torch.where(torch.rand(rows, generator=g) < 0.5, 0.0, 0.1)
    temperature = torch.rand(rows, generator=g) + 0.4
    u = torch.rand(rows, 1, generator=g, dtype=torch.float64)
    got = draw()(logits, temperature, top_k, top_p, min_p, int(top_k.max()), u[:, 0])
    assert got.tolist() == reference(logits, temperature, top_k, top_p, min_p, u).tolist()


def test_top_k_floor_is_the_kth_largest_logit_and_minus_inf_without_a_cut():
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0], [1.0, 1.0, 1.0, 0.0], [4.0, 3.0, 2.0, 1.0]])
    floor = top_k_floor(logits, torch.tensor([2, 3, 0]), max_top_k=3)
    assert floor.tolist() == [2.0, 1.0, float("-inf")]
    assert top_k_floor(logits, torch.tensor([4, 9, 1]), max_top_k=9).tolist() == [float("-inf")] * 2 + [4.0]


NUCLEUS_CASES = [(0.6, 0.0, 0.3, 0), (0.5, 0.3, 1.0, 0), (0.95, 0.0, 1.0, 0)]
# A top-k floor is the CUDA kernel's cut, which the torch steps mirror; the CPU draws top-k rows
# from their k largest instead (draw_top_k), so its C++ draw takes no floor.
FLOOR_CASE = (0.8, 0.0, 0.3, 7)


@pytest.mark.parametrize("draw,top_p,min_p,scale,top_k",
                         [pytest.param(draw.values[0], *case, id=f"{draw.id}-{case}")
                          for draw in TOP_P_DRAWS for case in NUCLEUS_CASES]
                         + [pytest.param(TOP_P_DRAWS[0].values[0], *FLOOR_CASE, id=f"torch-{FLOOR_CASE}")])
@pytest.mark.parametrize("rounds", [2, DRAW_ROUNDS])
def test_top_p_by_rejection_follows_the_nucleus(top_p, min_p, scale, top_k, rounds, draw):
    """Flat rows need several redraws; with 2 rounds, one redraw and then the cut nucleus. With
    a top-k floor (the torch steps only), the nucleus is of the top-k distribution."""
    n = 6000
    logits = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.9, 0.5, 0.0, -0.5, -1.0, -3.0]) * scale
    vocab = len(logits)
    u = torch.rand(n, rounds, generator=torch.Generator().manual_seed(rounds), dtype=torch.float64)
    rows = logits.repeat(n, 1)
    floor = top_k_floor(rows, torch.full((n,), top_k), top_k) if top_k else None
    settings_ = (rows, torch.ones(n), torch.full((n,), top_p), torch.full((n,), min_p), u)
    got = draw()(*settings_, floor) if floor is not None else draw()(*settings_)
    expected = filter_logits(logits[None], torch.tensor([top_k]), torch.tensor([top_p]),
                             torch.tensor([min_p]))[0].softmax(-1).double() * n
    observed = torch.bincount(got, minlength=vocab).double()
    support = expected > 0
    assert observed[~support].sum() == 0, "a token outside the nucleus was drawn"
    stat = ((observed[support] - expected[support]) ** 2 / expected[support]).sum()
    df = int(support.sum()) - 1
    assert float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2)) > P_THRESHOLD


@pytest.mark.parametrize("draw", TOP_P_DRAWS)
@pytest.mark.parametrize("top_p", [5e-324, 1e-30, 1e-6])
@pytest.mark.parametrize("rounds", [1, 2, DRAW_ROUNDS])
def test_a_vanishing_top_p_draws_the_most_likely_token(top_p, rounds, draw):
    """The nucleus always holds the most likely token, even where top_p times the row's mass
    is 0 in fp32 (the API accepts any top_p > 0; 5e-324 once sent the server a 500)."""
    logits = random_logits(16, 300, seed=7)
    temperature, _, _, _, u = settings(16, rounds)
    top_p_rows = torch.full((16,), top_p)
    got = draw()(logits, temperature, top_p_rows, torch.zeros(16), u)
    assert got.tolist() == logits.argmax(-1).tolist()


def test_uniforms_are_the_hash_of_key_position_and_stream_bit_for_bit():
    """Against the hash in Python integers: seeded keys, the negative keys of unseeded steps,
    large positions, every stream a row draws from. A seeded request's tokens stay what they
    were as long as these numbers do."""
    import numpy as np

    from app.engine.selection.draws import ROW_STREAMS, _mix64_host, host_uniforms, request_key, step_key
    keys = [request_key(s) for s in (0, 1, 2**40 + 7, 2**63 - 1)] + [step_key(0, 1), step_key(5, 10**6)]
    positions = [0, 1, 17, 2**31, 5, 123456789]
    m = 2**64 - 1
    want = [[(_mix64_host((_mix64_host((k + 0x9E3779B97F4A7C15) & m) + p * 0xD1B54A32D192ED03
                           + stream * 0x9E3779B97F4A7C15) & m) >> 11) * 2.0**-53 for stream in ROW_STREAMS]
            for k, p in zip(keys, positions)]
    got = host_uniforms(np.array(keys, dtype=np.int64), np.array(positions, dtype=np.int64))
    assert got.tolist() == want
    assert got[0, 0] == 0.6524484863740322  # seed 0, position 0, SAMPLE: as drawn since d80866d
