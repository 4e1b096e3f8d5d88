"""The elementwise work of a decoder layer, chosen once per model: plain PyTorch (the CPU
path, and the reference), or fused Triton kernels where they run (CUDA with the Triton
attention backend), which turn about 55 kernel launches per layer per decode step into about
ten. Either way a layer reads as the same few calls:

    hidden, residual = ops.add_rms_norm(hidden, residual, norm, qkv_proj)  # residual None: first layer
    q = ops.rotary_write_kv(q, k, v, cos, sin, kv_cache, meta, backend, o_proj)
    act = ops.gate_up_silu(x, gate_up_proj)                                 # SiLU(gate) * up

`next_linear` names the projection the result goes to: the fused kernels may ask its weights
into L2 while they run (`specserve_kernels/l2_prefetch.py`); the others ignore it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specserve_kernels.attention_interface import AttentionMetadata
from specserve_kernels.torch_rotary import apply_rotary


class TorchLayerOps:
    """The model's arithmetic in eager PyTorch, op for op what it was before fusion."""

    name = "torch"

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, norm, next_linear=None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """h = x + residual (h = x in the first layer) -> (norm(h), h), h the new residual."""
        if residual is not None:
            x = x + residual
        return norm(x), x

    @staticmethod
    def rotary_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                        backend, next_linear=None) -> torch.Tensor:
        """Rotate q and k, store k and v in the layer's cache; return the rotated q."""
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        backend.write_kv(k, v, kv_cache, meta)
        return q

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def gate_up_silu(self, x: torch.Tensor, gate_up_proj) -> torch.Tensor:
        """The MLP's activation: SiLU(gate) * up of `gate_up_proj(x)`."""
        return self.silu_and_mul(gate_up_proj(x))


class TritonLayerOps(TorchLayerOps):
    """One Triton kernel each (specserve_kernels/): RMSNorm with the residual add, rotary with the KV
    write (in the Triton backend's cache layout, which is the PyTorch backend's too), and
    SiLU with the multiply (or, up to 256 rows, with the gate_up projection too: off for now).
    The first two may prefetch the next projection's weights (off for now)."""

    name = "triton"

    def __init__(self):
        from specserve_kernels import gate_up_silu
        from specserve_kernels.l2_prefetch import prefetch_for
        from specserve_kernels.rmsnorm import rms_norm
        from specserve_kernels.rotary_kv_write import rotary_write_kv
        from specserve_kernels.silu_mul import silu_and_mul
        self._rms_norm, self._rotary_write_kv, self._prefetch_for = rms_norm, rotary_write_kv, prefetch_for
        self.silu_and_mul = silu_and_mul
        self._gate_up_silu = gate_up_silu  # the module: its ENABLED is read at each call

    def add_rms_norm(self, x, residual, norm, next_linear=None):
        prefetch = self._prefetch(next_linear, "norm")
        if residual is None:
            return self._rms_norm(x, norm.weight, norm.eps, prefetch=prefetch), x
        return self._rms_norm(x, norm.weight, norm.eps, residual=residual, prefetch=prefetch)

    def rotary_write_kv(self, q, k, v, cos, sin, kv_cache, meta, backend, next_linear=None):
        return self._rotary_write_kv(q, k, v, cos, sin, kv_cache[0], kv_cache[1], meta.slot_mapping,
                                     self._prefetch(next_linear, "attention"))

    def _prefetch(self, next_linear, window: str):
        """The next projection's weights, to ask into L2 during `window` (specserve_kernels/l2_prefetch.py)."""
        return self._prefetch_for(None if next_linear is None else next_linear.weight, window)

    def gate_up_silu(self, x, gate_up_proj):
        """Up to 256 rows in 16-bit: the projection and the activation in one kernel, where it is on."""
        tiles = self._gate_up_silu.tiles_taking(x, gate_up_proj.weight)
        if tiles is not None:
            return self._gate_up_silu.gate_up_silu(x, gate_up_proj.weight, gate_up_proj.bias, tiles)
        return self.silu_and_mul(gate_up_proj(x))


class CpuLayerOps(TorchLayerOps):
    """One C++ pass each (specserve_kernels/cpu/layer_ops.cpp), fp32, chosen with the CPU attention
    backend: at small batches a CPU step is mostly per-op dispatch, and these cut a layer's
    elementwise ops from about twenty to three."""

    name = "cpu"

    def __init__(self, ops):
        """`ops`: `specserve_kernels.cpu.cpu_ops()`."""
        self._ops = ops
        self.silu_and_mul = ops.silu_and_mul

    def add_rms_norm(self, x, residual, norm, next_linear=None):
        return self._ops.add_rms_norm(x, residual, norm.weight, norm.eps)

    def rotary_write_kv(self, q, k, v, cos, sin, kv_cache, meta, backend, next_linear=None):
        return self._ops.rotary_write_kv(q, k, v, cos, sin, kv_cache, meta.slot_mapping)


TORCH_OPS = TorchLayerOps()


def select_layer_ops(device: torch.device, backend) -> TorchLayerOps | TritonLayerOps | CpuLayerOps:
    """Fused kernels on CUDA with the Triton attention backend, C++ ones with the CPU backend
    (fp32 on the CPU, where they build); PyTorch everywhere else."""
    if device.type == "cuda" and backend.name == "triton":
        return TritonLayerOps()
    if backend.name == "cpu":
        from specserve_kernels.cpu import cpu_ops
        return CpuLayerOps(cpu_ops())
    return TORCH_OPS
