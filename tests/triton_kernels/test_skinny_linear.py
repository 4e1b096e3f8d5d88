"""The few-row linear kernel against F.linear in fp32 on the same 16-bit inputs (fp16: the
interpreter gets bf16 wrong), at sizes that are not multiples of its tiles, and the module that
takes it for small batches only."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specserve_kernels.skinny_linear import MAX_ROWS, SkinnyLinear, skinny_linear, use_skinny_linears

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_TILES = dict(BLOCK_N=16, BLOCK_K=64, NUM_STAGES=2, num_warps=4)


def _inputs(rows, in_features, out_features, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    padded = torch.full((rows, in_features + 24), float("nan"))  # rows strided; the pad never read
    padded[:, :in_features] = torch.randn(rows, in_features, generator=g)
    x = padded.half().to(DEVICE)[:, :in_features]
    w = (torch.randn(out_features, in_features, generator=g) / in_features ** 0.5).half().to(DEVICE)
    b = torch.randn(out_features, generator=g).half().to(DEVICE) if bias else None
    return x, w, b


@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
@pytest.mark.parametrize("in_features,out_features", [(64, 48), (200, 40), (320, 129)])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_is_the_linear(rows, in_features, out_features, bias):
    x, w, b = _inputs(rows, in_features, out_features, bias, seed=rows + in_features)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    got = skinny_linear(x, w, b, SMALL_TILES)
    assert got.dtype == torch.float16 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("rows,block_m", [(40, 16), (33, 32)])
def test_larger_batches_in_row_tiles_are_the_linear(rows, block_m):
    """More rows than a tile (what benchmarks/linears.py times at 64 and 256 rows): tiles of
    block_m rows, the last one partial, across several blocks of features."""
    x, w, b = _inputs(rows, 200, 40, True, seed=rows)
    want = F.linear(x.float(), w.float(), b.float())
    got = skinny_linear(x, w, b, dict(SMALL_TILES, BLOCK_M=block_m))
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("rows,block_m,split_k", [(40, 16, 2), (40, 16, 3), (5, 16, 4)])
def test_split_k_sums_the_parts_of_k_once_and_leaves_its_counts_at_zero(rows, block_m, split_k):
    """K = 200 in tiles of 64: two parts of two tiles; three parts, the last one empty; four
    parts, one tile each, the last one partial. The counts must be back at zero for the next
    launch (a CUDA graph replays with the same buffer)."""
    from specserve_kernels.arrival_counts import _COUNTS
    x, w, b = _inputs(rows, 200, 40, True, seed=split_k)
    tiles = dict(SMALL_TILES, BLOCK_M=block_m, SPLIT_K=split_k)
    got = skinny_linear(x, w, b, tiles)
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float(), b.float()), atol=2e-3, rtol=2e-3)
    assert not _COUNTS[got.device].any()
    assert torch.equal(skinny_linear(x, w, b, tiles), got)


def test_the_module_takes_the_kernel_at_the_batches_its_row_configurations_give(monkeypatch):
    """Up to 16 rows in the small tiles (the default), 17-64 cuBLAS, 65-128 tiles of 64 rows,
    past the last configuration cuBLAS."""
    import specserve_kernels.skinny_linear as module
    calls = []
    monkeypatch.setattr(module, "skinny_linear", lambda x, w, b, tiles, out: calls.append((len(x), tiles)) or F.linear(x, w, b))
    linear = nn.Linear(32, 8).half().to(DEVICE)
    wide = dict(SMALL_TILES, BLOCK_M=64)
    skinny = SkinnyLinear(linear, ((MAX_ROWS, SMALL_TILES), (64, None), (128, wide)))
    for rows in (1, MAX_ROWS, MAX_ROWS + 1, 64, 65, 128, 129):
        x = torch.randn(rows, 32).half().to(DEVICE)
        assert torch.equal(skinny(x), linear(x))
    assert calls == [(1, SMALL_TILES), (MAX_ROWS, SMALL_TILES), (65, wide), (128, wide)]
    calls.clear()
    SkinnyLinear(linear)(torch.randn(MAX_ROWS + 1, 32).half().to(DEVICE))  # by default: up to 16 rows
    assert calls == []


class _Layer(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.qkv_proj, self.o_proj, self.down_proj = (nn.Linear(8, 8).to(dtype) for _ in range(3))


def test_only_the_named_16_bit_projections_are_replaced_each_with_its_row_configurations():
    model = nn.ModuleList([_Layer(torch.bfloat16), _Layer(torch.float32)])
    small, wide = ((MAX_ROWS, SMALL_TILES),), ((MAX_ROWS, None), (256, dict(SMALL_TILES, BLOCK_M=64)))
    assert use_skinny_linears(model, {"qkv_proj": small, "o_proj": wide}) == 2
    assert isinstance(model[0].qkv_proj, SkinnyLinear) and isinstance(model[0].o_proj, SkinnyLinear)
    assert model[0].qkv_proj.row_configs == small and model[0].o_proj.row_configs == wide
    assert type(model[0].down_proj) is nn.Linear and type(model[1].qkv_proj) is nn.Linear


def test_without_row_configurations_the_module_setting_at_replacement_is_used(monkeypatch):
    """benchmarks/ab_decode.py sets ROW_CONFIGS before the engine is built."""
    import specserve_kernels.skinny_linear as module
    monkeypatch.setattr(module, "ROW_CONFIGS", {"down_proj": ((MAX_ROWS, SMALL_TILES),)})
    model = _Layer(torch.float16)
    assert use_skinny_linears(model) == 1 and isinstance(model.down_proj, SkinnyLinear)


@pytest.mark.parametrize("rows", [3, 40, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_into_a_buffer_writes_its_own_rows_only(rows, bias):
    """How a CUDA graph's logits are written where ROW_CONFIGS names the lm_head: into the
    first rows of the graph's one buffer, the rows past them untouched. 3 rows take one row
    tile, 40 tiles of 16 rows, 70 (past the configurations) torch's product into the buffer."""
    x, w, b = _inputs(rows, 200, 40, bias, seed=rows)
    linear = nn.Linear(200, 40, bias=bias).half().to(DEVICE).requires_grad_(False)  # as the engine's
    linear.weight.data.copy_(w)
    if bias:
        linear.bias.data.copy_(b)
    skinny = SkinnyLinear(linear, ((MAX_ROWS, SMALL_TILES), (64, dict(SMALL_TILES, BLOCK_M=16))))
    buffer = torch.full((80, 40), float("nan"), dtype=torch.float16, device=DEVICE)
    got = skinny.forward_into(x, buffer[:rows])
    assert got.data_ptr() == buffer.data_ptr()
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(buffer[:rows].float(), want, atol=2e-3, rtol=2e-3)
    assert buffer[rows:].isnan().all()


