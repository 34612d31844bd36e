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

    def fake_flex(q, k, v, score_mod, mask, scale, compiled=None, kernel_options=None):
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


# --- training on CPU in bf16: in fp32 where torch's bf16 backward is the slower (CPU_FP32_BACKWARD_BELOW), as plain
# matmul–softmax up to CPU_MATMUL_ATTENTION_UP_TO head widths, beyond, the flash kernel with its backward in fp32 ---


class _AttentionOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the CPU flash-attention kernel's calls (with the query dtype of its backward) and the softmax
    backward (``_CpuMatmulAttention``'s, by the dtype it computes in)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
            self.seen.append("flash")
        elif func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
            self.seen.append(("flash backward", args[1].dtype))
        elif func is torch.ops.aten._softmax_backward_data.default:
            self.seen.append(("softmax backward", args[3]))
        return func(*args, **(kwargs or {}))


def _qkv(B, H, Hkv, T, Dh, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, h, T, Dh, generator=g, dtype=dtype).requires_grad_() for h in (H, Hkv, Hkv)]


class _Scale:
    def softmax_scale(self, head_dim):
        return head_dim**-0.5


MATMUL = [("softmax backward", torch.float32)]
FLASH_FP32_BACKWARD = ["flash", ("flash backward", torch.float32)]
TORCH_BF16 = ["flash", ("flash backward", torch.bfloat16)]


# head width 32: up to T 128 = 4 · 32 the matmul attention, then up to T · 32 = 16K (T 512) the flash kernel with its
# backward in fp32, from there torch's bf16 backward
@pytest.mark.parametrize("T, ops", [(64, MATMUL), (128, MATMUL), (136, FLASH_FP32_BACKWARD), (504, FLASH_FP32_BACKWARD),
                                    (512, TORCH_BF16)])  # fmt: skip
def test_cpu_bf16_training_attention_takes_the_tier_of_its_length(T, ops):
    """Under bf16 autocast on CPU (projections in bf16, as a training step has them), with grouped-query heads: the
    tier of the documented boundaries (module docstring), and its ops alone."""
    assert attention.CPU_MATMUL_ATTENTION_UP_TO == 4 and attention.CPU_FP32_BACKWARD_BELOW == 16384
    q, k, v = _qkv(1, 4, 2, T, 32)
    with _AttentionOps() as rec:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attention.sdpa_attention(q, k, v, _Scale(), AttentionMask())
        assert out.dtype == torch.bfloat16
        out.float().sum().backward()
    assert rec.seen == ops
    assert all(t.grad.dtype == torch.float32 for t in (q, k, v))  # the inputs' dtype, through autocast's casts


def test_cpu_fp32_backward_is_not_taken_without_gradients_or_bf16():
    q, k, v = _qkv(1, 2, 2, 64, 32)
    assert not attention._cpu_backward_in_fp32(q, k, v)  # fp32 inputs, no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention._cpu_backward_in_fp32(q, k, v)
        with torch.no_grad():  # inference: torch's bf16 forward alone, the faster one
            assert not attention._cpu_backward_in_fp32(q, k, v)
            with _AttentionOps() as rec:
                attention.sdpa_attention(q, k, v, _Scale(), AttentionMask())
            assert rec.seen == ["flash"]  # not the matmul attention either


