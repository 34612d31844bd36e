"""Perplexity vs context length on held-out long documents, and the per-position loss curve.

Two ways to cut a document into length-L inputs (Press et al. 2022, "Train Short, Test Long", §B discusses both):

- ``windows``  — non-overlapping windows of L tokens; every target is scored once, with 0..L-1 tokens of
  context (the average context is L/2). This is what "PPL at length L" means in most extrapolation tables, and
  it also yields the per-position loss curve: mean loss at token position t over all windows (the picture in
  ALiBi / xPos / YaRN papers: a model that extrapolates keeps the curve flat or falling past its training
  length; one that does not blows up right there).
- ``sliding``  — windows of L tokens advanced by ``stride`` S; after a document's first window only the last S
  targets are scored, so every scored token has at least L − S tokens of context (the transformers
  "perplexity of fixed-length models" recipe). Closer to how a model is used; costs L/S times more per token.
  Within the window budget, a random sample of those windows across all documents, as for ``windows``.

Documents: held-out (validation) documents of at least L + 1 tokens (L inputs and L shifted targets). When no
held-out document is that long, the packed held-out stream (documents back to back, EOS between them) is used
and the result says so (``source: packed``) — at such lengths the number measures cross-document context only.
For a run trained with ``data.document_mask`` (and ``data.restart_positions``) the packed windows are scored as its
packed training rows were (minilm.data.sampler): each token attends within its own document only, and positions
restart at each document start; the result says so (``document_mask`` / ``restart_positions``). A model that never
attended across documents would otherwise be scored on what it never saw.

Everything here takes plain token arrays and any module whose ``forward(idx) -> logits (B, T, V)``, so the
tests can feed a stub model and hand-made documents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from minilm.errors import MinilmError

MODES = ("windows", "sliding")
CURVE_POINTS = 128  # per-position curves longer than this are averaged into this many equal-width buckets


@dataclass
class PplResult:
    length: int
    mode: str  # windows | sliding
    loss: float  # mean cross-entropy in nats per scored token
    ppl: float  # exp(loss)
    tokens: int  # targets scored
    windows: int  # inputs of `length` tokens run
    source: str  # documents | packed
    stride: Optional[int] = None  # sliding mode only
    document_mask: bool = False  # packed windows scored within documents (doc_ids), as trained
    restart_positions: bool = False  # ... and with positions restarting at each document start
    per_position: Optional[np.ndarray] = field(default=None, repr=False)  # (L,) mean loss at position t (windows)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("length", "mode", "loss", "ppl", "tokens", "windows", "source")}
        if self.stride is not None:
            out["stride"] = self.stride
        if self.document_mask:  # (only then: the results of runs trained without it are as they were)
            out["document_mask"] = True
            out["restart_positions"] = self.restart_positions
        return out


# ---------------------------------------------------------------------------------------------------- documents


def eval_documents(store, length: int) -> tuple[List[np.ndarray], str]:
    """Held-out documents with at least ``length + 1`` tokens, or the packed stream when there are none.
    ``store`` is a ``minilm.data.TokenStore`` (``tokens``, ``doc_offsets``, ``doc_lengths``)."""
    long = np.flatnonzero(np.asarray(store.doc_lengths) >= length + 1)
    if len(long):
        offsets, lengths = store.doc_offsets, store.doc_lengths
        docs = [store.tokens[int(offsets[i]) : int(offsets[i] + lengths[i])] for i in long]
        return docs, "documents"
    if store.tokens.shape[0] < length + 1:
        raise MinilmError(
            f"the held-out split has {store.tokens.shape[0]} tokens, fewer than one window of {length + 1}; "
            "evaluate shorter lengths or hold out more data (data.val_fraction)"
        )
    return [store.tokens], "packed"


def packed_doc_ids(store) -> np.ndarray:
    """(N,) the document index of every token of the packed stream ``store.tokens`` (each document's trailing EOS
    is its own, as in the training sampler)."""
    lengths = np.asarray(store.doc_lengths, dtype=np.int64)
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def window_pieces(doc_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(doc_ids, positions), each (N, L+1), of windows whose tokens have the document indices ``doc_index``
    (N, L+1), by the training sampler's rule for a packed row (minilm.data.sampler.document_pieces): the documents of
    a window numbered 0, 1, 2, ... from its first token, positions restarting at 0 at each document start and at the
    window start."""
    from minilm.data.sampler import document_pieces

    new = np.zeros(doc_index.shape, dtype=bool)
    new[:, 1:] = doc_index[:, 1:] != doc_index[:, :-1]  # (N, L+1) a document starts here
    pieces = [document_pieces(row) for row in new]  # each window numbered as the sampler numbers a row (N >= 1)
    return np.stack([seg for seg, _ in pieces]), np.stack([pos for _, pos in pieces])


