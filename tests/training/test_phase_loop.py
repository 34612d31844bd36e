"""The phase loop's bookkeeping, in process: how often it validates, what it logs across phases, and trainer
settings Lightning refuses."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.training.phases import run_phases
from tests.conftest import tiny_run_yaml

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture
def config(tmp_path, tiny_text_dir):
    path = tmp_path / "exp.yaml"
    path.write_text(tiny_run_yaml(tiny_text_dir, tmp_path / "cache"))
    return path


def scalars(run_dir, tag):
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("val_every", [0, 10])
def test_the_end_of_a_phase_is_validated_once(config, tmp_path, val_every):
    """val_every 0 ("only at the end") or beyond the phase's steps: Lightning validated at the end of the epoch and
    the loop validated again after fit, the same loss logged twice at the last step (and a whole validation pass
    spent)."""
    run = tmp_path / "run"
    run_phases(load_config(config, [f"run.dir={run}", f"train.val_every={val_every}"]), log=lambda m: None)
    assert [step for step, _ in scalars(run, "val/loss")] == [0, 3]  # before the first step, and at the end


def test_the_run_records_the_documents_it_held_out_and_its_evaluation_checks_them(config, tmp_path):
    """An evaluation on a corpus prepared again could read documents the run trained on (same tokenizer, another
    split): the run records its held-out split's digest, the evaluation compares."""
    import json

    from minilm.data import load_corpus
    from minilm.eval.suite import eval_data

    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}"])
    run_phases(cfg, log=lambda m: None)
    corpus = load_corpus(cfg.data, progress=False)
    held = json.loads((run / "held_out.json").read_text())
    assert held == {"corpus": corpus.cache_dir.name, "documents": corpus.val.n_docs, "digest": corpus.val.digest()}
    assert eval_data(cfg, run).val.n_docs == corpus.val.n_docs
    (run / "held_out.json").write_text(json.dumps({**held, "digest": "0" * 64}))
    with pytest.raises(MinilmError, match="not those the run held out"):
        eval_data(cfg, run)


def test_resume_keeps_the_record_of_the_documents_the_run_held_out(config, tmp_path):
    """--resume rewrote held_out.json with the corpus as prepared now, so a run that went on after its source files
    changed recorded the new split, and its evaluation passed on documents it had trained on. A record that differs
    from the corpus now (here: as if the files changed) is refused where training goes on, kept as it was where
    nothing trains, and never overwritten; a restart of every phase records the split it trains beside."""
    import json

    run = tmp_path / "run"
    two = [f"run.dir={run}", "phases.a={seq_len: 32, steps: 2}", "phases.b={seq_len: 32, steps: 2}"]
    run_phases(load_config(config, two), log=lambda m: None)
    record = run / "held_out.json"
    then = {**json.loads(record.read_text()), "digest": "0" * 64}  # what the run held out before the files changed
    record.write_text(json.dumps(then))
    said = []
    run_phases(load_config(config, two), resume=True, log=said.append)  # a finished run: nothing trains
    assert json.loads(record.read_text()) == then
    assert any("holds out other documents than the run did" in m and "keeps the run's record" in m for m in said)
    for name in ("complete.json", "model.safetensors"):  # phase b interrupted before its first checkpoint
        (run / "b" / name).unlink()
    with pytest.raises(MinilmError, match=r"--resume: the corpus prepared now .* holds out other documents than the "
                                          r"run did .*Phases a trained beside the recorded split"):  # fmt: skip
        run_phases(load_config(config, two), resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"--phase b: the corpus prepared now"):
        run_phases(load_config(config, two), start_phase="b", log=lambda m: None)
    assert json.loads(record.read_text()) == then and not (run / "b" / "complete.json").exists()
    run_phases(load_config(config, two), start_phase="a", log=lambda m: None)  # every phase retrains: a new record
    assert json.loads(record.read_text())["digest"] != "0" * 64
    kept = record.stat().st_mtime_ns
    run_phases(load_config(config, two), resume=True, log=lambda m: None)  # the same split: left as it is
    assert record.stat().st_mtime_ns == kept
    record.unlink()  # a run from before the record (or a study's run with copied phases): the corpus now, recorded
    run_phases(load_config(config, two), resume=True, log=lambda m: None)
    assert json.loads(record.read_text())["digest"] != "0" * 64


def test_resume_refuses_a_tokenizer_other_than_the_one_the_kept_phases_trained_with(config, tmp_path):
    """Changed source files give another tokenizer (it is trained on them): --resume copied it over the run's, whose
    weights read the old ids, and exited 0 where nothing trained. Refused now, before anything is written, whether
    phases train or not; with the run's tokenizer back, the run goes on."""
    run = tmp_path / "run"
    two = [f"run.dir={run}", "phases.a={seq_len: 32, steps: 2}", "phases.b={seq_len: 32, steps: 2}"]
    run_phases(load_config(config, two), log=lambda m: None)
    tokenizer, saved = run / "tokenizer.model", run / "config.yaml"
    ours = tokenizer.read_bytes()
    tokenizer.write_bytes(b"the tokenizer the run trained with, before its files changed")
    written = {f: f.stat().st_mtime_ns for f in (tokenizer, saved)}
    with pytest.raises(MinilmError, match=r"--resume: the tokenizer prepared now .* is not the run's .*tokenizer\.model"
                                          r", which phases a, b trained with"):  # fmt: skip
        run_phases(load_config(config, two), resume=True, log=lambda m: None)  # a finished run: nothing trains
    for name in ("complete.json", "model.safetensors"):  # phase b interrupted before its first checkpoint
        (run / "b" / name).unlink()
    with pytest.raises(MinilmError, match=r"--resume: the tokenizer prepared now .* which phases a trained with"):
        run_phases(load_config(config, two), resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"--phase b: the tokenizer prepared now"):
        run_phases(load_config(config, two), start_phase="b", log=lambda m: None)
    assert {f: f.stat().st_mtime_ns for f in (tokenizer, saved)} == written
    tokenizer.write_bytes(ours)
    run_phases(load_config(config, two), resume=True, log=lambda m: None)
    assert (run / "b" / "complete.json").exists() and tokenizer.read_bytes() == ours


def test_resume_refuses_a_phase_inserted_before_finished_ones_and_an_init_it_would_replace(config, tmp_path):
    """A phase inserted before finished ones trained on --resume, then the finished ones were skipped: its training
    thrown away, TensorBoard's later curves purged. --resume --init said the initial weights were loaded, then the
    finished phases' weights replaced them. Both refused before anything is written."""
    run = tmp_path / "run"
    a, b = "phases.a={seq_len: 32, steps: 2}", "phases.b={seq_len: 32, steps: 2}"
    run_phases(load_config(config, [f"run.dir={run}", a, b]), log=lambda m: None)
    written = (run / "config.yaml").stat().st_mtime_ns
    inserted = load_config(config, [f"run.dir={run}", a, "phases.mid={seq_len: 32, steps: 2}", b])
    with pytest.raises(MinilmError, match=r"--resume: phase 'mid' has not finished, but 'b' after it has, trained "
                                          r"from other weights .*--phase mid"):  # fmt: skip
        run_phases(inserted, resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"--init: --resume continues the run from its trained phases \(a, b\)"):
        run_phases(load_config(config, [f"run.dir={run}", a, b]), resume=True, init=str(run / "model.safetensors"),
                   log=lambda m: None)  # fmt: skip
    assert (run / "config.yaml").stat().st_mtime_ns == written and not (run / "mid").exists()
    run_phases(inserted, start_phase="mid", log=lambda m: None)  # what the message says: mid, then b again
    assert (run / "mid" / "complete.json").exists() and (run / "b" / "complete.json").exists()


def test_resume_refuses_finished_phases_the_config_now_chains_otherwise(config, tmp_path):
    """A phase removed from the config (or the phases reordered) left a finished phase that had trained after another
    one: --resume skipped it as finished, and the run's weights were those of a chain the config no longer describes
    ('c' trained after 'b', the config now a then c). Refused before anything is written; --phase c retrains it."""
    run = tmp_path / "run"
    a, b, c = ("phases.a={seq_len: 32, steps: 1}", "phases.b={seq_len: 32, steps: 1}",
               "phases.c={seq_len: 32, steps: 1}")  # fmt: skip
    run_phases(load_config(config, [f"run.dir={run}", a, b, c]), log=lambda m: None)
    written = (run / "config.yaml").stat().st_mtime_ns
    removed = load_config(config, [f"run.dir={run}", a, c])
    with pytest.raises(MinilmError, match=r"--resume: phase 'c' finished after phase 'b' \(.*complete\.json\), but the "
                                          r"config now trains it after phase 'a'.*--phase c"):  # fmt: skip
        run_phases(removed, resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"--resume: phase 'b' finished after phase 'a' .*trains it as its first "
                                          r"phase"):  # fmt: skip
        run_phases(load_config(config, [f"run.dir={run}", b, a, c]), resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"--phase d: phase 'c' finished after phase 'b'"):  # the phase d starts from
        run_phases(load_config(config, [f"run.dir={run}", a, c, "phases.d={seq_len: 32, steps: 1}"]),
                   start_phase="d", log=lambda m: None)  # fmt: skip
    assert (run / "config.yaml").stat().st_mtime_ns == written
    run_phases(removed, start_phase="c", log=lambda m: None)  # what the message says
    run_phases(removed, resume=True, log=lambda m: None)  # the chain is the config's now


def test_tokens_seen_adds_each_phase_at_its_own_batch_and_length(config, tmp_path):
    """tokens_seen counted every step of the earlier phases at the current phase's batch_size · seq_len."""
    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}", "phases.a={seq_len: 32, batch_size: 4, steps: 2}",
                               "phases.b={seq_len: 64, batch_size: 1, steps: 2}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    assert scalars(run, "tokens_seen") == [(1, 128), (2, 256), (3, 256 + 64), (4, 256 + 128)]


