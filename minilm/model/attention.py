"""Causal self-attention: q, k, v -> position hooks -> the fastest exact kernel -> output.

The block never asks which encoding it has. It calls ``rotate`` on q and k, then picks a kernel from what the
encoding declared (``score_kind``, ``has_value_term``; see minilm/positions/base.py):

1. no score term                    -> ``F.scaled_dot_product_attention`` (flash / efficient / cuDNN on GPU,
                                       torch's choice or ``model.sdpa_kernel``'s first: ``sdpa_backends``;
                                       training in bf16 on CPU at short lengths, in fp32 where torch's bf16
                                       backward is the slower: up to 4 head widths, plain matmul–softmax
                                       (``cpu_matmul_attention``), beyond, its flash kernel with the backward on
                                       fp32 copies (``cpu_sdpa_fp32_backward``), then its own bf16 one);
                                       with a document mask, FlexAttention on CUDA instead (rung 2, no score_mod):
                                       SDPA would take the dense (B, 1, T, S) mask, which rules out the flash
                                       kernel and grows as T², where Flex skips the blocks between documents;
2. a score term with a score_mod    -> FlexAttention on CUDA (no T×S bias materialized) — see ``flex.py``; a
                                       decoding step (under ``FLEX_MIN_QUERIES`` queries) takes rung 1 or 3 instead;
3. a bias score term elsewhere      -> ``sdpa_bias_attention``: SDPA in fp32 with the bias as its float mask
                                       (CPU, or CUDA without FlexAttention or with heads under 16 wide);
4. anything else, and the reference -> ``reference_attention``: plain matmul–softmax in fp32.

On CPU rungs 3 and 4 run in blocks of queries, each against only the keys it can see (``in_query_blocks``).

Masking is by *index*, not by position value: query i (at absolute index ``offset + i``) sees key j when
j <= offset + i and, with document masking, when both lie in the same document. Positions (which may restart
per document or be remapped) only feed the encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend
from torch.nn.attention import sdpa_kernel as sdpa_order  # (model.sdpa_kernel is the name of a kernel)

from minilm.errors import MinilmError
from minilm.positions import PositionDims, build_position
from minilm.positions.base import PositionEncoding


@dataclass
class AttentionMask:
    """Causal (by index, with ``offset`` cached keys before the first query) and optional same-document."""

    offset: int = 0
    q_doc: Optional[Tensor] = None  # (B, T) document id of each query
    k_doc: Optional[Tensor] = None  # (B, S) document id of each key

    @property
    def is_plain_causal(self) -> bool:
        return self.q_doc is None

    def queries(self, i0: int, i1: int, s1: int) -> "AttentionMask":
        """The mask of queries i0..i1−1 against keys 0..s1−1 alone (a block of ``in_query_blocks``)."""
        return AttentionMask(offset=self.offset + i0,
                             q_doc=None if self.q_doc is None else self.q_doc[:, i0:i1],
                             k_doc=None if self.k_doc is None else self.k_doc[:, :s1])  # fmt: skip

    def dense(self, T: int, S: int, device: torch.device) -> Tensor:
        """Boolean mask broadcastable to (B, 1, T, S): True where attention is allowed."""
        i = torch.arange(T, device=device).unsqueeze(1) + self.offset
        j = torch.arange(S, device=device).unsqueeze(0)
        allowed = (j <= i).unsqueeze(0).unsqueeze(0)  # (1, 1, T, S)
        if self.q_doc is not None:
            allowed = allowed & (self.q_doc.unsqueeze(-1) == self.k_doc.unsqueeze(-2)).unsqueeze(1)
        return allowed


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, Hkv, S, Dh) -> (B, Hkv·n_rep, S, Dh): grouped-query heads shared by consecutive query heads."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def reference_attention(q, k, v, pos, q_pos, k_pos, mask: AttentionMask) -> Tensor:
    """The exact reference: fp32 matmul -> mask -> + score term (it reads the masked logits: CoPE) -> softmax -> @ v
    (+ value term). fp32 under autocast too (which would otherwise run the matmuls in bf16)."""
    with torch.autocast(q.device.type, enabled=False):
        return _reference_attention(q, k, v, pos, q_pos, k_pos, mask)


def _reference_attention(q, k, v, pos, q_pos, k_pos, mask: AttentionMask) -> Tensor:
    B, H, T, Dh = q.shape
    n_rep = H // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    logits = (q.float() @ k.float().transpose(-1, -2)) * pos.softmax_scale(Dh)  # (B, H, T, S)
    allowed = mask.dense(T, k.shape[2], q.device)
    logits = logits.masked_fill(~allowed, float("-inf"))  # masked first: contextual terms (CoPE) read it
    bias = pos.score(q, k, q_pos, k_pos, logits)
    if bias is not None:
        logits = logits + bias  # a finite bias keeps masked entries at −inf
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a fully masked row (never causal) gives zeros
    out = probs @ v.float()
    extra = pos.value(probs, q_pos, k_pos)
    if extra is not None:
        out = out + extra
    return out.to(q.dtype)


# model.sdpa_kernel -> the SDPA backend it puts first (minilm.config.SDPA_KERNELS but "auto")
SDPA_BACKEND = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
# behind it, every other backend SDPA has on CPU and CUDA, in torch's default order (flash, efficient, math, cuDNN)
SDPA_FALLBACKS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
                  SDPBackend.CUDNN_ATTENTION)  # fmt: skip
# torch.nn.attention.sdpa_kernel takes a priority order from torch 2.6 (pytorch#140467), and compiled graphs keep
# it from 2.7 (pytorch#147768); 2.6 compiled the default order without a word
SDPA_ORDER_TORCH = "2.7"


def sdpa_backends(kernel: str) -> Optional[tuple[SDPBackend, ...]]:
    """The SDPA backends in priority order for ``model.sdpa_kernel``: None for "auto" (torch's own choice,
    untouched), else the named one first and the others behind it, for the inputs it cannot take (a head width or
    mask it does not support). Only CUDA reads the order; on CPU, SDPA takes its flash kernel where it can, else
    math, as with "auto"."""
    if kernel == "auto":
        return None
    if torch.__version__ < SDPA_ORDER_TORCH:
        raise MinilmError(f"model.sdpa_kernel={kernel} needs torch >= {SDPA_ORDER_TORCH} (SDPA's priority order, "
                          f"and compiled graphs that keep it); this is torch {torch.__version__}: set "
                          "model.sdpa_kernel=auto, or upgrade torch")  # fmt: skip
    first = SDPA_BACKEND[kernel]
    return (first, *(b for b in SDPA_FALLBACKS if b != first))


def sdpa_attention(q, k, v, pos, mask: AttentionMask, backends: Optional[tuple[SDPBackend, ...]] = None) -> Tensor:
    """SDPA, causal (and with the mask's documents and offset); ``backends``: ``sdpa_backends``' order, for this
    call alone (``sdpa_order`` restores the previous order after it; compiled, dynamo bakes the order into the
    graph, so the compiled kernel is the one it names). A training call on CPU in bf16 under T · head width =
    ``CPU_FP32_BACKWARD_BELOW`` reads no order: up to ``CPU_MATMUL_ATTENTION_UP_TO`` head widths long it is plain
    matmul–softmax in fp32 (``cpu_matmul_attention``), beyond, torch's flash kernel with its backward in fp32
    (``cpu_sdpa_fp32_backward``)."""
    Dh, T, S = q.shape[-1], q.shape[2], k.shape[2]
    scale, gqa = pos.softmax_scale(Dh), q.shape[1] != k.shape[1]
    allowed = None if mask.is_plain_causal and mask.offset == 0 and T == S else mask.dense(T, S, q.device)
    if _cpu_backward_in_fp32(q, k, v):
        if T <= CPU_MATMUL_ATTENTION_UP_TO * Dh:
            return cpu_matmul_attention(q, k, v, scale, allowed)
        return cpu_sdpa_fp32_backward(q, k, v, scale, allowed)
    if backends is None:
        return _sdpa(q, k, v, allowed, scale, gqa)
    with sdpa_order(list(backends), set_priority=True):
        return _sdpa(q, k, v, allowed, scale, gqa)


def _sdpa(q, k, v, allowed: Optional[Tensor], scale: float, gqa: bool) -> Tensor:
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=gqa)


# On CPU the backward of torch's flash-attention kernel runs several times slower in bf16 than in fp32 at short
# sequences, while its forward and the model's matmuls run faster in bf16 (AMX, AVX512-BF16). Measured on the 2-core
# development machine (Xeon with AMX, torch 2.13, SDPA forward + backward, 4096 tokens; docs/performance.md): head
# width 32 at 128 tokens, bf16 27.3 ms, fp32 7.5 ms; the two even out near T · head width = 16K, past which bf16 is
# the faster. A Zen 4 EPYC (AVX512-BF16) gave the same picture.
CPU_FP32_BACKWARD_BELOW = 16384  # T · head width under which a bf16 SDPA on CPU takes its backward in fp32


def _cpu_backward_in_fp32(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether SDPA on these inputs is a CPU training call in bf16 (theirs, or autocast's) short enough that its
    backward is faster in fp32 (``cpu_sdpa_fp32_backward``). fp16 is left to torch: not measured."""
    if q.device.type != "cpu" or q.shape[2] * q.shape[3] >= CPU_FP32_BACKWARD_BELOW:
        return False
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return training and _sdpa_dtype(q) == torch.bfloat16


def _sdpa_dtype(q: Tensor) -> torch.dtype:
    """The dtype SDPA computes in: autocast's where it is on (SDPA is on its lower-precision list), else q's."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else q.dtype


def cpu_sdpa_fp32_backward(q, k, v, scale: float, allowed: Optional[Tensor]) -> Tensor:
    """SDPA on CPU with the forward in bf16 and the backward in fp32 (``_CpuSdpaFp32Backward``); the same attention
    as ``sdpa_attention``, within bf16 rounding (tests/model/test_attention_ladder.py). ``allowed``: the dense mask
    of ``AttentionMask.dense``, None for plain causal attention."""
    n_rep = q.shape[1] // k.shape[1]
    q, k, v = q.bfloat16(), repeat_kv(k, n_rep).bfloat16(), repeat_kv(v, n_rep).bfloat16()  # the kernel has no GQA
    bias = None if allowed is None else torch.zeros(1, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
    with torch.autocast("cpu", enabled=False):
        return _CpuSdpaFp32Backward.apply(q, k, v, bias, allowed is None, scale)


class _CpuSdpaFp32Backward(torch.autograd.Function):
    """torch's CPU flash-attention kernel: forward in bf16, backward on fp32 copies of its inputs and output (the
    saved log-sum-exp is fp32 already); gradients returned in bf16."""

    @staticmethod
    def forward(ctx, q, k, v, bias, causal: bool, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=bias, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, bias)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, bias = ctx.saved_tensors
        g, q32, k32, v32, out32 = (t.float() for t in (grad, q, k, v, out))
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g, q32, k32, v32, out32, lse, 0.0, ctx.causal, attn_mask=None if bias is None else bias.float(),
            scale=ctx.scale,
        )  # fmt: skip
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


# Shorter still, plain matmul–softmax in fp32 beats even that: at these lengths the (T, S) scores of a head are a
# few tens of KB, so three batched matmuls, a softmax and their backward over whole (T, S) blocks cost less than
# the flash kernel's tiling, and the causal half it skips is small. Rounding too: everything after the bf16 inputs
# is fp32, where the flash path computes its forward in bf16. Measured on the 2-core development machine (AMD EPYC
# Zen 4, torch 2.13, forward + backward, 4096 tokens a call), its time over the flash path's: head width 32, 0.86 at
# T 128, 0.99 at 192, 1.05 at 256; head width 64, 0.70 at T 128, 0.84 at 256, 0.73 at 384, 0.99 at 512. Up to 4 head
# widths it is the faster at both.
CPU_MATMUL_ATTENTION_UP_TO = 4  # on CPU, T / head width up to which a bf16 training call takes cpu_matmul_attention


def cpu_matmul_attention(q, k, v, scale: float, allowed: Optional[Tensor]) -> Tensor:
    """Attention on CPU as plain matmul–softmax in fp32 on bf16 inputs, output in bf16 (``_CpuMatmulAttention``): the
    same attention as ``sdpa_attention``, at fp32's rounding after the inputs' (tests/model/test_attention_ladder.py).
    ``allowed``: the dense mask of ``AttentionMask.dense``, None for plain causal attention (then T == S)."""
    B, H, T, Dh = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    n_rep = H // Hkv
    # The masked entries as an additive −inf bias, rows arranged as the Function's (B·Hkv, n_rep·T, S) scores. No
    # row is all −inf (which softmax would turn into NaN, where the flash kernel and the reference give zeros): query
    # i is the token at key index offset + i, which the causal mask allows and which lies in its own document
    if allowed is None:
        bias = torch.full((T, S), float("-inf"), device=q.device).triu_(1).repeat(n_rep, 1)  # (n_rep·T, S)
    else:
        bias = torch.zeros(1, device=q.device).masked_fill(~allowed, float("-inf"))  # (B|1, 1, T, S)
        bias = bias.unsqueeze(2).expand(B, Hkv, n_rep, T, S).reshape(B * Hkv, n_rep * T, S)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()  # what autocast gives SDPA
    with torch.autocast("cpu", enabled=False):
        return _CpuMatmulAttention.apply(q, k, v, bias, scale)


class _CpuMatmulAttention(torch.autograd.Function):
    """softmax(q·kᵀ · scale + bias) · v in fp32 on fp32 copies of q, k, v (B, H|Hkv, T|S, Dh), grouped-query heads
    without repeat_kv: the n_rep query heads sharing a key head stack their rows into one (n_rep·T, Dh) matrix per
    (batch, key head), so the key and value gradients sum over them in fp32 inside the matmuls. Saves the fp32
    copies and the probabilities (B·H·T·S floats, 4 MB a layer at the tiny config's B 16, H 4, T 128); returns the
    output and the gradients in the inputs' dtype."""

    @staticmethod
    def forward(ctx, q, k, v, bias, scale):
        B, H, T, Dh = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        rows = (B * Hkv, H // Hkv * T, Dh)  # a key head's queries, all its query heads' rows
        q32, k32, v32 = (t.to(torch.float32, memory_format=torch.contiguous_format) for t in (q, k, v))
        q32, k32, v32 = q32.view(rows), k32.view(B * Hkv, S, Dh), v32.view(B * Hkv, S, Dh)
        probs = torch.softmax(torch.baddbmm(bias, q32, k32.transpose(1, 2), alpha=scale), dim=-1)  # (B·Hkv, ., S)
        out = torch.bmm(probs, v32)
        ctx.save_for_backward(q32, k32, v32, probs)
        ctx.scale, ctx.dtype, ctx.kv_shape = scale, q.dtype, k.shape
        return out.view(B, H, T, Dh).to(q.dtype)

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast("cpu", enabled=False):  # a backward() called inside autocast would run the bmm in bf16
            return _CpuMatmulAttention._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        q32, k32, v32, probs = ctx.saved_tensors
        g = grad.to(torch.float32, memory_format=torch.contiguous_format).view(q32.shape)
        dv = torch.bmm(probs.transpose(1, 2), g)
        dscores = torch._softmax_backward_data(torch.bmm(g, v32.transpose(1, 2)), probs, -1, torch.float32)
        dq = torch.bmm(dscores, k32).mul_(ctx.scale)  # the scale on the (., Dh) products, not the (., S) scores
        dk = torch.bmm(dscores.transpose(1, 2), q32).mul_(ctx.scale)
        dtype, kv_shape = ctx.dtype, ctx.kv_shape
        return dq.view(grad.shape).to(dtype), dk.view(kv_shape).to(dtype), dv.view(kv_shape).to(dtype), None, None


# SDPA with a float mask can skip no key: a causal query's masked keys cost as much as its allowed ones, and a bias
# with a gradient (T5, KERPLE, FIRE) sends SDPA down its math path, a handful of passes over (B, H, T, S); the
# reference path (CoPE, Shaw's value term) makes more. Taken in blocks of queries, each against the keys up to its
# last query only (``in_query_blocks``), the work falls to about half, and a block's (B, H, block, S) passes stay in
# cache. Exact: each query's softmax, and each term of these encodings, is a function of its own row. On the 2-core
# development machine (AMD EPYC, torch 2.13, fp32, the tiny config's attention core, forward + backward at T 2048)
# T5 453 -> 137 ms, KERPLE 654 -> 140, FIRE 2151 -> 627, ALiBi 187 -> 119 (docs/performance.md); blocks of 128
# were within ~20 % of the best of 32..512 at every length measured. Not measured on a GPU, where these rungs are
# FlexAttention's fallbacks: there they run as one call while a (B, H, T, S) fp32 score matrix stays under
# QUERY_BLOCK_BYTES, and in blocks past it, so that memory, not speed, decides (an evaluation at 32K tokens with a
# training-free method built two or three such matrices of 48 GB each at 12 heads).
CPU_QUERY_BLOCK = 128  # on CPU, queries per block of the bias and reference rungs
QUERY_BLOCK_BYTES = 1 << 30  # elsewhere, the most bytes of fp32 scores (B, H, block, S) one block holds


def query_block(q: Tensor, k: Tensor) -> int:
    """The queries per block of ``in_query_blocks`` for q (B, H, T, Dh) against k (., ., S, Dh): ``CPU_QUERY_BLOCK``
    on CPU; elsewhere all T while B · H · T · S fp32 scores fit in ``QUERY_BLOCK_BYTES``, else the most that fit,
    in multiples of ``CPU_QUERY_BLOCK`` (one such block at the least)."""
    T, S = q.shape[2], k.shape[2]
    if q.device.type == "cpu":
        return CPU_QUERY_BLOCK
    rows = QUERY_BLOCK_BYTES // max(4 * q.shape[0] * q.shape[1] * S, 1)
    return T if rows >= T else max(CPU_QUERY_BLOCK, rows - rows % CPU_QUERY_BLOCK)


def in_query_blocks(attend, q, k, v, pos, q_pos, k_pos, mask: AttentionMask) -> Tensor:
    """``attend(q, k, v, pos, q_pos, k_pos, mask)`` over blocks of ``query_block`` queries (on CPU 128; elsewhere one
    call unless the scores would pass ``QUERY_BLOCK_BYTES``), each against the keys 0..s1−1 its last query can see
    (s1 = offset + its end). For an attention whose every output row depends on its own row of the scores only
    (softmax, a bias of (b, h, i, j), CoPE's cumulative sum over a row's keys, Shaw's value term): not for a score
    that mixes rows."""
    T, S = q.shape[2], k.shape[2]
    block = query_block(q, k)
    if T <= block:
        return attend(q, k, v, pos, q_pos, k_pos, mask)
    out = []
    for i0 in range(0, T, block):
        i1 = min(T, i0 + block)
        s1 = min(S, mask.offset + i1)  # the keys a causal query of the block can see
        out.append(attend(q[:, :, i0:i1], k[:, :, :s1], v[:, :, :s1], pos, q_pos[:, i0:i1], k_pos[:, :s1],
                          mask.queries(i0, i1, s1)))  # fmt: skip
    return torch.cat(out, dim=2)


def sdpa_bias_attention(q, k, v, pos, q_pos, k_pos, mask: AttentionMask) -> Tensor:
    """A ``"bias"`` score term (one that does not read the logits) as SDPA's float ``attn_mask``: the bias with
    −inf where attention is not allowed, in fp32 like the reference. The (B|1, H, T, S) bias is still built (on
    CPU in blocks of queries, ``in_query_blocks``), but the logits, the probabilities and their backward are SDPA's:
    on CPU its flash kernel when the bias needs no gradient (ALiBi), its fused math path otherwise (T5, KERPLE,
    FIRE, ...). Equal to the reference up to rounding (tests/positions/test_fast_paths.py); fp32 under autocast
    too, as FlexAttention's scores are."""
    return in_query_blocks(_sdpa_bias, q, k, v, pos, q_pos, k_pos, mask)


def _sdpa_bias(q, k, v, pos, q_pos, k_pos, mask: AttentionMask) -> Tensor:
    Dh, T, S = q.shape[-1], q.shape[2], k.shape[2]
    with torch.autocast(q.device.type, enabled=False):
        bias = pos.score(q, repeat_kv(k, q.shape[1] // k.shape[1]), q_pos, k_pos, None)  # fp32, (B|1, H, T, S)
        attn_mask = torch.where(mask.dense(T, S, q.device), bias.float(), float("-inf"))  # one pass, not a copy + fill
        out = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=attn_mask, scale=pos.softmax_scale(Dh),
            enable_gqa=q.shape[1] != k.shape[1],
        )  # fmt: skip
    return out.to(q.dtype)


FLEX_MIN_QUERIES = 16  # fewer queries than this (a decoding step) take SDPA with the bias mask, not FlexAttention


class Attention(nn.Module):
    # No dropout on the attention probabilities: FlexAttention has none, and every kernel must compute the same thing
    # (model.dropout acts on the embeddings and on each residual branch, in transformer.py)
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, position: dict, dims: PositionDims,
                 sdpa_kernel: str = "auto"):  # fmt: skip
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.sdpa_backends = sdpa_backends(sdpa_kernel)  # model.sdpa_kernel, for the "sdpa" rung
        self.head_dim = d_model // n_heads
        self.wq = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(d_model, 2 * n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        self.pos = build_position(position, dims, "attention")
        # A training-free extension method installed for evaluation / generation (minilm.positions.training_free);
        # when set, it computes attention itself from the rotary module and the position tensors.
        self.extension = None

    def forward(self, x: Tensor, q_pos: Tensor, mask: AttentionMask, cache=None) -> Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k, v = self.wkv(x).view(B, T, 2, self.n_kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, Hkv, T, Dh)
        k_pos = q_pos
        if cache is not None:  # keys are cached *before* rotation, so length-dependent RoPE re-rotates them all
            k, v, k_pos = cache.update(k, v, q_pos)
        if self.extension is not None:
            y = self.extension.attend(q, k, v, self.pos, q_pos, k_pos, mask)
        else:
            # positions as given, (1, T) when shared by the batch: rotary tables are then computed once, not B times
            q, k = self.pos.rotate(q, k, q_pos, k_pos)
            y = self.attend(q, k, v, q_pos, k_pos, mask)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, H·Dh)
        return self.wo(y)

    def kernel(self, device: torch.device, documents: bool = False) -> str:
        """The rung of the kernel ladder (module docstring) this encoding takes on ``device``, with a document mask
        or without: "sdpa", "flex", "sdpa_bias" or "reference"."""
        pos = self.pos
        if pos.has_value_term or pos.score_kind not in ("none", "bias"):
            return "reference"
        if pos.score_kind == "none":
            return "flex" if documents and self._flex_runs_on(device) else "sdpa"
        if type(pos).score_mod is not PositionEncoding.score_mod and self._flex_runs_on(device):
            return "flex"
        return "sdpa_bias"

    def _flex_runs_on(self, device: torch.device) -> bool:
        """FlexAttention's compiled kernel: CUDA only (no CPU backward), heads at least 16 wide (it refuses less)."""
        if torch.device(device).type != "cuda":
            return False
        from minilm.model.flex import FLEX_MIN_HEAD_DIM, flex_attention_available

        return flex_attention_available() and self.head_dim >= FLEX_MIN_HEAD_DIM

    def attend(self, q, k, v, q_pos, k_pos, mask: AttentionMask) -> Tensor:
        """The kernel ladder (module docstring). Positions arrive as given, (1, T) when the batch shares them;
        every score-term path reads them per row, except a position-only bias (``score_reads_qk = False``)
        through SDPA, which then builds one bias for the whole batch."""
        pos, kernel = self.pos, self.kernel(q.device, documents=not mask.is_plain_causal)
        B, T = q.shape[0], q.shape[2]
        if kernel == "flex" and T < FLEX_MIN_QUERIES:
            # KV-cache decoding (one query, or a few): the (B|1, H, T, S) bias or mask is small, and FlexAttention's
            # kernel (static shapes) would compile once per key length — a compilation every token for the first 8
            # tokens, until dynamo's recompile limit — for nothing it saves here
            kernel = "sdpa" if pos.score_kind == "none" else "sdpa_bias"
        if kernel == "sdpa":
            return sdpa_attention(q, k, v, pos, mask, self.sdpa_backends)
        rows = q_pos.expand(B, -1), k_pos.expand(B, -1)
        if kernel == "flex":  # (a score term here has a score_mod: ``kernel``)
            from minilm.model.flex import (
                flex_attention_in_parts,
                flex_attention_with_coefficient_grads,
                flex_attention_with_score_mod,
            )

            scale = pos.softmax_scale(q.shape[-1])
            bias = pos.score_kind == "bias"
            # the encoding's tables in fp32 under autocast too, as the other rungs compute its score: built inside the
            # training's bf16 autocast, those from a matmul (Shaw's q·R^K, Transformer-XL's and DeBERTa's q·R and
            # k·R, FIRE's linear pieces) were rounded to bf16, ~1 % off the reference (Transformer-XL's up to 0.05)
            with torch.autocast(q.device.type, enabled=False):
                parts = pos.flex_parts(q, k, *rows) if bias else None
                coefficients = pos.flex_coefficients(q, k, *rows) if bias and parts is None else None
                score_mod = pos.score_mod(q, k, *rows) if bias and parts is None and coefficients is None else None
            options = pos.flex_kernel_options()  # (smaller kernel blocks for a heavy score_mod, on CUDA)
            if parts is not None:
                return flex_attention_in_parts(q, k, v, parts, mask, scale, kernel_options=options)
            if coefficients is not None:
                return flex_attention_with_coefficient_grads(q, k, v, coefficients, mask, scale, kernel_options=options)
            return flex_attention_with_score_mod(q, k, v, score_mod, mask, scale, kernel_options=options)
        if kernel == "sdpa_bias":
            shared = rows if pos.score_reads_qk else (q_pos, k_pos)
            return sdpa_bias_attention(q, k, v, pos, *shared, mask)
        return in_query_blocks(reference_attention, q, k, v, pos, *rows, mask)
