"""CUDA's sort-free draw against the reference (filter by sorting, softmax, inverse CDF of the
same uniform): the same token where the kernel draws once or a row has top-k, and the same
distribution where top-p draws by rejection."""

import pytest
import torch

from app.engine.selection.distribution import filter_logits, row_probs, sample_on_device, sample_top_k
from app.engine.selection.verify import sample_inverse_cdf
from kernels.filtered_sampling import MAX_ROUNDS, filtered_sample

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
P_THRESHOLD = 1e-3


def settings(rows: int, rounds: int, device: str = DEVICE, seed: int = 1):
    """Per-row settings cycling through no cut, each cut alone, and cuts together."""
    g = torch.Generator().manual_seed(seed)
    temperature = torch.rand(rows, generator=g) * 1.5 + 0.3
    top_k = torch.tensor([0, 5, 0, 40, 2, 0, 3, 0])[torch.arange(rows) % 8]
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 0.99, 0.3, 0.7])[torch.arange(rows) % 8]
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0, 0.2, 0.0, 0.01])[torch.arange(rows) % 8]
    u = torch.rand(rows, rounds, generator=g, dtype=torch.float64)
    return [t.to(device) for t in (temperature, top_k, top_p, min_p, u)]


def reference(logits, temperature, top_k, top_p, min_p, u):
    return sample_inverse_cdf(row_probs(logits.float(), temperature, top_k, top_p, min_p, True), u[:, 0])


def strided_logits(rows, vocab, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    padded = torch.full((rows, vocab + 37), float("nan"))  # rows are strided; the pad is never read
    padded[:, :vocab] = torch.randn(rows, vocab, generator=g) * 3
    padded[:3, 200:] = float("-inf")  # tokens a grammar masked
    return padded.to(dtype).to(DEVICE)[:, :vocab]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_one_round_draws_the_reference_token(dtype):
    """With one uniform the kernel finds the top-p cut by search; top-k rows take their k
    largest: every row then draws the reference's token."""
    logits = strided_logits(24, 700, dtype)  # several blocks per row
    temperature, top_k, top_p, min_p, u = settings(24, rounds=1)
    got = sample_on_device(logits, temperature, top_k, top_p, min_p, int(top_k.max()), u)
    assert got.tolist() == reference(logits, temperature, top_k, top_p, min_p, u).tolist()


def test_rows_without_top_p_draw_the_reference_token():
    logits = strided_logits(16, 700, torch.float32, seed=4)
    temperature, top_k, _, min_p, u = settings(16, rounds=MAX_ROUNDS)
    top_p = torch.ones(16, device=DEVICE)
    got = sample_on_device(logits, temperature, top_k, top_p, min_p, int(top_k.max()), u)
    assert got.tolist() == reference(logits, temperature, top_k, top_p, min_p, u).tolist()


def test_top_k_rows_draw_the_reference_token_from_their_k_largest():
    """Pure torch, so many rows: k from 2 to past the vocabulary, with top-p and min-p after it."""
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
    got = sample_top_k(logits, temperature, top_k, top_p, min_p, int(top_k.max()), u[:, 0])
    assert got.tolist() == reference(logits, temperature, top_k, top_p, min_p, u).tolist()


@pytest.mark.parametrize("params,rounds,scale", [
    (dict(top_p=0.6), MAX_ROUNDS, 0.3),  # a flat row: several redraws before a nucleus token
    (dict(top_p=0.5, min_p=0.3), 2, 1.0),  # one redraw, then the search
])
def test_top_p_by_rejection_follows_the_nucleus(params, rounds, scale):
    n = 300  # rows run one by one under the interpreter
    logits = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.9, 0.5, 0.0, -0.5, -1.0, -3.0]) * scale
    vocab = len(logits)
    top_p = torch.full((n,), params["top_p"], device=DEVICE)
    min_p = torch.full((n,), params.get("min_p", 0.0), device=DEVICE)
    u = torch.rand(n, rounds, generator=torch.Generator().manual_seed(rounds), dtype=torch.float64).to(DEVICE)
    got = filtered_sample(logits.repeat(n, 1).to(DEVICE), torch.ones(n, device=DEVICE), top_p, min_p, u).cpu()
    expected = filter_logits(logits[None], torch.tensor([0]), top_p[:1].cpu(), min_p[:1].cpu())[0].softmax(-1).double() * n
    observed = torch.bincount(got, minlength=vocab).double()
    support = expected > 0
    assert observed[~support].sum() == 0, "a token outside the nucleus was drawn"
    stat = ((observed[support] - expected[support]) ** 2 / expected[support]).sum()
    df = int(support.sum()) - 1
    assert float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2)) > P_THRESHOLD


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_llama3_vocabulary_lands_where_the_reference_cdf_puts_the_uniform():
    """256 rows of a 128k vocabulary drawn once: each token's CDF interval holds the uniform, up to
    fp32 rounding of the masses (the reference sums in double). Logits of full fp32 precision:
    bf16 values (what a bf16 lm_head gives) tie often, and ties at a cut are kept whole here,
    an arbitrary subset of them by a sort, so there the two draw from different sets."""
    rows, vocab = 256, 128256
    logits = torch.randn(rows, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 3
    temperature, top_k, top_p, min_p, u = settings(rows, rounds=1, device="cuda")
    got = sample_on_device(logits, temperature, top_k, top_p, min_p, int(top_k.max()), u)
    probs = row_probs(logits.float(), temperature, top_k, top_p, min_p, True).double()
    cdf = probs.cumsum(-1)
    target = u[:, 0] * cdf[:, -1]
    upper = cdf.gather(1, got[:, None])[:, 0]
    lower = upper - probs.gather(1, got[:, None])[:, 0]
    tol = 1e-4 * cdf[:, -1]
    assert ((lower - tol <= target) & (target <= upper + tol)).all()