@pytest.mark.parametrize("override, named", [("trainer.accelerator=tpuu", "trainer.accelerator=tpuu"),
                                             ("trainer.devices=abc", "trainer.devices=abc"),
                                             ("trainer.strategy=dpp", "trainer.strategy=dpp")])
def test_trainer_settings_lightning_refuses_are_named_before_the_run_starts(config, tmp_path, override, named):
    """They went to lightning.Trainer when the first phase began: a ValueError / TypeError traceback (exit 1), after
    run.dir's config.yaml, tokenizer and TensorBoard directory were written."""
    run = tmp_path / "run"
    with pytest.raises(MinilmError, match=f"trainer: .*{named}"):
        run_phases(load_config(config, [f"run.dir={run}", override]), log=lambda m: None)
    assert not run.exists()


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_a_strategy_that_trains_in_spawned_processes_is_refused(config, tmp_path, strategy):
    """Lightning runs it, but the phases never get the trained state back: each ended 'stopped at step 0 of N;
    resume with --resume', and --resume did the same."""
    run = tmp_path / "run"
    overrides = [f"run.dir={run}", "trainer.devices=2", f"trainer.strategy={strategy}"]
    with pytest.raises(MinilmError, match=f"trainer.strategy={strategy}: .*use trainer.strategy=ddp"):
        run_phases(load_config(config, overrides), log=lambda m: None)
    assert not run.exists()


@pytest.mark.parametrize("kind", ["FSDPStrategy", "DeepSpeedStrategy"])
def test_a_strategy_that_shards_the_model_is_refused(config, tmp_path, monkeypatch, kind):
    """Lightning builds FSDP and DeepSpeed on CUDA only; there a phase trained, then ended in rank 0 alone, which
    holds a shard: its weights, optimizer state and evaluation were of a part of the model."""
    import lightning as L
    import lightning.pytorch.strategies as S

    real = L.Trainer

    def with_sharded_strategy(*args, **kwargs):  # a CPU trainer that reports the GPU-only strategy
        trainer = real(*args, **{**kwargs, "strategy": "auto"})
        trainer._accelerator_connector.strategy = object.__new__(getattr(S, kind))
        return trainer

    monkeypatch.setattr(L, "Trainer", with_sharded_strategy)
    run = tmp_path / "run"
    with pytest.raises(MinilmError, match=f"trainer.strategy=fsdp: {kind} shards the model .*use trainer.strategy=ddp"):
        run_phases(load_config(config, [f"run.dir={run}", "trainer.strategy=fsdp"]), log=lambda m: None)
    assert not run.exists()


def test_several_nodes_that_nothing_launched_are_refused(config, tmp_path, monkeypatch):
    """trainer.num_nodes=2 from a plain `python train.py`: the run waited for the other node's processes until the
    process group's timeout (30 minutes), then failed with a traceback."""
    for key in ("MASTER_ADDR", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    run = tmp_path / "run"
    overrides = [f"run.dir={run}", "trainer.devices=2", "trainer.strategy=ddp", "trainer.num_nodes=2"]
    with pytest.raises(MinilmError, match="trainer.num_nodes=2: this process was not started by torchrun or SLURM"):
        run_phases(load_config(config, overrides), log=lambda m: None)
    assert not run.exists()


SLURM = {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "5", "SLURM_NODELIST": "node1"}  # fmt: skip
TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip


@pytest.mark.parametrize("launcher, devices", [(SLURM, 2), (TORCHRUN, 1)], ids=["slurm", "torchrun"])
def test_devices_that_do_not_match_the_launched_processes_are_refused(config, tmp_path, monkeypatch, launcher,
                                                                      devices):  # fmt: skip
    """srun with --ntasks-per-node=1 and trainer.devices=2: Lightning checked the two agree only when the first
    phase started, a ValueError traceback (exit 1) after run.dir's config.yaml, tokenizer and TensorBoard were
    written. torchrun --nproc_per_node=2 with trainer.devices=1: every process trained a single-device run of its
    own, each writing the run's phase outputs."""
    for key, value in launcher.items():
        monkeypatch.setenv(key, value)
    run = tmp_path / "run"
    overrides = [f"run.dir={run}", f"trainer.devices={devices}"]
    with pytest.raises(MinilmError, match=f"trainer: .*trainer.devices={devices}.* do not match how the processes"):
        run_phases(load_config(config, overrides), log=lambda m: None)
    assert not run.exists()


def test_resume_past_or_at_a_shortened_phase_end(config, tmp_path):
    """--resume after the phase's steps were lowered: a checkpoint beyond the new end was restored, fit had nothing
    left to do, and the phase was marked finished with more steps in its weights than its config and complete.json
    said. It is refused; a checkpoint exactly at the new end finishes the phase, validated."""
    import json

    run = tmp_path / "run"
    over = [f"run.dir={run}", "train.ckpt_every=2", "train.val_every=0"]
    run_phases(load_config(config, [*over, "train.steps=3"]), log=lambda m: None)
    (run / "train" / "complete.json").unlink()  # as if killed after the checkpoint at step 2
    with pytest.raises(MinilmError, match=r"checkpoint at step 2 .*beyond the 1 steps .*at least 2 steps "
                                          r"\(train.steps=2\), or retrain"):  # the key to set, named
        run_phases(load_config(config, [*over, "train.steps=1"]), resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"at least 2 steps \(train.tokens=\d+\)"):  # a length set in tokens
        run_phases(load_config(config, [*over, "train.tokens=1"]), resume=True, log=lambda m: None)
    run_phases(load_config(config, [*over, "train.steps=2"]), resume=True, log=lambda m: None)
    summary = json.loads((run / "train" / "complete.json").read_text())
    assert summary["steps"] == 2 and summary["val_loss"] is not None


def test_micro_batch_size_splits_the_same_rows(config, tmp_path):
    """micro_batch_size trades memory for time: the sampler drew each micro-batch as a batch of its own (other rows
    than a run without accumulation) and validated on val_batches x micro_batch_size rows (a quarter of the rows at
    micro_batch_size = batch_size / 4), so runs differing only in it trained and validated on different data."""
    import json

    from safetensors.torch import load_file

    runs = {}
    for micro in (4, 1):
        run = tmp_path / f"micro{micro}"
        run_phases(load_config(config, [f"run.dir={run}", f"train.micro_batch_size={micro}", "train.val_batches=2",
                                        "train.precision=32"]),  # rounding in fp32 (auto may be bf16-mixed on CPU)
                   log=lambda m: None)  # fmt: skip
        runs[micro] = (load_file(run / "model.safetensors"), json.loads((run / "train/complete.json").read_text()))
    (whole, whole_summary), (split, split_summary) = runs[4], runs[1]
    # the same rows summed in another order: fp32 rounding, which AdamW's normalized steps carry into the weights
    # (1.25e-5 seen once); other rows move a weight by up to lr = 3e-3 a step in another direction
    assert max(float((whole[k] - split[k]).abs().max()) for k in whole) < 1e-4
    assert abs(whole_summary["val_loss"] - split_summary["val_loss"]) < 1e-4


def test_micro_batch_size_trains_as_the_whole_batch_when_rows_differ_in_targets(tmp_path, tiny_text_dir):
    """Synthetic rows trained on their answer alone have a few targets, corpus rows seq_len: a step's loss is the
    mean over all its targets. It was the mean of the micro-batches' means, each row weighed by 1 / its micro-batch's
    targets, so micro_batch_size (and DDP's ranks, the same average over ranks: test_ddp.py) trained otherwise,
    0.015 apart in weights after 3 steps, and validated 0.08 apart."""
    import json

    from safetensors.torch import load_file

    path = tmp_path / "exp.yaml"
    synthetic = "{fraction: 0.5, loss: answer, tasks: [passkey]}"
    path.write_text(tiny_run_yaml(tiny_text_dir, tmp_path / "cache", synthetic=synthetic))
    runs = {}
    for micro in (4, 1):
        run = tmp_path / f"micro{micro}"
        over = [f"run.dir={run}", f"train.micro_batch_size={micro}", "train.val_batches=2", "train.seq_len=128",
                "train.precision=32"]  # rounding in fp32 (auto: bf16-mixed on a CPU with a bf16 unit)
        run_phases(load_config(path, over), log=lambda m: None)
        runs[micro] = (load_file(run / "model.safetensors"), json.loads((run / "train/complete.json").read_text()))
    (whole, whole_summary), (split, split_summary) = runs[4], runs[1]
    assert max(float((whole[k] - split[k]).abs().max()) for k in whole) < 1e-4
    assert abs(whole_summary["val_loss"] - split_summary["val_loss"]) < 1e-4


def _killed_after_checkpoint(run, phase: str, step: int) -> None:
    """The run directory as a kill after phase ``phase``'s checkpoint at ``step`` leaves it: TensorBoard holds the
    steps logged after that checkpoint, the phase has no finished outputs, later checkpoints never happened."""
    for name in ("complete.json", "model.safetensors", "config.yaml", "optimizer.pt"):
        (run / phase / name).unlink(missing_ok=True)
    for ckpt in (run / phase / "checkpoints").glob("step-*.ckpt"):
        if int(ckpt.stem.split("-")[1]) > step:
            ckpt.unlink()
    (run / "model.safetensors").unlink()


TAGS = ("train/loss", "lr", "tokens_seen", "val/loss")


def restart_aware_points(run_dir, tag):
    """(step, value) of ``tag`` as TensorBoard's restart rule gives them: event files read in name order, a
    SessionLog.START at step s after the run's first one drops the points at steps >= s read before it (the first
    is the run's start). (EventAccumulator's own fallback, dropping points when a step goes back, depends on where
    Lightning happened to start new files; it also takes every START for a restart, where `tensorboard --logdir`
    does not: served_points.)"""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    points, started = [], False
    for path in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                if started:
                    points = [(step, value) for step, value in points if step < event.step]
                started = True
            points += [(event.step, v.simple_value) for v in event.summary.value if v.tag == tag]
    return points


def served_points(run_dir, tag):
    """(step, value) of ``tag`` as `tensorboard --logdir` serves them (its plugin_event_accumulator)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as Served
    from tensorboard.util import tensor_util

    acc = Served(str(run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


@pytest.mark.parametrize("how", ["resume", "phase"])
def test_tensorboard_after_a_resume_or_restart_shows_each_step_once(config, tmp_path, how, monkeypatch):
    """A resumed (or --phase restarted) run logged again the steps the interrupted process had already logged past
    its checkpoint: TensorBoard showed them twice, each curve jumping back to the checkpoint's step. The new events
    purge the old ones from the resumed step on (purge_step), so the curves equal an uninterrupted run's."""
    import shutil
    import time
    import types

    import tensorboard.summary.writer.event_file_writer as event_file_writer

    over = ["train.ckpt_every=2", "train.val_every=3", "train.keep_checkpoints=9",
            "phases.a={seq_len: 32, steps: 5}", "phases.b={seq_len: 32, steps: 4}"]  # fmt: skip
    straight, run = tmp_path / "straight", tmp_path / "run"
    run_phases(load_config(config, [f"run.dir={straight}", *over]), log=lambda m: None)
    shutil.copytree(straight, run)
    # TensorBoard reads event files in name order: time in seconds, host, pid, a counter. The second process of a
    # real resume is later and another pid; here it is this process, often within the same second, where a counter
    # going from 9 to 10 sorted the new file first. Its clock is moved on as a real restart's would be.
    later = time.time() + 10
    monkeypatch.setattr(event_file_writer, "time", types.SimpleNamespace(time=lambda: later))
    if how == "resume":  # killed in phase b after its checkpoint at step 2 (run step 7), steps 8 and 9 logged
        _killed_after_checkpoint(run, "b", 2)
        run_phases(load_config(config, [f"run.dir={run}", *over]), resume=True, log=lambda m: None)
    else:  # phase a and b retrained
        run_phases(load_config(config, [f"run.dir={run}", *over]), start_phase="a", log=lambda m: None)
    for tag in TAGS:
        assert scalars(run, tag) == scalars(straight, tag), tag
        assert restart_aware_points(run, tag) == restart_aware_points(straight, tag), tag
        assert served_points(run, tag) == served_points(straight, tag), tag


def test_tensorboard_as_served_drops_the_steps_the_killed_process_logged_after_its_checkpoint(config, tmp_path):
    """`tensorboard --logdir` takes a run's first SessionLog.START for its start and only a later one for a restart:
    the run wrote none when it started, so the one a first --resume writes at its purge step was ignored, and the
    steps the killed process had logged after its checkpoint were served twice (EventAccumulator, which takes every
    START for a restart, hid it). A run writes one at step 0 when it starts."""
    from minilm.training.lit_module import LitGPT

    over = ["train.steps=5", "train.ckpt_every=2", "train.val_every=0", "train.keep_checkpoints=9"]
    straight, run = tmp_path / "straight", tmp_path / "run"
    run_phases(load_config(config, [f"run.dir={straight}", *over]), log=lambda m: None)
    start = LitGPT.on_train_batch_start

    def killed_at_step_3(self, batch, batch_idx):
        if self.global_step == 3:  # steps 1 to 3 logged, the checkpoint at 2 written
            raise KeyboardInterrupt  # as a kill: nothing after it runs
        start(self, batch, batch_idx)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LitGPT, "on_train_batch_start", killed_at_step_3)
        with pytest.raises(KeyboardInterrupt):
            run_phases(load_config(config, [f"run.dir={run}", *over]), log=lambda m: None)
    run_phases(load_config(config, [f"run.dir={run}", *over]), resume=True, log=lambda m: None)
    for tag in TAGS:
        assert [s for s, _ in served_points(run, tag)] == [s for s, _ in served_points(straight, tag)], tag
        assert served_points(run, tag) == served_points(straight, tag), tag


