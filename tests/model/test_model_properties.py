"""GPT properties the other model tests leave open: the parameter counts the training log prints, the shape of the
per-token loss."""

import pytest
import torch

from minilm.config import load_config
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
