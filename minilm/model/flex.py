"""FlexAttention path (CUDA): score terms applied inside the kernel, so no T×S bias is materialized.

``flex_attention_with_score_mod`` runs ``torch.nn.attention.flex_attention`` with

- a ``BlockMask`` built from the same rule as ``AttentionMask.dense`` — key j is visible to query i when
  j <= offset + i (causal by index, ``offset`` cached keys first) and, with document masking, when both lie in the
  same document; fully masked blocks are skipped. Plain causal masks are cached per (T, S, offset, device);
- the encoding's ``score_mod(score, b, h, i, j)`` (minilm.positions: ALiBi, T5, KERPLE, FIRE, and the per-step
  q·R tables of Shaw, Transformer-XL, DeBERTa), which reads positions as q_pos[b, i], k_pos[b, j]; or none, for
  the document mask of an encoding without a score term (RoPE family, absolute, NoPE);
- grouped-query attention through ``enable_gqa`` (consecutive query heads share a key head, as ``repeat_kv``).

It is compiled on CUDA (the fused kernel: by ``_compiled_flex`` in an eager model, by the model's own compile
under ``train.compile``); elsewhere it runs FlexAttention's eager implementation, which
materializes the scores and supports no backward on CPU — the attention block only takes this path on CUDA, and
the CPU tests use it to check each score_mod against the reference path.
"""

from __future__ import annotations

import functools

import torch

from minilm.positions.base import FlexCoefficients, FlexPart


# The CUDA kernel's smallest head dimension: inductor's Triton lowering refuses a smaller one ("NYI: embedding
# dimension of the query, key, and value must be at least 16"; tl.dot needs 16), at the first compiled call.
FLEX_MIN_HEAD_DIM = 16


@functools.cache
def flex_attention_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


# Shapes the eager model's FlexAttention kernel compiles for before dynamo gives up on it. The kernel is one
# process-wide compiled function, static per shape (and per grad mode), and an evaluation meets many: each length's
# perplexity windows, retrieval batches and greedy-example prompt, plus their remainder batches — about ten per
# length. Past dynamo's default limit (8, reached in a run's first evaluation) flex_attention ran eagerly,
# materializing the (B, H, T, S) scores: slow, and out of memory at long lengths. (Under dynamo's global cap of
# 256 compilations, accumulated_recompile_limit.)
FLEX_RECOMPILE_LIMIT = 128


@functools.cache
def _compiled_flex_kernel():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _compiled_flex(*args, **kwargs):
    """The compiled kernel, called with dynamo's recompile limit raised to FLEX_RECOMPILE_LIMIT for this call only
    (the limit is read when a call misses the cache and compiles)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    with config.patch(name, max(getattr(config, name), FLEX_RECOMPILE_LIMIT)):
        return _compiled_flex_kernel()(*args, **kwargs)


@functools.cache
def _compiled_create_block_mask():  # (create_block_mask's own _compile flag is deprecated since torch 2.11)
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


@functools.lru_cache(maxsize=32)
def _causal_block_mask(T: int, S: int, offset: int, device: str, compile: bool = False):
    """``compile`` as in ``document_block_mask``: uncompiled, create_block_mask evaluates the rule on the whole
    (T, S) grid, ~10 bytes per element at once (10 GB at T = S = 32K, 160 GB at 128K)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, i, j):
        return j <= i + offset

    build = _compiled_create_block_mask() if compile else create_block_mask
    return build(causal, None, None, T, S, device=device)


def _allowed(mask, keep=None):
    """The mask_mod of ``mask`` (``AttentionMask.dense``'s rule: causal by index after ``offset`` cached keys, and
    same-document where it has documents), and of ``keep(b, h, i, j)`` too when given."""
    offset, q_doc, k_doc = mask.offset, mask.q_doc, mask.k_doc

    def allowed(b, h, i, j):
        rule = j <= i + offset
        if keep is not None:
            rule = rule & keep(b, h, i, j)
        return rule if q_doc is None else rule & (q_doc[b, i] == k_doc[b, j])

    return allowed


def document_block_mask(mask, B: int, T: int, S: int, device, compile: bool = False):
    """Causal and same-document. ``compile`` builds it with create_block_mask's compiled kernel, block by block;
    uncompiled, create_block_mask evaluates the rule on the whole (B, T, S) grid at once (8 GB at B 8, T 32K)."""
    from torch.nn.attention.flex_attention import create_block_mask

    build = _compiled_create_block_mask() if compile else create_block_mask
    return build(_allowed(mask), B, None, T, S, device=device)