@pytest.mark.parametrize("micro", [4, 2])
def test_a_kill_during_a_validation_after_a_checkpoint_leaves_no_hole_in_the_curve(config, tmp_path, monkeypatch,
                                                                                   micro):  # fmt: skip
    """The checkpoint of a step was written before that step's validation (Lightning runs the callbacks' batch end
    first): killed during the validation, the run resumed after the checkpoint, and Lightning does not validate a
    step it resumes at, so val/loss had no point at that step. It is written after the validation now: the kill
    leaves the previous checkpoint, and the resumed run ends with the curves and weights of an uninterrupted one."""
    from safetensors.torch import load_file

    from minilm.training.lit_module import LitGPT

    over = ["train.steps=6", "train.ckpt_every=2", "train.val_every=2", "train.keep_checkpoints=9",
            f"train.micro_batch_size={micro}"]  # fmt: skip
    straight, run = tmp_path / "straight", tmp_path / "run"
    run_phases(load_config(config, [f"run.dir={straight}", *over]), log=lambda m: None)
    validate = LitGPT.on_validation_start

    def killed_at_step_4(self):
        if self.trainer.state.fn == "fit" and self.global_step == 4:
            raise KeyboardInterrupt  # as a kill: nothing after it runs
        validate(self)

    monkeypatch.setattr(LitGPT, "on_validation_start", killed_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        run_phases(load_config(config, [f"run.dir={run}", *over]), log=lambda m: None)
    monkeypatch.setattr(LitGPT, "on_validation_start", validate)
    run_phases(load_config(config, [f"run.dir={run}", *over]), resume=True, log=lambda m: None)
    for tag in TAGS:
        assert scalars(run, tag) == scalars(straight, tag), tag
    a, b = load_file(straight / "model.safetensors"), load_file(run / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_is_written_after_what_its_step_logged_is_on_disk(config, tmp_path, monkeypatch):
    """TensorBoard's writer holds events for up to two minutes: a kill right after a checkpoint lost the points
    logged before it (the resumed run logs only the steps after it). The events are flushed before each checkpoint;
    what a kill at that moment leaves is copied aside here. That includes the step's own training scalars: LitGPT
    logged them in its batch end, which Lightning runs after the callback's that wrote the checkpoint, so a kill
    then left a hole at step 2 of train/loss, lr and tokens_seen for good."""
    import shutil

    from minilm.training.lit_module import AtomicCheckpointIO

    run = tmp_path / "run"
    save = AtomicCheckpointIO.save_checkpoint

    def save_then_copy(self, checkpoint, path, storage_options=None):
        save(self, checkpoint, path, storage_options)
        shutil.copytree(run / "tb", tmp_path / f"at-{Path(path).stem}" / "tb")

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_then_copy)
    over = [f"run.dir={run}", "train.steps=6", "train.ckpt_every=2", "train.val_every=4", "train.keep_checkpoints=9"]
    run_phases(load_config(config, over), log=lambda m: None)
    assert [step for step, _ in scalars(tmp_path / "at-step-00000002", "train/loss")] == [1, 2]
    assert [step for step, _ in scalars(tmp_path / "at-step-00000002", "tokens_seen")] == [1, 2]
    assert [step for step, _ in scalars(tmp_path / "at-step-00000004", "train/loss")] == [1, 2, 3, 4]
    assert [step for step, _ in scalars(tmp_path / "at-step-00000004", "val/loss")] == [0, 4]


def test_tensorboard_reads_the_steps_of_a_many_phase_run_in_order(config, tmp_path, monkeypatch):
    """Lightning closed the writer after every fit and validate, so each phase wrote several event files, named by
    the second and a counter: within one second file ….10 sorts before ….9 and TensorBoard read later steps first.
    (The clock is frozen here so that every file falls in one second.)"""
    import tensorboard.summary.writer.event_file_writer as event_file_writer

    class Frozen:
        @staticmethod
        def time():
            return 1_700_000_000.0

    monkeypatch.setattr(event_file_writer, "time", Frozen)
    run = tmp_path / "run"
    phases = [f"phases.p{i}={{seq_len: 32, steps: 1}}" for i in range(8)]
    run_phases(load_config(config, [f"run.dir={run}", "train.val_every=1", *phases]), log=lambda m: None)
    assert [step for step, _ in scalars(run, "train/loss")] == [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("change, key", [  # each key named as the config sets it (here: the phase itself)
    ("phases.b.lr=0.01", "phases.b.lr"), ("phases.b.warmup_steps=3", "phases.b.warmup_steps"),
    ("phases.b.position={base: 500.0}", "phases.b.position.base"),
    ("phases.b.micro_batch_size=2", "phases.b.micro_batch_size"),
])
def test_resume_refuses_an_interrupted_phase_the_config_now_trains_differently(config, tmp_path, change, key):
    """Lightning restored the optimizer's lr, betas and weight decay and the schedule's base lr from the checkpoint:
    a new lr on --resume was silently ignored (a new warmup or position base applied halfway), while config.yaml
    said the phase trained with it throughout. Lightning counts the restored loop in micro-batches: another
    micro_batch_size put the resumed position mid-step, and its steps mixed the rows of two batches."""
    run = tmp_path / "run"
    over = [f"run.dir={run}", "train.ckpt_every=2", "phases.a={seq_len: 32, steps: 1}",
            "phases.b={seq_len: 32, steps: 3}"]  # fmt: skip
    run_phases(load_config(config, over), log=lambda m: None)
    _killed_after_checkpoint(run, "b", 2)
    saved = (run / "config.yaml").read_text()
    with pytest.raises(MinilmError, match=rf"phase 'b' was interrupted training with {key} = .*--phase b"):
        run_phases(load_config(config, [*over, change]), resume=True, log=lambda m: None)
    assert (run / "config.yaml").read_text() == saved
    run_phases(load_config(config, [*over, "train.val_every=1"]), resume=True, log=lambda m: None)  # how, not what
    assert (run / "b" / "complete.json").is_file()


def test_resume_takes_a_position_default_spelled_out_and_refuses_a_changed_one(config, tmp_path):
    """A position or scaling parameter given on --resume at its default trains the same model: it was refused as a
    change ("finished with ...scaling.beta_fast = null, the config now says 32"), for a finished phase and for the
    interrupted one alike. Another value is still refused, naming the key."""
    run = tmp_path / "run"
    over = [f"run.dir={run}", "train.ckpt_every=2", "phases.a={seq_len: 32, steps: 1}",
            "phases.b={seq_len: 64, steps: 3, position: {scaling: {rope_type: yarn, factor: 2.0, "
            "original_max_position_embeddings: 32}}}", "phases.c={seq_len: 64, steps: 3, position: {scaling: "
            "{rope_type: yarn, factor: 2.0, original_max_position_embeddings: 32}}}"]  # fmt: skip
    defaults = ["model.position.fraction=1.0", "model.position.layout=half", "phases.a.position.scaling=null",
                "phases.b.position.scaling.beta_fast=32", "phases.c.position.scaling.beta_slow=1",
                "phases.c.position.scaling.truncate=true"]  # fmt: skip
    run_phases(load_config(config, over), log=lambda m: None)
    _killed_after_checkpoint(run, "c", 2)
    run_phases(load_config(config, [*over, *defaults]), resume=True, log=lambda m: None)
    assert (run / "c" / "complete.json").is_file()
    with pytest.raises(MinilmError, match=r"phase 'b' finished with phases\.b\.position\.scaling\.beta_fast = 32\.0 "):
        run_phases(load_config(config, [*over, "phases.b.position.scaling.beta_fast=16"]), resume=True,
                   log=lambda m: None)


def test_resume_and_init_take_the_model_defaults_spelled_out_and_refuse_other_values(config, tmp_path, capsys):
    """model.n_kv_heads null means n_heads and d_ff null the MLP's default width (64 for a SwiGLU of d_model 32):
    spelled out on --resume they build the same model, but --resume refused them ("the run trains one model") and
    --init of a run's weights printed "another model config". Another value is still refused."""
    run = tmp_path / "run"
    over = [f"run.dir={run}", "train.ckpt_every=2", "phases.a={seq_len: 32, steps: 3}"]
    run_phases(load_config(config, over), log=lambda m: None)
    _killed_after_checkpoint(run, "a", 2)
    spelled = ["model.n_kv_heads=2", "model.d_ff=128"]  # tiny_run_yaml: 2 heads, d_model 32 -> d_ff 64 * 2 = 128
    run_phases(load_config(config, [*over, *spelled]), resume=True, log=lambda m: None)
    assert (run / "a" / "complete.json").is_file()
    with pytest.raises(MinilmError, match=r"--resume: model\.n_kv_heads is 1 here but 2 in the run's saved "):
        run_phases(load_config(config, [*over, "model.n_kv_heads=1"]), resume=True, log=lambda m: None)
    notes = []
    run_phases(load_config(config, [f"run.dir={tmp_path / 'next'}", "phases.a={seq_len: 32, steps: 1}", *spelled]),
               init=str(run / "model.safetensors"), log=notes.append)  # fmt: skip
    assert not [n for n in notes if "another model config" in n], notes


def test_resume_names_the_batch_size_a_phase_sets_as_it_sets_it(config, tmp_path):
    """Another batch_size in a phase that sets its own was refused as 'train.batch_size 4 x 1 ... resume with
    train.batch_size=4': following that advice changed the other phases' batch (the finished one was then refused)
    and left the phase's own unchanged. The interrupted phase and a finished one name phases.b.batch_size."""
    run = tmp_path / "run"
    over = [f"run.dir={run}", "train.ckpt_every=2", "phases.a={seq_len: 32, steps: 1}",
            "phases.b={seq_len: 32, steps: 3, batch_size: 4}"]  # fmt: skip
    run_phases(load_config(config, over), log=lambda m: None)
    _killed_after_checkpoint(run, "b", 2)
    with pytest.raises(MinilmError, match=r"interrupted training with a global batch of 4 sequences \(phases\.b\."
                                          r"batch_size 4 x 1.*resume with phases\.b\.batch_size=4 on 1 process"):
        run_phases(load_config(config, [*over, "phases.b.batch_size=2"]), resume=True, log=lambda m: None)
    run_phases(load_config(config, over), resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"phase 'b' finished with the global batch \(phases\.b\.batch_size x "):
        run_phases(load_config(config, [*over, "phases.b.batch_size=2"]), resume=True, log=lambda m: None)


def test_resume_takes_new_kernel_and_memory_settings(config, tmp_path):
    """The settings that change how a step computes, not what it learns (the same loss and gradients): a run that
    ran out of memory must be able to resume with the chunked loss or activation checkpointing, and one that was
    started before train.compile_mode existed has none in its checkpoint. --resume refused all of them as "trains
    differently"."""
    run = tmp_path / "run"
    over = [f"run.dir={run}", "train.ckpt_every=2", "phases.a={seq_len: 32, steps: 3}"]
    run_phases(load_config(config, over), log=lambda m: None)
    _killed_after_checkpoint(run, "a", 2)
    how = ["model.loss_chunk_size=16", "model.activation_checkpointing=true", "model.sdpa_kernel=flash",
           "train.compile_mode=max-autotune-no-cudagraphs"]  # fmt: skip
    with pytest.raises(MinilmError, match=r"--resume: model\.norm_eps is 1e-06 here but 1e-05 in the run's saved "):
        run_phases(load_config(config, [*over, *how, "model.norm_eps=1e-6"]), resume=True, log=lambda m: None)
    # another encoding is named by its name, not by the first of the parameters that differ with it (base)
    with pytest.raises(MinilmError, match=r"--resume: model\.position\.name is 'alibi' here but 'rope' in the run's"):
        run_phases(load_config(config, [*over, "model.position.name=alibi"]), resume=True, log=lambda m: None)
    # booleans as the config writes them (a changed-phase refusal does alike: run_checks._shown)
    with pytest.raises(MinilmError, match=r"--resume: model\.tie_embeddings is false here but true in the run's"):
        run_phases(load_config(config, [*over, "model.tie_embeddings=false"]), resume=True, log=lambda m: None)
    run_phases(load_config(config, [*over, *how]), resume=True, log=lambda m: None)
    assert (run / "a" / "complete.json").is_file()


def test_a_failed_write_of_the_runs_tokenizer_leaves_the_previous_one_whole(config, tmp_path, monkeypatch):
    """Every start (--resume included) copied tokenizer.model into run.dir with shutil.copyfile, which truncates
    the file first: a full disk or a kill during the copy left the run's tokenizer empty or half, and evaluation,
    generation and export of its finished phases failed until the next successful resume."""
    import builtins
    import errno
    from pathlib import Path

    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}"])
    run_phases(cfg, log=lambda m: None)
    before = (run / "tokenizer.model").read_bytes()
    real_open = builtins.open

    def disk_full_for_the_tokenizer(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "w" in mode and Path(file).name.lstrip(".").startswith("tokenizer.model"):
            f.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return f

    monkeypatch.setattr(builtins, "open", disk_full_for_the_tokenizer)
    with pytest.raises(OSError, match="No space left"):
        run_phases(cfg, resume=True, log=lambda m: None)
    monkeypatch.undo()
    assert (run / "tokenizer.model").read_bytes() == before
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_xpos_under_fp16_is_refused_where_its_scale_overflows_fp16(config, tmp_path):
    """xPos's scale e^(ln(1/ζ_0)·⌈(L−1)/2⌉/scale_base) past fp16's 65504 makes 16-mixed q and k inf (a NaN loss):
    refused with the phase's length, the precision and what to change (checked on the encoding's hooks, as a CUDA
    run checks them before training: on this CPU 16-mixed itself is refused first)."""
    from minilm.config import phase_config
    from minilm.model.transformer import position_hooks
    from minilm.training.run_checks import check_fits

    cfg = load_config(config, ["model.position={name: xpos, scale_base: 2.0}", "train.precision=16-mixed",
                               "phases.a={seq_len: 16, steps: 1}", "phases.b={seq_len: 64, steps: 1}"])  # fmt: skip
    hooks = position_hooks(cfg.model)
    check_fits(hooks, phase_config(cfg, "a"), "a", cfg.phases.a)  # e^5.0 fits
    with pytest.raises(MinilmError, match=r"phases\.b\.seq_len: 64 with xpos under train\.precision=16-mixed: .*"
                                          r"e\^20\.0.*bf16-mixed or 32.*model\.position\.scale_base \(now 2\)"):
        check_fits(hooks, phase_config(cfg, "b"), "b", cfg.phases.b)
    # an even length: its farthest position is L/2 from the center ((L - 1) // 2), not (L - 1)/2: 36 overflows
    # (e^11.3), where (36 - 1)/2 gave e^11.0 and passed
    at36 = load_config(config, ["model.position={name: xpos, scale_base: 2.0}", "train.precision=16-mixed",
                                "phases.c={seq_len: 36, steps: 1}"])  # fmt: skip
    with pytest.raises(MinilmError, match=r"phases\.c\.seq_len: 36 .* by up to e\^11\.3"):
        check_fits(hooks, phase_config(at36, "c"), "c", at36.phases.c)
    fp32 = load_config(config, ["model.position={name: xpos, scale_base: 2.0}", "train.precision=32",
                                "phases.b={seq_len: 64, steps: 1}"])  # fmt: skip
    check_fits(hooks, phase_config(fp32, "b"), "b", fp32.phases.b)  # fp32's range: up to 128 positions


def test_a_phase_its_encoding_cannot_reach_is_refused_before_run_dir_or_the_corpus_is_made(config, tmp_path):
    """The check of every phase against its encoding's limits ran after config.yaml and tokenizer.model were written
    into run.dir; then after the corpus was prepared (a tokenizer trained for nothing) and an empty run.dir made."""
    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}", "model.position={name: learned, max_positions: 32}",
                               "phases.a={seq_len: 32, steps: 1}", "phases.b={seq_len: 64, steps: 1}"])  # fmt: skip
    with pytest.raises(MinilmError, match=r"phases\.b\.seq_len: 64 is longer than the learned encoding supports"):
        run_phases(cfg, log=lambda m: None)
    assert not run.exists() and not (tmp_path / "cache").exists()
    # a run without phases names its own key (it named phases.train.seq_len, which no config has), as does a phase
    # whose seq_len is the run's
    plain = load_config(config, [f"run.dir={run}", "model.position={name: learned, max_positions: 32}",
                                 "train.seq_len=64"])  # fmt: skip
    with pytest.raises(MinilmError, match=r"^train\.seq_len: 64 is longer than the learned encoding supports"):
        run_phases(plain, log=lambda m: None)
    # the advice names what raises the limit, as the config sets it: it said "use an encoding that extrapolates"
    # alone to an xPos run, whose scale_base and gamma set its limit
    assert "raise model.position.max_positions, or use" in str(_refusal(plain))
    xpos = load_config(config, [f"run.dir={run}", "model.position={name: xpos, scale_base: 0.5}",
                                "phases.a={seq_len: 16, steps: 1}", "phases.b={seq_len: 64, steps: 1}",
                                "phases.b.position.scale_base=0.2"])  # fmt: skip
    assert "(13 positions); shorten the phase, raise phases.b.position.scale_base or gamma, or" in str(_refusal(xpos))


