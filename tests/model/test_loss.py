"""Memory savers change nothing: chunked LM head + cross-entropy == the plain loss (values and gradients), and
activation checkpointing gives the same gradients."""

import pytest
import torch

from minilm.config import load_config
from minilm.model import GPT
from minilm.model.loss import chunked_cross_entropy, plain_cross_entropy

V = 97


def _inputs(N=23, D=16, ignore=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g, dtype=torch.float64).float().requires_grad_()
    w = (0.3 * torch.randn(V, D, generator=g)).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    if ignore:
        t[::5] = -100
    return h, w, t


def _grads(fn, h, w, t, **kw):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fn(h, w, t, **kw)
    upstream = torch.linspace(0.5, 1.5, loss.numel()).view_as(loss) if loss.dim() else torch.tensor(1.7)
    (loss * upstream).sum().backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("compiled_form", [False, True])  # gather/scatter_add eagerly, compares in a compiled graph
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [1, 4, 7, 23, 64])  # 7 does not divide 23: a ragged last chunk
def test_chunked_equals_plain(reduction, chunk, compiled_form, monkeypatch):
    if compiled_form:  # the form torch.compile traces, run eagerly
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    h, w, t = _inputs()
    ref = _grads(plain_cross_entropy, h, w, t, reduction=reduction)
    got = _grads(chunked_cross_entropy, h, w, t, chunk_size=chunk, reduction=reduction)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_chunked_no_grad_and_batched_shape():
    h, w, t = _inputs(N=24)
    with torch.no_grad():
        a = chunked_cross_entropy(h.view(2, 12, -1), w, t.view(2, 12), 5, reduction="none")
        b = plain_cross_entropy(h.view(2, 12, -1), w, t.view(2, 12), reduction="none")
    assert a.shape == (2, 12)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_chunked_all_ignored_is_nan_like_plain():
    h, w, t = _inputs(N=6)
    t[:] = -100
    assert torch.isnan(chunked_cross_entropy(h, w, t, 4)) and torch.isnan(plain_cross_entropy(h, w, t))


def test_chunked_rejects_bad_arguments():
    h, w, t = _inputs(N=4)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_cross_entropy(h, w, t, 0)
    with pytest.raises(ValueError, match="reduction"):
        chunked_cross_entropy(h, w, t, 2, reduction="max")


@pytest.mark.parametrize("bad", [-1, -5, "V"])
def test_chunked_refuses_an_out_of_range_target_as_plain_does(bad):
    """A target outside [0, V) that is not -100: the plain path raises; the chunked one read a negative target
    as class 0 and returned a loss."""
    h, w, t = _inputs(N=6)
    t[2] = w.shape[0] if bad == "V" else bad
    with pytest.raises(IndexError):
        plain_cross_entropy(h, w, t)
    with pytest.raises(RuntimeError, match=r"target is out of bounds; targets must lie in \[0, \d+\) or be -100"):
        chunked_cross_entropy(h, w, t, 4)


