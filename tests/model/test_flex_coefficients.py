"""A bias's coefficients with their gradients from extra FlexAttention forwards (minilm/model/flex.py
``flex_attention_with_coefficient_grads``, ``FlexCoefficients``): KERPLE with ``flex_coefficient_forwards``, whose
kernel then adds into no learned tensor.

On CPU FlexAttention runs eagerly and has no backward, so q, k and v take no gradient here: the coefficients' come
from the extra forwards alone, and are checked against the reference path's; the CUDA kernel with q, k and v too is
``-m gpu``'s."""

import pytest
import torch

import minilm.model.flex as flex
from minilm.model.attention import Attention, AttentionMask, reference_attention

from tests.positions.helpers import hook
from tests.positions.test_fast_paths import CASES, grads_agree, qkv

KERNELS = ["log", "power"]


def kerple(kernel: str = "log", **params):
    pos = hook("kerple", kernel=kernel, **params)
    pos.flex_coefficient_forwards = True
    return pos


def _attend(pos, q, k, v, q_pos, k_pos, mask):
    spec = pos.flex_coefficients(q, k, q_pos, k_pos)
    return flex.flex_attention_with_coefficient_grads(q, k, v, spec, mask, pos.softmax_scale(q.shape[-1]),
                                                      compiled=False)  # fmt: skip


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", list(CASES))
def test_kerple_coefficients_take_the_reference_gradients(case, kernel):
    """The forward equals the reference's, and r1 and r2 (through their raw parameters) get the reference's
    gradients from the two extra forwards: restarted documents, queries after cached keys."""
    pos = kerple(kernel)
    T, S, q_pos, k_pos, mask = CASES[case]
    q, k, v = qkv(T, S, seed=8)
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    got = _attend(pos, q, k, v, q_pos, k_pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    grads_agree(got, want, [pos.raw_r1, pos.raw_r2], atol=1e-5, rtol=1e-4)


def test_the_kernel_reads_no_learned_tensor():
    """What makes the path fast: nothing the score_mods capture requires a gradient, so the CUDA kernel's backward
    adds into nothing (the coefficients get theirs from the extra forwards)."""
    pos = kerple()
    T, S, q_pos, k_pos, _ = CASES["packed"]
    q, k, _ = qkv(T, S)
    spec = pos.flex_coefficients(q, k, q_pos, k_pos)
    for mod in (spec.score_mod, *spec.weight_mods):
        captured = [c.cell_contents for c in mod.__closure__ or ()]
        assert not any(torch.is_tensor(t) and t.requires_grad for t in captured)
    assert all(c.requires_grad for c in spec.coefficients)


def test_coefficient_weights_are_the_negative_derivatives():
    """w = −∂k/∂r at whole distances (the extra forwards add log w to the scores), against autograd."""
    d = torch.arange(0, 50, dtype=torch.float32)
    for kernel in KERNELS:
        pos = kerple(kernel)
        r1, r2 = (c[0].detach().requires_grad_() for c in pos.coefficients())
        want = torch.stack([torch.stack(torch.autograd.grad(pos.bias(r1, r2, x), (r1, r2))) for x in d]).T.neg()
        got = torch.stack([w.expand_as(d) for w in pos.coefficient_weights(r1.detach(), r2.detach(), d)])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        assert (got >= 0).all()


def test_off_by_default_and_absent_elsewhere():
    q, k, _ = qkv(16, 16)
    positions = torch.arange(16).expand(2, 16)
    assert hook("kerple").flex_coefficients(q, k, positions, positions) is None
    assert hook("alibi").flex_coefficients(q, k, positions, positions) is None  # the base


@pytest.mark.parametrize("position, form, entry", [
    (["name=t5", "num_buckets=8", "max_distance=6"], "flex_split", "flex_attention_in_parts"),
    (["name=kerple"], "flex_coefficient_forwards", "flex_attention_with_coefficient_grads"),
])  # fmt: skip
def test_the_flex_rung_takes_the_form_the_encoding_asks_for(position, form, entry, monkeypatch):
    """``Attention.attend`` on the FlexAttention rung (CUDA's, forced here) takes T5's parts when ``flex_parts``
    gives some, KERPLE's extra forwards when ``flex_coefficients`` gives a spec, and one call with the score_mod
    otherwise."""
    from minilm.config import load_config
    from minilm.positions import PositionDims

    cfg = load_config(overrides=["model.d_model=64", "model.n_heads=4", *(f"model.position.{p}" for p in position)])
    attn = Attention(64, 4, 4, cfg.model.position, PositionDims(64, 4, 4, 16, 1, 0))
    monkeypatch.setattr(Attention, "_flex_runs_on", lambda self, device: True)
    calls = []
    monkeypatch.setattr(flex, entry, lambda *a, **kw: calls.append("form") or a[0])
    monkeypatch.setattr(flex, "flex_attention_with_score_mod", lambda *a, **kw: calls.append("one") or a[0])
    q = torch.randn(1, 4, 32, 16)
    positions = torch.arange(32).unsqueeze(0)
    for on in (False, True):
        setattr(attn.pos, form, on)
        attn.attend(q, q, q, positions, positions, AttentionMask())
    assert calls == ["one", "form"]


def test_traces_as_one_graph_with_its_backward():
    """The main call, its lse and the custom backward's two extra forwards, traced by dynamo as one graph
    (``fullgraph``) and run by AOT autograd, forward and backward, against the reference. (Inductor's CPU
    FlexAttention refuses the lse; the CUDA kernel is ``-m gpu``'s.)"""
    pos = kerple()
    T, S, q_pos, k_pos, mask = CASES["packed"]
    q, k, v = qkv(T, S, seed=9)
    torch._dynamo.reset()
    got = torch.compile(lambda q, k, v: _attend(pos, q, k, v, q_pos, k_pos, mask), fullgraph=True,
                        backend="aot_eager")(q, k, v)  # fmt: skip
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    grads_agree(got, want, [pos.raw_r1, pos.raw_r2], atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_compiled_kerple_forwards_on_cuda_equal_the_reference(kernel):
    """The CUDA kernels, forward and backward: q, k, v from FlexAttention's backward and r1, r2 from the extra
    forwards equal the reference's, with partial blocks and a document boundary inside a block."""
    from minilm.model.flex import FLEX_MIN_HEAD_DIM

    from tests.positions.test_fast_paths import odd_length_case

    torch._dynamo.reset()
    pos, (q, k, v), (q_pos, k_pos, mask) = odd_length_case("kerple", seed=3, head_dim=FLEX_MIN_HEAD_DIM)
    if kernel != pos.kernel:
        pos = hook("kerple", head_dim=FLEX_MIN_HEAD_DIM, kernel=kernel)
    pos.flex_coefficient_forwards = True
    pos, q_pos, k_pos = pos.cuda(), q_pos.cuda(), k_pos.cuda()
    q, k, v = (t.detach().cuda().requires_grad_() for t in (q, k, v))
    mask = AttentionMask(q_doc=mask.q_doc.cuda(), k_doc=mask.k_doc.cuda())
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    spec = pos.flex_coefficients(q, k, q_pos, k_pos)
    got = flex.flex_attention_with_coefficient_grads(q, k, v, spec, mask, pos.softmax_scale(q.shape[-1]))
    assert torch.allclose(got, want, atol=1e-4)
    grads_agree(got, want, [q, k, v, pos.raw_r1, pos.raw_r2], atol=1e-4, rtol=1e-3)
