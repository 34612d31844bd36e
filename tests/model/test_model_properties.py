"""GPT properties the other model tests leave open: the parameter counts the training log prints, the shape of the
per-token loss, the MLP forms."""

import pytest
import torch
import torch.nn.functional as F

from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.model import GPT

V = 97


@pytest.mark.parametrize("tied", [True, False])
def test_num_params_counts_each_tensor_once_and_leaves_out_the_token_embedding(tied):
    """``num_params()`` (the "M non-embedding parameters" of the training log) is every parameter but the (V, D)
    token embedding; ``num_params(False)`` all of them, a tied LM head counted once."""
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4",
                                 f"model.tie_embeddings={str(tied).lower()}"])  # fmt: skip
    model = GPT(cfg.model, V)
    unique = {id(p): p.numel() for m in model.modules() for p in m.parameters(recurse=False)}
    assert model.num_params(non_embedding=False) == sum(unique.values())
    assert model.num_params() == sum(unique.values()) - V * 32
    assert model.num_params(False) - model.num_params() == model.tok_emb.weight.numel() == V * 32
    # untied, the LM head is a parameter of its own, and counts among the non-embedding ones
    assert (model.lm_head.weight is model.tok_emb.weight) == tied


@pytest.mark.parametrize("chunk", [None, 5])
def test_per_token_loss_is_shaped_like_the_targets(chunk):
    """``GPT.loss(..., reduction="none")`` gives one loss per target, (B, T) like ``targets``, with or without the
    chunked LM head (whose docstring promises that shape): the two paths are interchangeable; an ignored target's
    loss is 0."""
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=4",
                                 f"model.loss_chunk_size={chunk or 'null'}"])  # fmt: skip
    torch.manual_seed(0)
    model = GPT(cfg.model, V).eval()
    x = torch.randint(0, V, (3, 9))
    y = torch.randint(0, V, (3, 9))
    y[1, 4] = -100
    with torch.no_grad():
        per_token = model.loss(x, y, reduction="none")
        mean = model.loss(x, y)
    assert per_token.shape == (3, 9) and per_token[1, 4] == 0 and (per_token[y != -100] > 0).all()
    torch.testing.assert_close(per_token.sum() / (y != -100).sum(), mean)


@pytest.mark.parametrize("kind", ["swiglu", "gelu"])
def test_mlp_is_the_documented_gated_or_plain_form(kind):
    """transformer.py's MLP: SwiGLU w_out(silu(gate) · up) with [gate | up] = w_in(x) (hidden 8/3·d rounded to 64),
    or GELU w_out(gelu(w_in(x))) with hidden 4·d."""
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=4", f"model.mlp={kind}"])
    torch.manual_seed(0)
    mlp = GPT(cfg.model, V).blocks[0].mlp
    x = torch.randn(2, 5, 32)
    h = x @ mlp.w_in.weight.T
    if kind == "swiglu":
        assert mlp.w_out.weight.shape == (32, 128)  # 8/3 · 32 = 85.3, rounded up to 64s
        gate, up = h.chunk(2, dim=-1)
        want = (F.silu(gate) * up) @ mlp.w_out.weight.T
    else:
        assert mlp.w_out.weight.shape == (32, 4 * 32)
        want = F.gelu(h) @ mlp.w_out.weight.T
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), want)


def tiny(name, *overrides):
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4",
                                 f"model.position.name={name}", *overrides])  # fmt: skip
    torch.manual_seed(0)
    return GPT(cfg.model, V).eval()


def test_position_modules_keep_their_own_initialization():
    """GPT's N(0, init_std) for every matrix, then each encoding's own init (reset_position_parameters): CoPE's
    position table starts at zero, as in the paper, not at the matrices' random init."""
    model = tiny("cope")
    for block in model.blocks:
        assert block.attn.pos.pos_emb.abs().max() == 0
    assert model.blocks[0].attn.wq.weight.std() > 0.01  # (the model's own matrices are initialized)


def test_document_ids_reach_the_embedding_hook():
    """conv's taps stop at a document boundary given by doc_ids even where the positions run on across it: a
    packed second document's logits do not depend on the first document's tokens."""
    model = tiny("conv")
    for p in model.pos_emb.parameters():  # taps large enough to matter
        torch.nn.init.normal_(p, std=1.0)
    x = torch.randint(0, V, (1, 16))
    y = x.clone()
    y[:, :8] = (y[:, :8] + 5) % V  # only the first document changes
    docs = torch.tensor([[0] * 8 + [1] * 8])
    with torch.no_grad():
        a, b = model(x, doc_ids=docs), model(y, doc_ids=docs)  # default positions: 0..15, no restart
    torch.testing.assert_close(a[:, 8:], b[:, 8:])


@pytest.mark.parametrize("chunk", [None, 5])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_token_ids_and_targets_of_any_integer_dtype_give_the_int64_loss(chunk, dtype):
    """A memmap's int32 (or uint16-sized) ids: int32 targets trained with model.loss_chunk_size and were torch's
    "expected target dtype to be Long" without it; int16 and uint8 ids were the embedding's error. Both loss paths
    take them, as the same ids in int64; float ids are refused by name."""
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=4",
                                 f"model.loss_chunk_size={chunk or 'null'}"])  # fmt: skip
    torch.manual_seed(0)
    model = GPT(cfg.model, V).eval()
    x, y = torch.randint(0, V, (2, 9)), torch.randint(0, V, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model.loss(x.to(dtype), y.to(dtype)), model.loss(x, y))
        torch.testing.assert_close(model(x.to(dtype)), model(x))
    with pytest.raises(MinilmError, match="targets: must be integers"):
        model.loss(x, y.float())
    with pytest.raises(MinilmError, match="idx: must be integers"):
        model(x.float())
