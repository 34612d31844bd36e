"""Every fast path equals the fp32 reference path.

- score_mod (the FlexAttention form of a score term) evaluated on broadcast index tensors equals ``score()``,
  for every encoding that declares ``score_kind = "bias"`` — with grouped-query heads, with queries that start
  after cached keys, and with positions that restart per document;
- the whole FlexAttention path (eager on CPU: forward only) equals ``reference_attention`` with the same mask; so
  does the compiled one on CPU (``-m slow``; forward only, FlexAttention has no CPU backward);
- the SDPA path equals the reference for encodings without a score term, and SDPA with a bias score term as its
  float mask (the CPU path of ALiBi, T5, KERPLE, FIRE, ...) equals it in the forward and in every gradient;
- RoPE's rotation on CPU in eager mode (one autograd Function) equals the composition of torch ops that compiled
  graphs, CUDA and tables with a gradient take, in the forward and in the gradient, for both layouts.
The compiled CUDA kernel runs the same score_mods; ``-m gpu`` checks it where a GPU exists.
"""

import warnings

import pytest
import torch

from minilm.model.attention import (
    Attention,
    AttentionMask,
    reference_attention,
    repeat_kv,
    sdpa_attention,
    sdpa_bias_attention,
)
from minilm.model.flex import flex_attention_available, flex_attention_with_score_mod
import minilm.positions.bias as biases
from minilm.positions import PositionDims
from minilm.positions.rotary import _Rotary, apply_rotary, cos_sin_tables, rotary_by_ops

from .helpers import ATTENTION_SIDE, hook

B, H, HKV, DH = 2, 4, 2, 8
BIAS = [n for n in ATTENTION_SIDE if hook(n).score_kind == "bias"]
NO_SCORE = [n for n in ATTENTION_SIDE if hook(n).score_kind == "none" and not hook(n).has_value_term]
REFERENCE = [n for n in ATTENTION_SIDE if hook(n).score_kind == "full" or hook(n).has_value_term]
PARAMS = {"shaw": {"max_distance": 3}, "deberta": {"max_distance": 3}, "t5": {"num_buckets": 8, "max_distance": 12},
          "fire": {"init_L": 6.0, "mlp_width": 4}}  # fmt: skip


def cases():
    """(name, T, S, q_pos, k_pos, mask): plain causal; 5 queries after 11 cached keys (positions from 11); two
    packed documents whose positions restart."""
    S = 16
    plain = (16, S, torch.arange(S).expand(B, S), torch.arange(S).expand(B, S), AttentionMask())
    cached = (5, S, torch.arange(11, S).expand(B, 5), torch.arange(S).expand(B, S), AttentionMask(offset=11))
    docs = torch.tensor([[0] * 6 + [1] * 10, [0] * 11 + [1] * 5])
    restart = torch.stack([torch.cat([torch.arange(6), torch.arange(10)]),
                           torch.cat([torch.arange(11), torch.arange(5)])])  # fmt: skip
    packed = (S, S, restart, restart, AttentionMask(q_doc=docs, k_doc=docs))
    return {"plain": plain, "cached": cached, "packed": packed}


CASES = cases()


def qkv(T, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, DH, generator=g)
    return q, torch.randn(B, HKV, S, DH, generator=g), torch.randn(B, HKV, S, DH, generator=g)


def key_term_case(name, case, seed):
    """(encoding, (q, k, v), (q_pos, k_pos, mask)) for a FlexAttention check: Shaw's value term lives on the
    reference path only, so it is switched off and its key term alone is compared."""
    pos = hook(name, **PARAMS.get(name, {}))
    if pos.has_value_term:
        pos.has_value_term, pos.rel_v = False, None
    T, S, q_pos, k_pos, mask = CASES[case]
    return pos, qkv(T, S, seed=seed), (q_pos, k_pos, mask)


def grads_agree(got, want, inputs, atol, rtol):
    """The gradients of ``got`` and ``want`` for one random output gradient agree on every input (None on both
    or on neither)."""
    out_grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(0)).to(want.device)
    want_grads = torch.autograd.grad(want, inputs, out_grad, allow_unused=True)
    got_grads = torch.autograd.grad(got, inputs, out_grad, allow_unused=True)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert (g is None) == (w is None), f"input {i}: a gradient on one path only"
        if w is not None:
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=f"input {i}")


def grid(T, S, batch=B):
    """Index tensors (b, h, i, j) that broadcast to every (b, h, i, j) of (batch, H, T, S)."""
    return (torch.arange(batch).view(batch, 1, 1, 1), torch.arange(H).view(1, H, 1, 1),
            torch.arange(T).view(1, 1, T, 1), torch.arange(S).view(1, 1, 1, S))  # fmt: skip


def dense(score_mod, T, S):
    """Evaluate a score_mod on every (b, h, i, j) at once by broadcasting index tensors."""
    return score_mod(torch.zeros(B, H, T, S), *grid(T, S)).expand(B, H, T, S)


DISTANCE_TABLES = ["t5", "kerple"]  # the learned biases of i − j alone (FIRE's also reads the query position)
LEARNED_TABLES = DISTANCE_TABLES + ["fire"]  # the score_mods that read learned tables (FLEX_TABLE_COPIES applies)
COPIES = 3  # copies of each learned table in the "/copies" cases: odd, fewer than a row's keys
HUGE_T5_DISTANCE = 10**10  # a table of every distance to it would be 160 GB


def strip_copies(name: str, monkeypatch) -> str:
    """The encoding of a "/copies" case name, with ``FLEX_TABLE_COPIES`` = COPIES for the test; others as given."""
    name, copies, _ = name.partition("/copies")
    if copies:
        monkeypatch.setattr(biases, "FLEX_TABLE_COPIES", COPIES)
    return name


def variant(name: str, monkeypatch):
    """The encoding of a test case name: "t5", or "t5/direct" (``flex_distance_table = False``,
    scripts/bench_attention.py --no-flex-table), or "t5/copies" (``FLEX_TABLE_COPIES`` = COPIES,
    --flex-table-copies), or "t5/buckets" (a max_distance no table of distances is built for: each score's bucket,
    ``T5Bias.reach``)."""
    name, _, form = strip_copies(name, monkeypatch).partition("/")
    pos = hook(name, **{**PARAMS.get(name, {}), **({"max_distance": HUGE_T5_DISTANCE} if form == "buckets" else {})})
    if form == "direct":
        pos.flex_distance_table = False
    return pos


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", BIAS + ["t5/buckets"] + [f"{n}/{form}" for form, names in (
    ("direct", DISTANCE_TABLES), ("copies", LEARNED_TABLES)) for n in names])  # fmt: skip
