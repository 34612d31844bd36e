"""Choosing the weights to generate from or export (minilm.runs.resolve_run): a phase that the path contradicts, or
that the run does not have, is an error naming it, never weights loaded under another phase's config."""

from pathlib import Path

import pytest
import torch

from minilm.config import load_config, save_config
from minilm.errors import MinilmError
from minilm.runs import resolve_run

REPO = Path(__file__).resolve().parents[1]
PHASES = ["pretrain", "extend_512", "extend_2k"]


@pytest.fixture
def run_dir(tmp_path):
    """A finished three-phase run as far as resolve_run looks: config.yaml, tokenizer.model, weights files."""
    run = tmp_path / "run"
    save_config(load_config(str(REPO / "configs" / "rope_yarn_tiny.yaml")), run / "config.yaml")
    (run / "tokenizer.model").write_bytes(b"")
    for name in PHASES:
        (run / name).mkdir()
        (run / name / "model.safetensors").write_bytes(b"")
        (run / name / "complete.json").write_text("{}")  # written last: the phase has finished
    (run / "model.safetensors").write_bytes(b"")
    return run


def test_paths_and_phases_that_agree(run_dir):
    assert resolve_run(run_dir) == (run_dir, None, run_dir / "model.safetensors")
    assert resolve_run(run_dir, "extend_512") == (run_dir, "extend_512", run_dir / "extend_512" / "model.safetensors")
    assert resolve_run(run_dir / "pretrain")[1:] == ("pretrain", run_dir / "pretrain" / "model.safetensors")
    assert resolve_run(run_dir / "pretrain", "pretrain")[1] == "pretrain"
    assert resolve_run(run_dir / "extend_2k" / "model.safetensors", "extend_2k")[1] == "extend_2k"
    assert resolve_run(run_dir / "model.safetensors", "extend_2k")[2] == run_dir / "model.safetensors"  # the last


@pytest.mark.parametrize("where,phase,says", [
    ("pretrain", "extend_2k", "holds phase 'pretrain'"),
    ("pretrain/model.safetensors", "extend_512", "holds phase 'pretrain'"),
    ("model.safetensors", "pretrain", "holds the run's final weights"),
])  # fmt: skip
def test_a_phase_the_path_contradicts_is_refused(run_dir, where, phase, says):
    """Before, the weights of the path were loaded under the config of the phase asked for: a pretraining model
    with the extension's YaRN scaling, silently."""
    with pytest.raises(MinilmError, match=says) as err:
        resolve_run(run_dir / where, phase)
    assert f"'{phase}' was asked for" in str(err.value)


def test_an_unknown_phase_lists_the_run_s_phases(run_dir):
    with pytest.raises(MinilmError, match="phase 'nope': not a phase of .*; its phases: pretrain, extend_512, extend_2k"):
        resolve_run(run_dir, "nope")


def test_a_folder_of_the_run_that_is_no_phase_is_refused_as_such(run_dir):
    """runs/tiny/tb was taken for a phase: "tb/model.safetensors: not found (has phase 'tb' finished?)"."""
    (run_dir / "tb").mkdir()
    with pytest.raises(MinilmError, match=r"tb: not a phase directory: 'tb' is not a phase of .*; its phases: "
                                          r"pretrain, extend_512, extend_2k$"):
        resolve_run(run_dir / "tb")


def test_a_step_checkpoint_names_its_phase_not_checkpoints(run_dir):
    """A step checkpoint lies in <phase>/checkpoints/: it was taken for a phase named "checkpoints", whose config
    does not exist (a traceback), or which contradicted --phase."""
    ckpt = run_dir / "extend_512" / "checkpoints" / "step-00000010.ckpt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"")
    assert resolve_run(ckpt) == (run_dir, "extend_512", ckpt)
    assert resolve_run(ckpt, "extend_512")[1] == "extend_512"
    with pytest.raises(MinilmError, match="not a run or phase directory"):
        resolve_run(ckpt.parent)


def test_a_file_that_is_not_weights_is_refused_by_name(run_dir):
    (run_dir / "extend_512" / "config.yaml").write_text("")
    with pytest.raises(MinilmError, match=r"config.yaml: not a weights file; .*\.safetensors / \.ckpt"):
        resolve_run(run_dir / "extend_512" / "config.yaml")


