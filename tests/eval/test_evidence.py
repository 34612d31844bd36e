"""Evaluation outputs as evidence: what results.json, report.md and compare.md say about a number must be what was
measured — the extension's parameters as applied, how many prompts a retrieval accuracy rests on."""

from __future__ import annotations

import json

import pytest

from minilm.eval import evaluate_run

QUICK = dict(lengths=[32], tasks=["ppl"], batches=1, batch_tokens=64, sliding=False, tensorboard=False, device="cpu",
             log=lambda *_: None)  # fmt: skip


@pytest.mark.parametrize("extension,filled", [({"name": "dynamic", "factor": 2}, {"original_max_position_embeddings": 64}),
                                              ({"name": "logn"}, {"train_len": 64}),
                                              ({"name": "rope_scaling", "rope_type": "dynamic", "factor": 2},
                                               {"original_max_position_embeddings": 64})])  # fmt: skip
def test_the_report_names_the_extension_parameters_taken_from_the_training_length(fake_run, tmp_path, extension,
                                                                                  filled):  # fmt: skip
    """``--extension dynamic factor=2`` on a phase trained at 64 runs dynamic NTK with original length 64; results.json
    and report.md used to record only ``{name: dynamic, factor: 2}``, so a reader could not tell which original
    length the numbers were measured with (a later phase's training length, not the pretraining length)."""
    res, out = evaluate_run(fake_run, extension=extension, out=tmp_path / "ev", **QUICK)
    assert res["extension"] == {**extension, **filled}
    assert json.loads((out / "results.json").read_text())["extension"] == {**extension, **filled}
    key, value = next(iter(filled.items()))
    assert f'"{key}": {value}' in (out / "report.md").read_text()
