"""SiLU(gate) * up in one pass over the gate_up projection's output (eager PyTorch runs a
SiLU kernel and a multiply kernel, and writes the SiLU in between). The reference is
`specserve_kernels.reference.silu_and_mul_ref`, which is `app.models.llama.MLP`'s arithmetic.

Rounding follows the model: SiLU is computed in fp32 and rounded to the activation dtype, then
multiplied by `up` and rounded again, as `F.silu(gate) * up` does in that dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve_kernels.dependent_launch import dependent_launch_args, wait_for_predecessor

MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr,
                         DEPENDENT_LAUNCH: tl.constexpr):
    wait_for_predecessor(DEPENDENT_LAUNCH)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)
    out = silu.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """x [T, 2 * I] (gate then up, as `gate_up_proj` writes them) -> SiLU(gate) * up [T, I]."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(-1) == 1
    rows, cols = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    if rows and cols:
        block = block or min(MAX_BLOCK, triton.next_power_of_2(cols))
        _silu_and_mul_kernel[(rows, triton.cdiv(cols, block))](
            x, out, x.stride(0), out.stride(0), cols, BLOCK=block,
            num_warps=max(1, min(8, block // 256)), **dependent_launch_args(x.device))
    return out
