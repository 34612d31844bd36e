"""FlexAttention in parts (minilm/model/flex.py ``flex_attention_in_parts``): the keys split by ``FlexPart`` rules,
each part attended with its own log-sum-exp and the parts merged exactly; T5's near and far keys
(``T5Bias.flex_split``), whose far bucket becomes a shift of the far part's log-sum-exp instead of a score_mod term.

On CPU FlexAttention runs eagerly and has no backward, so the forward is checked with FlexAttention itself and the
gradients with a dense stand-in for each part's kernel (``dense_part``: the same (out, lse) contract, with autograd),
which checks the partition, the merge and the shift's gradient; the CUDA kernel's own backward is ``-m gpu``'s.
"""

import pytest
import torch

import minilm.model.flex as flex
from minilm.model.attention import AttentionMask, reference_attention, repeat_kv

from tests.positions.helpers import hook
from tests.positions.test_fast_paths import CASES, H, grads_agree, grid, learned_tensor_reads, qkv

T5 = {"num_buckets": 8, "max_distance": 6}  # far keys (d >= 6) in every case's rows from the 7th on


def t5_split(**params):
    pos = hook("t5", **{**T5, **params})
    pos.flex_split = True
    return pos


def dense_part(q, k, v, part, mask, scale, compiled, kernel_options=None):
    """``flex.attend_part`` by materialized scores, differentiable: (out, lse), out 0 and lse −inf in a row with no
    key in the part."""
    B, _, T, _ = q.shape
    S = k.shape[2]
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    b, h, i, j = grid(T, S, B)
    if part.score_mod is not None:
        s = part.score_mod(s, b, h, i, j)
    keep = mask.dense(T, S, q.device) & part.keep(b, h, i, j)
    s = s.masked_fill(~keep, float("-inf"))
    lse = s.logsumexp(-1)
    p = torch.where(keep, torch.exp(s - lse.unsqueeze(-1).clamp(min=-1e30)), 0.0)
    return p @ v.float(), lse


@pytest.mark.parametrize("case", list(CASES))
def test_the_parts_partition_the_allowed_keys(case):
    """Near (d < max_distance) and far (d >= max_distance) keys: every allowed key in exactly one part, by the
    positions' distance (restarted documents, queries after cached keys)."""
    pos = t5_split()
    T, S, q_pos, k_pos, mask = CASES[case]
    q, k, _ = qkv(T, S)
    parts = pos.flex_parts(q, k, q_pos, k_pos)
    b, h, i, j = grid(T, S, q.shape[0])
    near, far = (p.keep(b, h, i, j).expand(-1, H, -1, -1) for p in parts)
    allowed = mask.dense(T, S, q.device).expand_as(near)
    assert not (near & far).any() and ((near | far) == torch.ones_like(near)).all()
    assert (far & allowed).any() and (near & allowed).any()  # both parts hold keys in every case
    assert parts[0].shift is None and parts[1].score_mod is None and parts[1].shift.shape == (H,)


