"""A run's saved config.yaml that cannot be read (truncated, edited by hand) is one message naming it, wherever it is
read: minilm.runs.load_run_config (evaluate, generate, export, the finished-phase checks) and train.py --resume."""

import pytest

from minilm.errors import MinilmError
from tests.conftest import REPO

BROKEN = {
    "not_yaml": "model:\n  n_layers: [\n",
    "duplicate_key": "model: {n_layers: 2}\nmodel: {n_layers: 3}\n",
    "unknown_key": "model:\n  n_layer: 2\n",
    "not_a_mapping": "garbage\n",
}


@pytest.mark.parametrize("text", BROKEN.values(), ids=BROKEN.keys())
def test_an_unreadable_run_config_is_named(tmp_path, text):
    from minilm.runs import load_run_config

    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(MinilmError, match=f"{tmp_path / 'config.yaml'}: not a readable run config"):
        load_run_config(tmp_path / "config.yaml")


def test_resume_on_a_run_whose_config_is_unreadable_exits_2(tmp_path, train_here):
    """It was a YAML / OmegaConf traceback from the --resume model-section check."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(BROKEN["duplicate_key"])
    proc = train_here("--config", REPO / "configs" / "tiny.yaml", f"run.dir={run}", "--resume", check=False)
    err = proc.stderr
    assert proc.returncode == 2
    assert f"{run / 'config.yaml'}: not a readable run config" in err and "duplicate key" in err, err
    assert "Traceback" not in err and (run / "config.yaml").read_text() == BROKEN["duplicate_key"]
