"""What the ranks of a DDP run other than rank 0 decide, in process (no second process): from the one checkpoint
rank 0 writes, and from a run directory rank 0 may be changing while they look."""

import logging
from types import SimpleNamespace

import pytest

from minilm.config import load_config, phase_config
from minilm.data import load_corpus
from minilm.errors import MinilmError
from minilm.training import phases, run_checks
from minilm.training.datamodule import PhaseData
from tests.conftest import tiny_run_yaml

pytestmark = pytest.mark.usefixtures("one_thread")

TWO_PHASES = ["phases.short.steps=2", "phases.long.steps=2", "phases.long.seq_len=64"]


@pytest.fixture
def config(tmp_path, tiny_text_dir):
    path = tmp_path / "exp.yaml"
    path.write_text(tiny_run_yaml(tiny_text_dir, tmp_path / "cache", steps=4, batch_size=2, ckpt_every=1))
    return path


@pytest.fixture
def phase(config):
    cfg = load_config(config, [])
    return load_corpus(cfg.data), phase_config(cfg, "train")


def data_on(corpus, pcfg, rank: int, world_size: int) -> PhaseData:
    data = PhaseData(corpus, pcfg, "train")
    data.trainer = SimpleNamespace(global_rank=rank, world_size=world_size)  # what PhaseData reads of its trainer
    return data


def test_every_rank_resumes_from_rank_zeros_checkpoint_without_a_warning(phase, caplog):
    """Rank 0 writes the checkpoint (its sampler state says rank 0); rank 1 warned on every exact DDP resume that
    its batches "differ from the original run from here on"."""
    corpus, pcfg = phase
    saved = data_on(corpus, pcfg, 0, 2).state_dict()
    with caplog.at_level(logging.WARNING):
        data_on(corpus, pcfg, 1, 2).load_state_dict(saved)
    assert "differ" not in caplog.text


def test_resuming_on_another_device_count_with_the_same_global_batch_is_exact(config, caplog):
    """train.batch_size is per device and the sampler draws the global batch: 2 devices x 2 rows continue as 1 x 4
    (the same rows), and 1 x 4 as 4 x 1. The restore refused 1 x 4 ("batch_size: checkpoint 2 != now 4") and only
    warned of 1 x 2, which trains on half the rows of each step from there on."""
    cfg = load_config(config, [])
    corpus = load_corpus(cfg.data)
    per_device = {b: phase_config(load_config(config, [f"train.batch_size={b}"]), "train") for b in (1, 2, 4)}
    saved = data_on(corpus, per_device[2], 0, 2).state_dict()
    with caplog.at_level(logging.WARNING):
        one = data_on(corpus, per_device[4], 0, 1)
        one.load_state_dict(saved)
        data_on(corpus, per_device[1], 3, 4).load_state_dict(saved)
    assert "differ" not in caplog.text
    two = [data_on(corpus, per_device[2], r, 2).sampler.batch(5)["input_ids"] for r in (0, 1)]
    assert one.sampler.batch(5)["input_ids"].tolist() == [*two[0].tolist(), *two[1].tolist()]
    with pytest.raises(MinilmError, match=r"global batch of 4 sequences \(batch_size 2 x 2 process\(es\)\), this "
                                          r"run on 2"):  # fmt: skip
        data_on(corpus, per_device[2], 0, 1).load_state_dict(saved)


def _interrupted(config, tmp_path, batch_size: int, *over: str):
    """A one-device run with ``batch_size`` rows per step, as a kill after its checkpoint at step 2 leaves it."""
    run_dir = tmp_path / "run"
    phases.run_phases(load_config(config, [f"run.dir={run_dir}", f"train.batch_size={batch_size}", *over]),
                      log=lambda msg: None)  # fmt: skip
    for name in ("complete.json", "model.safetensors", "config.yaml", "optimizer.pt"):
        (run_dir / "train" / name).unlink()
    for ckpt in (run_dir / "train" / "checkpoints").glob("step-*.ckpt"):
        if ckpt.name != "step-00000002.ckpt":
            ckpt.unlink()
    return run_dir


