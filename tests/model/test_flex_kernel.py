"""The eager model's FlexAttention kernel (minilm/model/flex.py) across the many shapes one evaluation meets."""

import functools

import pytest
import torch

from minilm.model import flex
from minilm.model.attention import AttentionMask

pytestmark = pytest.mark.skipif(not flex.flex_attention_available(), reason="FlexAttention needs torch >= 2.5")


@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile with dynamo's own recompile bookkeeping but no inductor (seconds per shape on CPU): what is
    checked here is how many shapes dynamo keeps compiling, not the kernel."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", functools.partial(real, backend="eager"))
    flex._compiled_flex_kernel.cache_clear()
    torch._dynamo.reset()
    yield
    flex._compiled_flex_kernel.cache_clear()
    torch._dynamo.reset()


def test_the_compiled_kernel_keeps_compiling_past_dynamos_default_recompile_limit(eager_backend):
    """An evaluation runs the kernel at about ten shapes per length (windows, retrieval batches, their remainders,
    a greedy example's prompt). Past dynamo's default limit of 8 shapes flex_attention ran eagerly, materializing
    the (B, H, T, S) scores, with only a warning: here that is an error."""
    def alibi_like(score, b, h, i, j):
        return score - (i - j).abs().float()

    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True), torch.no_grad():
        for T in range(16, 16 * 13, 16):  # 12 shapes
            q = torch.randn(1, 2, T, 16)
            out = flex.flex_attention_with_score_mod(q, q, q, alibi_like, AttentionMask(), 0.25, compiled=True)
            assert out.shape == q.shape
    assert torch._dynamo.config.recompile_limit == 8  # raised for the kernel's calls only


@pytest.mark.parametrize("name, small", [("alibi", False), ("t5", False), ("kerple", False), ("fire", True),
                                         ("t5/split", True), ("kerple/forwards", False)])  # fmt: skip
def test_a_heavy_score_mod_asks_for_small_kernel_blocks_in_every_flex_call(name, small, monkeypatch):
    """FIRE's score_mod, and T5's near part, did not fit an H100's shared memory in inductor's default blocks (bf16,
    head size 64); ``SMALL_FLEX_BLOCKS`` reaches each of their FlexAttention calls (the parts' too), and the others
    keep the default blocks. (Here on CPU with the ladder sent to FlexAttention's eager form: the options are what
    the layer hands ``_options``, which passes them on to the kernel on CUDA only.)"""
    from minilm.model.attention import Attention
    from minilm.positions import PositionDims
    from minilm.positions.base import SMALL_FLEX_BLOCKS

    encoding, _, form = name.partition("/")
    attn = Attention(64, 4, 4, {"name": encoding}, PositionDims(64, 4, 4, 16, 1, 0))
    if form:
        setattr(attn.pos, {"split": "flex_split", "forwards": "flex_coefficient_forwards"}[form], True)
    monkeypatch.setattr(Attention, "kernel", lambda self, device, documents=False: "flex")
    seen = []
    monkeypatch.setattr(flex, "_options", lambda q, options: seen.append(options) or {})
    q, k, v = torch.randn(3, 1, 4, 40, 16).unbind(0)
    positions = torch.arange(40).unsqueeze(0)
    with torch.no_grad():
        attn.attend(q, k, v, positions, positions, AttentionMask())
    assert len(seen) == (2 if form == "split" else 1)
    assert all(options == (SMALL_FLEX_BLOCKS if small else None) for options in seen)


def test_the_small_blocks_are_kernel_options_flex_attention_takes():
    """Each key is a block size FlexAttention's kernel options name, behind the pass it applies to (an unknown or
    misplaced one would be ignored, or refused at the first compiled call); each block divides the BlockMask's
    128-wide blocks, and the backward's pairs divide as its kernel needs. On CUDA they go to the kernel as a copy
    (inductor pops keys from what it is given), from 128 queries (below, inductor's decoding kernel); elsewhere
    nothing is passed."""
    from types import SimpleNamespace

    from minilm.positions.base import SMALL_FLEX_BLOCKS as small

    fwd = {k[4:]: v for k, v in small.items() if k.startswith("fwd_")}
    bwd = {k[4:]: v for k, v in small.items() if k.startswith("bwd_")}
    assert set(fwd) == {"BLOCK_M", "BLOCK_N"} and set(bwd) == {"BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"}
    assert len(fwd) + len(bwd) == len(small)
    assert all(128 % size == 0 for size in small.values())
    assert bwd["BLOCK_N1"] % bwd["BLOCK_M1"] == 0 and bwd["BLOCK_M2"] % bwd["BLOCK_N2"] == 0
    try:
        from torch.nn.attention.flex_attention import FlexKernelOptions  # torch >= 2.9 names them
    except ImportError:
        pass
    else:
        assert set(fwd) | set(bwd) <= set(FlexKernelOptions.__annotations__)
    def q(is_cuda=True, T=flex.FLEX_DECODING_QUERIES):
        return SimpleNamespace(is_cuda=is_cuda, shape=(2, 4, T, 64))

    passed = flex._options(q(), small)
    assert passed == {"kernel_options": small} and passed["kernel_options"] is not small
    assert flex._options(q(is_cuda=False), small) == {} and flex._options(q(), None) == {}
    # fewer queries take the decoding kernel, whose own BLOCK_M a forward block would replace unchecked
    assert flex._options(q(T=flex.FLEX_DECODING_QUERIES - 1), small) == {}
