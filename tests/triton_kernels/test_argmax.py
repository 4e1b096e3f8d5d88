"""The two-kernel argmax is torch's (the first index of the maximum), and the chosen tokens are
the greedy rows' argmax and the sampled rows' draws."""

import pytest
import torch

from specserve_kernels.argmax import CHUNK, argmax_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def strided_logits(rows: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Random rows with ties at the maximum inside a chunk, across chunks and in the last
    (partial) chunk, rows of NaN logits; the rows' padding past the vocabulary is NaN, never to
    be read."""
    g = torch.Generator().manual_seed(0)
    padded = torch.full((rows, vocab + 37), float("nan"))
    padded[:, :vocab] = torch.randn(rows, vocab, generator=g)
    padded[0, [5, CHUNK + 9, vocab - 1]] = 9.0  # the first of three, in three chunks
    padded[1, [CHUNK + 9, CHUNK + 700]] = 9.0  # two in one chunk, not the first
    padded[2, [vocab - 3, vocab - 1]] = 9.0  # in the partial last chunk
    padded[3, :vocab] = 0.5  # every token ties
    padded[4, :vocab] = float("-inf")  # every token masked (a grammar's dead end)
    padded[5, :vocab - 1] = float("-inf")  # only the last token allowed
    padded[5, vocab - 1] = -3.0
    padded[6, [CHUNK + 3, CHUNK + 90, 2 * CHUNK + 5]] = float("nan")  # a broken row: torch takes the first NaN
    padded[7, vocab - 2] = float("nan")
    return padded.to(dtype).to(DEVICE)[:, :vocab]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_argmax_is_torchs_first_index_of_the_maximum(dtype):
    vocab = 2 * CHUNK + 300
    logits = strided_logits(9, vocab, dtype)
    argmax = torch.full((9,), -1, dtype=torch.long, device=DEVICE)
    argmax_rows(logits, argmax)
    assert argmax.tolist() == torch.argmax(logits.float(), dim=-1).tolist()
    assert argmax[:8].tolist() == [5, CHUNK + 9, vocab - 3, 0, 0, vocab - 1, CHUNK + 3, vocab - 2]


def test_a_vocabulary_of_one_chunk():
    logits = torch.randn(7, 700, device=DEVICE)
    logits[0, [3, 600]] = 5.0
    argmax = torch.empty(7, dtype=torch.long, device=DEVICE)
    argmax_rows(logits, argmax)
    assert argmax.tolist() == torch.argmax(logits, dim=-1).tolist()


def test_greedy_rows_choose_the_argmax_and_sampled_rows_their_draw():
    logits = strided_logits(8, 2 * CHUNK + 300, torch.float16)
    temperature = torch.tensor([0.0, 0.7, 0.0, 1.0, 2.0, 0.0, 0.0, 0.5], device=DEVICE)
    drawn = torch.tensor([-5, 11, -5, 12, 13, -5, -5, 14], device=DEVICE)  # greedy rows' draws: unwritten
    argmax = torch.empty(8, dtype=torch.long, device=DEVICE)
    chosen = torch.full((8,), -1, dtype=torch.long, device=DEVICE)
    argmax_rows(logits, argmax, temperature, drawn, chosen)
    expected_argmax = torch.argmax(logits.float(), dim=-1)
    assert argmax.tolist() == expected_argmax.tolist()
    assert chosen.tolist() == torch.where(temperature > 0, drawn, expected_argmax).tolist()