def window_starts(docs: Sequence[np.ndarray], length: int, stride: int) -> List[tuple[int, int]]:
    """(doc, start) of every full window of ``length + 1`` tokens advanced by ``stride``, doc by doc."""
    out = []
    for d, doc in enumerate(docs):
        out.extend((d, s) for s in range(0, len(doc) - length, stride))
    return out


def _stack(docs: Sequence[np.ndarray], starts: Sequence[tuple[int, int]], length: int) -> np.ndarray:
    return np.stack([np.asarray(docs[d][s : s + length + 1], dtype=np.int64) for d, s in starts])  # (N, L+1)


# ------------------------------------------------------------------------------------------------------ scoring


def autocast(device: torch.device):
    """bf16 autocast on CUDA (as training runs there); plain fp32 on CPU."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def token_losses(model: torch.nn.Module, tokens: Tensor, doc_ids: Optional[Tensor] = None,
                 positions: Optional[Tensor] = None) -> Tensor:
    """tokens (B, T+1) -> next-token cross-entropy (B, T) in fp32 nats; ``doc_ids`` / ``positions`` (B, T): the
    model's (GPT.forward's), given only when not None."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    extra = {k: v for k, v in (("doc_ids", doc_ids), ("positions", positions)) if v is not None}
    with autocast(x.device):
        logits = model(x, **extra)  # (B, T, V)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
    return loss.view_as(y)


def model_device(model: torch.nn.Module) -> torch.device:
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


@torch.inference_mode()
def score_windows(model, windows: np.ndarray, batch_size: int, doc_index: Optional[np.ndarray] = None,
                  restart_positions: bool = False) -> np.ndarray:
    """Loss (N, L) of every window (N, L+1), run ``batch_size`` windows at a time. ``doc_index`` (N, L+1): each
    token's document, to attend within documents (and, with ``restart_positions``, to restart positions) as the
    training sampler's packed rows did (``window_pieces``)."""
    device = model_device(model)
    out = []
    for i in range(0, len(windows), batch_size):
        chunk = torch.from_numpy(windows[i : i + batch_size]).to(device)
        doc_ids = positions = None
        if doc_index is not None:
            seg, pos = window_pieces(doc_index[i : i + batch_size])
            doc_ids = torch.from_numpy(seg[:, :-1]).to(device)  # (B, L): the inputs' own, as the sampler's
            positions = torch.from_numpy(pos[:, :-1]).to(device) if restart_positions else None
        out.append(token_losses(model, chunk, doc_ids, positions).cpu().numpy())
    return np.concatenate(out, axis=0)


def bucket_curve(curve: np.ndarray, points: int = CURVE_POINTS) -> tuple[List[float], List[float]]:
    """(positions, values): the curve itself when short, else means over ``points`` equal-width buckets (the
    position reported is each bucket's centre)."""
    n = len(curve)
    if n <= points:
        return [float(i) for i in range(n)], [float(v) for v in curve]
    edges = np.linspace(0, n, points + 1).round().astype(int)
    pos = [float((a + b - 1) / 2) for a, b in zip(edges[:-1], edges[1:])]
    val = [float(curve[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])]
    return pos, val


