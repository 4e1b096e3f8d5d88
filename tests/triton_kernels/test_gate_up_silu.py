"""The gate_up projection with SiLU(gate) * up in one kernel: the same numbers as the skinny
projection followed by the SiLU kernel (fp16: the interpreter gets bf16 wrong), close to the
fp32 reference, at sizes off its tiles, and taken by the layer ops for small 16-bit batches
only, when on."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels.gate_up_silu import gate_up_silu
from kernels.silu_mul import silu_and_mul
from kernels.skinny_linear import MAX_ROWS, skinny_linear
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


class _GateUp(nn.Linear):
    def __init__(self, dtype):
        super().__init__(64, 2 * 48, bias=False, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("enabled,rows,dtype,fused", [
    (True, 1, torch.float16, True), (True, MAX_ROWS, torch.float16, True),
    (True, MAX_ROWS + 1, torch.float16, False), (True, 4, torch.float32, False),
    (False, 1, torch.float16, False)])
def test_the_layer_ops_take_it_for_small_16_bit_batches_when_on(monkeypatch, enabled, rows, dtype, fused):
    import kernels.gate_up_silu as module
    from app.models.layer_ops import TritonLayerOps
    monkeypatch.setattr(module, "ENABLED", enabled)
    calls = []
    monkeypatch.setattr(module, "gate_up_silu", lambda x, w, b: calls.append(len(x)) or silu_and_mul(F.linear(x, w, b)))
    linear = _GateUp(dtype)
    x = torch.randn(rows, 64, dtype=dtype, device=DEVICE)
    got = TritonLayerOps().gate_up_silu(x, linear)
    assert calls == ([rows] if fused else [])
    gate, up = linear(x).float().chunk(2, dim=-1)
    torch.testing.assert_close(got.float(), F.silu(gate) * up, atol=4e-3, rtol=4e-3)
