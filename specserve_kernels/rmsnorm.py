"""Fused RMSNorm (optionally with the residual add before it): one read of the row instead of
the four or five elementwise kernels eager PyTorch runs. CUDA only; the reference is
`specserve_kernels.reference.rms_norm_ref`, which is `app.models.llama.RMSNorm`'s arithmetic.

The norm before a projection may also prefetch that projection's weights into L2
(`specserve_kernels/l2_prefetch.py`), in programs of its own after the rows'.

Rounding follows the model: the residual sum is rounded to the activation dtype, the
normalised row is rounded to it, then multiplied by the weight and rounded again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve_kernels.dependent_launch import dependent_launch_args, wait_for_predecessor
from specserve_kernels.l2_prefetch import NO_PREFETCH, Prefetch, launch_args, prefetch_share


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
                     stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                     n_rows, prefetch_ptr, prefetch_bytes,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr,
                     PREFETCH_LANES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if PREFETCH_LANES:
        if row >= n_rows:  # a program after the rows': its share of the next weight, and done
            prefetch_share(prefetch_ptr, prefetch_bytes, row - n_rows, tl.num_programs(0) - n_rows, PREFETCH_LANES)
            return
    wait_for_predecessor(DEPENDENT_LAUNCH)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, h, mask=mask)
        x = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)
    xn = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (xn * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, prefetch: Prefetch = NO_PREFETCH
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [T, hidden] -> RMSNorm(x); with `residual`, h = x + residual and returns
    (RMSNorm(h), h), h being the next layer's residual stream. `prefetch`: the next weight's
    bytes to ask into L2 meanwhile (`specserve_kernels.l2_prefetch.prefetch_for`)."""
    assert x.dim() == 2 and x.stride(-1) == 1 and weight.is_contiguous()
    rows, cols = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    res_in = residual if residual is not None else x
    if rows:
        block = triton.next_power_of_2(cols)
        num_warps = min(16, max(1, block // 512))
        prefetch_args, prefetch_lanes = launch_args(prefetch, weight, num_warps)
        _rms_norm_kernel[(rows + prefetch.programs,)](
            x, res_in, weight, out, res_out, x.stride(0), res_in.stride(0), out.stride(0),
            res_out.stride(0), cols, eps, rows, *prefetch_args, HAS_RESIDUAL=residual is not None,
            BLOCK=block, num_warps=num_warps, **prefetch_lanes, **dependent_launch_args(x.device))
    return out if residual is None else (out, res_out)