def block_mask(mask, B: int, T: int, S: int, device: torch.device):
    """The BlockMask equal to ``mask.dense(T, S)`` (minilm.model.attention.AttentionMask). Inside a compiled model
    it is built in the graph. In an eager one the causal mask is cached per shape, and a document mask is built
    once per forward (every layer gets the same AttentionMask object), both by the compiled builder on CUDA."""
    if torch.compiler.is_compiling():  # part of the compiled graph: no caches, no nested compile
        if mask.q_doc is None:
            return _causal_block_mask.__wrapped__(T, S, mask.offset, str(device))
        return document_block_mask(mask, B, T, S, device)
    on_cuda = torch.device(device).type == "cuda"
    if mask.q_doc is None:
        return _causal_block_mask(T, S, mask.offset, str(device), compile=on_cuda)
    memo = mask.__dict__.setdefault("_block_masks", {})
    key = (B, T, S, str(device))
    if key not in memo:
        memo[key] = document_block_mask(mask, B, T, S, device, compile=on_cuda)
    return memo[key]


def parts_block_mask(mask, keep, B: int, T: int, S: int, device):
    """The BlockMask of ``mask`` (as ``block_mask``) and ``keep(b, h, i, j)``, a rule of one part of the keys
    (``minilm.positions.base.FlexPart``). Built per call (``keep`` reads the positions, which are data, so nothing
    is cached): in the graph when compiling, else by the compiled builder on CUDA."""
    from torch.nn.attention.flex_attention import create_block_mask

    compile = torch.device(device).type == "cuda" and not torch.compiler.is_compiling()
    build = _compiled_create_block_mask() if compile else create_block_mask
    return build(_allowed(mask, keep), B, None, T, S, device=device)