@pytest.mark.parametrize("case", list(CASES))
def test_t5_in_parts_equals_the_reference(case):
    """FlexAttention (eager on CPU, forward) in two parts, merged, against the reference over all keys."""
    pos = t5_split()
    T, S, q_pos, k_pos, mask = CASES[case]
    q, k, v = qkv(T, S, seed=4)
    with torch.no_grad():
        want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
        got = flex.flex_attention_in_parts(q, k, v, pos.flex_parts(q, k, q_pos, k_pos), mask,
                                           pos.softmax_scale(q.shape[-1]), compiled=False)  # fmt: skip
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("copies", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_t5_in_parts_gradients_equal_the_reference(case, copies, monkeypatch):
    """The merge's gradients, each part's kernel by ``dense_part``: q, k, v and T5's table (its near buckets through
    the near part's score_mod, its far bucket through the far part's lse shift) equal the reference's; with the near
    table in copies too (``FLEX_TABLE_COPIES``)."""
    import minilm.positions.bias as biases

    monkeypatch.setattr(flex, "attend_part", dense_part)
    monkeypatch.setattr(biases, "FLEX_TABLE_COPIES", copies)
    pos = t5_split()
    T, S, q_pos, k_pos, mask = CASES[case]
    q, k, v = (t.requires_grad_() for t in qkv(T, S, seed=5))
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    got = flex.flex_attention_in_parts(q, k, v, pos.flex_parts(q, k, q_pos, k_pos), mask,
                                       pos.softmax_scale(q.shape[-1]), compiled=False)  # fmt: skip
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    far = torch.autograd.grad(got.square().sum(), pos.table, retain_graph=True)[0][-1]  # the last bucket: far keys'
    assert far.abs().max() > 0
    grads_agree(got, want, [q, k, v, pos.table], atol=1e-5, rtol=1e-4)


def test_the_near_part_reads_its_learned_table_once_by_one_index():
    """The rule every bias score_mod keeps for FlexAttention's CUDA backward (test_fast_paths.py), for the near
    part's; the far part has no score_mod, its learned value being the lse shift."""
    pos = t5_split()
    T, S, q_pos, k_pos, _ = CASES["packed"]
    q, k, _ = qkv(T, S)
    near, far = pos.flex_parts(q, k, q_pos, k_pos)
    assert len(learned_tensor_reads(near.score_mod)) == 1 and far.score_mod is None and far.shift.requires_grad


def test_split_is_off_by_default_and_for_bidirectional_buckets():
    q, k, _ = qkv(16, 16)
    positions = torch.arange(16).expand(2, 16)
    assert hook("t5", **T5).flex_parts(q, k, positions, positions) is None
    assert t5_split(bidirectional=True, num_buckets=16).flex_parts(q, k, positions, positions) is None
    assert hook("alibi").flex_parts(q, k, positions, positions) is None  # the base: one call with the score_mod


def test_t5_in_parts_traces_as_one_graph():
    """Both parts, their block masks built in the graph and their lse asked for, traced by dynamo as one graph
    (``fullgraph``) and run by AOT autograd, against the reference. (Inductor's CPU FlexAttention refuses the lse:
    "torch.compile on CPU only supports inference and `return_lse` is not supported yet", torch 2.13; the CUDA
    kernel is ``-m gpu``'s.)"""
    pos = t5_split()
    T, S, q_pos, k_pos, mask = CASES["packed"]
    q, k, v = qkv(T, S, seed=6)

    def attend(q, k, v, q_pos, k_pos):
        return flex.flex_attention_in_parts(q, k, v, pos.flex_parts(q, k, q_pos, k_pos), mask,
                                            pos.softmax_scale(q.shape[-1]), compiled=False)  # fmt: skip

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(attend, fullgraph=True, backend="aot_eager")(q, k, v, q_pos, k_pos)
        want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_compiled_t5_in_parts_on_cuda_equals_the_reference():
    """The CUDA kernels, forward and backward (through each part's lse too), against the reference: q, k, v and
    T5's table, with partial blocks and a document boundary inside a block."""
    from minilm.model.flex import FLEX_MIN_HEAD_DIM

    from tests.positions.test_fast_paths import odd_length_case

    torch._dynamo.reset()
    pos, (q, k, v), (q_pos, k_pos, mask) = odd_length_case("t5", seed=3, head_dim=FLEX_MIN_HEAD_DIM)
    pos.flex_split = True
    pos, q_pos, k_pos = pos.cuda(), q_pos.cuda(), k_pos.cuda()
    q, k, v = (t.detach().cuda().requires_grad_() for t in (q, k, v))
    mask = AttentionMask(q_doc=mask.q_doc.cuda(), k_doc=mask.k_doc.cuda())
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    got = flex.flex_attention_in_parts(q, k, v, pos.flex_parts(q, k, q_pos, k_pos), mask,
                                       pos.softmax_scale(q.shape[-1]))  # fmt: skip
    assert torch.allclose(got, want, atol=1e-4)
    grads_agree(got, want, [q, k, v, *pos.parameters()], atol=1e-4, rtol=1e-3)


def test_dense_part_matches_flex_forward():
    """The stand-in keeps FlexAttention's contract: the same out and lse as the eager kernel, out 0 and lse −inf
    in rows with no key in the part."""
    pos = t5_split()
    T, S, q_pos, k_pos, mask = CASES["plain"]
    q, k, v = qkv(T, S, seed=7)
    with torch.no_grad():
        for part in pos.flex_parts(q, k, q_pos, k_pos):
            want_out, want_lse = flex.attend_part(q, k, v, part, mask, 0.5, compiled=False)
            got_out, got_lse = dense_part(q, k, v, part, mask, 0.5, compiled=False)
            torch.testing.assert_close(got_lse, want_lse)
            torch.testing.assert_close(got_out, want_out.float(), atol=1e-5, rtol=1e-5)
    assert torch.isneginf(got_lse[:, :, 0]).all() and (got_out[:, :, 0] == 0).all()  # row 0: no far key