def test_an_unfinished_run_opens_its_newest_finished_phase(run_dir):
    """No final weights yet (the run is still training extend_2k): the run directory alone means the last phase
    that has finished, named, not the first; none finished is an error saying so."""
    (run_dir / "model.safetensors").unlink()
    (run_dir / "extend_2k" / "model.safetensors").unlink()
    assert resolve_run(run_dir) == (run_dir, "extend_512", run_dir / "extend_512" / "model.safetensors")
    for name in PHASES[:2]:
        (run_dir / name / "model.safetensors").unlink()
    with pytest.raises(MinilmError, match="has no finished phase yet"):
        resolve_run(run_dir)


def test_a_run_with_step_checkpoints_alone_names_the_newest(run_dir):
    """A run interrupted before any phase finished said only to finish its first phase; a step checkpoint, which
    evaluate.py and generate.py take, is named too: the latest phase's latest step (not the one written last)."""
    for name in PHASES:
        (run_dir / name / "model.safetensors").unlink()
    (run_dir / "model.safetensors").unlink()
    with pytest.raises(MinilmError, match=r"has no finished phase yet .*--resume$"):  # none: no hint
        resolve_run(run_dir)
    for phase, step in [("extend_512", 30), ("pretrain", 300), ("extend_512", 40), ("extend_512", 5)]:
        (run_dir / phase / "checkpoints").mkdir(exist_ok=True)
        (run_dir / phase / "checkpoints" / f"step-{step:08d}.ckpt").write_bytes(b"")
    (run_dir / "extend_512" / "checkpoints" / "step-00000090.ckpt.tmp").write_bytes(b"")  # a killed write
    newest = run_dir / "extend_512" / "checkpoints" / "step-00000040.ckpt"
    with pytest.raises(MinilmError, match=rf"--resume; or give a step checkpoint, the newest: {newest} \(phase "
                                          r"'extend_512', step 40\)$"):  # fmt: skip
        resolve_run(run_dir)
    assert resolve_run(newest) == (run_dir, "extend_512", newest)


def test_a_hugging_face_export_is_said_to_be_one(tmp_path):
    """An export_hf.py directory (or its model.safetensors) given to evaluate.py, generate.py or --init said 'not
    inside a minilm run directory' and no more."""
    out = tmp_path / "exported"
    out.mkdir()
    for name in ["config.json", "model.safetensors", "minilm_export.json"]:
        (out / name).write_text("{}")
    for given in [out, out / "model.safetensors"]:
        with pytest.raises(MinilmError, match=rf"{given} is a Hugging Face transformers export \(minilm_export.json\), "
                                              r"not a minilm run: load it with transformers"):  # fmt: skip
            resolve_run(given)


def test_a_phase_killed_after_its_weights_is_not_taken_for_finished(run_dir):
    """A phase writes its weights, then evaluates (eval_lengths: minutes at long lengths), then writes complete.json.
    Killed during that evaluation, --resume trains it again from its last checkpoint, but evaluate.py, generate.py,
    export_hf.py and --init RUN read its weights as the run's newest finished phase (with their step counted from a
    length the resumed config may have changed), and compare_runs.py called it finished but not evaluated."""
    (run_dir / "model.safetensors").unlink()
    (run_dir / "extend_2k" / "complete.json").unlink()
    assert resolve_run(run_dir) == (run_dir, "extend_512", run_dir / "extend_512" / "model.safetensors")
    (run_dir / "extend_512" / "complete.json").unlink()
    (run_dir / "pretrain" / "complete.json").unlink()
    with pytest.raises(MinilmError, match="has no finished phase yet"):
        resolve_run(run_dir)


def test_the_final_weights_load_under_the_last_phase_s_config(run_dir):
    """The run's model.safetensors is its last phase's: the config it is built with is that phase's (extend_2k's
    sequence length and RoPE scaling), never the pretraining's."""
    from omegaconf import OmegaConf

    from minilm.runs import run_config

    final, last, first = (run_config(run_dir, p) for p in (None, "extend_2k", "pretrain"))
    assert OmegaConf.to_container(final) == OmegaConf.to_container(last)
    assert final.train.seq_len != first.train.seq_len


