"""Every shipped configs/positions/<name>.yaml trains 30 steps through train.py's entry point, loss falling."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import train  # noqa: E402  (the CLI module itself, so the test runs what a user runs)

CONFIGS = sorted((REPO / "configs" / "positions").glob("*.yaml"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i in range(30):
        lines = [f"def f_{i}_{j}(x):\n    return x * {j} + {i}\n" for j in range(12)]
        (root / f"m{i}.py").write_text("\n".join(lines))
    return root


def test_every_encoding_has_a_config():
    from minilm.positions import REGISTRY

    assert {p.stem for p in CONFIGS} == set(REGISTRY)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_trains_30_steps_with_falling_loss(config, corpus, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    argv = [
        "--config", str(config), f"run.dir={run}",
        "data.sources.embedded=null", f"data.sources.local={{kind: files, paths: ['{corpus}/*.py']}}",
        "data.tokenizer.vocab_size=320", f"data.cache_dir={corpus.parent / 'cache'}",
        "model.n_layers=2", "model.d_model=32", "model.n_heads=2",
        "train.seq_len=32", "train.batch_size=8", "train.steps=30", "train.val_every=0", "train.val_batches=1",
        "train.log_every=5", "train.ckpt_every=0", "optim.lr=0.01", "optim.warmup_steps=3",
    ]  # fmt: skip
    assert train.run_cli(train.main, train.parser(), argv) == 0, capsys.readouterr().err
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert losses[-1] < 0.8 * losses[0], losses