def _refusal(cfg) -> MinilmError:
    with pytest.raises(MinilmError) as e:
        run_phases(cfg, log=lambda m: None)
    return e.value


def test_resume_refuses_a_changed_finished_phase_before_the_corpus_is_prepared(config, tmp_path):
    """A --resume refusal that needs no data came after the corpus was prepared: a changed tokenizer setting (one
    way to be refused) trained a new tokenizer and tokenized every document first, minutes for nothing."""
    import json

    from minilm.config import phase_config, save_config
    from minilm.training.run_checks import ChangedPhaseError

    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}"])
    save_config(cfg, run / "config.yaml")  # a finished run, as far as the checks read it (no weights needed)
    save_config(phase_config(cfg, "train"), run / "train" / "config.yaml")
    (run / "train" / "complete.json").write_text(json.dumps({"carried_optimizer": False}))
    changed = load_config(config, [f"run.dir={run}", "data.tokenizer.vocab_size=300"])
    with pytest.raises(ChangedPhaseError, match=r"phase 'train' finished with data.tokenizer.vocab_size = 400"):
        run_phases(changed, resume=True, log=lambda m: None)
    assert not (tmp_path / "cache").exists()


def test_an_init_that_does_not_fit_is_refused_before_phase_removes_the_phases_it_retrains(config, tmp_path):
    """--phase b --init WEIGHTS of another model deleted b and the phases after it, rewrote config.yaml, and only
    then found that the weights do not fit: the finished phases were lost to a refused command."""
    import json

    from minilm.config import phase_config, save_config
    from minilm.model import GPT
    from minilm.training.checkpoint import save_weights

    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 1}"])  # fmt: skip
    save_config(cfg, run / "config.yaml")  # a finished run, as far as the checks read it
    for phase in ("a", "b"):
        save_config(phase_config(cfg, phase), run / phase / "config.yaml")
        (run / phase / "complete.json").write_text(json.dumps({"carried_optimizer": False}))
    other = tmp_path / "other.safetensors"
    save_weights(GPT(load_config(config, ["model.position.name=learned"]).model, 40), other)
    with pytest.raises(MinilmError, match="weights from .*other.safetensors do not fit this model"):
        run_phases(cfg, start_phase="b", init=str(other), log=lambda m: None)
    assert (run / "b" / "complete.json").exists() and not (run / "tokenizer.model").exists()


