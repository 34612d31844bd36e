"""torch.compile hygiene: the training loss traces as one graph (no graph breaks), compiles once per sequence
length (no recompilation within a phase), and equals the eager loss."""

import pytest
import torch

from minilm.config import load_config
from minilm.model import GPT
from minilm.positions import REGISTRY

V = 64
TINY = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2"]
CASES = {
    "rope": [],
    # bias score terms: SDPA with the bias as its mask on CPU (one bias for the batch: positions are shared)
    "alibi": ["model.position.name=alibi"],
    "t5": ["model.position.name=t5"],
    "kerple": ["model.position.name=kerple"],
    "fire": ["model.position.name=fire"],
    # q-dependent relative terms on the bias rung: their per-distance tables are sized by the shapes, not by the
    # positions read on the host (Transformer-XL's was: a graph break in every layer)
    "shaw": ["model.position.name=shaw"],
    "transformer_xl": ["model.position.name=transformer_xl"],
    "deberta": ["model.position.name=deberta"],
    "rope_chunked_checkpointed": ["model.loss_chunk_size=8", "model.activation_checkpointing=true"],
    # the length-dependent scalings read 1 + the largest key position: as a tensor, so no break and no recompile
    "rope_dynamic": ["model.position.scaling={rope_type: dynamic, factor: 2, original_max_position_embeddings: 8}"],
    "rope_dynamic_yarn": ["model.position.scaling={rope_type: dynamic_yarn, original_max_position_embeddings: 8}"],
    "rope_longrope": [
        "model.position.scaling={rope_type: longrope, original_max_position_embeddings: 8, factor: 4,"
        " short_factor: [1, 1, 1, 1, 1.5, 2, 2, 2], long_factor: [1, 1, 2, 3, 4, 4, 4, 4]}"
    ],
}
LENGTH_DEPENDENT_CASES = ["rope_dynamic", "rope_dynamic_yarn", "rope_longrope"]


def _model(overrides):
    torch.manual_seed(0)
    return GPT(load_config(overrides=[*TINY, *overrides]).model, V).train()


@pytest.mark.parametrize("case", list(CASES))
def test_loss_has_no_graph_breaks(case):
    model = _model(CASES[case])
    x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.loss)(x, y)
    reasons = [b.reason for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons


# Encodings whose embedding reads the highest position on the host (to refuse positions beyond their table or
# cache_size with an error, and for FLOATER to know how far to integrate its ODE, which runs eagerly): one graph
# break per forward, before the first block (docs/performance.md, "Compilation")
BREAK_AT_THE_EMBEDDING = {"learned", "floater"}


def _graph_breaks(name: str, n_layers: int) -> list:
    model = _model([f"model.position.name={name}", f"model.n_layers={n_layers}"])
    x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
    pos = (torch.arange(16) % 6).expand(2, 16)  # packed documents with restarted positions
    doc = (torch.arange(16) // 6).expand(2, 16)
    torch._dynamo.reset()
    return torch._dynamo.explain(model.loss)(x, y, pos, doc).break_reasons


@pytest.mark.parametrize("name", list(REGISTRY))
def test_no_encoding_breaks_the_graph_in_every_layer(name):
    """Every registered encoding traces its layers into one graph (a break per layer splits the step into as many
    graphs and, with Transformer-XL, failed in torch 2.13); the exceptions break once, at the embedding."""
    one, three = _graph_breaks(name, 1), _graph_breaks(name, 3)
    assert len(one) == len(three), [b.reason for b in three]
    assert bool(one) == (name in BREAK_AT_THE_EMBEDDING), [b.reason for b in one]


def test_compiled_chunked_loss_indexes_no_target_column():
    """Compiled, the chunked loss finds each row's target column by comparison: inductor's scatter_add kernel into a
    chunk faulted at 128K tokens × 32K classes on an H100 (minilm/model/loss.py). No gather or scatter in the
    traced graphs, the forward bodies of the autograd Function included."""
    model = _model(["model.loss_chunk_size=8"])
    x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.loss)(x, y)
    code = "\n".join(m.code for g in explained.graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule))
    assert "autograd_function_apply(" in code and "arange" in code
    assert "scatter" not in code and "gather" not in code


