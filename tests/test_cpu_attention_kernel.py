"""The C++ paged-attention kernel of the CPU path (specserve_kernels/cpu) against the PyTorch reference:
it must read exactly each sequence's own cached tokens (unused slots hold NaN), at any head
size, block size and GQA ratio, and leave the rows of sequences it was not given alone. Where
the compiler targets AVX-512, the kernel is also built without it, and that build is checked
too: it is the one machines without AVX-512 run."""

from __future__ import annotations

import subprocess

import pytest
import torch

from app.engine.model_runner import select_attention_backend
from specserve_kernels.cpu import CFLAGS, SOURCES, build_paged_attention
from specserve_kernels.cpu.backend import CpuAttentionBackend
from specserve_kernels.reference import attention_ref, make_paged_case
from tests.cpu_kernels import require_cpu_kernels


def test_kernel_builds_where_there_is_a_compiler():
    """Without it the engine quietly takes the slower PyTorch path: a broken build must show."""
    require_cpu_kernels()
    assert isinstance(select_attention_backend("auto", torch.device("cpu")), CpuAttentionBackend)


def targets_avx512() -> bool:
    flags = subprocess.run(["c++", *CFLAGS, "-dM", "-E", "-x", "c++", "/dev/null"],
                           capture_output=True, text=True).stdout
    return "__AVX512F__" in flags


@pytest.fixture(scope="module", params=["native", "without AVX-512"])
def kernel(request, tmp_path_factory):
    native = require_cpu_kernels().paged_attention_short
    if request.param == "native":
        return native
    if not targets_avx512():
        pytest.skip("the native build has no AVX-512 path: it is the portable one")
    return build_paged_attention(SOURCES[0].read_text(), "specserve_cpu_portable",
                                 tmp_path_factory.mktemp("portable_kernel"), extra_cflags=("-mno-avx512f",))


def run_kernel(kernel, case, seqs, scale, out=None):
    out = torch.zeros_like(case.query) if out is None else out
    m = case.meta
    kernel(case.query, case.kv_cache, m.block_tables, m.query_start_loc, m.seq_lens,
           torch.tensor(seqs, dtype=torch.long), scale, out)
    return out


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 4, 32), (10, 2, 24), (4, 4, 64), (8, 1, 128)])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_matches_reference_with_nan_in_unused_slots(kernel, heads, kv_heads, head_dim, block_size):
    # Decodes at and around block boundaries, an empty context, 1 + k verify rows, a 16-row one.
    query_lens = [1, 1, 1, 1, 5, 16, 3]
    context_lens = [0, block_size - 1, block_size, 3 * block_size + 5, 2 * block_size - 2, 9, 70]
    case = make_paged_case(query_lens, context_lens, heads, kv_heads, head_dim, block_size,
                           torch.float32, seed=heads + head_dim + block_size)
    scale = head_dim ** -0.5
    out = run_kernel(kernel, case, range(len(query_lens)), scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out, attention_ref(case, scale), atol=2e-6, rtol=1e-5)


def test_only_the_given_sequences_are_written(kernel):
    case = make_paged_case([1, 2, 1, 0, 1], [20, 7, 33, 5, 0], 8, 4, 32, 16, torch.float32, seed=4)
    sentinel = torch.full_like(case.query, 7.0)
    out = run_kernel(kernel, case, [0, 2, 3], 32 ** -0.5, out=sentinel.clone())
    ref = attention_ref(case, 32 ** -0.5)
    starts = case.meta.query_start_loc.tolist()
    for i in range(5):
        rows = slice(starts[i], starts[i + 1])
        if i in (0, 2):
            torch.testing.assert_close(out[rows], ref[rows], atol=2e-6, rtol=1e-5)
        else:  # not given, or given with no query tokens
            assert torch.equal(out[rows], sentinel[rows])


def test_backend_mixes_kernel_rows_and_prompt_chunks():
    """Decodes and verify rows through the kernel, prompt chunks (more than 16 query tokens)
    through PyTorch, in one step; a 16-bit cache falls back to PyTorch whole."""
    case = make_paged_case([1, 40, 4, 17, 1], [30, 0, 12, 50, 1], 8, 2, 32, 16, torch.float32, seed=5)
    backend = CpuAttentionBackend(require_cpu_kernels().paged_attention_short)
    scale = 32 ** -0.5
    torch.testing.assert_close(backend.attend(case.query, case.kv_cache, case.meta, scale),
                               attention_ref(case, scale), atol=2e-6, rtol=1e-5)
    half = make_paged_case([1, 3], [9, 20], 4, 2, 16, 16, torch.float16, seed=6)
    torch.testing.assert_close(backend.attend(half.query, half.kv_cache, half.meta, 0.25).float(),
                               attention_ref(half, 0.25), atol=2e-3, rtol=1e-3)
