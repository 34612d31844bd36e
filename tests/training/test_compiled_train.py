"""train.py with ``train.compile: true`` as a user runs it: Lightning around the compiled loss, fused AdamW, and
on CUDA bf16 autocast with FlexAttention for the bias encodings. The run must finish, learn, and trace with no
graph break (TORCH_LOGS=graph_breaks prints one line per break), packed documents with restarted positions
included, and each phase compiles afresh. On CPU it is ``-m slow`` (inductor's C++ compilation takes a minute
or two); on CUDA ``-m gpu``."""

import json
import math

import pytest
import torch

from tests.conftest import local_data_yaml, run_train

VOCAB = 300
CONFIG = """
model: {{n_layers: 2, d_model: 64, n_heads: 4, position: {{name: {encoding}}}}}
{data}train: {{seq_len: 64, batch_size: 8, steps: 40, val_every: 20, val_batches: 2, log_every: 10, ckpt_every: 0,
         compile: true}}
optim: {{lr: 0.003, warmup_steps: 4}}
trainer: {{accelerator: {accelerator}}}
"""


def _compiled_run(tmp_path, corpus, encoding, accelerator, *overrides):
    config = tmp_path / "exp.yaml"
    data = local_data_yaml(corpus, tmp_path / "cache", VOCAB, document_mask="true", restart_positions="true")
    config.write_text(CONFIG.format(encoding=encoding, data=data, accelerator=accelerator))
    run_dir = tmp_path / "run"
    proc = run_train("--config", config, f"run.dir={run_dir}", *overrides,
                     env={"TORCH_LOGS": "graph_breaks,recompiles"}, timeout=1200)  # fmt: skip
    breaks = [line for line in proc.stderr.splitlines() if "Graph break" in line]
    assert not breaks, "\n".join(breaks[:5])
    # past dynamo's recompile limit the loss would run eagerly, with only this warning to say so
    assert "recompile_limit" not in proc.stderr
    return run_dir, proc.stderr


def _recompiles_of_the_loss(stderr: str) -> int:
    return sum("Recompiling function loss " in line for line in stderr.splitlines())


def _learned(run_dir, phase="train"):
    summary = json.loads((run_dir / phase / "complete.json").read_text())
    assert summary["val_loss"] < math.log(VOCAB) - 1.0, summary  # well below the uniform guess: it learned


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_compiled_training_on_cpu(tmp_path, tiny_text_dir, encoding):
    """Validated before training, at step 20 and at step 40: one graph for validation, one for training."""
    run_dir, stderr = _compiled_run(tmp_path, tiny_text_dir, encoding, "cpu")
    _learned(run_dir)
    assert _recompiles_of_the_loss(stderr) == 1


@pytest.mark.slow
def test_each_phase_compiles_afresh(tmp_path, tiny_text_dir):
    """Three phases, as configs/rope_yarn_tiny.yaml has them: lengths and batch sizes change (the last batch is
    1, which dynamo's dynamic shapes do not cover), and each phase compiles the loss for validation, training and
    validation after training. Had the phases shared dynamo's cache, the third phase would pass its recompile limit
    (8) and train eagerly, with one warning to say so. Within a phase the two validations share one graph: the
    first, run by Trainer.validate in inference mode, compiled one the validation inside fit (no_grad) could not
    use."""
    phases = ("phases={p1: {seq_len: 16, steps: 6}, p2: {seq_len: 32, steps: 4, batch_size: 4},"
              " p3: {seq_len: 64, steps: 3, batch_size: 1}}")  # fmt: skip
    run_dir, stderr = _compiled_run(tmp_path, tiny_text_dir, "rope", "cpu", phases, "train.val_every=0")
    assert all((run_dir / p / "complete.json").is_file() for p in ("p1", "p2", "p3"))
    assert _recompiles_of_the_loss(stderr) == 3  # the training graph of each phase, after its validation graph


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("encoding", ["rope", "alibi", "t5", "kerple", "fire"])
def test_compiled_training_on_cuda(tmp_path, tiny_text_dir, encoding):
    _learned(_compiled_run(tmp_path, tiny_text_dir, encoding, "gpu")[0])