def test_init_takes_what_evaluate_takes_and_names_a_file_that_is_no_weights(config, tmp_path):
    """--init RUN/config.yaml was read as a checkpoint: 'checkpoint ... is unreadable (IndexError: list index out of
    range)'; --init RUN of a run with no final weights yet was 'no weights at RUN/model.safetensors', where
    evaluate.py reads its newest finished phase (minilm.runs.resolve_run). Both refused before anything is written."""
    run, other, said = tmp_path / "run", tmp_path / "other", []
    a, b = "phases.a={seq_len: 32, steps: 1}", "phases.b={seq_len: 32, steps: 1}"
    run_phases(load_config(config, [f"run.dir={run}", a, b]), log=lambda m: None)
    for path in (run / "model.safetensors", run / "b" / "model.safetensors"):  # b retraining: 'a' is the newest
        path.unlink()
    cfg = load_config(config, [f"run.dir={other}"])
    (tmp_path / "empty.safetensors").write_bytes(b"")
    for init, message in ((run / "config.yaml", r"--init .*config.yaml: not a weights file; give a run directory, a "
                                                r"phase directory or a \.safetensors / \.ckpt file"),
                          (run / "tb", r"--init: .*tb: not a phase directory: 'tb' is not a phase of .*a, b"),
                          (tmp_path, r"--init: .* is a folder of runs \(run\), not a run"),
                          # the flag named, as for every other --init: 'no weights at X', 'weights file X is unreadable'
                          (tmp_path / "nope.safetensors", r"^--init .*nope\.safetensors: no such file or directory; "
                                                          r"give a run directory"),
                          (tmp_path / "empty.safetensors", r"^--init weights file .*empty\.safetensors is unreadable")):
        with pytest.raises(MinilmError, match=message):
            run_phases(cfg, init=str(init), log=lambda m: None)
    assert not other.exists()
    run_phases(cfg, init=str(run), log=said.append)
    assert f"initial weights from {run / 'a' / 'model.safetensors'}" in said, said
    assert not any("another tokenizer" in line for line in said), said


def test_init_of_a_phase_directory_takes_it_only_when_the_phase_has_finished(config, tmp_path):
    """--init RUN/PHASE took the phase's model.safetensors whenever it existed, where evaluate.py refuses a phase
    without complete.json (stopped during its end-of-phase evaluation, or being trained again); the weights file
    given as such is still taken."""
    run, other = tmp_path / "run", tmp_path / "other"
    run_phases(load_config(config, [f"run.dir={run}", "phases.a={seq_len: 32, steps: 1}",
                                    "phases.b={seq_len: 32, steps: 1}"]), log=lambda m: None)  # fmt: skip
    (run / "a" / "complete.json").unlink()
    cfg = load_config(config, [f"run.dir={other}"])
    with pytest.raises(MinilmError, match=r"^--init: phase 'a' of .* has not finished \(no complete\.json"):
        run_phases(cfg, init=str(run / "a"), log=lambda m: None)
    assert not other.exists()
    said = []
    run_phases(cfg, init=str(run / "a" / "model.safetensors"), log=said.append)
    assert any("initial weights from" in line for line in said), said


def test_init_weights_of_another_tokenizer_are_warned_of(config, tmp_path):
    """--init weights of a run whose tokenizer is another (a corpus of other files, another vocab_size setting that
    gave the same size) loaded without a word, each embedding row standing for another token. Simulated: the
    --init run's tokenizer.model rewritten, as another tokenizer's would be."""
    run, other, said = tmp_path / "run", tmp_path / "other", []
    run_phases(load_config(config, [f"run.dir={run}"]), log=lambda m: None)
    (run / "tokenizer.model").write_bytes(b"another tokenizer")
    run_phases(load_config(config, [f"run.dir={other}"]), init=str(run / "model.safetensors"), log=said.append)
    warned = [line for line in said if line.startswith("warning: these weights were trained with")]
    assert len(warned) == 1 and f"{run / 'tokenizer.model'}, another tokenizer" in warned[0], said


