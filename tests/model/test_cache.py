"""The KV cache's own promises (minilm/model/cache.py): positions kept per row once any call gives per-row ones, and
the misuses it names instead of decoding from misaligned keys — an interrupted forward, document ids given only
after tokens were cached without them (or given, then left out), positions that do not match the new keys."""

import pytest
import torch

from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.model import GPT
from minilm.model.cache import KVCache, LayerCache

V = 61


def tiny():
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2"])
    torch.manual_seed(0)
    return GPT(cfg.model, V).eval()


def test_per_row_positions_then_shared_ones_keep_every_row():
    """A prompt with per-row positions (B, T), then steps with the default shared (1, T) ones: the cache keeps
    (B, S) positions, and each step's logits equal a cache-free forward over the whole sequence."""
    model = tiny()
    x = torch.randint(0, V, (2, 9))
    starts = torch.tensor([[0], [3]])  # the second row's positions start at 3
    cache = KVCache.for_model(model)
    with torch.no_grad():
        prompt = model(x[:, :6], positions=starts + torch.arange(6), cache=cache)
        # the default positions continue from the cache length (6, 7, 8) for every row
        steps = [model(x[:, t : t + 1], cache=cache) for t in (6, 7, 8)]
        want = torch.tensor([list(range(9)), list(range(3, 9)) + [6, 7, 8]])
        whole = model(x, positions=want)
    assert torch.equal(cache.layers[0].positions, want)
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), whole, atol=1e-5, rtol=1e-5)


def test_an_interrupted_forward_is_named_not_decoded_from():
    """A forward that failed midway left some layers a token ahead: the next call says so instead of attending
    over keys that no longer line up across layers."""
    model = tiny()
    cache = KVCache.for_model(model)
    x = torch.randint(0, V, (1, 5))
    with torch.no_grad():
        model(x, cache=cache)
        handle = model.blocks[1].register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            model(x[:, :1], cache=cache)  # layer 0 has cached the token, layer 1 never ran
        handle.remove()
        with pytest.raises(MinilmError, match="layer 0 holds 6 tokens but the cache is at 5; .* start a new cache"):
            model(x[:, :1], cache=cache)


def test_document_ids_must_come_from_the_first_call_on():
    model = tiny()
    cache = KVCache.for_model(model)
    x = torch.randint(0, V, (1, 5))
    with torch.no_grad():
        model(x, cache=cache)
        with pytest.raises(MinilmError, match="doc_ids given now but not for the tokens already cached"):
            model(x[:, :1], doc_ids=torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_document_ids_given_once_must_be_given_on_every_call():
    """The other way round: doc_ids on the prompt, none on a step. The step attended across the documents of the
    cached keys without a word (its logits off by ~1.7 on this model), and the next call with doc_ids failed on
    mismatched shapes. It is refused before any layer caches the step, so the cache goes on with doc_ids."""
    model = tiny()
    cache = KVCache.for_model(model)
    x = torch.randint(0, V, (1, 8))
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        whole = model(x, doc_ids=docs)
        prompt = model(x[:, :6], doc_ids=docs[:, :6], cache=cache)
        with pytest.raises(MinilmError, match="doc_ids were given for the 6 tokens already cached but not for these"):
            model(x[:, 6:7], cache=cache)
        assert cache.length == 6 and all(layer.size == 6 for layer in cache.layers)  # nothing of the step cached
        steps = [model(x[:, t : t + 1], doc_ids=docs[:, t : t + 1], cache=cache) for t in (6, 7)]
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), whole, atol=1e-5, rtol=1e-5)


def test_positions_must_match_the_new_keys():
    layer = LayerCache()
    k = torch.randn(1, 2, 3, 8)
    with pytest.raises(MinilmError, match="3 new keys but 4 positions"):
        layer.update(k, k, torch.arange(4).unsqueeze(0))
    assert layer.size == 0 and layer.keys is None  # nothing cached
