"""The CPU's verification distribution without a sort (specserve_kernels/cpu/draw.cpp's filtered_probs,
through `filtered_probs`): the reference's (`row_probs`) on rows without ties, and every tied
token kept where a cut falls inside a tie."""

import pytest
import torch

from app.engine.selection.distribution import filtered_probs, row_probs
from tests.cpu_kernels import require_cpu_kernels


@pytest.fixture(autouse=True)
def cpu_kernels():
    require_cpu_kernels()


def random_rows(rows: int, vocab: int, scale: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * scale
    logits[::3, torch.randperm(vocab, generator=g)[: vocab // 3]] = float("-inf")  # a grammar's mask
    logits[::3, 0] = 1.0  # every row keeps a token
    temperature = torch.rand(rows, generator=g) * 1.5 + 0.3
    setting = torch.arange(rows) % 11  # the last: temperature alone, no cut
    top_k = torch.tensor([0, 5, 0, 40, 2, 0, 3, 0, 1000, 0, 0])[setting]
    top_p = torch.tensor([0.95, 1.0, 0.9, 0.5, 1.0, 0.99, 0.3, 0.7, 0.999, 1e-30, 1.0])[setting]
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0, 0.2, 0.0, 0.01, 0.0, 0.0, 0.0])[setting]
    return logits, temperature, top_k, top_p, min_p


@pytest.mark.parametrize("vocab", [1, 7, 300, 4096])
@pytest.mark.parametrize("scale", [0.05, 3.0, 40.0])  # a nucleus inside the first bucket, and cut past the last
def test_the_cpu_distribution_is_the_reference_on_rows_without_ties(vocab, scale):
    """Sums run in another order than the reference's fp32 cumsum, so a token at a cut could
    differ only within rounding; the reference also cuts a tail of ~1e-9 at top_p = 1, where
    its fp32 cumsum reaches 1.0 early. So: the same tokens above 1e-6, and within 2e-6 in all."""
    args = random_rows(22, vocab, scale, seed=vocab)
    expected = row_probs(*args, needs_sort=True).double()
    got = filtered_probs(*args, needs_sort=True).double()
    assert torch.equal(got > 1e-6, expected > 1e-6)
    assert (got - expected).abs().sum(-1).max() < 4e-6
    assert torch.allclose(got.sum(-1), torch.ones(22, dtype=torch.float64), atol=1e-5)


def test_tied_tokens_at_a_cut_are_all_kept():
    """The reference keeps an arbitrary order of tied logits at a top-k or top-p cut; the CPU
    keeps them all, as the draws do."""
    logits = torch.tensor([[3.0, 2.0, 1.0, 2.0, 0.0],    # top-k 2: the two 2.0s tie for second
                           [1.0, 0.0, 1.0, 1.0, -9.0]])  # top-p 0.5: the first 1.0 alone holds under half
    top_k, top_p = torch.tensor([2, 0]), torch.tensor([1.0, 0.5])
    got = filtered_probs(logits, torch.ones(2), top_k, top_p, torch.zeros(2), needs_sort=True)
    assert (got[0] > 0).tolist() == [True, True, False, True, False]
    assert got[0, 1] == got[0, 3]
    assert (got[1] > 0).tolist() == [True, False, True, True, False]
    assert torch.allclose(got[1, [0, 2, 3]], torch.full((3,), 1 / 3))


def test_the_most_likely_token_stays_whatever_the_cuts():
    """A vanishing top-p (0 in fp32) and min-p 1 keep the largest logit, as the reference does."""
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(3))
    got = filtered_probs(logits, torch.full((4,), 0.7), torch.zeros(4, dtype=torch.long),
                         torch.tensor([5e-324, 1e-30, 1.0, 1.0]), torch.tensor([0.0, 0.0, 1.0, 0.0]), needs_sort=True)
    argmax = logits.argmax(-1)
    assert got[:3].argmax(-1).tolist() == argmax[:3].tolist()
    assert got[:3].max(-1).values.tolist() == [1.0, 1.0, 1.0]
    assert (got[3] > 0).all()
