"""Chunked linear + cross-entropy: the LM head and the loss without ever holding the whole (N, V) logits.

``chunked_cross_entropy(hidden, weight, targets, chunk_size)`` equals
``F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=-100)`` — values and gradients, within fp32
rounding — but computes the logits ``chunk_size`` rows at a time, so peak memory holds one (chunk, V) block in
fp32 instead of (N, V) in the compute dtype *and* in fp32 (the plain path's ``.float()`` copy plus its softmax
saved for backward). At 128K tokens and a 32K vocabulary the plain path needs tens of GB for those (8.6 GB per
bf16 copy, 17 GB per fp32 one); a 4K-row chunk 0.5 GB.

How (the approach of Liger-Kernel's fused linear cross-entropy, Hsu et al. 2024, arXiv:2410.10989):

- ``mean`` / ``sum`` reductions, gradients needed: the forward pass computes each chunk's gradient on the spot —
  d loss / d logits = softmax − one_hot (zero on ignored rows), scaled by 1/n_valid for ``mean`` — and multiplies
  it straight into grad_hidden (chunk, D) and grad_weight (V, D, accumulated in fp32). The backward pass only
  scales those by the incoming scalar gradient. Three matmuls per chunk, as many as the plain path: no recompute.
- ``none`` reduction (per-token losses, a per-row incoming gradient) or no gradient needed: the forward pass
  keeps only the per-row loss; the backward pass recomputes each chunk's logits (one extra matmul).

Precision: matmuls run in the inputs' dtype (under autocast, the autocast dtype: the caller's ``hidden`` and the
cast ``weight`` carry it), log-sum-exp and softmax in fp32 — as the plain path ``lm_head(h).float()`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100


def _chunk_loss_and_dlogits(h: Tensor, weight: Tensor, t: Tensor, want_grad: bool, row_scale=None):
    """Per-row loss (n,) in fp32 and, if asked, d loss_row / d logits (n, V) in fp32, zero on ignored rows and
    multiplied by ``row_scale`` (a scalar or (n,) tensor: 1/n_valid, the incoming gradient) in the same pass."""
    # one fused log-softmax pass, then exp in place for the softmax: about half the time of logsumexp + sub + exp
    logp = torch.log_softmax((h @ weight.T).float(), dim=-1)  # (n, V)
    valid = t != IGNORE_INDEX
    compiled = torch.compiler.is_compiling()
    if compiled:
        # the target's column by comparison: compiled at 128K rows × 32K classes, inductor's kernel for the
        # scatter_add below faulted on an H100 ("illegal memory access"; 64K ran), where rows · V passes 2^31
        hit = torch.arange(logp.shape[1], device=logp.device) == t.unsqueeze(1)  # (n, V); ignored rows hit none
        target_logp = torch.where(hit, logp, torch.zeros((), dtype=logp.dtype, device=logp.device)).sum(1)
    else:  # eager: gather and scatter touch n entries where the compares pass over n·V (the loss ~25 % faster on CPU)
        safe_t = t.clamp(min=0).unsqueeze(1)  # ignored rows read class 0 and are zeroed below
        target_logp = logp.gather(1, safe_t).squeeze(1)
    loss = torch.where(valid, -target_logp, torch.zeros_like(target_logp))
    if not want_grad:
        return loss, None
    dlogits = logp.exp_()  # softmax − one_hot, in the log-probabilities' own storage (n, V)
    if compiled:
        dlogits.sub_(hit.to(dlogits.dtype))
    else:
        dlogits.scatter_add_(1, safe_t, torch.full_like(target_logp, -1.0).unsqueeze(1))
    keep = valid.float() if row_scale is None else valid.float() * row_scale
    return loss, dlogits.mul_(keep.unsqueeze(1))


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size: int, reduction: str, needs_grad: bool):
        N = hidden.shape[0]
        n_valid = (targets != IGNORE_INDEX).sum()
        precompute = needs_grad and reduction != "none"
        scale = (1.0 / n_valid.clamp(min=1).float()) if reduction == "mean" else None
        losses = torch.empty(N, dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if precompute and ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if precompute else None
        for s in range(0, N, chunk_size):
            h, t = hidden[s : s + chunk_size], targets[s : s + chunk_size]
            loss, dlogits = _chunk_loss_and_dlogits(h, weight, t, precompute, scale)
            losses[s : s + chunk_size] = loss
            if precompute:
                d = dlogits.to(hidden.dtype)
                if grad_h is not None:
                    grad_h[s : s + chunk_size] = d @ weight  # (n, D)
                if ctx.needs_input_grad[1]:
                    grad_w.add_(d.T @ h)  # (V, D), summed over chunks in fp32
        ctx.reduction, ctx.chunk_size, ctx.precompute = reduction, chunk_size, precompute
        if precompute:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype) if ctx.needs_input_grad[1] else None)
        else:
            ctx.save_for_backward(hidden, weight, targets)
        if reduction == "none":
            return losses
        total = losses.sum()
        return total / n_valid.float() if reduction == "mean" else total  # n_valid == 0: nan, as F.cross_entropy

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.precompute:
            grad_h, grad_w = ctx.saved_tensors
            gh = grad_h * grad_out.to(grad_h.dtype) if grad_h is not None else None
            gw = grad_w * grad_out.to(grad_w.dtype) if grad_w is not None else None
            return gh, gw, None, None, None, None
        hidden, weight, targets = ctx.saved_tensors  # reduction "none": grad_out is per row (N,)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        c = ctx.chunk_size
        for s in range(0, hidden.shape[0], c):
            h, t = hidden[s : s + c], targets[s : s + c]
            _, dlogits = _chunk_loss_and_dlogits(h, weight, t, True, grad_out[s : s + c].float())
            d = dlogits.to(hidden.dtype)
            if grad_h is not None:
                grad_h[s : s + c] = d @ weight
            if ctx.needs_input_grad[1]:
                grad_w.add_(d.T @ h)
        gw = grad_w.to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_h, gw, None, None, None, None


def chunked_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int, reduction: str = "mean"
) -> Tensor:
    """Cross-entropy of ``hidden @ weight.T`` against ``targets`` (-100 ignored), ``chunk_size`` rows at a time.

    hidden (..., D), weight (V, D), targets (...) -> a scalar (``mean``, ``sum``) or per-token losses shaped
    like ``targets`` (``none``). Equal to the plain path; see the module docstring."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be mean, sum or none, got {reduction!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    shape = targets.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    t1 = targets.reshape(-1)  # (N,)
    # F.cross_entropy refuses such a target; the gather below would read a negative one as class 0. Asynchronous on
    # the GPU (no host sync; a device-side assert when it fails), and traced by torch.compile without a break.
    V = weight.shape[0]
    torch._assert_async(
        ((t1 == IGNORE_INDEX) | ((t1 >= 0) & (t1 < V))).all(),
        f"chunked_cross_entropy: a target is out of bounds; targets must lie in [0, {V}) or be {IGNORE_INDEX} "
        "(ignored)",
    )
    if torch.is_autocast_enabled(h2.device.type):  # the plain path's lm_head would run in the autocast dtype
        dtype = torch.get_autocast_dtype(h2.device.type)
        h2, weight = h2.to(dtype), weight.to(dtype)
    needs_grad = torch.is_grad_enabled() and (h2.requires_grad or weight.requires_grad)
    with torch.autocast(h2.device.type, enabled=False):
        out = _ChunkedLinearCrossEntropy.apply(h2, weight, t1, chunk_size, reduction, needs_grad)
    return out.view(shape) if reduction == "none" else out


def plain_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """The reference: whole logits, then F.cross_entropy (what GPT.loss does without ``model.loss_chunk_size``)."""
    logits = F.linear(hidden, weight).float()
    loss = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction=reduction)
    return loss.view_as(targets) if reduction == "none" else loss