def _relative_error(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("mask", ["causal", "documents", "offset"])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_cpu_bf16_training_attention_equals_the_reference(mask, Hkv, monkeypatch):
    """Output and every gradient of each CPU bf16 training tier against the fp64 reference on the same bf16 inputs,
    causal, document-masked and after 5 cached keys (T < S), with grouped-query heads or without. The flash kernel
    with its backward in fp32: within bf16 rounding, and no less accurate than torch's bf16 backward (the path it
    replaces). The matmul attention: within 2 % of rounding the exact result to bf16, the least error a bf16 output
    can have, so no less accurate than either (which compute in bf16 in places: the flash kernel's forward, and the
    sum of a key head's gradients over its query heads after repeat_kv)."""
    T, Dh, offset = 48, 16, 5 if mask == "offset" else 0
    doc = torch.tensor([[0] * 20 + [1] * 28, [0] * 7 + [1] * 30 + [2] * 11])
    masks = {"causal": AttentionMask(), "documents": AttentionMask(q_doc=doc, k_doc=doc),
             "offset": AttentionMask(offset=offset)}  # fmt: skip
    q, _, _ = (t.detach().bfloat16() for t in _qkv(2, 4, Hkv, T, Dh))
    _, k, v = (t.detach().bfloat16() for t in _qkv(2, 4, Hkv, T + offset, Dh))
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]

    class Pos(_Scale):
        def score(self, *a):
            return None

        def value(self, *a):
            return None

    ref = attention.reference_attention(*ref_in, Pos(), None, None, masks[mask])
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).bfloat16()  # bf16, as autograd's
    ref_grads = torch.autograd.grad(ref, ref_in, grad.double())
    exact = (ref, *ref_grads)

    def errors(matmul_up_to, fp32_backward_below):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        with monkeypatch.context() as m:
            m.setattr(attention, "CPU_MATMUL_ATTENTION_UP_TO", matmul_up_to)
            m.setattr(attention, "CPU_FP32_BACKWARD_BELOW", fp32_backward_below)
            out = attention.sdpa_attention(*inputs, Pos(), masks[mask])
        grads = torch.autograd.grad(out, inputs, grad)
        assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
        got = (out, *grads)
        return [(a.double() - b).abs().max().item() for a, b in zip(got, exact)], [
            _relative_error(a, b) for a, b in zip(got, exact)
        ]

    (_, matmul), (flash_abs, flash) = errors(T // Dh, T * Dh + 1), errors(0, T * Dh + 1)
    torch_abs, torch_bf16 = errors(0, 0)
    assert max(flash_abs) < 0.05, flash_abs
    assert all(e <= 1.25 * t + 1e-3 for e, t in zip(flash_abs, torch_abs)), (flash_abs, torch_abs)
    rounded = [_relative_error(t.bfloat16(), t) for t in exact]  # bf16's own error on the exact values
    assert all(e <= 1.02 * r for e, r in zip(matmul, rounded)), (matmul, rounded)
    assert all(e <= min(f, t) for e, f, t in zip(matmul, flash, torch_bf16)), (matmul, flash, torch_bf16)


def test_cpu_matmul_attention_backward_inside_autocast():
    """A backward() called inside the bf16 autocast region (a loop that keeps the step under one ``with``) gives the
    same fp32 gradients: the Function's matmuls would otherwise run in bf16 there, and its fp32 softmax backward
    refused them (RuntimeError: expected scalar type BFloat16)."""
    grads = []
    for backward_inside in (False, True):
        q, k, v = _qkv(2, 4, 2, 32, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attention.sdpa_attention(q, k, v, _Scale(), AttentionMask())
            if backward_inside:
                out.float().square().sum().backward()
        if not backward_inside:
            out.float().square().sum().backward()
        grads.append([t.grad for t in (q, k, v)])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("B, H, T, blocks", [(16, 12, 1024, 1), (1, 12, 32768, 52), (2, 4, 4096, 1)])
def test_off_cpu_query_blocks_bound_the_scores_not_the_length(B, H, T, blocks):
    """Off CPU the bias and reference rungs and the training-free methods ran ``in_query_blocks`` as one call at any
    length: an evaluation at 32K tokens with ReRoPE, Self-Extend or DCA (or CoPE) built (B, H, T, S) fp32 matrices of
    48 GB each at 12 heads. They still take one call while the scores fit in ``QUERY_BLOCK_BYTES`` (a training step
    at 1K, batch 16), and past it blocks of a multiple of 128 queries, each against the keys it can see, that hold
    no more than that. Shapes only, on the meta device (which is not CPU)."""
    seen = []

    def attend(q, k, v, pos, q_pos, k_pos, mask):
        seen.append((q.shape[2], k.shape[2], mask.offset))
        return torch.empty(q.shape[:3] + (v.shape[-1],), device=q.device)

    q = torch.empty(B, H, T, 8, device="meta")
    k = v = torch.empty(B, H // 2, T, 8, device="meta")
    pos = torch.arange(T, device="meta")[None]
    out = attention.in_query_blocks(attend, q, k, v, None, pos, pos, AttentionMask())
    assert out.shape == (B, H, T, 8) and len(seen) == blocks
    assert sum(t for t, _, _ in seen) == T
    for t, s, offset in seen:
        assert s == offset + t  # against the keys up to the block's last query
        assert blocks == 1 or (4 * B * H * t * s <= attention.QUERY_BLOCK_BYTES and t % 128 in (0, T % 128))
