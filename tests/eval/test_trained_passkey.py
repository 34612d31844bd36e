"""The suite must be able to succeed too: ``configs/passkey_tiny.yaml`` — a tiny GPT trained on CPU, through
train.py, on the synthetic passkey rows of the embedded corpus with the loss on the answer — scores high on passkey
at its training length in its end-of-phase evaluation (the untrained end is pinned in test_eval.py).

Slow: ~3 minutes on 2 cores, plus preparing the embedded corpus once if ``data/cache`` does not hold it yet (shared
with ``make train``). Measured with this config on the 2-core dev box (docs/evaluation.md): passkey 1.0 at 48 for
run.seed 1337, 1 and 2."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_train

SEQ_LEN = 48


@pytest.mark.slow
def test_passkey_tiny_config_retrieves_at_its_training_length(tmp_path):
    run = tmp_path / "run"
    run_train("--config", "configs/passkey_tiny.yaml", f"run.dir={run}", f"eval.lengths=[{SEQ_LEN}]", timeout=1200)
    results = json.loads((run / "train" / "eval" / "results.json").read_text())
    assert results["train_seq_len"] == SEQ_LEN
    assert results["passkey"][str(SEQ_LEN)] >= 0.8, results["passkey_grid"]