def test_complete_json_records_the_weights_a_phase_started_from(config, tmp_path, monkeypatch):
    """--phase b --init PATH retrained b from PATH's weights, and nothing in the run said so: b's complete.json, its
    config and its last line were those of a b trained from phase a. complete.json records where the weights came
    from (the --init path as given and the file it named; the previous phase; run.seed's initialization), and the
    phase's lines say it."""
    import json

    monkeypatch.chdir(tmp_path)  # (an --init path relative to the working directory, as a user gives one)
    run, said = tmp_path / "run", []
    cfg = load_config(config, ["run.dir=run", "run.seed=5", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 1}"])  # fmt: skip
    started = lambda phase: json.loads((run / phase / "complete.json").read_text())["started_from"]  # noqa: E731
    run_phases(cfg, log=lambda m: None)
    assert started("a") == {"kind": "fresh", "seed": 5} and started("b") == {"kind": "phase", "phase": "a"}
    run_phases(cfg, start_phase="b", init="run/a", log=said.append)
    weights = str((run / "a" / "model.safetensors").resolve())
    digest = _sha256(run / "a" / "model.safetensors")
    assert started("b") == {"kind": "init", "init": "run/a", "weights": weights, "sha256": digest}
    assert started("a") == {"kind": "fresh", "seed": 5}  # (not retrained)
    shown = f"from --init run/a ({weights}, sha256 {digest[:12]})"
    lines = [line for line in said if line.startswith("phase 'b'") and shown in line]
    assert len(lines) == 2, said  # its transition line (TensorBoard's text too) and its last line
    run_phases(cfg, start_phase="b", log=lambda m: None)  # retrained from a again: recorded so
    assert started("b") == {"kind": "phase", "phase": "a"}


def test_a_resumed_phase_s_first_line_names_the_step_and_checkpoint_it_resumes_from(config, tmp_path):
    """The line that opens a resumed phase gave its settings only, and a second line the checkpoint: which step of
    how many it went on from was not said (a kill after an unreadable newest checkpoint resumes earlier than the
    user may think). The first line of the phase says it, in the form of a phase's opening line."""
    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "train.keep_checkpoints=5",
                               "phases.a={seq_len: 32, steps: 1}", "phases.b={seq_len: 32, steps: 3}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    _killed_after_checkpoint(run, "b", 2)
    said = []
    run_phases(cfg, resume=True, log=said.append)
    first = next(line for line in said if line.startswith("phase 'b'"))
    assert first.startswith("phase 'b': seq_len 32, 3 steps of 4 sequences, lr 0.003 (cosine),"), said
    assert first.endswith(f"; resumes at step 2 of 3 from {run / 'b' / 'checkpoints' / 'step-00000002.ckpt'}"), said
    assert "starts from" not in first  # (its start is the checkpoint's record, said when the phase finishes)


def test_resume_keeps_the_record_of_the_weights_an_interrupted_phase_started_from(config, tmp_path):
    """A phase retrained with --phase b --init and interrupted continues from its checkpoint on a plain --resume: it
    still started from the --init weights, which its checkpoint records (the command that resumes it gives none).
    A checkpoint of an older minilm records nothing: complete.json says null, not a guess."""
    import json

    import torch

    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 2}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    init = str(run / "a" / "model.safetensors")
    run_phases(cfg, start_phase="b", init=init, log=lambda m: None)
    _killed_after_checkpoint(run, "b", 1)
    said = []
    run_phases(cfg, resume=True, log=said.append)
    assert any("resumes at step 1 of 2" in line for line in said), said
    record = {"kind": "init", "init": init, "weights": str(Path(init).resolve()), "sha256": _sha256(init)}
    assert json.loads((run / "b" / "complete.json").read_text())["started_from"] == record
    _killed_after_checkpoint(run, "b", 1)
    ckpt = run / "b" / "checkpoints" / "step-00000001.ckpt"
    old = torch.load(ckpt, weights_only=True)
    del old["minilm"]["started_from"]  # as an older minilm wrote it
    torch.save(old, ckpt)
    run_phases(cfg, resume=True, log=said.append)
    assert json.loads((run / "b" / "complete.json").read_text())["started_from"] is None
    assert "it started from weights its checkpoint does not record" in said[-2], said[-2:]


def test_resume_refuses_init_weights_other_than_those_the_interrupted_phase_started_from(config, tmp_path):
    """--resume --phase b --init Y into b's checkpoint: b goes on from the checkpoint, whose weights replace Y's; Y
    was loaded, said to be loaded, and silently dropped. Refused unless Y holds the weights b started from (by
    whatever path), naming what it did start from and both remedies."""
    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 2}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    init, other = run / "a" / "model.safetensors", tmp_path / "other.safetensors"
    _other_weights(init, other)
    run_phases(cfg, start_phase="b", init=str(init), log=lambda m: None)
    _killed_after_checkpoint(run, "b", 1)
    with pytest.raises(MinilmError, match=rf"--init {other} \(sha256 {_sha256(other)[:12]}\): phase 'b' was "
                                          rf"interrupted .* after it started from --init {init} \(sha256 "
                                          rf"{_sha256(init)[:12]}\), .* resume it with --init {init}, or retrain it"):
        run_phases(cfg, start_phase="b", init=str(other), resume=True, log=lambda m: None)
    run_phases(cfg, start_phase="b", init=str(run / "a"), resume=True, log=lambda m: None)  # the same file
    run_phases(cfg, start_phase="b", log=lambda m: None)  # b from a's weights, then interrupted
    _killed_after_checkpoint(run, "b", 1)
    with pytest.raises(MinilmError, match=r"after it started from the weights of phase 'a', .* resume it without "
                                          r"--init, or retrain it from these weights with --phase b --init"):
        run_phases(cfg, start_phase="b", init=str(init), resume=True, log=lambda m: None)


def test_an_evaluation_says_what_weights_its_phase_started_from(config, tmp_path):
    """results.json and report.md of a phase's evaluation, at its end and by evaluate_run later (of its finished
    weights and of a step checkpoint), say where the phase's weights started, as its complete.json and checkpoints
    record it: a phase retrained from --init weights was evaluated as if it had started from the phase before."""
    import json

    from minilm.eval import evaluate_run

    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "train.keep_checkpoints=2", "eval.lengths=[32]",
                               "eval.tasks=[ppl]", "eval.batches=1", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 2}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    init = str(run / "a" / "model.safetensors")
    run_phases(cfg, start_phase="b", init=init, log=lambda m: None)
    record = {"kind": "init", "init": init, "weights": init, "sha256": _sha256(init)}
    at_end = run / "b" / "eval"
    assert json.loads((at_end / "results.json").read_text())["started_from"] == record
    said = f"- the phase started from --init {init} (sha256 {_sha256(init)[:12]})\n"
    assert said in (at_end / "report.md").read_text()
    checkpoint = next((run / "b" / "checkpoints").glob("*.ckpt"))
    for path, phase in ((run, None), (run, "a"), (checkpoint, None)):
        results, out = evaluate_run(path, phase, out=tmp_path / f"eval-{phase}-{path.suffix}", tensorboard=False,
                                    log=lambda m: None)  # fmt: skip
        assert results["started_from"] == (record if phase is None else {"kind": "fresh", "seed": cfg.run.seed})
        assert "- the phase started from " in (out / "report.md").read_text()


def test_resume_compares_init_weights_by_content_not_by_path(config, tmp_path):
    """The record pinned a path: --init X overwritten since (its run retrained) was accepted on --resume --phase b
    --init X though its weights are not those b started from, and a byte-identical copy at another path was refused.
    The record keeps the file's sha256, which --resume compares."""
    import json
    import shutil

    run, init, copy = tmp_path / "run", tmp_path / "donor.safetensors", tmp_path / "copy.safetensors"
    cfg = load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 2}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    shutil.copy(run / "a" / "model.safetensors", init)
    shutil.copy(init, copy)
    run_phases(cfg, start_phase="b", init=str(init), log=lambda m: None)
    _killed_after_checkpoint(run, "b", 1)
    started = _sha256(init)
    _other_weights(copy, init)  # the donor file overwritten
    with pytest.raises(MinilmError, match=rf"--init {init} \(sha256 {_sha256(init)[:12]}\): phase 'b' was "
                                          rf"interrupted .* after it started from --init {init} \(sha256 "
                                          rf"{started[:12]}\), .* resume it without --init, or retrain it"):
        run_phases(cfg, start_phase="b", init=str(init), resume=True, log=lambda m: None)
    said = []
    run_phases(cfg, start_phase="b", init=str(copy), resume=True, log=said.append)  # the same weights elsewhere
    assert json.loads((run / "b" / "complete.json").read_text())["started_from"]["sha256"] == started
    # the checkpoint's weights continue it: the --init ones are checked, not loaded (the log said they were)
    assert any("resumes at step 1 of 2 from" in line for line in said), said
    assert not any(line.startswith("initial weights from") for line in said), said


def test_resume_before_the_first_checkpoint_starts_the_phase_from_the_weights_it_began_from(config, tmp_path,
                                                                                             monkeypatch):
    """--phase b --init X killed before b's first step checkpoint, then a plain --resume (a requeued job's): nothing
    remembered X, and b retrained from a's weights without a word; later it was refused, and the user had to retype
    X. The phase's folder records what it began from (X's file and sha256): a plain --resume goes on as begun, from
    X, and says so. --resume with other weights is refused before any data is prepared, naming the file and the
    commands."""
    import json

    import minilm.data

    run, donor, other = tmp_path / "run", tmp_path / "donor.safetensors", tmp_path / "other.safetensors"
    cfg = load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 2}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    _other_weights(run / "a" / "model.safetensors", donor)
    _other_weights(donor, other)
    run_phases(cfg, start_phase="b", init=str(donor), log=lambda m: None)
    _killed_after_checkpoint(run, "b", 0)  # (every checkpoint gone: killed before the first)
    prepare = minilm.data.load_corpus
    monkeypatch.setattr(minilm.data, "load_corpus", lambda *a, **k: pytest.fail("prepared the corpus"))
    began = rf"began from --init {donor} \(sha256 {_sha256(donor)[:12]}\) \({run / 'b' / 'started_from.json'}\)"
    with pytest.raises(MinilmError, match=rf"{began} .* would start it from --init {other} \(sha256 .* with --phase b "
                                          rf"--init {other} \(without --resume\)$"):
        run_phases(cfg, start_phase="b", init=str(other), resume=True, log=lambda m: None)
    with pytest.raises(MinilmError, match=r"^--resume: phase 'a' finished with phases\.a\.lr = 0\.003"):  # (kept)
        run_phases(load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "phases.a={seq_len: 32, steps: 1, "
                                        "lr: 0.01}", "phases.b={seq_len: 32, steps: 2}"]), resume=True, log=print)
    monkeypatch.setattr(minilm.data, "load_corpus", prepare)
    said = []
    run_phases(cfg, resume=True, log=said.append)
    assert f"--resume: phase 'b' {began.replace(chr(92), '')}; going on as --resume --phase b --init {donor}" in said
    started = json.loads((run / "b" / "complete.json").read_text())["started_from"]
    assert started["kind"] == "init" and started["sha256"] == _sha256(donor)


