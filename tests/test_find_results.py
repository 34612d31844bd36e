"""minilm.runs.find_results: what compare_runs.py is given, and what it says when that is not a run."""

from pathlib import Path

import pytest

from minilm.config import load_config, save_config
from minilm.errors import MinilmError
from minilm.runs import find_results


def test_a_folder_of_runs_is_named_as_such(tmp_path):
    """A study's variant folder holds one run per seed; compare_runs.py told the user to evaluate the folder itself,
    which is not a run."""
    variant = tmp_path / "yarn"
    for seed in ("seed1", "seed2"):
        (variant / seed).mkdir(parents=True)
        (variant / seed / "config.yaml").write_text("run: {name: x}\n")
    with pytest.raises(MinilmError, match=r"yarn: not a run but a folder of runs \(seed1, seed2\); name them: "):
        find_results(variant)
    with pytest.raises(MinilmError, match="no such file or directory"):
        find_results(tmp_path / "missing")
    with pytest.raises(MinilmError, match=r"not a run directory \(no config.yaml\)"):
        find_results(tmp_path)  # holds no run: only a folder that does


def _run(tmp_path):
    """A three-phase run as far as find_results looks: its config.yaml (pretrain, extend_512, extend_2k)."""
    run = tmp_path / "run"
    repo = Path(__file__).resolve().parents[1]
    save_config(load_config(str(repo / "configs" / "rope_yarn_tiny.yaml")), run / "config.yaml")
    return run


def _results(where):
    where.mkdir(parents=True, exist_ok=True)
    (where / "results.json").write_text("{}")
    return where / "results.json"


def test_each_documented_path_finds_its_results(tmp_path):
    """A results.json itself, an evaluation directory, a phase directory (its eval/) and a run directory: the last
    phase with an evaluation, not the first one."""
    run = _run(tmp_path)
    first = _results(run / "pretrain" / "eval")
    assert find_results(run) == first  # the only evaluated phase
    middle = _results(run / "extend_512" / "eval")
    assert find_results(run) == middle  # the later one, though extend_2k (the last) has none
    assert find_results(run / "pretrain") == first
    assert find_results(run / "pretrain" / "eval") == first
    assert find_results(first) == first
    other = _results(tmp_path / "elsewhere")  # an evaluation written with --out anywhere
    assert find_results(other.parent) == other
    for name in ("pretrain", "extend_512"):
        (run / name / "eval" / "results.json").unlink()
    (run / "pretrain" / "model.safetensors").write_bytes(b"")  # finished, not evaluated
    (run / "pretrain" / "complete.json").write_text("{}")
    with pytest.raises(MinilmError, match="no results.json found; run scripts/evaluate.py --run"):
        find_results(run)  # a run not evaluated yet
    # evaluated only with a training-free method (evaluate.py --extension): "no results.json found" was not so
    method = _results(run / "pretrain" / "eval-dynamic")
    with pytest.raises(MinilmError, match=rf"none of its phases has its own evaluation \(eval/results.json\); name "
                                          rf"one of its other evaluations \({method.parent}\), or run scripts/"):
        find_results(run)
    assert find_results(method.parent) == method


def test_a_path_outside_any_run_is_named_as_given(tmp_path):
    """evaluate.py --run configs/tiny.yaml said 'configs is not inside a minilm run directory': the folder of the
    file, not what the user gave."""
    from minilm.runs import resolve_run

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.yaml").write_text("run: {name: x}\n")
    with pytest.raises(MinilmError, match=rf"^{tmp_path / 'configs' / 'tiny.yaml'} is not inside a minilm run "):
        resolve_run(tmp_path / "configs" / "tiny.yaml")


def test_a_run_without_a_finished_phase_is_told_to_finish_it_not_to_evaluate_it(tmp_path):
    """compare_runs.py advised 'run scripts/evaluate.py --run RUN first', which then refused: no phase had finished."""
    run = _run(tmp_path)
    (run / "pretrain").mkdir()
    with pytest.raises(MinilmError, match=r"no evaluation, and no finished phase to evaluate yet; finish its first "
                                          rf"phase with: python train.py --config {run}/config.yaml run.dir={run} "
                                          r"--resume, then scripts/evaluate.py"):
        find_results(run)
    (run / "pretrain" / "model.safetensors").write_bytes(b"")  # a finished phase: evaluate it
    (run / "pretrain" / "complete.json").write_text("{}")
    with pytest.raises(MinilmError, match=rf"no results.json found; run scripts/evaluate.py --run {run} first"):
        find_results(run)


def test_a_phase_directory_without_an_evaluation_is_named_as_a_phase_of_its_run(tmp_path):
    """A phase directory holds a config.yaml of its own (its phase's, without phases): it was taken for a run whose
    only phase is 'train', and compare_runs.py advised training into the phase directory: 'finish its first phase
    with: python train.py --config RUN/extend_512/config.yaml run.dir=RUN/extend_512 --resume'."""
    from minilm.config import phase_config

    run = _run(tmp_path)
    cfg = load_config(str(run / "config.yaml"))
    save_config(phase_config(cfg, "extend_512"), run / "extend_512" / "config.yaml")
    with pytest.raises(MinilmError, match=rf"^{run / 'extend_512'}: phase 'extend_512' of {run} has not finished, so "
                                          rf"it has no evaluation; continue the run with: python train.py --config "
                                          rf"{run}/config.yaml run.dir={run} --resume$"):
        find_results(run / "extend_512")
    (run / "extend_512" / "model.safetensors").write_bytes(b"")  # written before its evaluation and complete.json
    with pytest.raises(MinilmError, match=rf"phase 'extend_512' of {run} has not finished"):
        find_results(run / "extend_512")
    (run / "extend_512" / "complete.json").write_text("{}")
    with pytest.raises(MinilmError, match=rf"has no evaluation \(no eval/results.json\); run scripts/evaluate.py "
                                          rf"--run {run} --phase extend_512 first$"):
        find_results(run / "extend_512")
