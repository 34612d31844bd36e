"""A key/value cache for incremental decoding, in the shape ``GPT.hidden`` and ``Attention.forward`` call it.

Per layer it holds the keys and values of every token seen so far and their positions; per model it holds the
document ids (when the caller passes any) and ``length``, the number of tokens cached. One forward call of T
tokens appends T entries to every layer, then ``advance(T)``.

Conventions chosen here:

- Keys are cached BEFORE rotation (the attention block calls ``update`` before ``pos.rotate``): each step
  rotates every cached key again at the current length, so RoPE scalings that read the current length (dynamic
  NTK, dynamic YaRN, longrope) and the training-free methods that remap positions see exactly the keys a
  cache-free forward would. Rotating again costs O(S·Dh) per layer and step, small next to the O(S·Dh) attention
  it feeds. (Only the hidden states of earlier layers stay as they were computed — for length-dependent scalings
  beyond the original length, a cache-free forward recomputes them at the longer length: the same difference
  transformers' dynamic RoPE has; docs/export.md says so.)
- Storage grows by doubling (amortized O(1) appends, views returned); ``max_length`` allocates it once.
- Positions are stored as (1, S) when every call passes (1, T) positions (the default), else (B, S).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from minilm.errors import MinilmError


def _grow(buf: Optional[Tensor], used: int, new: Tensor, dim: int, capacity: Optional[int]) -> Tensor:
    """Write ``new`` after ``used`` entries of ``buf`` along ``dim``, reallocating (doubling) when full."""
    need = used + new.shape[dim]
    if buf is None or need > buf.shape[dim]:
        old_size = buf.shape[dim] if buf is not None else 0
        size = capacity if capacity is not None and capacity >= need else max(need, 2 * old_size, 16)
        shape = list(new.shape)
        shape[dim] = size
        grown = new.new_empty(shape)
        if buf is not None and used:
            grown.narrow(dim, 0, used).copy_(buf.narrow(dim, 0, used))
        buf = grown
    buf.narrow(dim, used, new.shape[dim]).copy_(new)
    return buf


class LayerCache:
    """One attention layer's keys (B, Hkv, S, Dh), values (B, Hkv, S, Dh) and key positions (1 or B, S)."""

    def __init__(self, capacity: Optional[int] = None):
        self.capacity = capacity
        self.size = 0
        self._k: Optional[Tensor] = None
        self._v: Optional[Tensor] = None
        self._pos: Optional[Tensor] = None

    def update(self, k: Tensor, v: Tensor, q_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Append this call's (unrotated) keys and values at positions ``q_pos`` (1 or B, T); return every cached
        key, value and key position (the new ones included)."""
        T = k.shape[2]
        if q_pos.shape[-1] != T:
            raise MinilmError(f"KV cache: {T} new keys but {q_pos.shape[-1]} positions")
        if self._pos is not None and q_pos.shape[0] != self._pos.shape[0]:  # (1, ·) and (B, ·) mixed: keep (B, ·)
            B = max(q_pos.shape[0], self._pos.shape[0])
            self._pos = self._pos[:, : self.size].expand(B, -1).contiguous()
            q_pos = q_pos.expand(B, -1)
        self._k = _grow(self._k, self.size, k, 2, self.capacity)
        self._v = _grow(self._v, self.size, v, 2, self.capacity)
        self._pos = _grow(self._pos, self.size, q_pos.to(torch.long), 1, self.capacity)
        self.size += T
        S = self.size
        return self._k[:, :, :S], self._v[:, :, :S], self._pos[:, :S]

    @property
    def keys(self) -> Optional[Tensor]:
        return None if self._k is None else self._k[:, :, : self.size]

    @property
    def values(self) -> Optional[Tensor]:
        return None if self._v is None else self._v[:, :, : self.size]

    @property
    def positions(self) -> Optional[Tensor]:
        return None if self._pos is None else self._pos[:, : self.size]


class KVCache:
    """The cache of a whole ``GPT``: ``GPT.forward(idx, cache=cache)`` reads ``length``, calls ``layer(i)`` for
    every block, ``update_docs`` when document ids are given, and ``advance(T)`` at the end."""

    def __init__(self, n_layers: int, max_length: Optional[int] = None):
        """``max_length``: allocate room for this many tokens at once (a hint; the cache still grows past it)."""
        self.n_layers = n_layers
        self.max_length = max_length
        self.length = 0  # tokens cached (every layer holds this many after a complete forward)
        self.layers = [LayerCache(max_length) for _ in range(n_layers)]
        self._docs: Optional[Tensor] = None

    @classmethod
    def for_model(cls, model, max_length: Optional[int] = None) -> "KVCache":
        return cls(len(model.blocks), max_length)

    def layer(self, i: int) -> LayerCache:
        if self._docs is not None and self._docs.shape[1] == self.length:
            # a call with doc_ids extends them (update_docs) before any layer is reached, so this call gave none:
            # its queries attended across the documents of the cached keys, and the next call with doc_ids failed
            # on mismatched shapes. Said here, before the first layer stores anything, so the cache stays usable
            raise MinilmError(
                f"KV cache: doc_ids were given for the {self.length} tokens already cached but not for these; give "
                "doc_ids on every call with this cache, or on none"
            )
        layer = self.layers[i]
        if layer.size != self.length:
            raise MinilmError(
                f"KV cache: layer {i} holds {layer.size} tokens but the cache is at {self.length}; a forward call "
                "was interrupted — start a new cache"
            )
        return layer

    def update_docs(self, doc_ids: Tensor) -> Tensor:
        """Append document ids (B, T) of this call's tokens; returns those of every cached key (B, S)."""
        if self.length and self._docs is None:
            raise MinilmError("KV cache: doc_ids given now but not for the tokens already cached")
        self._docs = doc_ids if self._docs is None else torch.cat([self._docs, doc_ids], dim=1)
        return self._docs

    def advance(self, T: int) -> None:
        self.length += T

    def __repr__(self) -> str:
        return f"KVCache(n_layers={self.n_layers}, length={self.length})"