def _b_begun_with_init(config, tmp_path):
    """(cfg, run, donor, copy): phases a and b trained, then b again by --phase b --init donor (other weights than
    a's, also at copy); the caller leaves b as a kill would (``_killed_after_checkpoint``)."""
    run, donor, copy = tmp_path / "run", tmp_path / "donor.safetensors", tmp_path / "copy.safetensors"
    cfg = load_config(config, [f"run.dir={run}", "train.ckpt_every=1", "phases.a={seq_len: 32, steps: 1}",
                               "phases.b={seq_len: 32, steps: 2}"])  # fmt: skip
    run_phases(cfg, log=lambda m: None)
    _other_weights(run / "a" / "model.safetensors", donor)
    shutil.copy(donor, copy)
    run_phases(cfg, start_phase="b", init=str(donor), log=lambda m: None)
    return cfg, run, donor, copy


def test_a_plain_resume_refuses_a_phase_begun_from_weights_its_file_no_longer_holds(config, tmp_path, monkeypatch):
    """The --init file overwritten since b began from it: a plain --resume cannot go on as begun, and is refused as
    before (it would start b from a's weights), naming the retraining; --resume --phase b --init with a copy of the
    weights goes on."""
    import minilm.data

    cfg, run, donor, copy = _b_begun_with_init(config, tmp_path)
    _killed_after_checkpoint(run, "b", 0)
    _other_weights(copy, donor)  # overwritten since
    prepare = minilm.data.load_corpus
    monkeypatch.setattr(minilm.data, "load_corpus", lambda *a, **k: pytest.fail("prepared the corpus"))
    with pytest.raises(MinilmError, match=r"^--resume: phase 'b' began from --init .* interrupted before its first "
                                          r"step checkpoint; this command would start it from the weights of phase "
                                          r"'a'\. Retrain it from these weights with --phase b \(without --resume\)$"):
        run_phases(cfg, resume=True, log=lambda m: None)
    monkeypatch.setattr(minilm.data, "load_corpus", prepare)
    run_phases(cfg, start_phase="b", init=str(copy), resume=True, log=lambda m: None)
    assert (run / "b" / "complete.json").is_file()


def _b_begun_with_init_where_a_never_ran(config, tmp_path):
    """(cfg, run, donor, donor_run, phases): a run whose phase b was trained by --phase b --init donor (another run's
    phase a, at donor_run), its phase a never run; the caller leaves b as a kill would."""
    donor_run, run, donor = tmp_path / "donor", tmp_path / "run", tmp_path / "donor.safetensors"
    phases = ["phases.a={seq_len: 32, steps: 1}", "phases.b={seq_len: 32, steps: 2}", "train.ckpt_every=1"]
    run_phases(load_config(config, [f"run.dir={donor_run}", *phases]), log=lambda m: None)
    shutil.copy(donor_run / "a" / "model.safetensors", donor)
    cfg = load_config(config, [f"run.dir={run}", *phases])
    run_phases(cfg, start_phase="b", init=str(donor), log=lambda m: None)
    return cfg, run, donor, donor_run, phases


def test_a_plain_resume_goes_on_with_a_phase_begun_by_init_where_the_phases_before_it_never_ran(config, tmp_path):
    """--phase b --init X on a run whose phase a never ran, killed before b's first checkpoint: a plain --resume
    trained a, which the command had not asked for, then b from a's weights (its record of X overwritten). It goes
    on with b from X, as begun; with X overwritten it is refused, naming what works."""
    cfg, run, donor, donor_run, phases = _b_begun_with_init_where_a_never_ran(config, tmp_path)
    _killed_after_checkpoint(run, "b", 0)
    kept = tmp_path / "kept"
    shutil.copytree(run, kept)
    run_phases(cfg, resume=True, log=lambda m: None)
    assert not (run / "a").exists() and (run / "b" / "complete.json").is_file()
    _other_weights(donor_run / "a" / "model.safetensors", donor)  # overwritten since
    with pytest.raises(MinilmError, match=rf"which {donor} no longer holds, and 'a' before it never ran, so "
                                          r"--resume cannot go on as it was begun\. Resume it with --resume --phase b "
                                          r"--init FILE where FILE is a copy of those weights; retrain it .*; or train "
                                          r"the run from its first phase with --phase a$"):
        run_phases(load_config(config, [f"run.dir={kept}", *phases]), resume=True, log=lambda m: None)


def test_a_plain_resume_goes_on_with_a_phase_begun_by_init_after_the_phase_before_it_was_interrupted(config, tmp_path):
    """a interrupted after a checkpoint, then --phase b --init X, killed before b's first checkpoint: a plain --resume
    continued a and trained b from a's weights, the command's start from X dropped without a word. It goes on with b
    from X, as begun, and leaves a as it was; with X overwritten it is refused, saying a has not finished."""
    run, donor = tmp_path / "run", tmp_path / "donor.safetensors"
    overrides = [f"run.dir={run}", "train.ckpt_every=1", "phases.a={seq_len: 32, steps: 2}",
                 "phases.b={seq_len: 32, steps: 2}"]  # fmt: skip
    cfg = load_config(config, overrides)
    run_phases(cfg, log=lambda m: None)
    _other_weights(run / "a" / "model.safetensors", donor)
    _killed_after_checkpoint(run, "a", 1)
    shutil.rmtree(run / "b")
    run_phases(cfg, start_phase="b", init=str(donor), log=lambda m: None)
    _killed_after_checkpoint(run, "b", 0)
    kept = tmp_path / "kept"
    shutil.copytree(run, kept)
    said = []
    run_phases(cfg, resume=True, log=said.append)
    assert any(line.endswith(f"going on as --resume --phase b --init {donor}") for line in said), said
    started = json.loads((run / "b" / "complete.json").read_text())["started_from"]
    assert started["kind"] == "init" and started["sha256"] == _sha256(donor)
    assert not (run / "a" / "complete.json").exists()  # a left as it was: interrupted, its checkpoint kept
    assert [p.name for p in (run / "a" / "checkpoints").glob("*.ckpt")] == ["step-00000001.ckpt"]
    _other_weights(run / "b" / "model.safetensors", donor)  # X overwritten since (with b's final weights, other ones)
    with pytest.raises(MinilmError, match=r"and 'a' before it has not finished, so --resume cannot go on as it was "
                                          r"begun\."):  # fmt: skip
        run_phases(load_config(config, [f"run.dir={kept}", *overrides[1:]]), resume=True, log=lambda m: None)


def test_a_refusal_names_the_unreadable_checkpoint_of_a_phase_it_would_start_over(config, tmp_path):
    """b begun with --init X, its only step checkpoint truncated (a disk full, a kill in a copy), X overwritten since:
    --resume was refused saying b 'was interrupted before its first step checkpoint', though the user could see one
    in its folder. The refusal names the unreadable file. With X intact, a plain --resume starts b over from X, the
    warning naming the file."""
    cfg, run, donor, copy = _b_begun_with_init(config, tmp_path)
    _killed_after_checkpoint(run, "b", 1)
    ckpt = run / "b" / "checkpoints" / "step-00000001.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # truncated
    _other_weights(copy, donor)
    with pytest.raises(MinilmError, match=rf"\) and has no readable step checkpoint: step-00000001\.ckpt in "
                                          rf"{ckpt.parent} is unreadable \(truncated or corrupt\), so the phase "
                                          r"starts over from its first step; this command would start it from the "
                                          r"weights of phase 'a'\. Retrain it"):
        run_phases(cfg, resume=True, log=lambda m: None)
    shutil.copy(copy, donor)  # the weights b began from, back
    said = []
    run_phases(cfg, resume=True, log=said.append)
    assert any(line.startswith(f"warning: checkpoint {ckpt} is unreadable") for line in said), said
    assert any(line.startswith("phase 'b': seq_len") and line.endswith(f"starts from --init {donor} (sha256 "
                                                                        f"{_sha256(donor)[:12]})") for line in said)


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _other_weights(source, dest) -> None:
    """A weights file at ``dest`` that fits the model of ``source`` but holds other values."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    weights = {k: v + 1 for k, v in load_file(str(source)).items()}
    with safe_open(str(source), "pt") as f:
        save_file(weights, str(dest), metadata=f.metadata())


def test_resume_with_no_run_there_says_it_starts_one(config, tmp_path):
    """'Always pass --resume' is a normal way to requeue a job, so it is not refused; but it must not be silent
    that nothing was resumed (a mistyped run.dir would otherwise retrain from scratch without a word)."""
    run, said = tmp_path / "run", []
    run_phases(load_config(config, [f"run.dir={run}"]), log=said.append, resume=True)
    assert any(f"--resume: {run} holds no run yet; starting one" in m for m in said)
    said.clear()
    run_phases(load_config(config, [f"run.dir={run}"]), log=said.append, resume=True)  # now there is one
    assert not any("holds no run yet" in m for m in said)


def test_resume_with_an_unknown_phase_is_refused_without_saying_it_starts_a_run(config, tmp_path):
    """--resume --phase with a misspelled name said "holds no run yet; starting one" before the error that refused
    it, as if a run had started."""
    run, said = tmp_path / "run", []
    with pytest.raises(MinilmError, match="--phase zzz: no such phase; phases are: train"):
        run_phases(load_config(config, [f"run.dir={run}"]), log=said.append, resume=True, start_phase="zzz")
    assert said == [] and not run.exists()


def test_resume_of_a_run_stopped_before_its_first_phase_says_what_it_found(tmp_path):
    """A run killed before its first phase began has its config, tokenizer and TensorBoard files: --resume said it
    'holds no run yet', which the user could see was not so."""
    from minilm.training.run_checks import nothing_to_resume

    run = tmp_path / "run"
    (run / "tb").mkdir(parents=True)
    (run / "config.yaml").write_text("")
    (run / "tokenizer.model").write_text("")
    said = nothing_to_resume(run, "pretrain")
    assert said == (f"--resume: {run} holds no checkpoint yet, only config.yaml, tb/, tokenizer.model (the run "
                    "stopped before its first phase began training); nothing to resume, so phase 'pretrain' starts "
                    "from step 0")
    assert nothing_to_resume(tmp_path / "none", "a") == f"--resume: {tmp_path / 'none'} holds no run yet; starting one"


def test_a_resume_removes_what_writes_a_kill_cut_short_left_beside_the_outputs(config, tmp_path):
    """A kill in the middle of an atomic write (the phase's weights, its evaluation's results.json, the run's
    weights) leaves the temporary file, whose removal never ran: the resumed run rewrote the file and left the
    temporary one beside it for good. It is removed when the run resumes; a live process's (an evaluation writing
    into the phase's eval/ now) is kept."""
    import subprocess
    import sys

    run = tmp_path / "run"
    over = [f"run.dir={run}", "train.steps=4", "train.ckpt_every=2", "train.keep_checkpoints=9"]
    run_phases(load_config(config, over), log=lambda m: None)
    _killed_after_checkpoint(run, "train", 2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # the killed process: its pid exists no more
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = [run / f".model.safetensors.{dead.pid}.tmp", run / "train" / f".model.safetensors.{dead.pid}.tmp",
                run / "train" / "eval" / f".results.json.{dead.pid}.tmp"]  # fmt: skip
        writing = run / "train" / "eval" / f".report.md.{live.pid}.tmp"
        for path in [*left, writing]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"half")
        run_phases(load_config(config, over), resume=True, log=lambda m: None)
    finally:
        live.kill()
        live.wait()
    assert [p for p in left if p.exists()] == [] and writing.exists()