def test_load_run_gives_the_saved_weights_in_eval_mode(tiny_text_dir, tmp_path):
    """load_run: the model evaluate / generate / export use is built from the run's config and tokenizer, holds the
    saved weights and is in eval mode (with dropout in the config, a model left in training mode would give other
    logits at every call)."""
    from minilm.data.tokenizer import train_tokenizer
    from minilm.model import GPT
    from minilm.runs import load_run
    from minilm.training.checkpoint import save_weights

    run = tmp_path / "run"
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=4", "model.dropout=0.5",
                                 "data.tokenizer.vocab_size=300"])  # fmt: skip
    save_config(cfg, run / "config.yaml")
    docs = [p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))[:8]]
    tokenizer = train_tokenizer(docs, run / "tokenizer.model", cfg.data.tokenizer)
    torch.manual_seed(0)
    model = GPT(cfg.model, tokenizer.vocab_size)
    save_weights(model, run / "model.safetensors")
    loaded = load_run(run)
    assert not loaded.model.training and loaded.phase is None and loaded.weights == run / "model.safetensors"
    x = torch.randint(0, tokenizer.vocab_size, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), model.eval()(x))


def test_a_damaged_run_tokenizer_is_named_as_the_run_s_not_a_config_key(run_dir):
    """load_run (evaluate.py, generate.py, export_hf.py) on a run whose tokenizer.model is not a sentencepiece model
    said 'data.tokenizer.model_file: ... is not a sentencepiece model', a key the run's config may not even set."""
    from minilm.runs import load_run

    (run_dir / "tokenizer.model").write_bytes(b"not a model")
    with pytest.raises(MinilmError) as e:
        load_run(run_dir)
    assert str(e.value).startswith("the run's tokenizer (the token ids its weights were trained with; ")
    assert f"{run_dir / 'tokenizer.model'} is not a sentencepiece model" in str(e.value)


@pytest.mark.parametrize("by", ["name", "directory"])
def test_an_unfinished_phase_asked_for_says_how_to_finish_it_and_names_its_newest_checkpoint(run_dir, by):
    """``--phase extend_2k`` of a run that has not finished it said only "model.safetensors: not found (has phase
    'extend_2k' finished?)", where the run-level message says how to finish it and which step checkpoint it has."""
    for name in ("extend_2k/model.safetensors", "extend_2k/complete.json", "model.safetensors"):
        (run_dir / name).unlink()
    (run_dir / "extend_2k" / "checkpoints").mkdir()
    for step in (10, 20):
        (run_dir / "extend_2k" / "checkpoints" / f"step-{step}.ckpt").write_bytes(b"")
    (run_dir / "extend_512" / "checkpoints").mkdir()
    (run_dir / "extend_512" / "checkpoints" / "step-30.ckpt").write_bytes(b"")  # another phase's: not named
    with pytest.raises(MinilmError) as err:
        resolve_run(run_dir, "extend_2k") if by == "name" else resolve_run(run_dir / "extend_2k")
    said = str(err.value)
    assert "phase 'extend_2k' has not finished; finish it with: python train.py --config" in said and "--resume" in said
    assert f"the newest: {run_dir / 'extend_2k' / 'checkpoints' / 'step-20.ckpt'} (phase 'extend_2k', step 20)" in said


@pytest.mark.parametrize("by", ["name", "directory"])
def test_a_phase_asked_for_with_weights_but_no_complete_json_is_refused_unless_its_file_is_given(run_dir, by):
    """A phase killed during its end-of-phase evaluation keeps the weights written before it, but no complete.json:
    phase_finished (--resume, a run directory alone) counts it unfinished, yet --phase NAME or its directory loaded
    it in evaluate.py, generate.py and export_hf.py as if finished. It is refused with how to finish it, and the
    weights file itself, named as such, is still taken."""
    (run_dir / "model.safetensors").unlink()
    (run_dir / "extend_2k" / "complete.json").unlink()
    weights = run_dir / "extend_2k" / "model.safetensors"
    with pytest.raises(MinilmError) as err:
        resolve_run(run_dir, "extend_2k") if by == "name" else resolve_run(run_dir / "extend_2k")
    said = str(err.value)
    assert said.startswith(f"phase 'extend_2k' of {run_dir} has not finished (no complete.json beside {weights})")
    assert "--resume" in said and said.endswith(f"to use those weights as they are, give the file {weights}")
    assert resolve_run(weights) == (run_dir, "extend_2k", weights)
    assert resolve_run(run_dir, "extend_512")[2] == run_dir / "extend_512" / "model.safetensors"  # finished: loads
