"""RMSNorm (Zhang & Sennrich 2019): ``nn.RMSNorm`` with a hand-written backward on CPU in eager mode.

Training on CPU, torch's ``rms_norm`` runs as an autograd composition (pow, mean, add, rsqrt, two muls), whose
backward is thirteen elementwise ops and reductions over the (B, T, D) input. ``_RMSNormFunction`` takes torch's
fused kernel for the forward (``_fused_rms_norm``: the output, bitwise the composition's in fp64, fp32 and bf16 at
widths 1 to 4096 on the development machine, and 1/rms per row) and writes the backward out in eight:

    x̂ = x · rstd,   gw = g · w,   dx = (gw − x̂ · ⟨gw, x̂⟩ / D) · rstd,   dw = Σ_rows g · x̂

(the gradient of y = x̂ · w, with rstd = 1/sqrt(mean(x²) + eps)), in the opmath dtype (fp32 for bf16 inputs).

Compiled graphs keep the composition, which inductor fuses; so do other devices (the GPU results were measured
with it; this path was not). The parameter, the state dict and the output (values and dtype: the input's, under
autocast too, which leaves rms_norm alone) are ``nn.RMSNorm``'s; tests/model/test_norm.py checks forward and
gradients against the composition.

Measured on the 2-core development machine (AMD EPYC, torch 2.13, 2 threads): forward + backward at (16, 128, 128)
fp32, 546 -> 377 µs (the fused forward alone is no faster than the composition's: the gain is the backward); the
tiny config's whole bf16-mixed training step, nine norms, about 2 % faster.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


# torch's fused RMSNorm kernel; a torch without it (the stack allows 2.5 on) keeps nn.RMSNorm's composition
_FUSED_FORWARD = hasattr(torch.ops.aten, "_fused_rms_norm")


class RMSNorm(nn.RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        if (
            not _FUSED_FORWARD
            or x.device.type != "cpu"
            or torch.compiler.is_compiling()
            or len(self.normalized_shape) != 1
            or (w is not None and w.dtype != x.dtype)  # torch's composition promotes mixed dtypes: left to it
        ):
            return super().forward(x)
        return _RMSNormFunction.apply(x, w, self.eps)


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm over the last dimension: torch's fused forward, the backward by hand (module docstring)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight, eps):
        y, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)  # rstd (..., 1), opmath dtype
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # rstd is saved without its graph: no double backward
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        g = grad.to(rstd.dtype)
        xhat = x * rstd  # (..., D), opmath dtype
        gw = g if weight is None else g * weight
        dot = (gw * xhat).sum(-1, keepdim=True)  # (..., 1); not linalg.vecdot: no faster, and on autocast's bf16 list
        dx = torch.addcmul(gw, xhat, dot, value=-1.0 / x.shape[-1]).mul_(rstd).to(x.dtype)
        dw = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = (g * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)  # (D,)
        return dx, dw, None