def test_a_run_that_starts_training_drops_its_final_weights_until_every_phase_has_finished(tmp_path):
    """The run's final weights are its last phase's. With a phase appended (or --phase, --resume) the old ones stayed
    until the new last phase finished: evaluate.py RUN read them under the new last phase's config, or refused them
    as "copied from another run". Gone from the start, the run's newest finished phase is read meanwhile."""
    from types import SimpleNamespace

    from minilm.training.phases import _write_run_files

    run = tmp_path / "run"
    run.mkdir()
    for name in ("model.safetensors", "final_config.yaml"):
        (run / name).write_text("the old last phase's")
    (tmp_path / "tok.model").write_bytes(b"sentencepiece")
    corpus = SimpleNamespace(tokenizer=SimpleNamespace(model_file=str(tmp_path / "tok.model")))
    _write_run_files(load_config(overrides=[f"run.dir={run}"]), corpus, run, ["train"], None)
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "tokenizer.model"]


def test_a_kill_while_phase_restarts_its_folder_leaves_no_finished_phase_behind(config, tmp_path, monkeypatch):
    """--phase a removes the folders of a and the phases after it before training them again. Killed inside that
    removal (shutil.rmtree deletes file by file), a folder kept its complete.json beside deleted weights, and
    --resume took the phase as finished, then failed on the missing model.safetensors (and the phases after it, not
    reached yet, as finished after an unfinished one): every restarted phase's complete.json goes first."""
    import shutil

    import minilm.training.phases as phases

    run = tmp_path / "run"
    two = [f"run.dir={run}", "phases.a={seq_len: 32, steps: 2}", "phases.b={seq_len: 32, steps: 2}"]
    run_phases(load_config(config, two), log=lambda m: None)

    def killed_inside(path, ignore_errors=False):  # the weights deleted, then the process is gone
        (Path(path) / "model.safetensors").unlink(missing_ok=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(phases.shutil, "rmtree", killed_inside)
    with pytest.raises(KeyboardInterrupt):
        run_phases(load_config(config, two), start_phase="a", log=lambda m: None)
    assert not (run / "a" / "complete.json").exists() and not (run / "b" / "complete.json").exists()
    monkeypatch.setattr(phases.shutil, "rmtree", shutil.rmtree)
    run_phases(load_config(config, two), resume=True, log=lambda m: None)  # a trains again, then b
    assert (run / "a" / "complete.json").exists() and (run / "b" / "model.safetensors").exists()


def test_the_command_that_resumes_a_phase_as_begun_names_its_init_file_not_the_relative_path_given(tmp_path):
    """--init was given relative to the working directory of the command that began the phase: the remedy names the
    weights file it resolved to, which works from any directory."""
    import json

    from minilm.training.run_checks import STARTED, _check_begun_from

    (tmp_path / "b").mkdir()
    donor = tmp_path / "elsewhere" / "donor.safetensors"
    donor.parent.mkdir()
    donor.write_bytes(b"the weights b began from")
    began = {"kind": "init", "init": "donor.safetensors", "weights": str(donor), "sha256": _sha256(donor)}
    (tmp_path / "b" / STARTED).write_text(json.dumps(began))
    with pytest.raises(MinilmError, match=rf"with --resume --phase b --init {donor}, or retrain"):
        _check_begun_from(tmp_path, "b", {"kind": "phase", "phase": "a"}, {"kind": "phase", "phase": "a"})


def test_a_phase_whose_beginning_weights_are_gone_is_offered_only_its_retraining(tmp_path):
    """The resume-as-begun command named an --init file overwritten since (the refused command again, refused again),
    a phase begun after another that the config no longer has crashed (KeyError) instead of saying anything, and
    "--resume without --init" was offered where that command starts the phase from other weights still (phase x now
    before b, where b began after a)."""
    import json

    from minilm.training.run_checks import STARTED, _check_begun_from

    (tmp_path / "b").mkdir()
    donor = tmp_path / "donor.safetensors"
    donor.write_bytes(b"other weights since")
    began = {"kind": "init", "init": "donor.safetensors", "weights": str(donor), "sha256": "ab" * 32}
    after_a, after_x, fresh = ({"kind": "phase", "phase": "a"}, {"kind": "phase", "phase": "x"},
                               {"kind": "fresh", "seed": 1})  # fmt: skip
    for was, now, plain in ((began, after_a, after_a), (after_a, fresh, fresh), (after_a, began, after_x)):
        (tmp_path / "b" / STARTED).write_text(json.dumps(was))
        with pytest.raises(MinilmError, match=r"this command would start it from .*\. Retrain it from these weights "
                                              r"with --phase b( --init \S+)? \(without --resume\)$"):
            _check_begun_from(tmp_path, "b", now, plain)


def test_the_same_command_after_a_kill_before_the_first_checkpoint_starts_over(config, tmp_path):
    """A phase writes started_from.json as it begins; a run killed before its first checkpoint then counted as one
    that holds outputs, and the same command run again was refused ('already holds a run'), where it used to start
    over: nothing had been saved."""
    from minilm.training.run_checks import STARTED

    run = tmp_path / "run"
    cfg = load_config(config, [f"run.dir={run}"])
    run_phases(cfg, log=lambda m: None)
    for path in (run / "train").iterdir():  # as a kill before the first checkpoint leaves it
        if path.name != STARTED:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (run / "model.safetensors").unlink()
    (run / "train" / f".{STARTED}.999999.tmp").write_text("{")  # (a kill inside its write left this too)
    said = []
    run_phases(cfg, log=said.append)
    assert (run / "train" / "complete.json").is_file(), said
    with pytest.raises(MinilmError, match="already holds a run"):  # (a phase that saved something is a run)
        run_phases(cfg, log=lambda m: None)


def test_a_phase_begun_by_init_goes_on_from_its_checkpoint_where_the_weights_it_began_from_are_gone(config, tmp_path,
                                                                                                     monkeypatch):
    """--phase b --init X in a run whose phase a never ran, interrupted after a checkpoint, X overwritten since: a
    plain --resume was refused (it could not go on as begun without X), and --resume --phase b was refused too (a has
    not finished), though b's checkpoint continues it without X; only retraining b was left. Both go on from the
    checkpoint now, and say so, without reading X (here gone); --resume --phase b --init with other weights is
    refused, offering the plain --resume."""
    cfg, run, donor, donor_run, phases = _b_begun_with_init_where_a_never_ran(config, tmp_path)
    started = _sha256(donor)
    _killed_after_checkpoint(run, "b", 1)
    _other_weights(donor_run / "a" / "model.safetensors", donor)  # overwritten since
    with pytest.raises(MinilmError, match=r"whose weights would replace these; resume it without --init, or "
                                          rf"retrain it from these weights with --phase b --init {donor} \(without "
                                          r"--resume\)$"):  # fmt: skip
        run_phases(cfg, start_phase="b", init=str(donor), resume=True, log=lambda m: None)
    kept = tmp_path / "kept"
    shutil.copytree(run, kept)
    donor.unlink()  # (not read)
    for where, phase in ((run, None), (kept, "b")):
        said = []
        run_phases(load_config(config, [f"run.dir={where}", *phases]), resume=True, start_phase=phase,
                   log=said.append)  # fmt: skip
        ckpt = where / "b" / "checkpoints" / "step-00000001.ckpt"
        began = f"began from --init {donor} (sha256 {started[:12]}) ({where / 'b' / 'started_from.json'})"
        assert f"--resume: phase 'b' {began}, which {donor} no longer holds; its checkpoint {ckpt} continues it " \
               "without them: going on as --resume --phase b" in said, said
        assert any(line.startswith("phase 'b'") and f"resumes at step 1 of 2 from {ckpt}" in line for line in said)
        assert not any(line.startswith("initial weights from") for line in said), said
        assert json.loads((where / "b" / "complete.json").read_text())["started_from"]["sha256"] == started
        assert not (where / "a").exists()