def perplexity(
    model: torch.nn.Module,
    docs: Sequence[np.ndarray],
    length: int,
    *,
    mode: str = "windows",
    n_windows: int = 16,
    batch_size: int = 4,
    stride: Optional[int] = None,
    seed: int | Sequence[int] = 0,
    source: str = "documents",
    doc_index: Optional[Sequence[np.ndarray]] = None,
    restart_positions: bool = False,
) -> PplResult:
    """Perplexity of ``model`` at context ``length`` over ``docs`` (token arrays), from at most ``n_windows``
    inputs of ``length`` tokens. ``windows``: a seeded random choice among all non-overlapping windows.
    ``sliding``: a seeded random choice among all windows ``stride`` apart (default L/2) in every document; each
    scores the targets no earlier window of its document would (a document's first window: all of them), so a
    choice of all the windows is the recipe — but for each document's last < stride targets, which its shorter last
    step scores and no window here does — and every scored target has at least L − stride of context.
    ``doc_index``: for each of ``docs``, its tokens' document indices (``packed_doc_ids`` of the packed stream): the
    windows are then scored within documents, as a run trained with ``data.document_mask`` was, with positions
    restarting at each document start when ``restart_positions`` (``data.restart_positions``)."""
    if mode not in MODES:
        raise MinilmError(f"eval.ppl_modes: unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    rng = np.random.default_rng(seed)
    flags = {"document_mask": doc_index is not None, "restart_positions": doc_index is not None and restart_positions}

    def masking(chosen):  # score_windows' doc_index and restart_positions for the windows chosen
        return (None, False) if doc_index is None else (_stack(doc_index, chosen, length), restart_positions)

    if mode == "windows":
        starts = window_starts(docs, length, length)
        if not starts:
            raise MinilmError(f"no document holds a window of {length + 1} tokens")
        chosen = [starts[i] for i in _pick(rng, len(starts), n_windows)]
        windows = _stack(docs, chosen, length)
        losses = score_windows(model, windows, batch_size, *masking(chosen))  # (N, L)
        loss = float(losses.mean())
        return PplResult(length, mode, loss, _exp(loss), int(losses.size), len(windows), source,
                         per_position=losses.mean(axis=0), **flags)  # fmt: skip
    stride = stride or max(1, length // 2)
    if not 0 < stride <= length:
        raise MinilmError(f"eval.stride: must be in [1, length={length}], got {stride}")
    # a seeded random choice among every document's sliding windows, as the windows mode draws its own: whole
    # documents taken in turn until the windows ran out read one to four of them at 2048 tokens, and the number
    # swung with which (configs/rope_yarn_tiny.yaml's run, 16 windows, six seeds: sd 10.6 about a mean of 56.0;
    # drawn so, sd 5.8 about 58.4; 60.9 over every window)
    every = window_starts(docs, length, stride)
    if not every:
        raise MinilmError(f"no document holds a window of {length + 1} tokens")
    starts = [every[i] for i in _pick(rng, len(every), n_windows)]
    windows = _stack(docs, starts, length)
    losses = score_windows(model, windows, batch_size, *masking(starts))  # (N, L)
    # a document's first window scores every target; later ones only the S targets no earlier window scored
    first = np.array([s == 0 for _, s in starts])
    scored = np.concatenate([losses[i] if first[i] else losses[i, length - stride :] for i in range(len(starts))])
    loss = float(scored.mean())
    return PplResult(length, mode, loss, _exp(loss), int(scored.size), len(windows), source, stride=stride, **flags)


def _pick(rng: np.random.Generator, count: int, n: int) -> np.ndarray:
    """The indices, in order, of ``n`` (at most ``count``) of ``count`` windows drawn at random: the first ``n`` of one
    seeded permutation, so more windows (eval.batches, batch_tokens) measure the fewer ones and more. (Until
    2026-11-24 ``rng.choice(count, n, replace=False)``, whose draws of 4 and of 8 had no window in common, so a
    longer evaluation measured other text, not more of it.)"""
    return np.sort(rng.permutation(count)[:n])


def _exp(loss: float) -> float:
    """exp(loss), inf when it overflows a float (a mean loss above ~709 nats: finite but huge logits of a diverged
    model), not an OverflowError; the suite reports such a length as not measured."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
