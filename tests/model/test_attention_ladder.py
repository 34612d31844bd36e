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


# --- SDPA on CPU in bf16: the backward in fp32 where torch's bf16 one is the slower (CPU_FP32_BACKWARD_BELOW) ---


class _BackwardDtypes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the query dtype of every call of the CPU flash-attention backward."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
            self.seen.append(args[1].dtype)
        return func(*args, **(kwargs or {}))


def _qkv(B, H, Hkv, T, Dh, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, h, T, Dh, generator=g, dtype=dtype).requires_grad_() for h in (H, Hkv, Hkv)]


class _Scale:
    def softmax_scale(self, head_dim):
        return head_dim**-0.5


@pytest.mark.parametrize("T, backward", [(64, torch.float32), (512, torch.bfloat16)])  # T · 32 = 2K, 16K
def test_cpu_bf16_sdpa_takes_its_backward_in_fp32_below_the_threshold(T, backward):
    """Under bf16 autocast on CPU (projections in bf16, as a training step has them), a short sequence's attention
    backward runs on fp32 copies; from T · head width = CPU_FP32_BACKWARD_BELOW on, torch's bf16 backward."""
    assert attention.CPU_FP32_BACKWARD_BELOW == 16384  # the boundary the parameters straddle
    q, k, v = _qkv(1, 2, 2, T, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention.sdpa_attention(q, k, v, _Scale(), AttentionMask())
    assert out.dtype == torch.bfloat16
    with _BackwardDtypes() as rec:
        out.float().sum().backward()
    assert rec.seen == [backward]


def test_cpu_fp32_backward_is_not_taken_without_gradients_or_bf16():
    q, k, v = _qkv(1, 2, 2, 64, 32)
    assert not attention._cpu_backward_in_fp32(q, k, v)  # fp32 inputs, no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention._cpu_backward_in_fp32(q, k, v)
        with torch.no_grad():  # inference: torch's bf16 forward alone, the faster one
            assert not attention._cpu_backward_in_fp32(q, k, v)


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_cpu_fp32_backward_equals_the_reference(documents, Hkv):
    """Output and every gradient of the bf16-forward, fp32-backward path against the fp64 reference on the same
    bf16 inputs: within bf16 rounding, and no less accurate than torch's bf16 backward (the path it replaces);
    causal and document-masked, with grouped-query heads or without."""
    T, Dh = 48, 16
    doc = torch.tensor([[0] * 20 + [1] * 28, [0] * 7 + [1] * 30 + [2] * 11])
    mask = AttentionMask(q_doc=doc, k_doc=doc) if documents else AttentionMask()
    q, k, v = (t.detach().bfloat16() for t in _qkv(2, 4, Hkv, T, Dh))
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]

    class Pos(_Scale):
        def score(self, *a):
            return None

        def value(self, *a):
            return None

    ref = attention.reference_attention(*ref_in, Pos(), None, None, mask)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, ref_in, grad)

    def errors(fp32_backward_below):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        old, attention.CPU_FP32_BACKWARD_BELOW = attention.CPU_FP32_BACKWARD_BELOW, fp32_backward_below
        try:
            out = attention.sdpa_attention(*inputs, Pos(), mask)
        finally:
            attention.CPU_FP32_BACKWARD_BELOW = old
        grads = torch.autograd.grad(out, inputs, grad.bfloat16())
        assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
        return [(a.double() - b).abs().max().item() for a, b in zip((out, *grads), (ref, *ref_grads))]

    ours, torch_bf16 = errors(T * Dh + 1), errors(0)
    assert max(ours) < 0.05, ours
    assert all(e <= 1.25 * t + 1e-3 for e, t in zip(ours, torch_bf16)), (ours, torch_bf16)