def test_score_mod_equals_score(name, case, monkeypatch):
    """Every bias score_mod; T5's and KERPLE's direct forms besides their per-distance tables; the learned
    tables in copies (``variant``)."""
    pos = variant(name, monkeypatch)
    T, S, q_pos, k_pos, mask = CASES[case]
    q, k, _ = qkv(T, S)
    with torch.no_grad():
        want = pos.score(q, repeat_kv(k, H // HKV), q_pos, k_pos, None).expand(B, H, T, S)
        got = dense(pos.score_mod(q, k, q_pos, k_pos), T, S)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 1e-3  # the term is really there


@pytest.mark.parametrize("name", BIAS + ["t5/buckets"] + [f"{n}/copies" for n in LEARNED_TABLES])
def test_score_mod_gradients_equal_score_gradients(name, monkeypatch):
    """Training through FlexAttention needs the gradients of the tables a score_mod captures: evaluated densely,
    the score_mod must pass the reference score's gradients to q, k and the encoding's parameters (a table
    built under no_grad or detached would give none; a table's copies must sum theirs). The kernel's own backward
    is the CUDA test's."""
    pos = variant(name, monkeypatch)
    T, S, q_pos, k_pos, _ = CASES["packed"]
    q, k, _ = (t.requires_grad_() for t in qkv(T, S, seed=2))
    inputs = [q, k, *pos.parameters()]
    want = pos.score(q, repeat_kv(k, H // HKV), q_pos, k_pos, None).expand(B, H, T, S)
    got = dense(pos.score_mod(q, k, q_pos, k_pos), T, S)
    if not want.requires_grad:  # ALiBi: fixed slopes, a bias independent of q and k; nothing to learn
        assert not got.requires_grad and not inputs[2:]
        return
    grads_agree(got, want, inputs, atol=1e-5, rtol=1e-4)


def captured_tensors(score_mod):
    """The tensors a score_mod closes over (what FlexAttention captures and, in its backward, scatters into)."""
    return [c.cell_contents for c in score_mod.__closure__ or () if isinstance(c.cell_contents, torch.Tensor)]


@pytest.mark.parametrize("name", DISTANCE_TABLES)
def test_learned_distance_biases_give_flex_one_table_entry_per_distance(name):
    """FlexAttention's backward adds each score element's gradient into the captured tensor it read with one
    atomic add, so what a learned bias captures decides how many adds meet at one address. T5 and KERPLE capture
    one table with an entry per distance the keys span (S = 64 keys here, beyond T5's max_distance of 12): not
    KERPLE's two per-head coefficients, nor T5's table clamped at max_distance, which every far key reads."""
    pos = hook(name, **PARAMS.get(name, {}))
    S = 64
    positions = torch.arange(S).unsqueeze(0)
    q, k, _ = qkv(S, S)
    learned = [t for t in captured_tensors(pos.score_mod(q, k, positions, positions)) if t.requires_grad]
    assert learned, "the score_mod captures no learned table"
    for t in learned:
        assert t.shape[0] == H and t.shape[-1] >= S, f"a captured learned tensor of shape {tuple(t.shape)}"


@pytest.mark.parametrize("name", LEARNED_TABLES)
def test_table_copies_share_out_the_adds_and_sum_to_the_table(name, monkeypatch):
    """With ``FLEX_TABLE_COPIES`` = R, every learned table a score_mod captures is (H, R, n), and the score
    elements' gradients spread over the copies: each copy takes some (else the adds still meet at one copy), and
    the copies' gradients sum to the gradient of the table without copies (so the parameters' are unchanged)."""
    T, S, q_pos, k_pos, _ = CASES["plain"]
    q, k, _ = qkv(T, S)
    out_grad = torch.randn(B, H, T, S, generator=torch.Generator().manual_seed(1))
    grads = {}
    for copies in (1, COPIES):
        monkeypatch.setattr(biases, "FLEX_TABLE_COPIES", copies)
        torch.manual_seed(0)  # the same parameters both times
        pos = hook(name, **PARAMS.get(name, {}))
        score_mod = pos.score_mod(q, k, q_pos, k_pos)
        tables = [t for t in captured_tensors(score_mod) if t.requires_grad]
        assert tables and all(t.dim() == (2 if copies == 1 else 3) for t in tables), [t.shape for t in tables]
        grads[copies] = torch.autograd.grad(dense(score_mod, T, S), tables, out_grad)
    for one, spread in zip(grads[1], grads[COPIES]):
        assert spread.shape == (one.shape[0], COPIES, one.shape[1])
        assert all(spread[:, r].abs().sum() > 0 for r in range(COPIES)), "a copy that takes no adds"
        torch.testing.assert_close(spread.sum(1), one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", BIAS + [f"{n}/copies" for n in LEARNED_TABLES])
def test_score_mods_read_each_learned_tensor_once_by_one_index(name, monkeypatch):
    """FlexAttention's CUDA backward takes a captured tensor's gradient from one indexing of it: inductor refuses a
    score_mod that indexes a tensor requiring gradients twice ("multiple indexing operations on the same tensor",
    torch 2.11 on an H100, where FIRE's MLP unrolled into the kernel read each weight 32 times). Checked on the
    score_mod traced as FlexAttention traces it (make_fx, with tensor indices turned into aten.index): every
    learned tensor is read by exactly one aten.index, with the head among its indices, and nothing else."""
    name = strip_copies(name, monkeypatch)
    pos, (q, k, _), (q_pos, k_pos, _) = key_term_case(name, "packed", seed=0)
    reads = learned_tensor_reads(pos.score_mod(q, k, q_pos, k_pos))
    assert reads or name == "alibi", "no learned tensor in the score_mod"


def learned_tensor_reads(score_mod) -> dict:
    """Trace ``score_mod`` as FlexAttention does (make_fx, tensor indices as aten.index) and check that every
    captured tensor requiring gradients is read by exactly one aten.index with the head among its indices (the
    rules of ``test_score_mods_read_each_learned_tensor_once_by_one_index``). Returns {name: [(op, args)]}."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.fx.experimental.proxy_tensor import make_fx

    args = (torch.tensor(0.5), *(torch.tensor(x) for x in (1, 2, 3, 1)))  # score, b, h, i, j
    with TransformGetItemToIndex():
        graph = make_fx(score_mod)(*args)
    head = next(node for node in graph.graph.nodes if node.op == "placeholder" and node.target.startswith("h"))
    reads = {}  # a learned tensor's name in the graph -> (op, indices) of every read
    for node in graph.graph.nodes:
        if node.op == "get_attr" and getattr(graph, node.target).requires_grad:
            reads.setdefault(node.target, []).extend((user.target, user.args[1:]) for user in node.users)
    for target, ops in reads.items():
        where = f"{target} {tuple(getattr(graph, target).shape)}"
        assert [op for op, _ in ops] == [torch.ops.aten.index.Tensor], f"{where}: read by {ops}"
        # and by the head among its indices: the backward's atomic add into a one-dimensional table indexed per
        # element fails to compile (torch 2.11, H100: "can only unsplat single-element tensors"; FIRE's ψ tables)
        assert head in ops[0][1][0], f"{where}: indexed without the head, by {ops[0][1][0]}"
    return reads


def t5_as_before(pos, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """T5's bias (B, H, T, S) as it was computed before its tables followed the lengths: from the bucket of every
    distance in [−max_distance, max_distance], each distance clamped into that range."""
    m, nb, bidirectional = pos.params.max_distance, pos.params.num_buckets, pos.params.bidirectional
    bucket_of = biases.t5_bucket(torch.arange(-m, m + 1), nb, m, bidirectional)
    d = (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)).clamp(-m, m) + m  # (B, T, S)
    return pos.table[bucket_of[d]].permute(0, 3, 1, 2)  # (B, H, T, S)


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional",
                         [(8, 12, False), (8, 16, True), (32, 128, False), (32, 128, True), (4, 3, False),
                          (32, 939, False), (64, 3224, True)])  # (near-ties of t5_bucket's fp32 logs: at 728, 371)
def test_t5_bias_is_unchanged_by_tables_that_follow_the_lengths(num_buckets, max_distance, bidirectional):
    """T5's per-step tables follow the lengths, not max_distance (``T5Bias.reach``): a table of the distances, or
    each score's bucket where that table would be larger than the scores. Every path gives the bias as before —
    score (the reference, SDPA's mask), the score_mod with a table per distance and in its direct form, flex_split's
    near part and far shift — on every case and on positions spread far beyond the keys and max_distance."""
    pos = hook("t5", num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    spread = (torch.arange(16) * 40).expand(B, 16)  # distances up to 600
    decoding = (1, 3, spread[:, 2:3], spread[:, :3])  # one query: fewer scores than distances to max_distance
    for T, S, q_pos, k_pos in [case[:4] for case in CASES.values()] + [(16, 16, spread, spread), decoding]:
        q, k, _ = qkv(T, S)
        with torch.no_grad():
            want = t5_as_before(pos, q_pos, k_pos)
            assert torch.equal(pos.score(q, k, q_pos, k_pos, None).expand(B, H, T, S), want)
            for per_distance in (True, False):
                pos.flex_distance_table = per_distance
                assert torch.equal(dense(pos.score_mod(q, k, q_pos, k_pos), T, S), want)
            if not bidirectional:  # (flex_split: causal bucketing only)
                pos.flex_split = True
                near, far = pos.flex_parts(q, k, q_pos, k_pos)
                is_far = far.keep(*grid(T, S)).expand(B, H, T, S)
                assert torch.equal(dense(near.score_mod, T, S)[~is_far], want[~is_far])
                assert torch.equal(far.shift.view(1, H, 1, 1).expand(B, H, T, S)[is_far], want[is_far])


def test_t5_buckets_do_not_hang_on_how_a_device_rounds_its_logs(monkeypatch):
    """The buckets of a step were t5_bucket's fp32 logs, computed on the step's device (and, decoding, inside the
    compiled score_mod): a device or kernel whose log rounds a near-tie the other way (max_distance 939 of 32
    buckets, distance 728) put that distance in another bucket than training did. They are integer comparisons with
    thresholds found once, on the CPU: a log that rounds otherwise changes none."""
    pos = hook("t5", num_buckets=32, max_distance=939)
    d = torch.arange(-1000, 1001)
    want = biases.t5_bucket(d.clamp(-939, 939), 32, 939)
    log = torch.log
    monkeypatch.setattr(torch, "log", lambda x: log(x) * (1 - 1e-6))  # a log a few ulps low
    assert not torch.equal(biases.t5_bucket(d.clamp(-939, 939), 32, 939), want)  # (728 moves down a bucket)
    assert torch.equal(pos.buckets(d), want)


def test_t5_with_a_huge_max_distance_builds_what_the_lengths_need():
    """max_distance 10^10 built a bucket for every distance to it when the encoding was made: 160 GB, a
    RuntimeError from the allocator. Now every path builds no tensor larger than its scores, and still gives each
    distance its bucket's bias."""
    pos = hook("t5", num_buckets=8, max_distance=HUGE_T5_DISTANCE)
    T, S, q_pos, k_pos, _ = CASES["packed"]
    q, k, _ = qkv(T, S)
    d = q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)
    want = pos.table[biases.t5_bucket(d, 8, HUGE_T5_DISTANCE)].permute(0, 3, 1, 2)  # (B, H, T, S)
    with torch.no_grad():
        assert torch.equal(pos.score(q, k, q_pos, k_pos, None), want)
        score_mod = pos.score_mod(q, k, q_pos, k_pos)
        assert all(t.numel() <= B * H * T * S for t in captured_tensors(score_mod))
        assert torch.equal(dense(score_mod, T, S), want)


def test_positions_spread_beyond_the_keys():
    """The tables cover the distances of positions within [0, S). T5's stays exact for any positions (beyond
    max_distance the bucket no longer changes); KERPLE's and Transformer-XL's refuse positions further apart
    instead of clamping (Transformer-XL's on every rung: ``score`` gathers from the same table)."""
    T = S = 16
    q, k, _ = qkv(T, S)
    spread = (torch.arange(S) * 40).expand(B, S)  # distances up to 600, far beyond S − 1 and T5's max_distance
    t5 = hook("t5", **PARAMS["t5"])
    with torch.no_grad():
        want = t5.score(q, repeat_kv(k, H // HKV), spread, spread, None).expand(B, H, T, S)
        torch.testing.assert_close(dense(t5.score_mod(q, k, spread, spread), T, S), want)
    with pytest.raises(RuntimeError, match="KERPLE on FlexAttention: query and key positions lie more than 15 apart"):
        hook("kerple").score_mod(q, k, spread, spread)
    txl = hook("transformer_xl")
    with pytest.raises(RuntimeError, match="Transformer-XL: .* more than 15 apart"):
        txl.score_mod(q, k, spread, spread)  # (its table spans −15 … 15, fixed by the shapes)
    with pytest.raises(RuntimeError, match="Transformer-XL: .* more than 15 apart"):
        txl.score(q, k, spread, spread, None)  # (the same table on the SDPA-with-bias and reference rungs)
    with pytest.raises(RuntimeError, match=r"FIRE on FlexAttention: a position lies outside \[0, 15\]"):
        hook("fire").score_mod(q, k, spread, spread)  # (its per-position table too)


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("case", ["cached", "packed"])  # (eager Flex costs seconds per call on CPU)
@pytest.mark.parametrize("name", BIAS)
def test_flex_path_equals_reference(name, case):
    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case(name, case, seed=1)
    with torch.no_grad():
        want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
        got = flex_attention_with_score_mod(q, k, v, pos.score_mod(q, k, q_pos, k_pos), mask,
                                            pos.softmax_scale(DH), compiled=False)  # fmt: skip
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["rope", "none"])
def test_flex_path_without_a_score_term_equals_reference(name):
    """Document masking of an encoding with no score term takes FlexAttention on CUDA with the BlockMask alone
    (``score_mod=None``): the same attention as the reference's dense same-document mask."""
    pos = hook(name)
    T, S, q_pos, k_pos, mask = CASES["packed"]
    q, k, v = qkv(T, S, seed=5)
    q, k = pos.rotate(q, k, q_pos, k_pos)
    with torch.no_grad():
        want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
        got = flex_attention_with_score_mod(q, k, v, None, mask, pos.softmax_scale(DH), compiled=False)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", NO_SCORE)
def test_sdpa_path_equals_reference(name, case):
    pos = hook(name)
    T, S, q_pos, k_pos, mask = CASES[case]
    q, k, v = qkv(T, S, seed=2)
    q, k = pos.rotate(q, k, q_pos, k_pos)
    with torch.no_grad():
        want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
        assert torch.allclose(sdpa_attention(q, k, v, pos, mask), want, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", BIAS)
def test_sdpa_bias_path_equals_reference(name, case):
    """The bias as SDPA's float mask: same output and same gradients of q, k, v and the encoding's parameters."""
    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case(name, case, seed=4)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    got = sdpa_bias_attention(q, k, v, pos, q_pos, k_pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    grads_agree(got, want, [q, k, v, *pos.parameters()], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", BIAS)
def test_sdpa_bias_path_in_blocks_of_queries_equals_reference(name, case, monkeypatch):
    """On CPU the bias path runs in blocks of queries (``CPU_QUERY_BLOCK``), each against only the keys up to its
    last query: blocks of 3 (the last one short) give the reference's output and gradients, with cached keys before
    the queries and with documents too; and no block builds its bias over keys it cannot see."""
    import minilm.model.attention as attention

    monkeypatch.setattr(attention, "CPU_QUERY_BLOCK", 3)
    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case(name, case, seed=7)
    seen = []
    score = pos.score
    monkeypatch.setattr(pos, "score", lambda q, k, qp, kp, logits: seen.append((q.shape[2], k.shape[2]))
                        or score(q, k, qp, kp, logits))  # fmt: skip
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    got = sdpa_bias_attention(q, k, v, pos, q_pos, k_pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    grads_agree(got, want, [q, k, v, *pos.parameters()], atol=1e-5, rtol=1e-4)
    T, S = q.shape[2], k.shape[2]
    blocks = [(min(3, T - i0), min(S, mask.offset + i0 + 3)) for i0 in range(0, T, 3)]
    assert seen[1:] == blocks  # (seen[0]: the reference's one call)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", REFERENCE)
def test_reference_rung_in_blocks_of_queries_equals_reference(name, case, monkeypatch):
    """The encodings the ladder sends to the reference (CoPE reads each row's logits; Shaw's value term its
    probabilities) run it in blocks of queries on CPU, each against the keys up to its last query: the same output
    and gradients as one call of ``reference_attention``."""
    import minilm.model.attention as attention

    monkeypatch.setattr(attention, "CPU_QUERY_BLOCK", 3)
    pos = hook(name, **PARAMS.get(name, {}))
    T, S, q_pos, k_pos, mask = CASES[case]
    dims = PositionDims(d_model=H * DH, n_heads=H, n_kv_heads=HKV, head_dim=DH, n_layers=1)
    layer = Attention(H * DH, H, HKV, {"name": name, **PARAMS.get(name, {})}, dims)
    layer.pos = pos
    assert layer.kernel(torch.device("cpu")) == "reference"
    seen = []
    monkeypatch.setattr(attention, "reference_attention", lambda q, k, *a: seen.append((q.shape[2], k.shape[2]))
                        or reference_attention(q, k, *a))  # fmt: skip
    q, k, v = (t.requires_grad_() for t in qkv(T, S, seed=8))
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    got = layer.attend(q, k, v, q_pos, k_pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    grads_agree(got, want, [q, k, v, *pos.parameters()], atol=1e-5, rtol=1e-4)
    assert seen == [(min(3, T - i0), min(S, mask.offset + i0 + 3)) for i0 in range(0, T, 3)]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", [n for n in BIAS if not hook(n).score_reads_qk])
def test_position_only_bias_is_shared_by_a_batch_sharing_positions(name, case):
    """``score_reads_qk = False`` lets SDPA build one (1, H, T, S) bias for a batch whose rows share positions:
    the result and the gradients must equal those from per-row positions (the declaration is checked, too)."""
    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case(name, case, seed=6)
    q_pos, k_pos = q_pos[:1], k_pos[:1]  # one row of positions for the batch (the packed case keeps its doc mask)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert pos.score(q, k, q_pos, k_pos, None).shape[0] == 1
    want = sdpa_bias_attention(q, k, v, pos, q_pos.expand(B, -1), k_pos.expand(B, -1), mask)
    got = sdpa_bias_attention(q, k, v, pos, q_pos, k_pos, mask)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    grads_agree(got, want, [q, k, v, *pos.parameters()], atol=1e-5, rtol=1e-4)  # sums over rows reordered


@pytest.mark.parametrize("path", [reference_attention, sdpa_bias_attention])
def test_fp32_paths_stay_fp32_under_autocast(path):
    """bf16 autocast (bf16-mixed training) would run their matmuls and SDPA in bf16 (~1e-2 off); both promise fp32."""
    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case("kerple", "packed", seed=5)
    want = path(q, k, v, pos, q_pos, k_pos, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = path(q, k, v, pos, q_pos, k_pos, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", BIAS)
def test_score_mod_tables_stay_fp32_under_autocast(name, monkeypatch):
    """Attention.attend builds the FlexAttention score_mod inside the training's bf16 autocast, where the tables
    from a matmul (Shaw's q·R^K, Transformer-XL's and DeBERTa's q·R and k·R, FIRE's linear pieces) were rounded to
    bf16: the Flex terms were up to 0.05 off the fp32 reference and SDPA-bias ones. The score_mod the kernel would
    get (the FlexAttention rung taken on CPU, its kernel replaced by a catch) against the fp32 score."""
    import minilm.model.flex as flex

    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case(name, "packed", seed=7)
    T, S = q.shape[2], k.shape[2]
    want = pos.score(q, repeat_kv(k, H // HKV), q_pos, k_pos, None).expand(B, H, T, S)
    layer = Attention(H * DH, H, HKV, {"name": name, **PARAMS.get(name, {})},
                      PositionDims(d_model=H * DH, n_heads=H, n_kv_heads=HKV, head_dim=DH, n_layers=1))  # fmt: skip
    layer.pos = pos
    monkeypatch.setattr(Attention, "_flex_runs_on", lambda self, device: True)
    caught = []
    monkeypatch.setattr(flex, "flex_attention_with_score_mod",
                        lambda q, k, v, score_mod, *a, **kw: caught.append(score_mod))  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer.attend(q, k, v, q_pos, k_pos, mask)
        got = dense(caught[0], T, S)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_ladder_on_cpu_sends_bias_terms_to_sdpa_and_full_terms_to_the_reference(monkeypatch):
    """Routed by declaration: ALiBi (bias) takes SDPA with its bias as the mask; CoPE (full: reads the logits)
    and Shaw with its value term (needs the probabilities) take the reference."""
    import minilm.model.attention as attention

    taken = []
    for fn in ("sdpa_bias_attention", "reference_attention"):
        real = getattr(attention, fn)
        monkeypatch.setattr(attention, fn, lambda *a, _fn=fn, _real=real, **kw: taken.append(_fn) or _real(*a, **kw))
    T, S, q_pos, k_pos, mask = CASES["plain"]
    for name, params in [("alibi", {}), ("cope", {}), ("shaw", {"max_distance": 3})]:
        dims = PositionDims(d_model=H * DH, n_heads=H, n_kv_heads=HKV, head_dim=DH, n_layers=1)
        layer = Attention(H * DH, H, HKV, {"name": name, **params}, dims)
        layer(torch.randn(B, T, H * DH), q_pos, mask)
    assert taken == ["sdpa_bias_attention", "reference_attention", "reference_attention"]


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
def test_kernel_names_the_rung_per_device():
    """The routing a GPU run takes, checked without a GPU (``kernel`` reads the device, not a tensor): every bias
    term with a score_mod goes to Flex on CUDA and to SDPA-with-bias elsewhere; no score term to SDPA, or to Flex
    on CUDA with a document mask (SDPA's dense (B, 1, T, S) mask rules out its flash kernel). Heads under
    16 wide stay on SDPA-with-bias on CUDA too: inductor's Triton lowering of FlexAttention refuses them ("NYI:
    embedding dimension ... must be at least 16"), which crashed the first compiled step of such a model."""

    def kernels(name, head_dim=16, documents=False, **params):
        dims = PositionDims(d_model=H * head_dim, n_heads=H, n_kv_heads=HKV, head_dim=head_dim, n_layers=1)
        layer = Attention(H * head_dim, H, HKV, {"name": name, **params}, dims)
        return layer.kernel(torch.device("cpu"), documents), layer.kernel(torch.device("cuda"), documents)

    for name in ["rope", "none", "alibi", "t5", "kerple", "fire", "transformer_xl", "deberta"]:
        want = ("sdpa", "sdpa") if hook(name).score_kind == "none" else ("sdpa_bias", "flex")
        assert kernels(name, **PARAMS.get(name, {})) == want, name
    assert kernels("shaw", values=False) == ("sdpa_bias", "flex")
    assert kernels("shaw") == kernels("cope") == ("reference", "reference")
    assert kernels("alibi", head_dim=8) == kernels("t5", head_dim=15) == ("sdpa_bias", "sdpa_bias")
    # with a document mask: no score term takes Flex on CUDA too (its BlockMask, not SDPA's dense T×S mask)
    for name in ["rope", "none", "learned", "alibi"]:
        want = ("sdpa", "flex") if hook(name).score_kind == "none" else ("sdpa_bias", "flex")
        assert kernels(name, documents=True) == want, name
    assert kernels("rope", head_dim=8, documents=True) == ("sdpa", "sdpa")
    assert kernels("cope", documents=True) == ("reference", "reference")


def test_shaw_value_term_matches_the_definition():
    """z_i = Σ_j α_ij (v_j + R^V[clip(i − j, −k, k)]): the bucketed value term equals the direct sum."""
    pos = hook("shaw", max_distance=3)
    T, S, q_pos, k_pos, mask = CASES["cached"]
    probs = torch.softmax(torch.randn(B, H, T, S), -1)
    idx = (q_pos[:, :, None] - k_pos[:, None, :]).clamp(-3, 3) + 3  # (B, T, S)
    want = torch.einsum("bhts,btsd->bhtd", probs, pos.rel_v[idx])
    assert torch.allclose(pos.value(probs, q_pos, k_pos), want, atol=1e-6)


def test_encodings_declare_the_kernel_they_need():
    """What the ladder routes by (never by name): these are bias terms (SDPA with the bias as mask on CPU, Flex on
    CUDA); CoPE reads the logits and Shaw's value term the probabilities, so both take the reference."""
    assert set(BIAS) >= {"alibi", "t5", "kerple", "fire", "shaw", "transformer_xl", "deberta"}
    assert hook("cope").score_kind == "full"
    assert hook("shaw").has_value_term and not hook("shaw", values=False).has_value_term


@pytest.mark.slow  # ~4 s of inductor compile per encoding
@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
@pytest.mark.parametrize("name", BIAS + [f"{n}/copies" for n in LEARNED_TABLES])
def test_compiled_flex_on_cpu_equals_reference(name, monkeypatch):
    """The compiled FlexAttention path — dynamo tracing each score_mod with its captured tables (or their copies),
    inductor lowering it, the compiled document BlockMask — on CPU, forward only: FlexAttention has no CPU backward
    (inductor fails with "IndexError: tuple index out of range" when a captured table requires grad;
    pytorch/pytorch#148752, #169646), so this runs under no_grad. The CUDA kernel and its backward are ``-m gpu``'s
    (below)."""
    name = strip_copies(name, monkeypatch)
    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case(name, "packed", seed=3)
    with torch.no_grad():
        want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
        got = flex_attention_with_score_mod(q, k, v, pos.score_mod(q, k, q_pos, k_pos), mask,
                                            pos.softmax_scale(DH), compiled=True)  # fmt: skip
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
@pytest.mark.parametrize("name", BIAS)
@pytest.mark.parametrize("case", ["plain", "packed"])  # the cached causal BlockMask, and a document BlockMask
def test_flex_path_traces_as_one_graph_inside_a_compiled_model(name, case):
    """With train.compile on a GPU, dynamo traces the Flex path of every layer inside the compiled loss: the
    score_mod with its captured tables and the BlockMask must not break the graph (a break splits every layer's
    kernel and is where recompiles start). Checked on CPU by dynamo alone (``explain`` runs no inductor), with
    Lightning imported as train.py has it: Lightning wraps ``torch.compile`` in a function dynamo cannot trace."""
    import lightning  # noqa: F401

    pos, (q, k, v), (q_pos, k_pos, mask) = key_term_case(name, case, seed=1)

    def attend(q, k, v, q_pos, k_pos):
        score_mod = pos.score_mod(q, k, q_pos, k_pos)
        return flex_attention_with_score_mod(q, k, v, score_mod, mask, pos.softmax_scale(DH), compiled=True)

    torch._dynamo.reset()
    with torch.no_grad():  # FlexAttention has no CPU backward
        explained = torch._dynamo.explain(attend)(q, k, v, q_pos, k_pos)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # the CPU stand-in, eager
def test_decoding_steps_take_sdpa_with_the_bias_not_flex(monkeypatch):
    """On CUDA a prompt goes through FlexAttention, but a KV-cache decoding step (one query against a key length
    that grows every token) takes SDPA with the bias: FlexAttention's kernel, static per shape, compiled once per
    key length — every token of the first eight, then dynamo's recompile limit sent it to the eager kernel.
    Routed as on CUDA (``kernel`` says "flex"); the decoded logits stay those of the whole sequence at once."""
    import minilm.model.attention as attention
    import minilm.model.flex as flex
    from minilm.model.cache import KVCache

    from .helpers import tiny_model

    real_kernel, taken = attention.Attention.kernel, []
    monkeypatch.setattr(attention.Attention, "kernel",
                        lambda self, device, documents=False:
                        "flex" if real_kernel(self, device) == "sdpa_bias" else "?")  # fmt: skip
    for module, fn in ((flex, "flex_attention_with_score_mod"), (attention, "sdpa_bias_attention")):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, _fn=fn, _real=real, **kw: taken.append(_fn) or _real(*a, **kw))
    model = tiny_model("alibi")
    idx = torch.randint(0, 61, (1, 19))
    with torch.no_grad():  # (FlexAttention has no CPU backward)
        whole = model(idx)
        cache = KVCache.for_model(model)
        prompt = model(idx[:, :17], cache=cache)
        steps = [model(idx[:, t : t + 1], cache=cache) for t in (17, 18)]
    layers = len(model.blocks)
    assert taken == ["flex_attention_with_score_mod"] * 2 * layers + ["sdpa_bias_attention"] * 2 * layers
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
def test_document_masked_rope_on_flex_traces_as_one_graph():
    """As the bias encodings' Flex path above: RoPE's rotation and FlexAttention with the document BlockMask and no
    score_mod trace as one graph inside a compiled model (dynamo alone, on CPU)."""
    import lightning  # noqa: F401

    pos = hook("rope")
    T, S, q_pos, k_pos, mask = CASES["packed"]

    def attend(q, k, v):
        q, k = pos.rotate(q, k, q_pos, k_pos)
        return flex_attention_with_score_mod(q, k, v, None, mask, pos.softmax_scale(DH), compiled=True)

    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(attend)(*qkv(T, S, seed=7))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # the CPU stand-in, eager
def test_document_masked_rope_takes_flex_on_cuda(monkeypatch):
    """RoPE with packed documents on CUDA: FlexAttention with the document BlockMask (blocks between documents
    skipped, memory linear in T), where SDPA took the dense (B, 1, T, S) boolean mask — no flash kernel, T² bytes.
    Without documents, and for decoding steps, SDPA as before. Routed as on CUDA; the logits stay the same."""
    import minilm.model.attention as attention
    import minilm.model.flex as flex

    from .helpers import tiny_model

    taken = []
    monkeypatch.setattr(attention.Attention, "_flex_runs_on", lambda self, device: True)
    for module, fn in ((flex, "flex_attention_with_score_mod"), (attention, "sdpa_attention")):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, _fn=fn, _real=real, **kw: taken.append(_fn) or _real(*a, **kw))
    model = tiny_model("rope")
    idx = torch.randint(0, 61, (2, 20))
    docs = torch.tensor([[0] * 7 + [1] * 13, [0] * 20])
    positions = torch.stack([torch.cat([torch.arange(7), torch.arange(13)]), torch.arange(20)])
    with torch.no_grad():  # (FlexAttention has no CPU backward)
        got = model(idx, positions, docs)
        layers = len(model.blocks)
        assert taken == ["flex_attention_with_score_mod"] * layers
        taken.clear()
        model(idx)
        model(idx[:, :9], positions[:, :9], docs[:, :9])  # (under FLEX_MIN_QUERIES: a decoding step's size)
        assert taken == ["sdpa_attention"] * 2 * layers
        monkeypatch.undo()
        torch.testing.assert_close(got, model(idx, positions, docs), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
def test_document_block_mask_is_built_once_per_forward():
    """Every layer of a forward gets the same AttentionMask: the eager path builds its BlockMask once, not per
    layer (each build evaluates the rule over the whole (B, T, S) grid)."""
    from minilm.model.flex import block_mask

    T, S, _, _, mask = CASES["packed"]
    first = block_mask(mask, B, T, S, torch.device("cpu"))
    assert block_mask(mask, B, T, S, torch.device("cpu")) is first
    fresh = AttentionMask(q_doc=mask.q_doc.clone(), k_doc=mask.k_doc.clone())  # the next forward's mask
    assert block_mask(fresh, B, T, S, torch.device("cpu")) is not first


@pytest.mark.slow  # create_block_mask's compiled kernel: seconds of inductor on CPU
@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
def test_compiled_document_block_mask_equals_uncompiled():
    """On CUDA the eager path builds document masks with create_block_mask's compiled kernel (block by block, not
    the whole grid at once): the blocks must be the uncompiled build's. 3 x 3 blocks of 128, documents of 100
    and 200 tokens and the rest, so there are full, partial and empty blocks."""
    from minilm.model.flex import document_block_mask

    T = 384
    docs = torch.tensor([[0] * 100 + [1] * 200 + [2] * 84, [0] * 250 + [1] * 134])
    mask = AttentionMask(q_doc=docs, k_doc=docs)
    want = document_block_mask(mask, 2, T, T, "cpu")
    with warnings.catch_warnings():  # not through create_block_mask's deprecated _compile flag
        warnings.filterwarnings("error", message=".*_compile flag", category=DeprecationWarning)
        got = document_block_mask(mask, 2, T, T, "cpu", compile=True)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
def test_causal_block_mask_on_cuda_is_built_by_the_compiled_builder(monkeypatch):
    """An eager model on CUDA (bench_attention.py's core, train.compile off) built its causal BlockMask with the
    uncompiled create_block_mask, which evaluates the rule on the whole (T, S) grid: ~10 bytes per element at once,
    10 GB at 32K (counted in the attn part's peak memory as if the kernel needed it) and 160 GB at 128K. On CUDA it
    is now built by the compiled builder, as document masks are; on CPU (no FlexAttention in training) as before."""
    import minilm.model.flex as flex

    built = []
    monkeypatch.setattr(flex, "_compiled_create_block_mask",
                        lambda: lambda *a, device, **kw: built.append(device) or "compiled build")  # fmt: skip
    flex._causal_block_mask.cache_clear()
    try:
        assert flex.block_mask(AttentionMask(), 1, 300, 300, torch.device("cuda")) == "compiled build"
        assert built == ["cuda"]
        assert flex.block_mask(AttentionMask(), 1, 300, 300, torch.device("cpu")) != "compiled build"
    finally:
        flex._causal_block_mask.cache_clear()  # (the stub's result must not stay cached)


@pytest.mark.slow  # create_block_mask's compiled kernel: seconds of inductor on CPU
@pytest.mark.skipif(not flex_attention_available(), reason="torch without FlexAttention")
def test_compiled_causal_block_mask_equals_uncompiled():
    """The compiled build of the causal mask (CUDA's) has the uncompiled one's blocks, at lengths that are no
    multiple of 128 and with cached keys before the queries."""
    from minilm.model.flex import _causal_block_mask

    want = _causal_block_mask.__wrapped__(300, 377, 77, "cpu")
    got = _causal_block_mask.__wrapped__(300, 377, 77, "cpu", compile=True)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def odd_length_case(name, seed, S=300, head_dim=16):
    """A FlexAttention check at a length that is no multiple of its 128-wide blocks, with heads 16 wide (the CUDA
    kernel's least: ``FLEX_MIN_HEAD_DIM``; the CPU cases' 8 fail to compile there) and two documents per row, whose
    positions restart: (encoding, (q, k, v), (q_pos, k_pos, mask)), on CPU."""
    pos = hook(name, head_dim=head_dim, **PARAMS.get(name, {}))
    if pos.has_value_term:  # as key_term_case: the value term lives on the reference path only
        pos.has_value_term, pos.rel_v = False, None
    idx = torch.arange(S)
    docs = torch.stack([(idx >= cut).long() for cut in (100, 213)])  # (B, S), a boundary inside a block
    positions = torch.stack([torch.where(idx >= cut, idx - cut, idx) for cut in (100, 213)])
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, S, head_dim, generator=g) for h in (H, HKV, HKV))
    return pos, (q, k, v), (positions, positions, AttentionMask(q_doc=docs, k_doc=docs))


@pytest.mark.gpu
@pytest.mark.parametrize("name", BIAS + [f"{n}/copies" for n in LEARNED_TABLES])
def test_compiled_flex_on_cuda_equals_reference(name, monkeypatch):
    """The CUDA kernel, forward and backward: the gradients of q, k, v and of the encoding's own parameters
    (reached through the tables the score_mod captures, or their copies) equal the reference path's — with
    partial blocks and document boundaries inside blocks (``odd_length_case``)."""
    from minilm.model.flex import FLEX_MIN_HEAD_DIM

    name = strip_copies(name, monkeypatch)
    torch._dynamo.reset()  # this encoding's kernel compiled, not an eager fallback past the recompile limit
    pos, (q, k, v), (q_pos, k_pos, mask) = odd_length_case(name, seed=3, head_dim=FLEX_MIN_HEAD_DIM)
    pos, q_pos, k_pos = pos.cuda(), q_pos.cuda(), k_pos.cuda()
    q, k, v = (t.detach().cuda().requires_grad_() for t in (q, k, v))
    mask = AttentionMask(q_doc=mask.q_doc.cuda(), k_doc=mask.k_doc.cuda())
    want = reference_attention(q, k, v, pos, q_pos, k_pos, mask)
    got = flex_attention_with_score_mod(q, k, v, pos.score_mod(q, k, q_pos, k_pos), mask,
                                        pos.softmax_scale(q.shape[-1]))  # fmt: skip
    assert torch.allclose(got, want, atol=1e-4)
    grads_agree(got, want, [q, k, v, *pos.parameters()], atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in BIAS if not hook(n).score_reads_qk] + ["t5/split", "kerple/forwards"])
def test_the_cuda_kernel_compiles_at_the_benchmarks_shape_in_bf16(name):
    """The CUDA kernel, forward and backward, at configs/gpt2_small.yaml's shape: 12 heads of 64 in bf16, 1K tokens,
    through the attention layer's kernel ladder, as scripts/bench_attention.py runs it. The fp32 cases above, 16
    wide, take smaller kernel blocks, and passed where FIRE (and T5 in parts) here asked for more shared memory
    than an H100 has ("No valid triton configs. OutOfMemoryError: out of resource"; ``SMALL_FLEX_BLOCKS``). (The
    encodings whose score reads q and k build their tables in the layer's forward, before ``attend``.)"""
    encoding, _, form = name.partition("/")
    torch._dynamo.reset()
    torch.manual_seed(0)
    heads, head_dim, T = 12, 64, 1024
    attn = Attention(heads * head_dim, heads, heads, {"name": encoding},
                     PositionDims(heads * head_dim, heads, heads, head_dim, 1, 0)).cuda()  # fmt: skip
    if form:
        setattr(attn.pos, {"split": "flex_split", "forwards": "flex_coefficient_forwards"}[form], True)
    assert attn.kernel(torch.device("cuda"), documents=False) == "flex"
    q, k, v = (torch.randn(2, heads, T, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))  # fmt: skip
    positions, mask = torch.arange(T, device="cuda").unsqueeze(0), AttentionMask()
    got = attn.attend(q, k, v, positions, positions, mask)
    want = reference_attention(q.float(), k.float(), v.float(), attn.pos, positions, positions, mask)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    got.float().square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.pos.parameters() if p.requires_grad)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_the_cuda_kernel_takes_an_odd_head_width(name):
    """An odd head width is allowed since a9c7c43 for every encoding that rotates no pair of dimensions (head width 17:
    model.d_model=68 model.n_heads=4): FlexAttention's CUDA kernel, forward and backward, with document masks, against
    the reference. (torch's kernel rounds a head width up to its blocks; not run on a GPU when the rule changed.)"""
    torch._dynamo.reset()
    torch.manual_seed(0)
    heads, head_dim, T = 4, 17, 256
    attn = Attention(heads * head_dim, heads, heads, {"name": name},
                     PositionDims(heads * head_dim, heads, heads, head_dim, 1, 0)).cuda()  # fmt: skip
    assert attn.kernel(torch.device("cuda"), documents=True) == "flex"
    q, k, v = (torch.randn(2, heads, T, head_dim, device="cuda", requires_grad=True) for _ in range(3))
    positions = torch.arange(T, device="cuda").unsqueeze(0)
    docs = (torch.arange(T, device="cuda") >= 100).long().unsqueeze(0).expand(2, -1)  # two documents a row
    mask = AttentionMask(q_doc=docs, k_doc=docs)
    got = attn.attend(q, k, v, positions, positions, mask)
    want = reference_attention(q, k, v, attn.pos, positions, positions, mask)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    got.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.gpu
def test_document_masked_rope_on_cuda_equals_reference():
    """The CUDA kernel with the document BlockMask and no score_mod (RoPE with packed documents), forward and
    backward, against the reference's dense mask: partial blocks, boundaries inside blocks."""
    from minilm.model.flex import FLEX_MIN_HEAD_DIM

    torch._dynamo.reset()
    _, (q, k, v), (q_pos, k_pos, mask) = odd_length_case("alibi", seed=6, head_dim=FLEX_MIN_HEAD_DIM)
    pos = hook("rope", head_dim=FLEX_MIN_HEAD_DIM).cuda()
    q_pos, k_pos = q_pos.cuda(), k_pos.cuda()
    q, k, v = (t.detach().cuda().requires_grad_() for t in (q, k, v))
    mask = AttentionMask(q_doc=mask.q_doc.cuda(), k_doc=mask.k_doc.cuda())
    rq, rk = pos.rotate(q, k, q_pos, k_pos)
    want = reference_attention(rq, rk, v, pos, q_pos, k_pos, mask)
    got = flex_attention_with_score_mod(rq, rk, v, None, mask, pos.softmax_scale(q.shape[-1]))
    assert torch.allclose(got, want, atol=1e-4)
    grads_agree(got, want, [q, k, v], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_rotary_tables_are_computed_once_per_layer_for_a_shared_batch(name, monkeypatch):
    """Training passes one (1, T) position row for the whole batch and the keys are the queries: each layer
    computes its cos/sin tables once, at (1, T) — not once per row and once each for q and k (the profile showed
    that recomputation as ~10 % of a CPU step). The outputs stay those of batch-expanded positions."""
    from minilm.positions.rotary import Rope

    from .helpers import tiny_model

    model = tiny_model(name)
    calls = []
    original = Rope.cos_sin

    def counting(self, positions, seq_len):
        calls.append(tuple(positions.shape))
        return original(self, positions, seq_len)

    idx = torch.randint(0, 61, (3, 16))
    expanded = model(idx, positions=torch.arange(16).expand(3, -1))  # per-row positions: tables per row
    monkeypatch.setattr(Rope, "cos_sin", counting)
    out = model(idx)
    assert calls == [(1, 16)] * len(model.blocks)
    torch.testing.assert_close(out, expanded)


def rotary_case(dtype, dr, batch_positions, device="cpu", Dh=16, T=10):
    """q (B, H, T, Dh) in ``dtype``, a transposed view as attention makes it, and fp32 (cos, sin) of Dr/2 = dr/2
    frequencies (attention factor 1.3) at positions shared by the batch (1, T) or per row (B, T)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, H, Dh, generator=g).to(device, dtype).transpose(1, 2).requires_grad_()
    positions = torch.randint(0, 100, (B if batch_positions else 1, T), generator=g).to(device)
    inv_freq = 1.0 / 100.0 ** (torch.arange(0, dr, 2, device=device).float() / dr)
    return x, cos_sin_tables(positions, inv_freq, 1.3)


def takes_the_function(y) -> bool:
    return getattr(y.grad_fn, "_forward_cls", None) is _Rotary


@pytest.mark.parametrize("batch_positions", [False, True], ids=["shared", "per-row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dr", [16, 6], ids=["full", "partial"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_cpu_rotary_function_equals_the_composition(layout, dr, dtype, batch_positions):
    """On CPU in eager mode ``apply_rotary`` takes ``_Rotary``, whose output and gradient (the inverse rotation)
    equal the composition's, in x's dtype; the pass-through dims and their gradient are copied exactly. In bf16
    the gradients are compared with the composition in float64 (its exact value): in bf16 the composition rounds
    the gradient's two terms before it adds them, the Function rounds once, the closer of the two."""
    x, (cos, sin) = rotary_case(dtype, dr, batch_positions)
    y = apply_rotary(x, cos, sin, layout)
    assert takes_the_function(y) and y.dtype == dtype
    torch.testing.assert_close(y, rotary_by_ops(x, cos, sin, layout))
    x64 = x.detach().double().requires_grad_()
    want = rotary_by_ops(x64, cos.double(), sin.double(), layout)
    torch.testing.assert_close(y, want.to(dtype))
    out_grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (got,), (want,) = torch.autograd.grad(y, x, out_grad), torch.autograd.grad(want, x64, out_grad.double())
    assert got.dtype == dtype
    torch.testing.assert_close(got, want.to(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(got, torch.autograd.grad(rotary_by_ops(x, cos, sin, layout), x, out_grad)[0])
    assert torch.equal(y[..., dr:], x[..., dr:]) and torch.equal(got[..., dr:], out_grad[..., dr:])


@pytest.mark.parametrize("why", ["tables with a gradient", "compiling", "not on CPU"])
def test_rotary_takes_the_composition_where_the_function_does_not_apply(why, monkeypatch):
    """Tables with a gradient (a learned or tensor factor) get it from the composition (the Function gives them
    none); compiled graphs (inductor fuses the composition) and other devices (CUDA: measured so; here the meta
    device stands for it) keep the composition. The same call on CPU, eagerly, takes the Function."""
    x, (cos, sin) = rotary_case(torch.float32, 16, False)
    assert takes_the_function(apply_rotary(x, cos, sin, "half"))
    if why == "tables with a gradient":
        factor = torch.tensor(1.0, requires_grad=True)
        y = apply_rotary(x, cos * factor, sin * factor, "half")
        y.sum().backward()
        assert factor.grad is not None
    else:
        if why == "compiling":
            monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        else:
            x, cos, sin = x.to("meta"), cos.to("meta"), sin.to("meta")
        y = apply_rotary(x, cos, sin, "half")
    assert not takes_the_function(y)


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional",
                         [(32, 128, False), (32, 128, True), (2, 2, False), (4, 3, True), (64, 3224, True),
                          (8, HUGE_T5_DISTANCE, False)])  # fmt: skip
def test_t5_buckets_match_transformers_relative_position_bucket(num_buckets, max_distance, bidirectional):
    """``T5Bias.buckets`` (one search of bucket_starts per distance) and the score_mod's ``kernel_buckets``
    (a comparison per threshold) give every distance the bucket of transformers' ``_relative_position_bucket``
    (Raffel et al. 2020; relative_position = j − i = −d), far past max_distance too, on CPU."""
    t5_reference = pytest.importorskip("transformers.models.t5.modeling_t5").T5Attention._relative_position_bucket
    pos = hook("t5", num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    d = torch.cat([torch.arange(-5000, 5000), torch.tensor([-(2**40), 2**40, 10**15, 2**62])])
    want = t5_reference(-d, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert torch.equal(pos.buckets(d), want)
    assert torch.equal(pos.buckets(d.view(2, 1, -1, 1)), want.view(2, 1, -1, 1))  # any shape, (B, 1, T, S) too
    assert torch.equal(pos.kernel_buckets(d), want)