@pytest.mark.parametrize("batch_size, world_size, says", [
    (2, 2, None),  # 1 x 4 -> 2 x 2: the same global batch
    (1, 4, None),
    (4, 2, r"global batch of 4 sequences \(train.batch_size 4 x 1 process\(es\)\).*now gives 8 .*"
           r"resume with train.batch_size=2 on 2 process"),
    (2, 1, r"global batch of 4 .*now gives 2 .*resume with train.batch_size=4 on 1 process"),
    (1, 3, r"now gives 3 .*resume with 1 process\(es\) and train.batch_size=4"),
])
def test_resume_compares_the_global_batch_not_the_per_device_one(config, tmp_path, batch_size, world_size, says):
    """What --resume checks, for the device count it will run on: 1 x 4 may continue as 2 x 2 (exact: the test of
    it under DDP is in test_ddp.py), not as 2 x 4 or 1 x 2, and the message says which batch_size fits."""
    run_dir = _interrupted(config, tmp_path, 4, "train.ckpt_every=2")
    cfg = load_config(config, [f"run.dir={run_dir}", f"train.batch_size={batch_size}"])
    corpus, said, pcfg = load_corpus(cfg.data), [], phase_config(cfg, "train")

    def check():
        ckpt, sampler = run_checks._check_interrupted_phase(pcfg, "train", run_dir, world_size, said.append)
        run_checks._check_resumed_sampler(corpus, pcfg, "train", ckpt, sampler, world_size)
        return ckpt

    if says is None:
        assert check().name == "step-00000002.ckpt"
        assert said == [] if world_size == 1 else "interrupted on 1 process(es), resumed on" in said[0]
    else:
        with pytest.raises(MinilmError, match=says):
            check()


def test_resume_on_another_batch_split_keeps_the_micro_batches_per_step_and_the_steps(config, tmp_path):
    """Lightning restores its loop in micro-batches, so the count per step must stay (not micro_batch_size itself);
    and train.tokens counts one device's tokens, so at another batch_size it gives another number of steps."""
    run_dir = _interrupted(config, tmp_path, 4, "train.ckpt_every=2", "train.micro_batch_size=2")
    corpus = load_corpus(load_config(config, []).data)

    def check(*over, world_size=2):
        pcfg = phase_config(load_config(config, [f"run.dir={run_dir}", *over]), "train")
        ckpt, sampler = run_checks._check_interrupted_phase(pcfg, "train", run_dir, world_size, lambda msg: None)
        run_checks._check_resumed_sampler(corpus, pcfg, "train", ckpt, sampler, world_size)
        return ckpt

    assert check("train.batch_size=2", "train.micro_batch_size=1") is not None  # 2 micro-batches of 1 per step
    with pytest.raises(MinilmError, match=r"train.micro_batch_size = 2 \(2 micro-batch\(es\) per step.*now says 2 "
                                          r"\(1 of 2\); resume with train.micro_batch_size=1"):
        check("train.batch_size=2", "train.micro_batch_size=2")
    run_dir = _interrupted(config, tmp_path / "tokens", 4, "train.ckpt_every=2", "train.tokens=512")  # 4 steps
    with pytest.raises(MinilmError, match=r"training 4 steps .*gives 8 steps.*resume with train.tokens=256"):
        check("train.batch_size=2", "train.tokens=512")
    assert check("train.batch_size=2", "train.tokens=256") is not None


def test_a_restarted_phase_is_retrained_by_every_rank_whatever_run_dir_still_holds(config, tmp_path, monkeypatch):
    """--phase long under torchrun / SLURM: every rank starts at once and only rank 0 deletes the old outputs of
    the phases it retrains. Another rank that looked first found 'long' complete (or its old checkpoints) and
    skipped it, while rank 0 waited for it in the DDP setup forever. Here the other rank looks at a run directory
    nobody has cleared: it must train 'long' from its start all the same."""
    run_dir = tmp_path / "run"
    cfg = load_config(config, [*TWO_PHASES, f"run.dir={run_dir}"])
    phases.run_phases(cfg, log=lambda msg: None)
    assert (run_dir / "long" / "checkpoints" / "step-00000001.ckpt").is_file()  # an old checkpoint to ignore too
    monkeypatch.setattr(phases, "is_primary_process", lambda: False)
    trained, train_phase = [], phases._train_phase

    def recorded(model, corpus, pcfg, name, *args, fresh=False, **kwargs):
        trained.append((name, fresh))
        train_phase(model, corpus, pcfg, name, *args, fresh=fresh, **kwargs)

    monkeypatch.setattr(phases, "_train_phase", recorded)
    said = []
    phases.run_phases(cfg, start_phase="long", log=said.append)
    assert trained == [("long", True)]  # trained, from its start (not its old checkpoints)
    assert said == []  # the other ranks say nothing: each line of a DDP run was printed once per process


