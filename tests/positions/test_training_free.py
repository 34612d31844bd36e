"""Training-free extension methods (minilm/positions/training_free.py) against a plain reference written here:
explicit relative-position matrices from each paper's formulas, RoPE applied to the query at that relative
position, and a masked softmax. Tiny shapes: the whole file runs in a few seconds."""

import math

import pytest
import torch

from minilm.config import load_config
from minilm.errors import ConfigError, MinilmError
from minilm.model import GPT
import minilm.model.attention as attention
from minilm.model.attention import AttentionMask
from minilm.positions import compute_rope
from minilm.positions.base import PositionDims
from minilm.positions.rotary import Rope, RopeParams
from minilm.positions.training_free import (
    EXTENSIONS,
    build_extension,
    extension,
    install_extension,
    remove_extension,
)

V = 61
B, H, HKV, DH = 2, 4, 2, 8


# ---------------------------------------------------------------------------------------------------------------
# the reference: relative position matrices from the formulas, then an explicit rotation and masked softmax


def rel_plain(m, n):
    return m - n


def rel_rerope(w):
    return lambda m, n: m - n if m - n < w else w


def rel_self_extend(G, w):
    return lambda m, n: m - n if m - n < w else (m // G + w - w // G) - n // G


def rel_dca(chunk_size, local_window):
    s = chunk_size - local_window

    def rel(m, n):
        if m // s == n // s:  # intra-chunk
            return m % s - n % s
        if m // s - n // s == 1:  # successive chunk
            return min(s + m % s, chunk_size) - n % s
        return min(2 * s - 1, chunk_size) - n % s  # inter-chunk

    return rel


def rotate(x, angles, factor, rot_dim):
    """Half-layout rotation of the first rot_dim dims of x (..., Dh) by angles (..., rot_dim/2), times factor."""
    h = rot_dim // 2
    x1, x2, rest = x[..., :h], x[..., h:rot_dim], x[..., rot_dim:]
    c, s = angles.cos() * factor, angles.sin() * factor
    a, b = x1 * c - x2 * s, x2 * c + x1 * s
    rest = rest.expand(*a.shape[:-1], rest.shape[-1])
    return torch.cat((a, b, rest), dim=-1)


def reference(q, k, v, q_pos, k_pos, allowed, rel, rot_dim, scaling=None, q_scale=None):
    """q (B, H, T, Dh), k/v (B, Hkv, S, Dh), q_pos (T,), k_pos (S,), allowed (T, S): logit(i, j) =
    <R(r_ij) q_i, R(0) k_j> · Dh^-½ with r_ij = rel(q_pos[i], k_pos[j])."""
    n = int(k_pos.max()) + 1
    inv_freq, factor = compute_rope(rot_dim, 10000.0, scaling, seq_len=n)
    R = torch.tensor([[rel(int(m), int(j)) for j in k_pos] for m in q_pos], dtype=torch.float64)  # (T, S)
    q, k, v = q.double(), k.double(), v.double()
    if q_scale is not None:
        q = q * q_scale[:, None]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    q_rot = rotate(q[:, :, :, None, :], R[..., None] * inv_freq.double(), factor, rot_dim)  # (B, H, T, S, Dh)
    k_rot = rotate(k, torch.zeros(1, dtype=torch.float64), factor, rot_dim)  # R(0) k: only the factor
    logits = (q_rot * k_rot[:, :, None]).sum(-1) * q.shape[-1] ** -0.5
    logits = logits.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(logits, -1) @ v).float()


def rope(fraction=1.0, scaling=None, nope_every=0):
    kwargs = {"nope_every": nope_every} if nope_every else {}  # (a layer of nope_every n is the model's last, n − 1)
    dims = PositionDims(H * DH, H, HKV, DH, max(1, nope_every), layer=max(0, nope_every - 1))
    return Rope(RopeParams(fraction=fraction, scaling=scaling, **kwargs), dims)


def qkv(T, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, T, DH, generator=g),
        torch.randn(B, HKV, S, DH, generator=g),
        torch.randn(B, HKV, S, DH, generator=g),
    )