def test_chunked_under_bf16_autocast_matches_plain():
    """Under autocast both paths run the head matmul in bf16 and the softmax in fp32."""
    h, w, t = _inputs(N=32, D=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _grads(plain_cross_entropy, h, w, t)
        got = _grads(chunked_cross_entropy, h, w, t, chunk_size=8)
    assert got[1].dtype == torch.float32 and got[2].dtype == torch.float32  # grads of the fp32 leaves
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_bf16_weight_gradient_is_summed_over_chunks_in_fp32(reduction):
    """grad_weight sums one (V, D) term per chunk; in fp32 (loss.py), then rounded to bf16 once. Summed in bf16 over
    256 one-row chunks it drifted by several bf16 steps from the fp32 gradient; rounded once it is within one."""
    h, w, t = _inputs(N=256, D=16, ignore=False)
    g32 = _grads(plain_cross_entropy, h, w, t, reduction=reduction)[2]  # the fp32 reference
    g16 = _grads(chunked_cross_entropy, h.bfloat16(), w.bfloat16(), t, chunk_size=1, reduction=reduction)[2]
    assert g16.dtype == torch.bfloat16
    assert (g16.float() - g32).abs().max() <= g32.abs().max() / 128  # one bf16 step (2^-7 relative) at the largest


def _model(*overrides):
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4", *overrides])
    torch.manual_seed(0)
    return GPT(cfg.model, V).train()


def _model_grads(model, x, y):
    model.zero_grad()
    loss = model.loss(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.loss_chunk_size=10"],
        ["model.activation_checkpointing=true"],
        ["model.activation_checkpointing=true", "model.loss_chunk_size=7", "model.tie_embeddings=false"],
        ["model.activation_checkpointing=true", "model.dropout=0.1"],  # recompute replays the dropout masks
        ["model.activation_checkpointing=true", "model.position.name=alibi"],  # a score-term encoding
    ],
)
def test_model_memory_savers_give_identical_loss_and_grads(overrides):
    x = torch.randint(0, V, (2, 20))
    y = torch.roll(x, -1, dims=1)
    y[:, -1] = -100
    plain_overrides = [o for o in overrides if o.startswith(("model.tie", "model.dropout", "model.position"))]
    torch.manual_seed(1)
    ref = _model_grads(_model(*plain_overrides), x, y)
    torch.manual_seed(1)
    got = _model_grads(_model(*overrides), x, y)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    assert got[1].keys() == ref[1].keys()
    for name in ref[1]:
        torch.testing.assert_close(got[1][name], ref[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_activation_checkpointing_only_in_training():
    """Eval and no-grad forwards take the plain loop (checkpointing would only cost time there)."""
    model = _model("model.activation_checkpointing=true").eval()
    x = torch.randint(0, V, (1, 8))
    with torch.no_grad():
        a = model(x)
    model.train()
    b = model(x)
    torch.testing.assert_close(a, b.detach())


def test_activation_checkpointing_checkpoints_each_block_of_a_training_forward_only(monkeypatch):
    """Only a training forward that builds a graph checkpoints (one call per block); an eval forward, even one with
    gradients enabled, and a no-grad training forward run the blocks plainly."""
    import minilm.model.transformer as transformer

    calls = []
    real = transformer.checkpoint
    monkeypatch.setattr(transformer, "checkpoint", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = _model("model.activation_checkpointing=true")
    x = torch.randint(0, V, (1, 8))
    model.eval()(x)
    with torch.no_grad():
        model.train()(x)
    assert calls == []
    model.train()(x)
    assert len(calls) == len(model.blocks)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_gpu_chunked_bf16_matches_plain_and_saves_memory():
    """On CUDA in bf16 autocast: same loss and grads as the plain path, and the (N, V) logits never whole."""
    torch.manual_seed(0)
    N, D, Vb = 8192, 256, 32768
    h = torch.randn(N, D, device="cuda", requires_grad=True)
    w = (0.02 * torch.randn(Vb, D, device="cuda")).requires_grad_()
    t = torch.randint(0, Vb, (N,), device="cuda")
    peaks, results = {}, {}
    paths = {"plain": lambda: plain_cross_entropy(h, w, t), "chunked": lambda: chunked_cross_entropy(h, w, t, 1024)}
    for name, fn in paths.items():
        h.grad = w.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn()
        loss.backward()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        results[name] = (loss.detach(), h.grad.clone(), w.grad.clone())
    for a, b in zip(results["chunked"], results["plain"]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-4)
    logits_fp32 = N * Vb * 4
    assert peaks["plain"] > logits_fp32 and peaks["chunked"] < logits_fp32 / 2, peaks


@pytest.mark.gpu
@cuda
def test_gpu_activation_checkpointing_saves_memory_same_grads():
    x = torch.randint(0, V, (4, 512), device="cuda")
    out = {}
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = GPT(
            load_config(overrides=["model.n_layers=4", "model.d_model=256", "model.n_heads=4",
                                   f"model.activation_checkpointing={str(ckpt).lower()}"]).model, V
        ).cuda().train()  # fmt: skip
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.loss(x, torch.roll(x, -1, 1))
        loss.backward()
        out[ckpt] = (torch.cuda.max_memory_allocated() - base, {n: p.grad for n, p in model.named_parameters()})
    assert out[True][0] < out[False][0]
    for name, g in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], g, rtol=1e-2, atol=1e-4, msg=name)
