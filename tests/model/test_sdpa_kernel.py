"""model.sdpa_kernel: the SDPA kernel the encodings without a score term take on CUDA, for each call alone; on CPU
the same attention whatever it names."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from minilm.config import SDPA_KERNELS
from minilm.model.attention import SDPA_BACKEND, Attention, AttentionMask, sdpa_backends
from minilm.positions import PositionDims

KERNELS = [k for k in SDPA_KERNELS if k != "auto"]  # the schema's names, each of which the attention must map


def _layer(kernel: str, d_model: int = 32, heads: int = 4) -> Attention:
    torch.manual_seed(0)
    head_dim = d_model // heads
    return Attention(d_model, heads, heads, {"name": "rope"}, PositionDims(d_model, heads, heads, head_dim, 1, 0),
                     sdpa_kernel=kernel)  # fmt: skip


def _state() -> tuple:
    """SDPA's process-wide choice: its priority order and which backends are on."""
    b = torch.backends.cuda
    enabled = (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())
    return tuple(torch._C._get_sdp_priority_order()), enabled


def test_backends_put_the_named_kernel_first_and_keep_the_others_behind_it():
    assert sdpa_backends("auto") is None
    assert sorted(SDPA_BACKEND) == sorted(KERNELS)  # the config's names and the attention's, one set
    for kernel in KERNELS:
        order = sdpa_backends(kernel)
        assert order[0] == SDPA_BACKEND[kernel]
        assert len(order) == 4 and set(order) == {SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                  SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION}  # fmt: skip


def test_a_torch_without_a_priority_order_is_refused_by_name(monkeypatch):
    """torch 2.5 has no priority order (a TypeError at the first SDPA call) and 2.6 compiled the default order
    without a word: a named kernel there is an error before training, saying what to set; "auto" runs anywhere."""
    from torch.torch_version import TorchVersion

    from minilm.errors import MinilmError

    monkeypatch.setattr(torch, "__version__", TorchVersion("2.6.0+cu124"))
    with pytest.raises(MinilmError, match=r"model\.sdpa_kernel=cudnn needs torch >= 2\.7 .*this is torch 2\.6\.0"
                                          r"\+cu124: set model\.sdpa_kernel=auto"):  # fmt: skip
        _layer("cudnn")
    assert _layer("auto").sdpa_backends is None


@pytest.mark.parametrize("kernel", ["auto", *KERNELS])
def test_the_named_kernel_goes_first_for_the_call_alone(kernel, monkeypatch):
    """During the layer's SDPA call the named backend leads the order with every backend on (a shape it cannot take
    falls back); before and after the call SDPA's process-wide state is as it was; "auto" leaves it alone."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(_state())
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    x, positions = torch.randn(2, 16, 32), torch.arange(16).unsqueeze(0)
    before = _state()
    out = _layer(kernel)(x, positions, AttentionMask())
    assert _state() == before
    assert len(seen) == 1
    order, enabled = seen[0]
    if kernel == "auto":
        assert seen[0] == before
    else:
        assert order[0] == int(SDPA_BACKEND[kernel]) and all(enabled)
    monkeypatch.undo()
    assert torch.equal(out, _layer("auto")(x, positions, AttentionMask()))  # CPU: the same kernel whatever is named


def test_compiled_the_order_is_in_the_graph_around_the_attention():
    """Compiled, dynamo records the order as calls in the graph, around SDPA (no graph break): the AOT trace that
    picks SDPA's kernel runs them, so the compiled kernel is the named one. On CPU the layer through AOT autograd
    equals the eager one."""
    layer = _layer("cudnn")
    x, positions = torch.randn(2, 16, 32), torch.arange(16).unsqueeze(0)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(layer, backend=keep, fullgraph=True)(x, positions, AttentionMask())
    (gm,) = graphs
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    sdpa = next(i for i, n in enumerate(calls) if n.target is F.scaled_dot_product_attention)
    orders = [i for i, n in enumerate(calls) if n.target is torch.nn.attention._sdpa_kernel]
    assert len(orders) == 2 and orders[0] < sdpa < orders[1]
    first = calls[orders[0]].args[0][0]  # the node naming the first backend of the order set before SDPA
    assert first.args == ("CUDNN_ATTENTION",)
    # through AOT autograd, which runs the order's calls as it traces SDPA (inductor's C++ code adds ~4 s, nothing
    # about the order)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x, positions, AttentionMask())
    assert torch.allclose(compiled, layer(x, positions, AttentionMask()), atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_on_cuda_the_named_kernel_runs_and_equals_the_reference(kernel, compile):
    """On CUDA in bf16 the profile shows the named kernel's operator, eagerly and compiled, and the output and the
    gradients of the layer's input equal fp32 math attention's within bf16 rounding."""
    from torch.profiler import ProfilerActivity, profile

    layer = _layer(kernel, d_model=256, heads=4).cuda()  # heads 64 wide: every kernel takes them
    reference = _layer("auto", d_model=256, heads=4).cuda()
    x = torch.randn(2, 512, 256, device="cuda", requires_grad=True)
    positions, mask = torch.arange(512, device="cuda").unsqueeze(0), AttentionMask()
    torch._dynamo.reset()
    run = torch.compile(layer, fullgraph=True) if compile else layer
    with torch.autocast("cuda", dtype=torch.bfloat16):
        run(x, positions, mask).sum().backward()  # compiles outside the profile
        x.grad = None
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = run(x, positions, mask)
            out.float().pow(2).sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert any(f"_scaled_dot_product_{kernel}_attention" in n for n in names), sorted(n for n in names if "scaled" in n)
    got = x.grad.clone()
    x.grad = None
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        want = reference(x, positions, mask)
        want.pow(2).sum().backward()
    assert torch.allclose(out.float(), want, atol=3e-2, rtol=3e-2)
    assert torch.allclose(got, x.grad, atol=5e-2 * x.grad.abs().max().item())


def test_the_config_reaches_every_layer():
    from minilm.config import load_config
    from minilm.model import GPT

    model = GPT(load_config(overrides=["model.sdpa_kernel=cudnn"]).model, 64)
    assert [b.attn.sdpa_backends[0] for b in model.blocks] == [SDPBackend.CUDNN_ATTENTION] * len(model.blocks)
    assert all(b.attn.sdpa_backends is None for b in GPT(load_config().model, 64).blocks)