def _kernel(compiled: bool):
    """flex_attention, or in an eager model its process-wide compiled kernel. Inside a compiled model
    (train.compile) the outer compile captures flex_attention itself: calling torch.compile there would break the
    graph in every layer (dynamo traces into the compiled kernel, ignoring the cache, and Lightning replaces
    torch.compile with a wrapper dynamo cannot trace)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex if compiled and not torch.compiler.is_compiling() else flex_attention


def attend_part(q, k, v, part: FlexPart, mask, scale, compiled: bool, kernel_options=None):
    """(out (B, H, T, Dh), lse (B, H, T) fp32, natural log) of one part: FlexAttention over its keys; a row with
    no key in the part gives out 0 and lse −inf."""
    B, H, T, _ = q.shape
    bm = parts_block_mask(mask, part.keep, B, T, k.shape[2], q.device)
    return _attend_with_lse(q, k, v, part.score_mod, bm, scale, compiled, kernel_options)


def _attend_with_lse(q, k, v, score_mod, bm, scale, compiled: bool, kernel_options=None):
    """(out, lse) of FlexAttention with ``score_mod`` (None: the plain score) under BlockMask ``bm``."""
    attend = _kernel(compiled)
    kwargs = dict(score_mod=_in_score_dtype(score_mod), block_mask=bm, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                  **_options(q, kernel_options))  # fmt: skip
    try:  # torch >= 2.9 asks for the lse this way (return_lse is deprecated there)
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return attend(q, k, v, **kwargs, return_lse=True)
    out, aux = attend(q, k, v, **kwargs, return_aux=AuxRequest(lse=True))
    return out, aux.lse


def flex_attention_with_coefficient_grads(q, k, v, spec: FlexCoefficients, mask, scale, compiled=None,
                                          kernel_options=None):  # fmt: skip
    """FlexAttention with a bias whose coefficients take their gradients from one extra forward each in backward
    (``FlexCoefficients``, where the formula is), not from the kernel's atomic adds; q, k and v take theirs from the
    kernel as usual. ``compiled`` and ``kernel_options`` as ``flex_attention_with_score_mod``."""
    compiled = q.is_cuda if compiled is None else compiled
    B, H, T, _ = q.shape
    bm = block_mask(mask, B, T, k.shape[2], q.device)
    out, lse = _attend_with_lse(q, k, v, spec.score_mod, bm, scale, compiled, kernel_options)
    q0, k0, v0 = q.detach(), k.detach(), v.detach()

    def weighted(weight_mod):  # (out, lse) of the scores + log w: what backward reads for one coefficient
        return _attend_with_lse(q0, k0, v0, weight_mod, bm, scale, compiled, kernel_options)

    return _CoefficientGrads.apply(out, lse.detach(), weighted, spec.weight_mods, *spec.coefficients)


class _CoefficientGrads(torch.autograd.Function):
    """The identity on FlexAttention's output, whose backward also gives each coefficient its gradient
    −Σ_i E_i (dO_i · Ō_i − Δ_i) (``FlexCoefficients``), summed over batch and queries per head."""

    @staticmethod
    def forward(ctx, out, lse, weighted, weight_mods, *coefficients):
        ctx.weighted, ctx.weight_mods = weighted, weight_mods
        ctx.save_for_backward(out, lse)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, dout):
        out, lse = ctx.saved_tensors
        dout32 = dout.float()
        delta = (dout32 * out.float()).sum(-1)  # (B, H, T)
        grads = []
        for weight_mod in ctx.weight_mods:
            out_w, lse_w = ctx.weighted(weight_mod)
            share = torch.exp(lse_w - lse)  # E_i; 0 where no key has w > 0 (lse_w = −inf, out_w not read)
            per_row = torch.where(share > 0, share * ((dout32 * out_w.float()).sum(-1) - delta), 0.0)
            grads.append(-per_row.sum(dim=(0, 2)))
        return (dout, None, None, None, *grads)


def flex_attention_in_parts(q, k, v, parts: list, mask, scale, compiled=None, kernel_options=None):
    """Attention split over parts of the keys (``FlexPart``s, whose ``keep`` rules must partition every query's
    allowed keys), each part's FlexAttention merged exactly by its log-sum-exp: lse = log Σ_p exp(lse_p + shift_p),
    out = Σ_p exp(lse_p + shift_p − lse) · out_p, in fp32. Gradients reach each part through its output and its lse
    (FlexAttention differentiates its lse). ``compiled`` and ``kernel_options`` as
    ``flex_attention_with_score_mod``."""
    compiled = q.is_cuda if compiled is None else compiled
    outs, lses = [], []
    for part in parts:
        out, lse = attend_part(q, k, v, part, mask, scale, compiled, kernel_options)
        outs.append(out)
        lses.append(lse if part.shift is None else lse + part.shift.view(1, -1, 1).to(lse.dtype))
    lse = torch.logsumexp(torch.stack(lses), dim=0)  # (B, H, T); every query has an allowed key in some part
    merged = sum(torch.exp(part_lse - lse).unsqueeze(-1) * out.float() for part_lse, out in zip(lses, outs))
    return merged.to(q.dtype)


def _in_score_dtype(score_mod):
    """The score_mod with its result in the score's dtype (the encodings' tables are fp32; the kernel keeps the
    score's), or None."""
    if score_mod is None:
        return None

    def mod(score, b, h, i, j):
        return score_mod(score, b, h, i, j).to(score.dtype)

    return mod


# Under this many queries inductor lowers FlexAttention to its decoding kernel (flex_decoding.py), whose BLOCK_M is
# the queries of a key head padded to a power of two, and which decides from that value whether to check the rows'
# bounds: a forward block size given there would replace it after that decision (32 queries: no checks, 64 rows).
FLEX_DECODING_QUERIES = 128


def _options(q, kernel_options) -> dict:
    """``kernel_options`` as flex_attention's keyword on CUDA for ``FLEX_DECODING_QUERIES`` queries or more (the
    Triton kernel's blocks: ``SMALL_FLEX_BLOCKS``); none for fewer, or off CUDA, where no such kernel is built."""
    if not kernel_options or not q.is_cuda or q.shape[-2] < FLEX_DECODING_QUERIES:
        return {}
    return {"kernel_options": dict(kernel_options)}


def flex_attention_with_score_mod(q, k, v, score_mod, mask, scale, compiled=None, kernel_options=None):
    """q (B, H, T, Dh), k and v (B, Hkv, S, Dh) -> (B, H, T, Dh); ``score_mod`` None for the mask alone.
    ``compiled`` defaults to q.is_cuda; ``kernel_options`` (the encoding's ``flex_kernel_options()``) are passed to
    the kernel on CUDA."""
    attend = _kernel(q.is_cuda if compiled is None else compiled)
    B, H, T, _ = q.shape
    S = k.shape[2]
    # score_mod None: the mask alone (document masking of a RoPE-family encoding)
    return attend(q, k, v, score_mod=_in_score_dtype(score_mod), block_mask=block_mask(mask, B, T, S, q.device),
                  scale=scale, enable_gqa=H != k.shape[1], **_options(q, kernel_options))  # fmt: skip