@pytest.mark.parametrize("name", ["t5", "cope"])
def test_attention_in_blocks_of_queries_has_no_graph_breaks(name, monkeypatch):
    """On CPU the bias rung (T5) and the reference rung (CoPE) run in blocks of queries (``in_query_blocks``): a
    loop over blocks fixed by the shapes, unrolled into the one graph."""
    import minilm.model.attention as attention

    monkeypatch.setattr(attention, "CPU_QUERY_BLOCK", 4)
    model = _model([f"model.position.name={name}"])
    x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.loss)(x, y)
    reasons = [b.reason for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons


# head width 16: T 16 is under CPU_MATMUL_ATTENTION_UP_TO (4) head widths, T 80 over it
@pytest.mark.parametrize("T, kernel", [(16, "baddbmm"), (80, "_scaled_dot_product_flash_attention_for_cpu")])
def test_loss_under_cpu_bf16_autocast_has_no_graph_breaks(T, kernel):
    """bf16-mixed on CPU (train.precision auto on a CPU with AMX or AVX512-BF16): attention's fp32 paths, autograd
    Functions over matmuls in fp32 (short sequences) or torch's CPU flash-attention ops (minilm/model/attention.py),
    trace into the one graph."""
    model = _model([])
    x, y = torch.randint(0, V, (2, T)), torch.randint(0, V, (2, T))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(model.loss)(x, y)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, [b.reason for b in explained.break_reasons]
    assert str(explained.graphs[0].code).count("autograd_function_apply(") == 2  # one per layer
    code = "\n".join(m.code for g in explained.graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule))
    assert code.count(f"{kernel}(") == 2  # the path of this length, in each layer's Function


def _step_positions(step: int) -> torch.Tensor:
    """(2, 16) positions whose largest value changes per step, across the length-dependent cases' original length
    8: one sequence (max 15), documents restarting at 10 (max 9), documents of 6 (max 5, under 8)."""
    restart = [16, 10, 6][step % 3]
    return (torch.arange(16) % restart).expand(2, 16)


@pytest.mark.slow  # inductor's C++ compilation takes minutes on a shared 2-core machine
@pytest.mark.parametrize("case", ["rope", "rope_chunked_checkpointed", *LENGTH_DEPENDENT_CASES])
def test_compiled_training_steps_do_not_recompile_and_equal_eager(case):
    model = _model(CASES[case])
    eager = _model(CASES[case])
    torch._dynamo.reset()
    compiled = torch.compile(model.loss)
    g = torch.Generator().manual_seed(0)
    with torch._dynamo.config.patch(error_on_recompile=True):  # any recompilation after the first raises
        for step in range(3):  # new tokens and a new largest position every step, the same length: one compilation
            x, y = torch.randint(0, V, (2, 16), generator=g), torch.randint(0, V, (2, 16), generator=g)
            pos = _step_positions(step)
            got, ref = compiled(x, y, pos), eager.loss(x, y, pos)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            got.backward()
            ref.backward()
            for (name, a), b in zip(model.named_parameters(), eager.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
            with torch.no_grad():  # an optimizer-like update, so later steps see new weights
                for a, b in zip(model.parameters(), eager.parameters()):
                    a -= 0.1 * a.grad
                    b -= 0.1 * b.grad
                    a.grad = b.grad = None


@pytest.mark.slow  # inductor's C++ compilation: ~30 s on a shared 2-core machine
def test_transformer_xl_compiled_training_step_after_compiled_validation():
    """Transformer-XL read its positions' span on the host in every layer: a graph break there, and in torch 2.13
    the compiled frames it left failed the first training step after a validation in inference mode (Trainer.validate's
    default) — a garbage view shape or a segmentation fault. Now one graph per mode, equal to eager."""
    model, eager = _model(CASES["transformer_xl"]), _model(CASES["transformer_xl"])
    x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
    torch._dynamo.reset()
    compiled = torch.compile(model.loss)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.inference_mode():
            torch.testing.assert_close(compiled(x, y), eager.loss(x, y), rtol=1e-3, atol=1e-3)
        got, ref = compiled(x, y), eager.loss(x, y)
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
    got.backward()
    ref.backward()
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-2, atol=1e-3, msg=name)
