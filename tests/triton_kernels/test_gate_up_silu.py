"""The gate_up projection with SiLU(gate) * up in one kernel: the same numbers as the skinny
projection at the same tiles followed by the SiLU kernel (fp16: the interpreter gets bf16
wrong), close to the fp32 reference, at sizes off its tiles and in several row tiles, and taken
by the layer ops for 16-bit batches of up to 256 rows only, when on."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specserve_kernels.gate_up_silu import ROW_CONFIGS, config_for, gate_up_silu
from specserve_kernels.silu_mul import silu_and_mul
from specserve_kernels.skinny_linear import MAX_ROWS, skinny_linear
from tests.triton_kernels.test_skinny_linear import DEVICE, SMALL_TILES, _inputs

@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
@pytest.mark.parametrize("in_features,features", [(64, 48), (200, 40), (320, 129)])
@pytest.mark.parametrize("bias", [False, True])
def test_gate_up_silu_is_the_projection_then_the_activation(rows, in_features, features, bias):
    x, w, b = _inputs(rows, in_features, 2 * features, bias, seed=rows + in_features)
    got = gate_up_silu(x, w, b, SMALL_TILES)
    assert got.dtype == torch.float16 and got.shape == (rows, features)
    assert torch.equal(got, silu_and_mul(skinny_linear(x, w, b, SMALL_TILES)))
    gate, up = F.linear(x.float(), w.float(), None if b is None else b.float()).chunk(2, dim=-1)
    torch.testing.assert_close(got.float(), F.silu(gate) * up, atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("rows,block_m", [(40, 16), (33, 32)])
def test_row_tiles_are_the_projection_then_the_activation(rows, block_m):
    """Batches past one tile of rows (ROW_CONFIGS' larger ones): the last tile partial, and
    several blocks of features, so that a program taking another's rows or features fails."""
    tiles = dict(SMALL_TILES, BLOCK_M=block_m)
    x, w, b = _inputs(rows, 200, 2 * 40, True, seed=rows)
    got = gate_up_silu(x, w, b, tiles)
    assert torch.equal(got, silu_and_mul(skinny_linear(x, w, b, tiles)))
    gate, up = F.linear(x.float(), w.float(), b.float()).chunk(2, dim=-1)
    torch.testing.assert_close(got.float(), F.silu(gate) * up, atol=4e-3, rtol=4e-3)


def test_each_batch_takes_the_tiles_of_the_first_configuration_that_holds_it():
    (small, first), (medium, second), (largest, last) = ROW_CONFIGS
    assert config_for(1) is first and config_for(small) is first and config_for(small + 1) is second
    assert config_for(medium) is second and config_for(largest) is last and config_for(largest + 1) is None
    assert all(config["BLOCK_M"] <= rows for rows, config in ROW_CONFIGS)


class _GateUp(nn.Linear):
    def __init__(self, dtype):
        super().__init__(64, 2 * 48, bias=False, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("enabled,rows,dtype,fused", [
    (True, 1, torch.float16, True), (True, MAX_ROWS, torch.float16, True),
    (True, MAX_ROWS + 1, torch.float16, True), (True, 256, torch.float16, True),
    (True, 257, torch.float16, False), (True, 4, torch.float32, False),
    (False, 1, torch.float16, False)])
def test_the_layer_ops_take_it_for_16_bit_batches_of_up_to_256_rows_when_on(monkeypatch, enabled, rows, dtype, fused):
    import specserve_kernels.gate_up_silu as module
    from app.models.layer_ops import TritonLayerOps
    monkeypatch.setattr(module, "ENABLED", enabled)
    calls = []
    real = module.gate_up_silu
    monkeypatch.setattr(module, "gate_up_silu", lambda x, w, b, config: calls.append(len(x)) or real(x, w, b, config))
    linear = _GateUp(dtype)
    x = torch.randn(rows, 64, dtype=dtype, device=DEVICE)
    got = TritonLayerOps().gate_up_silu(x, linear)
    assert calls == ([rows] if fused else [])
    gate, up = linear(x).float().chunk(2, dim=-1)
    torch.testing.assert_close(got.float(), F.silu(gate) * up, atol=4e-3, rtol=4e-3)