CASES = {  # name -> (params, relative-position rule)
    "rerope": ({"window": 5}, rel_rerope(5)),
    "self_extend": ({"group_size": 3, "window": 4}, rel_self_extend(3, 4)),
    "self_extend_uneven": ({"group_size": 4, "window": 6}, rel_self_extend(4, 6)),
    "dca": ({"chunk_size": 7, "local_window": 2}, rel_dca(7, 2)),
    "dca_no_window": ({"chunk_size": 4, "local_window": 0}, rel_dca(4, 0)),
    "dca_wide_window": ({"chunk_size": 7, "local_window": 4}, rel_dca(7, 4)),  # inter position 2s − 1 < chunk_size
}


def method_name(case):
    return case.split("_uneven")[0].split("_no_window")[0].split("_wide_window")[0]


ROPES = {
    "plain": dict(),
    "partial": dict(fraction=0.5),
    "yarn": dict(scaling={"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 8}),
    "dynamic": dict(scaling={"rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 8}),
}


@pytest.fixture(params=[None, 4], ids=["one_call", "blocks_of_4"])
def query_block(request, monkeypatch):
    """The merged methods run on CPU in blocks of ``CPU_QUERY_BLOCK`` queries: as one call, and in blocks of 4."""
    if request.param:
        monkeypatch.setattr(attention, "CPU_QUERY_BLOCK", request.param)
    return request.param


@pytest.mark.parametrize("rope_kind", list(ROPES))
@pytest.mark.parametrize("case", list(CASES))
def test_remapping_methods_equal_the_reference(case, rope_kind, query_block, monkeypatch):
    """In blocks too, where each block's logits are computed at the length of all the keys (``dynamic`` reads
    it), and against only the keys up to the block's last query."""
    params, rel = CASES[case]
    method = build_extension(method_name(case), params)
    seen, logits = [], method.logits
    monkeypatch.setattr(method, "logits", lambda q, k, *a: seen.append((q.shape[2], k.shape[2])) or logits(q, k, *a))
    rot = rope(**ROPES[rope_kind])
    T = 23
    q, k, v = qkv(T, T)
    pos = torch.arange(T)
    out = method.attend(q, k, v, rot, pos[None], pos[None], AttentionMask())
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
    ref = reference(q, k, v, pos, pos, allowed, rel, rot.rot_dim, ROPES[rope_kind].get("scaling"))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    block = query_block or T
    assert seen == [(min(block, T - i0), min(T, i0 + block)) for i0 in range(0, T, block)]


@pytest.mark.parametrize("case", list(CASES))
def test_remapping_methods_with_a_kv_cache_offset(case, query_block):
    """Decoding: T new queries after S − T cached keys; positions continue, the mask is causal by index."""
    params, rel = CASES[case]
    method = build_extension(method_name(case), params)
    S, T = 21, 9
    q, k, v = qkv(T, S, seed=1)
    q_pos, k_pos = torch.arange(S - T, S), torch.arange(S)
    out = method.attend(q, k, v, rope(), q_pos[None], k_pos[None], AttentionMask(offset=S - T))
    allowed = k_pos[None, :] <= q_pos[:, None]
    torch.testing.assert_close(out, reference(q, k, v, q_pos, k_pos, allowed, rel, DH), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_remapping_methods_with_restarted_document_positions(case, query_block):
    params, rel = CASES[case]
    method = build_extension(method_name(case), params)
    T = 20
    docs = torch.tensor([0] * 12 + [1] * 8)
    pos = torch.cat((torch.arange(12), torch.arange(8)))
    q, k, v = qkv(T, T, seed=2)
    mask = AttentionMask(q_doc=docs[None].expand(B, -1), k_doc=docs[None].expand(B, -1))
    out = method.attend(q, k, v, rope(), pos[None], pos[None], mask)
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool)) & (docs[:, None] == docs[None, :])
    torch.testing.assert_close(out, reference(q, k, v, pos, pos, allowed, rel, DH), rtol=1e-5, atol=1e-5)


def test_logn_equals_the_reference():
    T, L_train = 30, 8
    q, k, v = qkv(T, T, seed=3)
    pos = torch.arange(T)
    out = build_extension("logn", {"train_len": L_train}).attend(q, k, v, rope(), pos[None], pos[None], AttentionMask())
    q_scale = torch.tensor([max(1.0, math.log(m + 1) / math.log(L_train)) for m in range(T)], dtype=torch.float64)
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
    ref = reference(q, k, v, pos, pos, allowed, rel_plain, DH, q_scale=q_scale)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rope_scaling_extension_equals_a_model_configured_with_that_scaling():
    block = {"rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 8}
    T = 24
    q, k, v = qkv(T, T, seed=4)
    pos = torch.arange(T)
    out = build_extension("rope_scaling", block).attend(q, k, v, rope(), pos[None], pos[None], AttentionMask())
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
    torch.testing.assert_close(out, reference(q, k, v, pos, pos, allowed, rel_plain, DH, block), rtol=1e-5, atol=1e-5)


def test_non_rotating_layers_get_plain_attention():
    """On the NoPE layers of ``nope_every`` the remapping is the identity: plain unrotated attention."""
    rot = rope(nope_every=2)
    assert not rot.rotates
    T = 16
    q, k, v = qkv(T, T, seed=5)
    pos = torch.arange(T)
    out = build_extension("rerope", {"window": 3}).attend(q, k, v, rot, pos[None], pos[None], AttentionMask())
    logits = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * DH**-0.5
    logits = logits.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(logits, -1) @ v.repeat_interleave(2, 1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# on a model: installation, reduction to plain RoPE, errors


def tiny(*overrides):
    small = ["model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2"]
    cfg = load_config(overrides=[*small, *overrides])
    torch.manual_seed(0)
    return GPT(cfg.model, V).eval()


T_MODEL = 20
LARGE = {  # parameters large enough (for T_MODEL tokens) that each method is plain RoPE attention
    "logn": {"train_len": T_MODEL},
    "rerope": {"window": T_MODEL},
    "self_extend": {"group_size": 4, "window": T_MODEL},
    "dca": {"chunk_size": T_MODEL + 3, "local_window": 3},
    "rope_scaling": {"rope_type": "dynamic", "factor": 4, "original_max_position_embeddings": T_MODEL},
}
SMALL = {  # parameters that remap positions inside T_MODEL tokens
    "logn": {"train_len": 4},
    "rerope": {"window": 4},
    "self_extend": {"group_size": 4, "window": 4},
    "dca": {"chunk_size": 6, "local_window": 2},
    "rope_scaling": {"rope_type": "dynamic", "factor": 4, "original_max_position_embeddings": 4},
}


def test_rerope_with_train_len_is_su_s_recipe_rerope_with_logn():
    """Su's reference ReRoPE (bojone/rerope) scales every query by log-n too; a model holds one method at a time, so
    ``logn`` could not be added to ``rerope``: ``train_len`` does it. With a window as long as the input it is log-n
    alone; with a short window, ReRoPE on log-n's queries (the ``logn`` queries, then ReRoPE's two regions)."""
    model = tiny()
    x = torch.randint(0, V, (2, T_MODEL))
    with torch.no_grad():
        with extension(model, "logn", train_len=4):
            logn = model(x)
        with extension(model, "rerope", window=T_MODEL, train_len=4):
            both_wide = model(x)
        with extension(model, "rerope", window=4):
            rerope = model(x)
        with extension(model, "rerope", window=4, train_len=4):
            both = model(x)
        with extension(model, "rerope", window=4, train_len=T_MODEL):  # log-n is 1 up to train_len
            rerope_again = model(x)
    torch.testing.assert_close(both_wide, logn, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rerope_again, rerope, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(both, rerope, atol=1e-4) and not torch.allclose(both, logn, atol=1e-4)


def test_tables_cover_the_registry():
    assert set(LARGE) == set(SMALL) == set(EXTENSIONS)


@pytest.mark.parametrize("name", list(EXTENSIONS))
def test_large_enough_parameters_reduce_to_plain_rope(name):
    model = tiny()
    x = torch.randint(0, V, (2, T_MODEL))
    with torch.no_grad():
        plain = model(x)
        with extension(model, name, **LARGE[name]):
            extended = model(x)
        changed = None
        with extension(model, name, **SMALL[name]):
            changed = model(x)
        again = model(x)
    torch.testing.assert_close(extended, plain, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(changed, plain, atol=1e-4)
    torch.testing.assert_close(again, plain, rtol=0, atol=0)  # removed on leaving the block


def test_self_extend_with_group_one_is_plain_rope():
    model = tiny()
    x = torch.randint(0, V, (1, T_MODEL))
    with torch.no_grad():
        plain = model(x)
        with extension(model, "self_extend", group_size=1, window=2):
            extended = model(x)
    torch.testing.assert_close(extended, plain, rtol=1e-5, atol=1e-5)


def test_install_sets_and_remove_clears_every_layer():
    model = tiny()
    method = install_extension(model, "rerope", window=8)
    assert all(b.attn.extension is method for b in model.blocks)
    remove_extension(model)
    assert all(b.attn.extension is None for b in model.blocks)


def test_a_second_method_is_refused_and_the_first_stays():
    """A second install_extension swapped the first method out without a word; inside nested ``with extension(...)``
    blocks, the inner block's removal then left the rest of the outer block with no method at all. One at a time."""
    model = tiny()
    first = install_extension(model, "rerope", window=8)
    said = r"^extension\.logn: the model already has 'rerope' installed; call remove_extension\(model\) first"
    with pytest.raises(ConfigError, match=said):  # a ConfigError, as every other refusal here (docs/extension.md)
        install_extension(model, "logn", train_len=8)
    assert all(b.attn.extension is first for b in model.blocks)
    remove_extension(model)
    with extension(model, "self_extend", group_size=2, window=4) as outer:
        with pytest.raises(MinilmError, match="already has 'self_extend' installed"):
            with extension(model, "rerope", window=8):
                pass
        assert all(b.attn.extension is outer for b in model.blocks)
    assert all(b.attn.extension is None for b in model.blocks)
    install_extension(model, "logn", train_len=8)  # after removal: installs


@pytest.mark.parametrize("position", ["none", "alibi", "xpos", "learned"])
@pytest.mark.parametrize("name", list(EXTENSIONS))
def test_clear_error_for_a_model_that_is_not_rope(position, name):
    """Named by the model's encoding: an absolute one's layers hold Identity, and the error said "this layer's position
    encoding is Identity" of a learned model."""
    model = tiny(f"model.position.name={position}")
    said = rf"extension\.{name} \(layer 0\): '{name}' needs a RoPE model .*; this model's encoding is '{position}'"
    with pytest.raises(ConfigError, match=said):
        install_extension(model, name, **LARGE[name])
    assert all(b.attn.extension is None for b in model.blocks)  # nothing half-installed


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("yarn_please", {}, r"extension\.name: unknown training-free method 'yarn_please'; available: logn, rerope"),
        ("rerope", {}, r"extension\.rerope\.window: required"),
        ("rerope", {"window": 0}, r"extension\.rerope\.window: must be >= 1, got 0"),
        ("rerope", {"window": 4, "size": 2}, r"extension\.rerope\.size: unknown parameter; rerope takes: window, "
                                             r"train_len$"),
        ("rerope", {"window": 4, "train_len": 1}, r"extension\.rerope\.train_len: must be >= 2, got 1"),
        ("rerope", {"window": 4.5}, r"extension\.rerope\.window: must be int"),
        ("self_extend", {"window": 4}, r"extension\.self_extend\.group_size: required"),
        ("dca", {"chunk_size": 4, "local_window": 4}, r"extension\.dca\.chunk_size: must be > local_window"),
        ("logn", {"train_len": 1}, r"extension\.logn\.train_len: must be >= 2"),
        # beyond int64 (positions' type) they became positions: torch's "value cannot be converted to type int64_t
        # without overflow", a traceback from evaluate.py --extension rerope window=10000000000000000000
        ("rerope", {"window": 2**63}, r"extension\.rerope\.window: must be at most 9223372036854775807 \(2\^63"),
        ("dca", {"chunk_size": 2**63, "local_window": 4}, r"extension\.dca\.chunk_size: must be at most 92233720"),
        (
            "rope_scaling",
            {"rope_type": "dynamic", "factor": 2},
            r"extension\.rope_scaling\.original_max_position_embeddings: required",
        ),
        ("rope_scaling", {"rope_type": "linear", "factor": 0.5}, r"extension\.rope_scaling\.factor: must be >= 1"),
        # without one it meant rope_type default, which drops the scaling a YaRN-trained model runs with
        ("rope_scaling", {"factor": 4}, r"extension\.rope_scaling\.rope_type: rope_scaling needs a rope_type"),
    ],
)
def test_bad_names_and_parameters_raise_naming_the_key(name, params, message):
    with pytest.raises(ConfigError, match=message):
        install_extension(tiny(), name, **params)


def test_rope_scaling_checks_list_lengths_against_the_model():
    block = {
        "rope_type": "longrope",
        "factor": 2,
        "original_max_position_embeddings": 8,
        "short_factor": [1.0] * 3,
        "long_factor": [1.0] * 3,
    }
    with pytest.raises(ConfigError, match=r"short_factor: must have one entry per rotary frequency \(4\), got 3"):
        install_extension(tiny(), "rope_scaling", **block)


def test_rope_scaling_keeps_the_rotary_dimensions_the_model_was_trained_with():
    """A model whose scaling block rotates half of each head (partial_rotary_factor 0.5): a rope_scaling block
    rotating all of it (its default 1) was installed and changed the logits without a word; it is refused, and the
    model's own factor gives the model's logits (rope_type default: the plain frequencies it was trained with)."""
    model = tiny("model.position.scaling={rope_type: default, partial_rotary_factor: 0.5}")
    x = torch.randint(0, V, (1, T_MODEL))
    with torch.no_grad():
        plain = model(x)
    for given in ({}, {"partial_rotary_factor": 1.0}):
        with pytest.raises(ConfigError, match=r"extension\.rope_scaling \(layer 0\)\.partial_rotary_factor: must be "
                                              r"the model's own \(0\.5.*got 1.*partial_rotary_factor=0\.5"):  # fmt: skip
            install_extension(model, "rope_scaling", rope_type="default", **given)
        assert all(b.attn.extension is None for b in model.blocks)
    with extension(model, "rope_scaling", rope_type="default", partial_rotary_factor=0.5), torch.no_grad():
        torch.testing.assert_close(model(x), plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["rerope", "self_extend", "dca"])
def test_merged_logits_stay_fp32_under_bf16_autocast(case):
    """Evaluation runs under bf16 autocast on a GPU (minilm.eval.perplexity.autocast). The merged methods must
    still build their logits and weighted sum in fp32 from the bf16 q, k, v (as the plain path's flash kernel keeps
    its scores in fp32): autocast used to round every logit to bf16, off by ~0.1 at logits of ~30."""
    params, _ = CASES[case]
    method = build_extension(method_name(case), params)
    T = 64
    q, k, v = (x.bfloat16() for x in qkv(T, T, seed=6))
    q, k = q * 3, k * 3  # logits of a few tens, as in a trained model
    pos = torch.arange(T)[None]
    expected = method.attend(q, k, v, rope(), pos, pos, AttentionMask())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = method.attend(q, k, v, rope(), pos, pos, AttentionMask())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# the papers' relative-position matrices, written out by hand for a small case (not computed from a formula, so a
# formula shared by the code and the reference above cannot hide a mistake)

HAND = {  # (method, params) -> rows m = 0..9 of the relative position m − n the logit of (m, n) is computed at
    ("rerope", (("window", 3),)): [  # Su: min(m − n, w)
        [0], [1, 0], [2, 1, 0], [3, 2, 1, 0], [3, 3, 2, 1, 0], [3, 3, 3, 2, 1, 0], [3, 3, 3, 3, 2, 1, 0],
        [3, 3, 3, 3, 3, 2, 1, 0], [3, 3, 3, 3, 3, 3, 2, 1, 0], [3, 3, 3, 3, 3, 3, 3, 2, 1, 0],
    ],
    # Jin et al.: exact below w_n = 2; beyond, ⌊m/2⌋ + (2 − 1) − ⌊n/2⌋
    ("self_extend", (("group_size", 2), ("window", 2))): [
        [0], [1, 0], [2, 1, 0], [2, 2, 1, 0], [3, 3, 2, 1, 0], [3, 3, 2, 2, 1, 0], [4, 4, 3, 3, 2, 1, 0],
        [4, 4, 3, 3, 2, 2, 1, 0], [5, 5, 4, 4, 3, 3, 2, 1, 0], [5, 5, 4, 4, 3, 3, 2, 2, 1, 0],
    ],
    # An et al. (ChunkLlama): chunk_size 6, local window 2 -> chunks of s = 4; keys at n mod 4; queries at m mod 4
    # (same chunk), min(4 + m mod 4, 6) (previous chunk), 6 (earlier chunks)
    ("dca", (("chunk_size", 6), ("local_window", 2))): [
        [0], [1, 0], [2, 1, 0], [3, 2, 1, 0],
        [4, 3, 2, 1, 0], [5, 4, 3, 2, 1, 0], [6, 5, 4, 3, 2, 1, 0], [6, 5, 4, 3, 3, 2, 1, 0],
        [6, 5, 4, 3, 4, 3, 2, 1, 0], [6, 5, 4, 3, 5, 4, 3, 2, 1, 0],
    ],
}


@pytest.mark.parametrize("method,params", list(HAND), ids=[m for m, _ in HAND])
def test_relative_positions_equal_the_papers_matrix_written_by_hand(method, params, monkeypatch):
    """One rotary frequency of 0.1 rad per position and q = k = (1, 0): the logit of (m, n) is cos(0.1 r) / √2 at
    the relative position r it was computed at, so r is read back from the logits the method builds."""
    import minilm.positions.training_free as tf

    rot = Rope(RopeParams(), PositionDims(2, 1, 1, 2, 1))
    rot.inv_freq = torch.tensor([0.1])
    captured = {}

    def capture(logits, v, mask, dtype):
        captured["logits"] = logits
        return torch.zeros(*logits.shape[:3], v.shape[-1], dtype=dtype)

    monkeypatch.setattr(tf, "_softmax_attend", capture)
    T = 10
    q = torch.tensor([1.0, 0.0]).expand(1, 1, T, 2)
    pos = torch.arange(T)[None]
    build_extension(method, dict(params)).attend(q, q, q, rot, pos, pos, AttentionMask())
    r = torch.arccos((captured["logits"][0, 0] * 2**0.5).clamp(-1, 1)) / 0.1  # (T, T)
    got = [[round(float(r[m, n])) for n in range(m + 1)] for m in range(T)]
    assert got == HAND[(method, params)]


@pytest.mark.parametrize("name", list(EXTENSIONS))
def test_generation_with_a_kv_cache_matches_the_full_forward(name):
    """Queries arriving in pieces through minilm.model.cache.KVCache (preallocated, views returned; the cache
    generate and the report's continuations use) see the same remapped positions as a full forward: a batch of two,
    prefill, a short chunk, then token by token. (Not for length-dependent scaling: dynamic NTK gives earlier tokens
    other frequencies by design, so a static block.)"""
    from minilm.model.cache import KVCache

    params = SMALL[name]
    if name == "rope_scaling":
        params = {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4}
    model = tiny()
    x = torch.randint(0, V, (2, T_MODEL))
    with torch.no_grad(), extension(model, name, **params):
        full = model(x)
        cache = KVCache.for_model(model, max_length=T_MODEL)
        steps = [model(x[:, :7], cache=cache), model(x[:, 7:10], cache=cache)]
        steps += [model(x[:, i : i + 1], cache=cache) for i in range(10, T_MODEL)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


EXACT = {  # method, params -> where (m, n) keeps its exact relative position m − n, by the paper's definition
    ("rerope", (("window", 5),)): lambda m, n: m - n <= 5,  # r < w kept; r >= w becomes w, which is r at r = w
    ("self_extend", (("group_size", 3), ("window", 6))): lambda m, n: m - n < 6,  # the neighbour window
    # chunks of s = 7: the same chunk, and the previous chunk while s + m mod s <= chunk_size (m mod s <= 3)
    ("dca", (("chunk_size", 10), ("local_window", 3))): lambda m, n: m // 7 == n // 7 or (
        m // 7 - n // 7 == 1 and m % 7 <= 3
    ),
}


@pytest.mark.parametrize("rope_kind", ["plain", "yarn"])
@pytest.mark.parametrize("method,params", list(EXACT), ids=[m for m, _ in EXACT])
def test_logits_equal_plain_rope_wherever_the_method_keeps_exact_positions(method, params, rope_kind, monkeypatch):
    """Within ReRoPE's window, Self-Extend's neighbour window and DCA's chunk (and its local window across the
    boundary) every logit is plain RoPE's, with a model's full set of frequencies (and YaRN's temperature); outside
    them the logits differ."""
    import minilm.positions.training_free as tf

    captured = {}

    def capture(logits, v, mask, dtype):
        captured["logits"] = logits
        return torch.zeros(*logits.shape[:3], v.shape[-1], dtype=dtype)

    monkeypatch.setattr(tf, "_softmax_attend", capture)
    rot = rope(**ROPES[rope_kind])
    T = 30
    q, k, v = qkv(T, T, seed=7)
    pos = torch.arange(T)[None]
    build_extension(method, dict(params)).attend(q, k, v, rot, pos, pos, AttentionMask())
    q_rot, k_rot = rot.rotate(q, k, pos, pos)
    plain = (q_rot @ k_rot.repeat_interleave(H // HKV, 1).transpose(-1, -2)) * rot.softmax_scale(DH)
    exact = torch.tensor([[EXACT[(method, params)](m, n) for n in range(T)] for m in range(T)])
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    got = captured["logits"]
    torch.testing.assert_close(got[..., exact & causal], plain[..., exact & causal], rtol=1e-5, atol=1e-5)
    outside = ~exact & causal
    assert outside.any() and (got[..., outside] - plain[..., outside]).abs().amax() > 1e-2


@pytest.mark.parametrize("name", list(EXTENSIONS))
def test_an_input_of_zero_tokens_gives_empty_logits(name):
    """Every method gives (B, 0, V) logits for zero tokens, alone or after a KV cache's prefill, as every encoding
    does (tests/positions/test_registry.py): the current length was the largest of no key positions, which torch
    refuses ("amax(): Expected reduction dim to be specified for input.numel() == 0")."""
    from minilm.model.cache import KVCache

    model = tiny()
    install_extension(model, name, **LARGE[name])
    empty = torch.zeros(2, 0, dtype=torch.long)
    with torch.no_grad():
        assert model(empty).shape == (2, 0, V)
        cache = KVCache.for_model(model)
        model(torch.randint(0, V, (2, 5)), cache=cache)
        assert model(empty, cache=cache).shape == (2, 0, V)


@pytest.mark.gpu
@pytest.mark.parametrize("name, params", [("rerope", {"window": 512}),
                                          ("self_extend", {"group_size": 8, "window": 512}),
                                          ("dca", {"chunk_size": 4096, "local_window": 512})])  # fmt: skip
def test_a_32k_evaluation_with_a_method_holds_one_query_block_of_scores_on_cuda(name, params):
    """On a GPU the methods run in blocks of queries once the (B, H, T, S) fp32 scores would pass
    ``QUERY_BLOCK_BYTES`` (1 GiB): at 32K tokens and 12 heads one such matrix is 48 GiB, and a method builds two or
    three of them, so without the blocks this forward needs over 100 GiB; with them a few blocks' worth."""
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=768", "model.n_heads=12", "model.n_kv_heads=12"])
    torch.manual_seed(0)
    model = GPT(cfg.model, V).cuda().eval()
    install_extension(model, name, **params)
    T = 32768
    tokens = torch.randint(0, V, (1, T), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens)
    peak = torch.cuda.max_memory_allocated()
    assert logits.shape == (1, T, V) and torch.isfinite(logits).all()
    assert peak < 8 * 2**30, f"{name} at {T} tokens peaked at {peak / 2**30:.1f} GiB"
