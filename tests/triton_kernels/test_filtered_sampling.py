"""The sampling kernel draws what the torch steps it mirrors draw (app/engine/selection/draw.py),
round for round, and with one round the reference's token (sort, softmax, inverse CDF)."""

import pytest
import torch

from app.engine.selection.distribution import row_probs
from app.engine.selection.draw import draw_top_p_by_rejection, draw_with_uniforms, top_k_floor
from app.engine.selection.draws import DRAW_ROUNDS
from app.engine.selection.verify import sample_inverse_cdf
from specserve_kernels.filtered_sampling import filtered_sample

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def settings(rows: int, rounds: int, device: str = DEVICE, seed: int = 1):
    """Per-row settings cycling through no cut, each cut alone, and cuts together."""
    g = torch.Generator().manual_seed(seed)
    temperature = torch.rand(rows, generator=g) * 1.5 + 0.3
    top_p = torch.tensor([1.0, 0.95, 0.9, 0.5, 0.8, 0.99, 0.3, 0.7])[torch.arange(rows) % 8]
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0, 0.2, 0.0, 0.01])[torch.arange(rows) % 8]
    u = torch.rand(rows, rounds, generator=g, dtype=torch.float64)
    return [t.to(device) for t in (temperature, top_p, min_p, u)]


def strided_logits(rows, vocab, dtype, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    padded = torch.full((rows, vocab + 37), float("nan"))  # rows are strided; the pad is never read
    padded[:, :vocab] = torch.randn(rows, vocab, generator=g) * scale
    padded[:3, 200:] = float("-inf")  # tokens a grammar masked
    return padded.to(dtype).to(DEVICE)[:, :vocab]


def top_k_rows(rows: int, device: str = DEVICE) -> torch.Tensor:
    """No cut on some rows; on others k = 3, 5, 40, and 250 past a 200-token grammar mask."""
    return torch.tensor([0, 5, 250, 0, 40, 0, 3])[torch.arange(rows) % 7].to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_one_round_draws_the_reference_token(dtype):
    """With one uniform the kernel cuts the nucleus by search, then draws as the reference."""
    logits = strided_logits(24, 700, dtype)  # several blocks per row
    temperature, top_p, min_p, u = settings(24, rounds=1)
    top_k = top_k_rows(24)
    if dtype == torch.float16:  # fp16 ties at a top-k cut; the reference keeps only some
        top_k = torch.zeros_like(top_k)
    reference = sample_inverse_cdf(row_probs(logits.float(), temperature, top_k, top_p, min_p, True), u[:, 0])
    floor = top_k_floor(logits, top_k, 250)
    assert filtered_sample(logits, temperature, top_p, min_p, u, floor).tolist() == reference.tolist()


@pytest.mark.parametrize("scale", [3.0, 0.05])  # peaked rows keep their first draw; flat ones redraw
def test_every_round_draws_what_the_torch_steps_draw(scale):
    logits = strided_logits(24, 300, torch.float32, scale=scale, seed=2)
    temperature, top_p, min_p, u = settings(24, rounds=DRAW_ROUNDS, seed=3)
    floor = top_k_floor(logits, top_k_rows(24), 250)
    expected = draw_top_p_by_rejection(logits.cpu(), temperature.cpu(), top_p.cpu(), min_p.cpu(), u.cpu(),
                                       floor.cpu())
    assert filtered_sample(logits, temperature, top_p, min_p, u, floor).tolist() == expected.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_llama3_vocabulary_lands_where_the_reference_cdf_puts_the_uniform():
    """256 rows of a 128k vocabulary drawn once: each token's CDF interval holds the uniform, up to
    fp32 rounding of the masses (the reference sums in double). Logits of full fp32 precision:
    bf16 values (what a bf16 lm_head gives) tie often, and ties at a cut are kept whole here,
    an arbitrary subset of them by a sort, so there the two draw from different sets."""
    rows, vocab = 256, 128256
    logits = torch.randn(rows, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 3
    temperature, top_p, min_p, u = settings(rows, rounds=1, device="cuda")
    top_k = torch.tensor([0, 5, 0, 40])[torch.arange(rows) % 4].cuda()
    got = draw_with_uniforms(logits, temperature, top_k, top_p, min_p, 40, u)
    probs = row_probs(logits.float(), temperature, top_k, top_p, min_p, True).double()
    cdf = probs.cumsum(-1)
    target = u[:, 0] * cdf[:, -1]
    upper = cdf.gather(1, got[:, None])[:, 0]
    lower = upper - probs.gather(1, got[:, None])[:, 0]
    tol = 1e-4 * cdf[:, -1]
    assert ((lower - tol <= target) & (target <= upper + tol)).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ties_at_the_top_k_cut_are_all_kept():
    """As vLLM keeps them: top_k 2 over [3, 1, 1, 1, 0] draws each tied 1 (a sort keeps one)."""
    n = 3000
    logits = torch.tensor([3.0, 1.0, 1.0, 1.0, 0.0], device="cuda").repeat(n, 1)
    u = torch.rand(n, DRAW_ROUNDS, generator=torch.Generator().manual_seed(8), dtype=torch.float64).cuda()
    ones = torch.ones(n, device="cuda")
    got = draw_with_uniforms(logits, ones, torch.full((n,), 2, device="cuda"), ones, 0 * ones, 2, u)
    counts = torch.bincount(got, minlength=5).tolist()
    assert counts[4] == 0 and min(counts[1:4]) > 0


@pytest.mark.parametrize("top_p", [5e-324, 1e-30])
def test_a_vanishing_top_p_draws_the_most_likely_token(top_p):
    logits = strided_logits(8, 300, torch.float32, seed=4)
    temperature, _, min_p, u = settings(8, rounds=DRAW_ROUNDS)
    top_p_rows = torch.full((8,), top_p, device=DEVICE)
    got = filtered_sample(logits, temperature, top_p_rows, torch.zeros_like(min_p), u)
    assert got.tolist() == logits.argmax(-1).tolist()


def test_rows_of_temperature_zero_draw_nothing_and_the_others_the_same():
    """A greedy row (temperature 0) leaves its slot unwritten and costs no pass over its
    logits; the other rows draw the tokens they draw without it (a CUDA graph that chooses for
    greedy and sampled rows alike relies on both)."""
    logits = strided_logits(8, 300, torch.float32, seed=4)
    temperature, top_p, min_p, u = settings(8, rounds=DRAW_ROUNDS, seed=5)
    expected = filtered_sample(logits, temperature, top_p, min_p, u)
    greedy = torch.tensor([True, False] * 4, device=DEVICE)
    got = filtered_sample(logits, temperature.masked_fill(greedy, 0.0), top_p, min_p, u,
                          out=torch.full((8,), -7, device=DEVICE))
    assert got[~greedy].tolist() == expected[~greedy].tolist() and (got[greedy] == -7).all()
    on_host = draw_with_uniforms(logits.cpu(), temperature.masked_fill(greedy, 0.0).cpu(), None, top_p.cpu(),
                                 min_p.cpu(), 0, u.cpu())  # the torch steps: the same for the others
    assert on_host[~greedy.cpu()].tolist() == expected[~greedy].tolist()
