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
