"""A GPT decoder in plain torch, read top to bottom.

Architecture choices:
- token embedding -> (absolute position hook) -> n pre-norm blocks -> final RMSNorm -> LM head;
- RMSNorm (Zhang & Sennrich 2019) before attention and MLP, residual connections around both; ``nn.RMSNorm``
  with a hand-written backward on CPU in eager mode (norm.py);
- MLP: SwiGLU (Shazeer 2020; LLaMA) with hidden size 8/3·d rounded to 64, or GELU with 4·d;
- attention: optional grouped-query attention (n_kv_heads < n_heads, Ainslie et al. 2023), no biases;
  positions through the hooks of minilm.positions (attention.py);
- optional tied input/output embeddings (Press & Wolf 2017);
- optional chunked LM head + cross-entropy (``model.loss_chunk_size``, loss.py) and activation checkpointing of
  each block (``model.activation_checkpointing``): memory savers with the same loss and gradients;
- dropout (``model.dropout``, 0 by default) on the embeddings and on each residual branch's output; none on the
  attention probabilities (FlexAttention has none, and every attention kernel computes the same thing);
- init: N(0, init_std) for every matrix, output projections of each residual branch scaled by 1/sqrt(2·n_layers)
  (GPT-2), so the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from minilm.config import ffn_dim, head_dim
from minilm.errors import MinilmError
from minilm.model.attention import Attention, AttentionMask
from minilm.model.loss import chunked_cross_entropy
from minilm.model.norm import RMSNorm
from minilm.positions import PositionDims, build_position


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, kind: str):
        super().__init__()
        self.kind = kind
        self.w_in = nn.Linear(d_model, 2 * d_ff if kind == "swiglu" else d_ff, bias=False)
        self.w_out = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.w_in(x)  # (B, T, 2·F) for SwiGLU, (B, T, F) for GELU
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.w_out(h)  # (B, T, D)


def position_dims(cfg, layer: int) -> PositionDims:
    """What the position hook of block ``layer`` (-1: the embedding side) is told about the model ``cfg``."""
    kv = cfg.n_kv_heads or cfg.n_heads
    return PositionDims(cfg.d_model, cfg.n_heads, kv, head_dim(cfg), cfg.n_layers, layer, init_std=cfg.init_std)


def _check_per_token(name: str, t: Tensor, B: int, T: int) -> None:
    """A tensor of one value per input token, (1, T) or (B, T) for input ids of shape (B, T)."""
    if t.dim() != 2 or t.shape[1] != T or t.shape[0] not in (1, B):
        raise MinilmError(f"{name}: must have shape (1, T) or (B, T) for input ids of shape (B, T) = ({B}, {T}), got "
                          f"{tuple(t.shape)}")


def _as_ids(name: str, t: Tensor) -> Tensor:
    """Token ids (``idx``) or targets of any integer dtype as int64, what the embedding and the loss index with: int32
    targets (a memmap's dtype) trained under model.loss_chunk_size and were torch's "expected target dtype to be Long"
    without it, and int16 or uint8 ids were torch's error from the embedding."""
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise MinilmError(f"{name}: must be integers (token ids), got {t.dtype} values")
    return t.long()


def position_hooks(cfg) -> list:
    """The position hook objects a GPT of ``cfg`` holds (the embedding side's, then one per block), built alone,
    without the model's weights: a run checks its phases' lengths against their limits with them before it prepares
    any data (minilm.training.run_checks)."""
    hooks = [build_position(cfg.position, position_dims(cfg, -1), "embedding")]
    return hooks + [build_position(cfg.position, position_dims(cfg, i), "attention") for i in range(cfg.n_layers)]


class Block(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        kv = cfg.n_kv_heads or cfg.n_heads
        self.norm1 = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg.d_model, cfg.n_heads, kv, cfg.position, position_dims(cfg, layer), cfg.sdpa_kernel)
        self.norm2 = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.d_model, ffn_dim(cfg), cfg.mlp)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, positions: Tensor, mask: AttentionMask, cache=None) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), positions, mask, cache))  # (B, T, D)
        return x + self.drop(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    def __init__(self, cfg, vocab_size: int):
        """``cfg`` is the ``model`` section of the config (minilm.config.ModelConfig)."""
        super().__init__()
        self.cfg, self.vocab_size = cfg, vocab_size
        # plain Python copies of the switches read in forward: torch.compile cannot trace DictConfig attribute
        # access (a graph break per read), and these are fixed for the model's life
        self.loss_chunk_size: Optional[int] = cfg.loss_chunk_size
        self.activation_checkpointing = bool(cfg.activation_checkpointing)
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos_emb = build_position(cfg.position, position_dims(cfg, -1), "embedding")
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                scale = 1 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w_out.weight")) else 1
                nn.init.normal_(p, mean=0.0, std=std * scale)
        for m in self.modules():
            if hasattr(m, "reset_position_parameters"):
                m.reset_position_parameters()  # encodings with their own init (tables, small networks)

    def hidden(
        self,
        idx: Tensor,
        positions: Optional[Tensor] = None,
        doc_ids: Optional[Tensor] = None,
        cache=None,
    ) -> Tensor:
        """Final normed hidden states (B, T, D). ``positions`` (B or 1, T) default to offset..offset+T-1;
        ``doc_ids`` (B, T) restrict attention to within documents."""
        idx = _as_ids("idx", idx)
        B, T = idx.shape
        offset = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(offset, offset + T, device=idx.device).unsqueeze(0)  # (1, T)
        else:  # (B, 1) positions put every token at one position, doc_ids in one document, without a word
            _check_per_token("positions", positions, B, T)
            if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
                # (RoPE and ALiBi took 2.5 as a position between two, a learned table failed with an IndexError)
                raise MinilmError(f"positions: must be integers (token indices), got {positions.dtype} values")
            # int64, as the encodings compute with them: in uint8 a distance i − j wrapped around (xPos scored keys
            # 255 apart), a learned table took uint8 positions for a boolean mask, and int16 is no index for gather
            positions = positions.long()
        if doc_ids is not None:
            _check_per_token("doc_ids", doc_ids, B, T)
        k_doc = doc_ids if cache is None or doc_ids is None else cache.update_docs(doc_ids)
        mask = AttentionMask(offset=offset, q_doc=doc_ids, k_doc=k_doc)
        x = self.tok_emb(idx)  # (B, T, D)
        x = self.drop(self.pos_emb.embed(x, positions, doc_ids))
        checkpointed = self.activation_checkpointing and self.training and cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if checkpointed:  # keep only each block's input; recompute its insides in backward (same RNG state)
                x = checkpoint(block, x, positions, mask, None, use_reentrant=False)
            else:
                x = block(x, positions, mask, cache.layer(i) if cache is not None else None)
        if cache is not None:
            cache.advance(T)
        return self.norm(x)

    def forward(self, idx: Tensor, positions=None, doc_ids=None, cache=None) -> Tensor:
        """Logits (B, T, V)."""
        return self.lm_head(self.hidden(idx, positions, doc_ids, cache))

    def loss(self, idx: Tensor, targets: Tensor, positions=None, doc_ids=None, reduction: str = "mean") -> Tensor:
        """Cross-entropy of next-token prediction; targets == -100 are ignored. With ``model.loss_chunk_size`` the
        LM head and the loss run chunk by chunk (minilm/model/loss.py), never holding the whole (B, T, V) logits.
        ``idx`` and ``targets`` may be of any integer dtype."""
        targets = _as_ids("targets", targets)
        if self.loss_chunk_size:
            h = self.hidden(idx, positions, doc_ids)  # (B, T, D)
            return chunked_cross_entropy(h, self.lm_head.weight, targets, self.loss_chunk_size, reduction)
        logits = self(idx, positions, doc_ids).float()
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction=reduction)
        return loss if reduction != "none" else loss.view_as(targets)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
        return n

    def position_modules(self):
        """Every attention-side position hook object, one per layer (phase changes reconfigure these)."""
        return [b.attn.pos for b in self.blocks]
