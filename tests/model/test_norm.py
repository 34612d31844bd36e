"""RMSNorm (minilm/model/norm.py): on CPU in eager mode its hand-written backward, which must equal torch's
composition (values and gradients); compiled graphs and other devices keep the composition; the parameter and the
state dict are nn.RMSNorm's."""

import pytest
import torch
from torch import nn

from minilm.config import load_config
from minilm.model import GPT
import minilm.model.norm as norm_module
from minilm.model.norm import RMSNorm

FAST = "_RMSNormFunctionBackward"  # the grad_fn of the hand-written path
TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: {}}


def _pair(D: int, dtype, eps, affine: bool):
    """minilm's RMSNorm and torch's, with the same random weight (not ones, so a missing or misplaced w shows)."""
    ours = RMSNorm(D, eps=eps, elementwise_affine=affine, dtype=dtype)
    ref = nn.RMSNorm(D, eps=eps, elementwise_affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            ours.weight.copy_(1 + 0.5 * torch.randn(D, dtype=torch.float64))
            ref.weight.copy_(ours.weight)
    return ours, ref


def _forward_backward(norm, x: torch.Tensor, g: torch.Tensor):
    x = x.clone().requires_grad_()
    y = norm(x)
    y.backward(g)
    return y, x.grad, None if norm.weight is None else norm.weight.grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 5, 16), (7, 3), (3, 33), (2, 2, 3, 128)])
@pytest.mark.parametrize("eps", [None, 1e-5, 0.5])
@pytest.mark.parametrize("affine", [True, False])
def test_equals_torch_composition(dtype, shape, eps, affine):
    """Output (same dtype) and the gradients of input and weight equal nn.RMSNorm's autograd composition: fp64 and
    fp32 tightly, bf16 within its rounding (the composition rounds to bf16 in between; the hand-written backward
    computes in fp32). eps 0.5 and inputs of scale 0.3: eps changes the result, so its handling shows."""
    torch.manual_seed(0)
    ours, ref = _pair(shape[-1], dtype, eps, affine)
    x = (0.3 * torch.randn(shape, dtype=torch.float64)).to(dtype)
    g = torch.randn(shape, dtype=torch.float64).to(dtype)
    got, want = _forward_backward(ours, x, g), _forward_backward(ref, x, g)
    assert got[0].grad_fn.name() == FAST and want[0].grad_fn.name() != FAST
    assert got[0].dtype == want[0].dtype == dtype
    for name, a, b in zip(["output", "input grad", "weight grad"], got, want):
        if b is None:
            assert a is None, name
        else:
            assert a.dtype == b.dtype, name
            torch.testing.assert_close(a, b, **TOL[dtype], msg=name)


def test_in_the_model_under_bf16_autocast():
    """Every norm of a GPT is minilm's and takes the hand-written path in a CPU bf16-mixed training step; the
    residual stream is fp32 there, and autocast leaves rms_norm alone: the output stays fp32, as nn.RMSNorm's."""
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4"])
    model = GPT(cfg.model, 97).train()
    norms = [m for m in model.modules() if isinstance(m, nn.RMSNorm)]
    assert len(norms) == 5 and all(type(m) is RMSNorm for m in norms)
    seen = []
    for m in norms:
        m.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype, out.grad_fn.name())))
    x = torch.randint(0, 97, (2, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.loss(x, x).backward()
    assert seen == [(torch.float32, torch.float32, FAST)] * 5


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # torch's, for the mixed case
def test_composition_where_not_cpu_eager():
    """Compiled (dynamo's graph calls rms_norm, no autograd Function), on another device (meta stands in for CUDA)
    and with a weight in another dtype than the input (torch promotes), the module is nn.RMSNorm's forward."""
    norm = RMSNorm(16, eps=1e-5)
    x = torch.randn(2, 16, requires_grad=True)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(norm)(x)
    code = "\n".join(m.code for g in explained.graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule))
    assert "rms_norm" in code and "autograd_function_apply" not in code

    meta = RMSNorm(16, eps=1e-5, device="meta")
    assert meta(torch.empty(2, 16, device="meta", requires_grad=True)).grad_fn.name() != FAST

    mixed = RMSNorm(16, eps=1e-5, dtype=torch.bfloat16)
    y = mixed(x)
    assert y.grad_fn.name() != FAST
    torch.testing.assert_close(y, nn.functional.rms_norm(x, [16], mixed.weight, 1e-5))


@pytest.mark.parametrize("affine", [True, False])
def test_state_dict_is_nn_rmsnorms(affine):
    """Same parameters, state dict and repr as nn.RMSNorm: checkpoints and the Hugging Face export read the norms by
    these names, and either module loads the other's state."""
    ours, ref = _pair(8, torch.float32, 1e-5, affine)
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [(k, v.shape) for k, v in ref.state_dict().items()]
    assert [n for n, _ in ours.named_buffers()] == [] and repr(ours) == repr(ref)
    nn.RMSNorm(8, eps=1e-5, elementwise_affine=affine).load_state_dict(ours.state_dict())
    RMSNorm(8, eps=1e-5, elementwise_affine=affine).load_state_dict(ref.state_dict())


def test_gradient_stays_exact_at_large_inputs():
    """At an RMS of 1e17 (the sinusoidal encoding allows entries up to 1.6e18 at d_model 128) the composition's
    backward is off by 20 %: its rsqrt's gradient, rstd³ ~ 1e-51, underflows fp32. The hand-written backward never
    forms rstd³: the gradients stay within fp32 rounding of fp64's."""
    torch.manual_seed(0)
    x = 1e17 * torch.randn(4, 128)
    ours = RMSNorm(128)
    with torch.no_grad():
        ours.weight.copy_(1 + 0.5 * torch.randn(128))
    truth = nn.RMSNorm(128, eps=torch.finfo(torch.float32).eps, dtype=torch.float64)
    truth.load_state_dict(ours.state_dict())
    g = torch.randn(4, 128)
    got, want = _forward_backward(ours, x, g), _forward_backward(truth, x.double(), g.double())
    for name, a, b in zip(["output", "input grad", "weight grad"], got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * b.abs().max().item(), msg=name)


def test_composition_on_a_torch_without_the_fused_kernel(monkeypatch):
    """torch before the fused kernel (the stack allows 2.5 on): nn.RMSNorm's forward, not an AttributeError."""
    monkeypatch.setattr(norm_module, "_FUSED_FORWARD", False)
    x = torch.randn(2, 16, requires_grad=True)
    y = RMSNorm(16, eps=1e-5)(x)
    assert y.grad_fn.name() != FAST
