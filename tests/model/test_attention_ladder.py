"""The attention block's kernel ladder at its documented boundaries (minilm/model/attention.py): on CUDA a bias
score term goes through FlexAttention from FLEX_MIN_QUERIES (16) queries on, through SDPA with the bias below that (a
decoding step); and an encoding whose score reads q or k receives per-row positions (B, T), as minilm/positions/base.py
promises, where one that reads positions only receives them as given."""

import pytest
import torch

import minilm.model.attention as attention
import minilm.model.flex as flex
from minilm.config import load_config
from minilm.model import GPT
from minilm.model.attention import AttentionMask

V = 61


def tiny_model(name):
    """2 layers, d_model 32, 4 query heads sharing 2 key heads (head_dim 8)."""
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2",
                                 f"model.position.name={name}"])  # fmt: skip
    torch.manual_seed(0)
    return GPT(cfg.model, V).eval()


def _routes(monkeypatch):
    """Route every bias encoding as on CUDA ("flex"), and record which kernel each call takes without running the
    eager FlexAttention (seconds per call on CPU): both recorders compute the SDPA-with-bias result."""
    real_kernel, real_bias, taken = attention.Attention.kernel, attention.sdpa_bias_attention, []
    monkeypatch.setattr(attention.Attention, "kernel",
                        lambda self, device, documents=False:
                        "flex" if real_kernel(self, device) == "sdpa_bias" else "?")  # fmt: skip

    def fake_flex(q, k, v, score_mod, mask, scale, compiled=None):
        taken.append("flex")
        return torch.zeros_like(q)

    monkeypatch.setattr(flex, "flex_attention_with_score_mod", fake_flex)
    monkeypatch.setattr(attention, "sdpa_bias_attention",
                        lambda *a, **kw: taken.append("sdpa_bias") or real_bias(*a, **kw))  # fmt: skip
    return taken


# docs/performance.md states the boundary: FlexAttention for 16 queries or more
@pytest.mark.parametrize("T, kernel", [(1, "sdpa_bias"), (15, "sdpa_bias"), (16, "flex"), (40, "flex")])
def test_flex_takes_calls_of_flex_min_queries_and_more(T, kernel, monkeypatch):
    taken = _routes(monkeypatch)
    attn = tiny_model("alibi").blocks[0].attn
    H, Hkv, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    S = T + 3  # three cached keys before the queries
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, H, T, Dh, generator=g), *torch.randn(2, 1, Hkv, S, Dh, generator=g)
    with torch.no_grad():
        attn.attend(q, k, v, torch.arange(3, S).unsqueeze(0), torch.arange(S).unsqueeze(0), AttentionMask(offset=3))
    assert taken == [kernel]


@pytest.mark.parametrize("name, per_row", [("deberta", True), ("transformer_xl", True), ("alibi", False)])
def test_score_reads_per_row_positions_unless_it_reads_positions_only(name, per_row, monkeypatch):
    """A batch of 3 sharing its positions ((1, T), the default): a q/k-reading score gets them expanded to the 3
    rows, a position-only one (``score_reads_qk = False``) the one shared row."""
    model = tiny_model(name)
    pos = model.blocks[0].attn.pos
    seen, real_score = [], type(pos).score
    monkeypatch.setattr(pos, "score", lambda *a: seen.append((a[2].shape[0], a[3].shape[0])) or real_score(pos, *a))
    with torch.no_grad():
        model(torch.randint(0, V, (3, 10)))
    assert seen and set(seen) == {(3, 3) if per_row else (1, 1)}