@pytest.mark.parametrize("var", ["NODE_RANK", "GROUP_RANK"])
def test_the_first_process_of_a_second_node_is_not_the_primary_one(monkeypatch, var):
    """Several nodes started by hand (Lightning's MASTER_ADDR / NODE_RANK, no global RANK): the first process of
    node 1 has local rank 0, and took the run lock and wrote run.dir's files as if it were rank 0."""
    for key in ("NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert run_checks.is_primary_process()
    monkeypatch.setenv(var, "1")
    assert not run_checks.is_primary_process()
    monkeypatch.setenv(var, "0")
    assert run_checks.is_primary_process()


def test_resume_compares_a_finished_phase_by_its_global_batch(config, tmp_path):
    """--resume skips finished phases whose config still trains them so: a phase finished on 1 device x 4 rows was
    "changed" to the config of 2 x 2 (train.batch_size 4 -> 2). Its summary now records its world size; a summary
    from before that is compared per device, as it was."""
    import json

    run_dir = tmp_path / "run"
    phases.run_phases(load_config(config, [f"run.dir={run_dir}", "train.batch_size=4"]), log=lambda msg: None)
    summary = run_dir / "train" / "complete.json"
    assert json.loads(summary.read_text())["world_size"] == 1

    def check(batch_size: int, world_size: int):
        pcfg = phase_config(load_config(config, [f"run.dir={run_dir}", f"train.batch_size={batch_size}"]), "train")
        run_checks.check_finished_phase(pcfg, "train", run_dir, "--resume", False, world_size)

    check(2, 2)
    check(1, 4)
    with pytest.raises(run_checks.ChangedPhaseError, match=r"the global batch \(train.batch_size x processes\) = "
                                                       r"'4 x 1' .*now says '2 x 1'"):  # fmt: skip
        check(2, 1)
    # saying which batch_size keeps the global batch on the new device count (it said only "retrain it")
    with pytest.raises(run_checks.ChangedPhaseError, match=r"keep its global batch with train.batch_size=2 on 2 "):
        check(4, 2)
    with pytest.raises(run_checks.ChangedPhaseError, match=r"keep its global batch with 1 process\(es\) and "
                                                       r"train.batch_size=4, retrain it"):  # fmt: skip
        check(1, 3)
    summary.write_text(json.dumps({k: v for k, v in json.loads(summary.read_text()).items() if k != "world_size"}))
    with pytest.raises(run_checks.ChangedPhaseError, match=r"train.batch_size = 4"):
        check(2, 2)


def test_another_device_count_hides_no_other_change_of_a_phase(config, tmp_path):
    """train.batch_size, compared as a global batch on another device count, sorts first in its section: dropping
    the first difference found there as "the batch split" hid every later one, so a finished phase whose
    train.steps doubled was skipped on 2 x 2 as if unchanged (it was refused on 1 x 4)."""
    run_dir = tmp_path / "run"
    phases.run_phases(load_config(config, [f"run.dir={run_dir}", "train.batch_size=4"]), log=lambda msg: None)
    for batch_size, world_size in [(4, 1), (2, 2)]:
        pcfg = phase_config(load_config(config, [f"run.dir={run_dir}", f"train.batch_size={batch_size}",
                                                 "train.steps=8"]), "train")  # fmt: skip
        with pytest.raises(run_checks.ChangedPhaseError, match=r"finished with train.steps = 4 .*now says 8"):
            run_checks.check_finished_phase(pcfg, "train", run_dir, "--resume", False, world_size)
    trained = run_checks.what_trains(pcfg)  # an interrupted phase, in what its checkpoint records: 1 x 4 rows of 64
    trained["train"].update(batch_size=4, seq_len=64)
    with pytest.raises(MinilmError, match=r"interrupted training with train.seq_len = 64 .*now says 32"):
        run_checks._check_trained_with(trained, pcfg, "train", run_dir / "step.ckpt", 1, 2)