def test_a_graphs_logits_take_the_lm_heads_replacement(monkeypatch):
    """`compute_logits(out=)`, as the decode graphs call it, runs the replaced lm_head's kernel
    into the graph's buffer, and torch's product into it where the lm_head is not replaced."""
    import specserve_kernels.skinny_linear as module
    from app.models.config import ModelConfig
    from app.models.llama import LlamaForCausalLM
    raw = dict(model_type="llama", vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               tie_word_embeddings=False, rope_theta=10000.0, eos_token_id=1, bos_token_id=1, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(ModelConfig.from_dict(raw)).half().to(DEVICE).requires_grad_(False)
    hidden = torch.randn(3, 32).half().to(DEVICE)
    want = F.linear(hidden.float(), model.lm_head.weight.float())
    buffer = torch.zeros(8, 40, dtype=torch.float16, device=DEVICE)
    model.compute_logits(hidden, fp32=False, out=buffer[:3])
    torch.testing.assert_close(buffer[:3].float(), want, atol=2e-3, rtol=2e-3)

    calls = []
    real = module.skinny_linear
    monkeypatch.setattr(module, "skinny_linear", lambda *args: calls.append(args[-1].data_ptr()) or real(*args))
    assert use_skinny_linears(model, {"lm_head": ((MAX_ROWS, SMALL_TILES),)}) == 1
    buffer.zero_()
    logits = model.compute_logits(hidden, fp32=False, out=buffer[:3])
    assert calls == [buffer.data_ptr()] and logits.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(buffer[:3].float(), want, atol=2e-3, rtol=2e-3)
