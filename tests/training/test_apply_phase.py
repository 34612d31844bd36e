"""apply_phase: the one place phases change the model; it verifies what it changed and refuses what can't apply."""

import pytest
import torch

from minilm.config import load_config, phase_config
from minilm.errors import MinilmError
from minilm.model import GPT
from minilm.positions import compute_rope
from minilm.training.phases import apply_phase, check_phase_fits

SMALL = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2"]


def _cfg(tmp_path, yaml: str, *extra):
    path = tmp_path / "p.yaml"
    path.write_text(yaml)
    return load_config(path, [*SMALL, *extra])


def test_rope_base_and_scaling_change_every_layer_to_compute_rope(tmp_path):
    cfg = _cfg(
        tmp_path,
        "phases:\n  a: {seq_len: 32, steps: 1}\n  b: {seq_len: 128, steps: 1, position: {base: 50000.0, "
        "scaling: {rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32}}}\n",
    )
    model = GPT(cfg.model, 64)
    logs = []
    apply_phase(model, phase_config(cfg, "a"), "a", logs.append)
    before = model.blocks[0].attn.pos.inv_freq.clone()
    apply_phase(model, phase_config(cfg, "b"), "b", logs.append)
    expected, factor = compute_rope(16, 50000.0, {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 32})
    for block in model.blocks:
        assert torch.equal(block.attn.pos.inv_freq, expected) and block.attn.pos.attention_factor == factor
    assert not torch.equal(before, expected)
    assert "reconfigured 2 layers" in logs[-1] and "yarn" in logs[-1]
    assert "1 step of " in logs[-1] and " sequences," in logs[-1]  # (not "1 steps")
    # train.batch_size is per process: the line says so, and the step's rows, under several
    batch = cfg.train.batch_size
    message = apply_phase(model, phase_config(cfg, "b"), "b", logs.append, world_size=2)
    assert f"1 step of {batch} sequences per process ({2 * batch} in all), lr" in message, message


def test_one_reconfigured_layer_is_one_layer(tmp_path):
    """A one-layer model's extension phase said "(reconfigured 1 layers)"."""
    cfg = _cfg(tmp_path, "phases:\n  a: {seq_len: 32, steps: 1}\n  b: {seq_len: 32, steps: 1, position: {base: 500.0}}\n",
               "model.n_layers=1")  # fmt: skip
    model = GPT(cfg.model, 64)
    message = apply_phase(model, phase_config(cfg, "b"), "b", lambda m: None)
    assert "(reconfigured 1 layer)" in message, message


def test_unchanged_non_rotary_encoding_passes(tmp_path):
    cfg = _cfg(tmp_path, "model: {position: {name: alibi}}\nphases:\n  a: {steps: 1}\n  b: {seq_len: 64, steps: 1}\n")
    model = GPT(cfg.model, 64)
    for name in ("a", "b"):
        apply_phase(model, phase_config(cfg, name), name, lambda m: None)


def test_learned_table_too_short_for_a_phase_is_named(tmp_path):
    cfg = _cfg(
        tmp_path,
        "model: {position: {name: learned, max_positions: 64}}\n"
        "phases:\n  short: {seq_len: 32, steps: 1}\n  long: {seq_len: 256, steps: 1}\n",
    )
    model = GPT(cfg.model, 64)
    check_phase_fits(model, phase_config(cfg, "short"), "short")
    with pytest.raises(MinilmError, match=r"phases\.long\.seq_len: 256 .*learned.*64"):
        check_phase_fits(model, phase_config(cfg, "long"), "long", cfg.phases.long)


def test_xpos_limit_is_checked_with_the_phase_s_own_scale_base(tmp_path):
    """xPos's longest sequence follows its scale_base, which a phase may change: each phase is checked as it will
    train, not with the parameters the model was built with. A phase raising scale_base to train longer was refused;
    one lowering it passed the check made before any training, then crashed in the phase's first forward."""
    phases = "phases:\n  short: {seq_len: 32, steps: 1}\n  long: {seq_len: 200, steps: 1, position: {scale_base: %s}}\n"
    raised = _cfg(tmp_path, "model: {position: {name: xpos, scale_base: 1.0}}\n" + phases % 4.0)
    model = GPT(raised.model, 64)
    limit = model.blocks[0].attn.pos.max_length()
    assert 32 < limit < 200  # scale_base 1.0 does not reach the long phase's 200 tokens
    for name in ("short", "long"):
        check_phase_fits(model, phase_config(raised, name), name)
        apply_phase(model, phase_config(raised, name), name, lambda m: None)
    model(torch.zeros(1, 200, dtype=torch.long))  # the long phase's length, under its own parameters
    lowered = _cfg(tmp_path, "model: {position: {name: xpos, scale_base: 4.0}}\n" + phases % 1.0)
    model = GPT(lowered.model, 64)
    check_phase_fits(model, phase_config(lowered, "short"), "short")
    with pytest.raises(MinilmError, match=r"phases\.long\.seq_len: 200 .*xpos"):
        check_phase_fits(model, phase_config(lowered, "long"), "long", lowered.phases.long)
    assert model.blocks[0].attn.pos.params.scale_base == 4.0  # checking configured a copy, not the model


def test_the_phase_line_says_document_masking_restarted_positions_and_the_synthetic_mix(tmp_path):
    """The line said long_fraction alone of what a phase trains on: data.document_mask, restart_positions and the
    synthetic mix (its fraction, tasks and loss) changed the rows and the loss without a word in the log. Each is
    said where it is on, from the phase's own data section, and not where it is off."""
    cfg = _cfg(tmp_path, "phases:\n  a: {seq_len: 32, steps: 1}\n"
                         "  b: {seq_len: 32, steps: 1, data: {document_mask: true, restart_positions: true,\n"
                         "      synthetic: {fraction: 0.25, tasks: [kv], loss: answer}}}\n")  # fmt: skip
    model = GPT(cfg.model, 64)
    plain = apply_phase(model, phase_config(cfg, "a"), "a", lambda m: None)
    assert "long_fraction 0.0, position {" in plain, plain
    assert not any(word in plain for word in ("document_mask", "restart_positions", "synthetic")), plain
    message = apply_phase(model, phase_config(cfg, "b"), "b", lambda m: None)
    assert ("long_fraction 0.0, document_mask, restart_positions, synthetic fraction 0.25 (tasks kv; loss answer), "
            "position {") in message, message
