"""Model properties: causality, GQA, overfitting one batch, SDPA == reference attention."""

import pytest
import torch

from minilm.config import load_config
from minilm.model import GPT
from minilm.model.attention import AttentionMask, reference_attention, sdpa_attention
from minilm.positions import PositionDims, build_position

V = 97


def tiny(*overrides):
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4", *overrides])
    torch.manual_seed(0)
    return GPT(cfg.model, V).eval()


@pytest.mark.parametrize("extra", [[], ["model.n_kv_heads=2"], ["model.mlp=gelu", "model.tie_embeddings=false"]])
def test_causal(extra):
    model = tiny(*extra)
    x = torch.randint(0, V, (2, 24))
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % V
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_document_mask_blocks_other_documents():
    model = tiny()
    x = torch.randint(0, V, (1, 16))
    docs = torch.tensor([[0] * 8 + [1] * 8])
    y = x.clone()
    y[:, :8] = (y[:, :8] + 3) % V  # change only the first document
    with torch.no_grad():
        a = model(x, positions=torch.arange(16).remainder(8)[None], doc_ids=docs)
        b = model(y, positions=torch.arange(16).remainder(8)[None], doc_ids=docs)
        c = model(x[:, 8:])  # the second document alone, positions restarting at 0
    assert torch.allclose(a[:, 8:], b[:, 8:], atol=1e-5)
    assert torch.allclose(a[:, 8:], c, atol=1e-5)


def test_overfits_one_batch():
    model = tiny().train()
    x = torch.randint(0, V, (4, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = model.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_sdpa_equals_reference(kv):
    dims = PositionDims(32, 4, kv, 8, 1)
    pos = build_position({"name": "rope"}, dims, "attention")
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, kv, 12, 8), torch.randn(2, kv, 12, 8)
    p = torch.arange(12)[None].expand(2, -1)
    for mask in [AttentionMask(), AttentionMask(q_doc=torch.tensor([[0] * 5 + [1] * 7] * 2),
                                                k_doc=torch.tensor([[0] * 5 + [1] * 7] * 2))]:
        ref = reference_attention(q, k, v, pos, p, p, mask)
        fast = sdpa_attention(q, k, v, pos, mask)
        assert torch.allclose(ref, fast, atol=1e-5)


def test_init_scales_residual_outputs_by_depth():
    """GPT-2's init: every matrix N(0, init_std), the output projection of each residual branch (attention wo, MLP
    w_out) init_std / sqrt(2·n_layers), so the residual stream's variance does not grow with depth."""
    cfg = load_config(overrides=["model.n_layers=8", "model.d_model=64", "model.n_heads=4", "model.init_std=0.02"])
    torch.manual_seed(0)
    model = GPT(cfg.model, V)
    for name, p in model.named_parameters():
        if p.dim() < 2 or "pos" in name:
            continue
        want = 0.02 / 4 if name.endswith(("wo.weight", "w_out.weight")) else 0.02  # sqrt(2·8) = 4
        assert abs(p.std().item() / want - 1) < 0.1, name


def test_dropout_acts_on_embeddings_and_each_residual_branch():
    """model.dropout drops the embeddings and each residual branch's output (attention, MLP), not the residual
    stream itself; in eval mode it does nothing."""
    cfg = load_config(overrides=["model.n_layers=3", "model.d_model=32", "model.n_heads=4", "model.dropout=0.5"])
    model = GPT(cfg.model, V).train()
    dropped, branches = [], []
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.register_forward_hook(lambda mod, inp, out: dropped.append((inp[0], out)))
    for block in model.blocks:
        for branch in (block.attn, block.mlp):
            branch.register_forward_hook(lambda mod, inp, out: branches.append(out))
    model(torch.randint(0, V, (2, 8)))
    assert len(dropped) == 1 + 2 * 3  # the embeddings, then attention and MLP of each block
    assert all(torch.equal(i, b) for (i, _), b in zip(dropped[1:], branches))  # the branch output is what drops
    assert not any(torch.equal(i, o) for i, o in dropped)
    dropped.clear()
    model.eval()(torch.randint(0, V, (2, 8)))
    assert len(dropped) == 7 and all(torch.equal(i, o) for i, o in dropped)


@pytest.mark.parametrize("shape", [(2, 1), (12,), (1, 3), (3, 12)])
def test_positions_of_another_shape_than_the_input_are_refused(shape):
    """positions are (1, T) or (B, T): a (B, 1) tensor broadcast every token to one position and ran without a word
    (RoPE, ALiBi, T5, learned alike); the others were torch's shape errors from inside an encoding."""
    from minilm.errors import MinilmError

    x = torch.randint(0, 50, (2, 12))
    for name in ("rope", "alibi", "none"):
        model = tiny(f"model.position.name={name}").eval()
        with pytest.raises(MinilmError, match=r"^positions: must have shape \(1, T\) or \(B, T\) for input ids of "
                                              rf"shape \(B, T\) = \(2, 12\), got \({', '.join(map(str, shape))},?\)"):
            model(x, positions=torch.zeros(shape, dtype=torch.long))
        for good in (torch.arange(12).unsqueeze(0), torch.arange(12).repeat(2, 1)):
            assert model(x, positions=good).shape == (2, 12, model.vocab_size)


def test_positions_that_are_not_integers_are_refused():
    """Masking is by index and the encodings read integer positions: RoPE and ALiBi took 2.5 as a position between
    two without a word, and a learned table failed with torch's IndexError."""
    from minilm.errors import MinilmError

    x = torch.randint(0, 50, (2, 12))
    for name in ("rope", "learned"):
        model = tiny(f"model.position.name={name}").eval()
        for dtype in (torch.float32, torch.bool):
            with pytest.raises(MinilmError, match=rf"^positions: must be integers \(token indices\), got {dtype}"):
                model(x, positions=torch.arange(12).unsqueeze(0).to(dtype))
        assert model(x, positions=torch.arange(12, dtype=torch.int32).unsqueeze(0)).shape == (2, 12, model.vocab_size)


@pytest.mark.parametrize("shape", [(2, 1), (12,), (1, 3)])
def test_document_ids_of_another_shape_than_the_input_are_refused(shape):
    """doc_ids are (1, T) or (B, T): a (B, 1) tensor put every token of a row in one document, so the document mask
    masked nothing, without a word."""
    from minilm.errors import MinilmError

    x = torch.randint(0, 50, (2, 12))
    model = tiny()
    with pytest.raises(MinilmError, match=r"^doc_ids: must have shape \(1, T\) or \(B, T\) for input ids of shape "
                                          rf"\(B, T\) = \(2, 12\), got \({', '.join(map(str, shape))},?\)"):
        model(x, doc_ids=torch.zeros(shape, dtype=torch.long))
    docs = torch.zeros(2, 12, dtype=torch.long)
    docs[:, 6:] = 1
    assert not torch.allclose(model(x, doc_ids=docs), model(x))  # (B, T): masked per document, as before



def test_positions_of_any_integer_dtype_are_the_same_positions():
    """Integer positions of a small dtype mean what they say: in uint8 xPos's distances i − j wrapped around (wrong
    logits without a word), a learned table read uint8 positions as a boolean mask (an IndexError), and the relative
    encodings' gather refused int16 (a RuntimeError from torch)."""
    x = torch.randint(0, 50, (2, 12))
    for name in ("learned", "xpos", "shaw"):
        model = tiny(f"model.position.name={name}")
        with torch.no_grad():
            want = model(x, positions=torch.arange(12).unsqueeze(0))
            for dtype in (torch.int16, torch.uint8):
                torch.testing.assert_close(model(x, positions=torch.arange(12, dtype=dtype).unsqueeze(0)), want)
