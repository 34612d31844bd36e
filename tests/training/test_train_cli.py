"""train.py end to end: outputs, bad input, phases, exact resume after SIGKILL. A subprocess as a user runs it
where a process of its own matters (signals, the lock, the exit status a shell sees), else train.py's main in process
(the train_here fixture)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import local_data_yaml
from tests.conftest import run_train as train

REPO = Path(__file__).resolve().parents[2]

TINY = """
model: {{n_layers: 2, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, batch_size: 4, steps: 20, val_every: 10, val_batches: 2, log_every: 5, ckpt_every: {ckpt}}}
optim: {{lr: 0.003, warmup_steps: 2}}
"""

PHASES = """
phases:
  short: {{seq_len: 32, steps: 12}}
  long:
    seq_len: 64
    steps: {long_steps}
    batch_size: 2
    lr: 0.001
    warmup_steps: 2
    carry_optimizer: true
    position: {{base: 40000.0}}
"""


def write_config(tmp_path: Path, corpus: Path, phases: bool = False, long_steps: int = 40) -> Path:
    text = TINY.format(data=local_data_yaml(corpus, tmp_path / "cache"), ckpt=3 if phases else 10)
    if phases:
        text += PHASES.format(long_steps=long_steps)
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_twenty_steps_write_events_weights_and_config(tmp_path, tiny_text_dir, train_here):
    """A plain training run as a user starts it, in a process of its own."""
    cfg = write_config(tmp_path, tiny_text_dir)
    run = tmp_path / "run"
    train("--config", cfg, f"run.dir={run}")
    assert (run / "model.safetensors").is_file() and (run / "config.yaml").is_file()
    assert (run / "train" / "complete.json").is_file() and (run / "tokenizer.model").is_file()
    events = list((run / "tb").glob("events.out.tfevents.*"))
    assert events, "no TensorBoard events"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "val/loss", "val/ppl", "lr", "grad_norm", "tokens_seen", "tokens_per_sec"} <= tags
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert losses[-1] < losses[0], losses
    # a second run into the same directory without --resume must not clobber it
    again = train_here("--config", cfg, f"run.dir={run}", check=False)
    assert again.returncode == 2 and "--resume" in again.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["model.n_layer=3"], "model.n_layer"),
        (["model.n_layers=two"], "model.n_layers"),
        (["data.sources.local.paths=[/nonexistent/*.txt]"], "data.sources.local"),
        (["run.dir={tmp}/a_file/run"], "run.dir"),
        (["data.tokenizer.model_file={tmp}/nope.model"], "data.tokenizer.model_file"),
        # before run.dir is written
        (["run.dir={tmp}/run", "--init", "{tmp}/nope.safetensors"], "nope.safetensors: no such file or directory"),
        # a later phase's data is checked before the first phase trains
        (["phases.a.steps=2", "phases.b.steps=2", "phases.b.data.long_fraction=0.5",
          "phases.b.data.long_min_tokens=1000000"], "phase 'b': phases.b.data.long_fraction=0.5"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path, tiny_text_dir, args, message, train_here):
    """In process (a subprocess per case cost ~13 s of imports; the subprocess's exit code 2 is checked by the tests
    above and below)."""
    cfg = write_config(tmp_path, tiny_text_dir)
    (tmp_path / "a_file").write_text("not a directory")
    argv = ["--config", str(cfg), *[a.format(tmp=tmp_path) for a in args]]
    proc = train_here(*argv, check=False)
    err = proc.stderr
    assert proc.returncode == 2
    assert not list(tmp_path.glob("**/config.yaml")), "bad input left a half-made run behind"
    assert message in err and "Traceback" not in err
    debug = train_here(*argv, "--debug", check=False)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_missing_config_and_print_config(tmp_path, tiny_text_dir, train_here):
    proc = train("--config", tmp_path / "nope.yaml", check=False)  # the exit status a shell sees
    assert proc.returncode == 2 and "not found" in proc.stderr
    cfg = write_config(tmp_path, tiny_text_dir)
    out = train_here("--config", cfg, "--print-config", "model.n_layers=3").stdout
    assert "n_layers: 3" in out and not (tmp_path / "run").exists()


def _wait_for(path_glob: Path, pattern: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.time()
    while not list(path_glob.glob(pattern)):
        if proc.poll() is not None:
            raise AssertionError(f"training ended before {pattern} appeared:\n{proc.stdout.read()[-3000:]}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"{pattern} never appeared")
        time.sleep(0.005)


def _train_until_a_long_checkpoint(cfg: Path, run: Path, stderr) -> subprocess.Popen:
    """train.py started as a user starts it, returned once phase 'long' has written a checkpoint."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # Ctrl-C as a terminal delivers it: a suite started in the background of a non-interactive shell (`make test &`)
    # runs with SIGINT ignored, which its children inherit, and the run went on to exit 0
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), "--config", str(cfg), f"run.dir={run}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    _wait_for(run / "long" / "checkpoints", "step-*.ckpt", proc)
    return proc


def test_sigkill_mid_phase_then_resume_equals_uninterrupted(tmp_path, tiny_text_dir, train_here):
    """Killed and resumed as a user's processes are; the uninterrupted run, in this process, is the reference."""
    cfg = write_config(tmp_path, tiny_text_dir, phases=True, long_steps=60)
    straight = tmp_path / "straight"
    train_here("--config", cfg, f"run.dir={straight}")

    killed = tmp_path / "killed"
    proc = _train_until_a_long_checkpoint(cfg, killed, stderr=subprocess.STDOUT)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "long" / "complete.json").exists(), "killed too late: the phase had finished"
    assert (killed / "short" / "complete.json").exists()

    again = train("--config", cfg, f"run.dir={killed}", "--resume")
    assert "phase 'short' is complete; skipping" in again.stdout
    assert "resumes at step" in again.stdout
    a, b = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs after resume"


def test_ctrl_c_says_how_to_continue_and_the_run_resumes(tmp_path, tiny_text_dir, train_here):
    """Lightning turns Ctrl-C inside fit into a silent sys.exit(1); the run must instead stop with the CLI's
    message and exit code 130, and continue with --resume."""
    # a phase far longer than the wait: a signal that does not arrive fails below, not by a run that finished
    cfg = write_config(tmp_path, tiny_text_dir, phases=True, long_steps=100_000)
    run = tmp_path / "run"
    proc = _train_until_a_long_checkpoint(cfg, run, stderr=subprocess.PIPE)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("Ctrl-C did not stop the run within 120 s") from None
    hint = "interrupted; continue with the same command plus --resume"
    assert proc.returncode == 130 and hint in err, (proc.returncode, err[-2000:], out[-2000:])
    assert not (run / "long" / "complete.json").exists()
    again = train_here("--config", cfg, f"run.dir={run}", "--resume", "phases.long.steps=6")
    assert "resumes at step" in again.stdout and (run / "long" / "complete.json").is_file()


def test_phase_and_init_run_only_the_extension(tmp_path, tiny_text_dir, train_here, monkeypatch):
    from minilm.training import checkpoint, run_checks

    reads, read = [], checkpoint.read_weights_and_model  # the --init file is read once (GPT-2-small's .ckpt: 1.5 GB)
    for module in (checkpoint, run_checks):
        monkeypatch.setattr(module, "read_weights_and_model", lambda path: reads.append(path) or read(path))
    train = train_here
    cfg = write_config(tmp_path, tiny_text_dir, phases=True, long_steps=4)
    base = tmp_path / "base"
    out = train("--config", cfg, f"run.dir={base}", "phases.long.steps=1").stdout
    # said before training: a 1-step phase with a 2-step warmup trains at half its peak lr
    assert "warning: phases.long.warmup_steps = 2 is longer than phase 'long' (1 step from" in out, out
    from minilm.training.checkpoint import recorded_model

    # each phase's weights record the encoding they were trained with (load_run refuses them under another)
    bases = [recorded_model(base / f / "model.safetensors")["position"].get("base") for f in ("short", "long", ".")]
    assert bases == [None, 40000.0, 40000.0], bases  # (short: the default base)
    ext = tmp_path / "ext"
    # the weights come from elsewhere: no optimizer moments to carry, and the config must not pretend otherwise
    proc = train("--config", cfg, f"run.dir={ext}", "--phase", "long", "--init", base / "short", check=False)
    assert proc.returncode == 2 and "phases.long.carry_optimizer=false" in proc.stderr, proc.stderr
    reads.clear()
    out = train("--config", cfg, f"run.dir={ext}", "--phase", "long", "--init", base / "short",
                "phases.long.carry_optimizer=false").stdout
    assert "initial weights from" in out and not (ext / "short").exists()
    # the weights of the phase before 'long' (the README's --phase extend_1k --init .../pretrain): no note, though
    # 'long' changes the position base; they were said to be "another model config than phase 'long' trains with"
    assert "note: these weights were trained with another model config" not in out, out
    assert [str(p) for p in reads].count(str(base / "short" / "model.safetensors")) == 1, reads  # (resolve_run's)
    assert (ext / "long" / "complete.json").is_file()
    # weights of another position config than the phase before (what --init is for) start it, and the log says so
    out = train("--config", cfg, f"run.dir={ext}", "--phase", "long", "--init", base / "long",
                "phases.long.carry_optimizer=false").stdout
    assert ("note: these weights were trained with another model config than phase 'short' trains with (where "
            "phase 'long' starts)") in out, out
    assert '"base": 40000.0' in out.split("model.position: trained with", 1)[1].split("\n")[0], out
    # --phase without finished earlier phases and without --init: a clear error
    proc = train("--config", cfg, f"run.dir={tmp_path / 'empty'}", "--phase", "long", check=False)
    assert proc.returncode == 2 and "--init" in proc.stderr


def test_a_second_process_is_refused_by_the_lock(tmp_path, tiny_text_dir, train_here):
    train = train_here  # the lock's holder is a process of its own; the refused run need not be
    cfg = write_config(tmp_path, tiny_text_dir)
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".lock").write_text(f"{holder.pid} {os.uname().nodename}")
        proc = train("--config", cfg, f"run.dir={run}", check=False)
        assert proc.returncode == 2 and str(holder.pid) in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead now: its lock is stale and is taken over
    out = train("--config", cfg, f"run.dir={run}", "train.steps=2").stdout
    assert "stale lock" in out and not (run / ".lock").exists()


@pytest.mark.parametrize("keep_step", [6, pytest.param(None, marks=pytest.mark.slow)],
                         ids=["mid_phase", "before_first_checkpoint"])  # fmt: skip
def test_resume_with_dropout_equals_uninterrupted(tmp_path, tiny_text_dir, keep_step, train_here):
    """Dropout draws from torch's global generator, which Lightning's data loaders also draw from (one number per
    loader iterator: the validation loader every val_every steps, the training loader at the start of a fit): a
    resumed run must still train with the dropout masks of the uninterrupted one, and so must a phase started in a
    fresh process (killed before its first checkpoint). Simulated by deleting what a kill would not have written."""
    import shutil

    train = train_here
    cfg = write_config(tmp_path, tiny_text_dir, phases=True, long_steps=12)
    args = ["model.dropout=0.2", "train.keep_checkpoints=100", "train.val_every=4"]
    straight = tmp_path / "straight"
    train("--config", cfg, f"run.dir={straight}", *args)
    killed = tmp_path / "killed"
    shutil.copytree(straight, killed)
    for name in ("model.safetensors", "final_config.yaml"):
        (killed / name).unlink()
    long_dir = killed / "long"
    for path in long_dir.iterdir():
        if path.name != "checkpoints":
            path.unlink()
    for ckpt in (long_dir / "checkpoints").iterdir():
        if keep_step is None or ckpt.name != f"step-{keep_step:08d}.ckpt":
            ckpt.unlink()
    out = train("--config", cfg, f"run.dir={killed}", *args, "--resume").stdout
    assert ("resumes at step" in out) == (keep_step is not None)
    import json

    # resumed from its checkpoint, 'long' took the moments saved there, carried from 'short' at its start
    assert json.loads((killed / "long" / "complete.json").read_text())["carried_optimizer"] is True
    a, b = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs after resume"


def test_resume_with_other_sampling_settings_is_refused_before_the_run_changes(tmp_path, tiny_text_dir, train_here):
    """The sampler's identity is saved in each checkpoint: a --resume whose seed or data settings differ would
    otherwise continue silently on other batches (and record the new settings in the run's config.yaml)."""
    import shutil

    train = train_here
    cfg = write_config(tmp_path, tiny_text_dir, phases=True, long_steps=6)
    straight = tmp_path / "straight"
    train("--config", cfg, f"run.dir={straight}", "train.keep_checkpoints=100")
    killed = tmp_path / "killed"
    shutil.copytree(straight, killed)
    for name in ("model.safetensors", "final_config.yaml"):
        (killed / name).unlink()
    for path in (killed / "long").iterdir():
        if path.is_file():
            path.unlink()
    saved = (killed / "config.yaml").read_text()
    for override, phase, key in (("run.seed=7", "short", "seed"),  # the finished phase is refused first
                                 ("phases.long.data.long_fraction=0.5", "long", "long_fraction")):
        proc = train("--config", cfg, f"run.dir={killed}", "--resume", override, check=False)
        assert proc.returncode == 2 and f"--resume: phase '{phase}'" in proc.stderr and key in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and (killed / "config.yaml").read_text() == saved
    again = train("--config", cfg, f"run.dir={killed}", "--resume", "train.log_every=3").stdout
    assert "resumes at step" in again


def test_resume_refuses_a_finished_phase_the_config_now_trains_differently(tmp_path, tiny_text_dir, train_here):
    """--resume skips finished phases: had their lr, data or position changed since, the run would silently keep
    weights the config no longer describes. Evaluation and bookkeeping settings may change."""
    train = train_here
    cfg = write_config(tmp_path, tiny_text_dir, phases=True, long_steps=2)
    run = tmp_path / "run"
    train("--config", cfg, f"run.dir={run}")

    def refused(*args) -> str:
        proc = train("--config", cfg, f"run.dir={run}", *args, check=False)
        assert proc.returncode == 2, proc.stdout[-2000:]
        return proc.stderr

    # each named as the config sets it: a phase's own key, else the run's (short takes the run's lr)
    for override, says in (("phases.long.lr=0.002", "phases.long.lr = 0.001"), ("optim.lr=0.002", "optim.lr = 0.003"),
                           ("phases.short.seq_len=16", "phases.short.seq_len = 32"),
                           ("phases.long.position.base=20000.0", "phases.long.position.base = 40000.0"),
                           ("phases.long.carry_optimizer=false", "phases.long.carry_optimizer = true")):  # fmt: skip
        err = refused("--resume", override)
        assert f"finished with {says} (" in err and "--phase" in err and "Traceback" not in err, err
    # --phase starts from the finished earlier phases: the same check, unless --init gives the weights
    err = refused("--phase", "long", "phases.short.lr=0.002")
    assert "--phase long: phase 'short' finished with phases.short.lr = 0.003" in err, err
    again = train("--config", cfg, f"run.dir={run}", "--resume", "train.log_every=1", "phases.long.eval_lengths=[32]")
    assert "phase 'long' is complete; skipping" in again.stdout
    # moments of other parameters (an older minilm grouped them otherwise) are refused before --phase removes what
    # it would retrain, as are no moments to carry (not trained with a fresh optimizer)
    import torch

    moments = torch.load(run / "short" / "optimizer.pt")
    torch.save({**moments, "params": moments["params"][::-1]}, run / "short" / "optimizer.pt")
    err = refused("--phase", "long")
    assert "phases.long.carry_optimizer: " in err and "holds the optimizer state of other parameters" in err, err
    assert (run / "long" / "complete.json").is_file()
    (run / "short" / "optimizer.pt").unlink()
    err = refused("--phase", "long")
    assert "phases.long.carry_optimizer" in err and "optimizer.pt" in err, err
    assert (run / "long" / "complete.json").is_file()  # refused before --phase removes what it would retrain


def test_the_phase_end_line_rounds_the_validation_loss():
    """It printed every digit of a float ("val loss 5.759598731994629")."""
    from minilm.training.phases import _val_summary

    assert _val_summary(None, 5.759598731994629) == "val loss 5.7596"


def test_val_batches_0_trains_without_validation_and_says_so(tmp_path, tiny_text_dir, train_here):
    """train.val_batches=0 turns validation off: the phase must say so (it printed "val loss None"), Lightning must
    not be handed an empty validation loader (it warned that its length is zero), and TensorBoard gets no val/."""
    import json

    cfg = write_config(tmp_path, tiny_text_dir)
    run = tmp_path / "run"
    proc = train_here("--config", cfg, f"run.dir={run}", "train.val_batches=0", "train.steps=4")
    finished = [line for line in proc.stdout.splitlines() if "finished in" in line]
    assert finished and "no validation (train.val_batches=0)" in finished[0] and "None" not in finished[0], finished
    assert not [w for w in proc.warnings if "DataLoader" in w], proc.warnings
    # 4 steps, log_every 5: minilm logs the last step itself; Lightning's "smaller than the logging interval" is noise
    assert not [w for w in proc.warnings if "log_every_n_steps" in w], proc.warnings
    assert "warning" not in proc.stdout  # 4 steps, warmup 2: nothing to warn of
    assert json.loads((run / "train" / "complete.json").read_text())["val_loss"] is None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert "train/loss" in tags and not any(t.startswith("val/") for t in tags), tags


def test_an_interrupted_phase_init_run_continues_with_the_same_command_plus_resume(tmp_path, tiny_text_dir,
                                                                                  train_here):
    """README: a stopped run continues "with the same command plus --resume". For `--phase long --init W` that
    deleted the phase's checkpoints and retrained it from step 0 (and a plain --resume trained the phases before
    it, which this run never had, from random weights). Simulated kill: what a kill after the step-3 checkpoint
    would not have written is deleted."""
    import shutil

    import torch

    from minilm.config import load_config
    from minilm.data import load_corpus
    from minilm.model import GPT
    from minilm.training.checkpoint import save_weights

    cfg = write_config(tmp_path, tiny_text_dir, phases=True, long_steps=6)
    torch.manual_seed(0)
    init = tmp_path / "init.safetensors"
    run_cfg = load_config(cfg)
    save_weights(GPT(run_cfg.model, load_corpus(run_cfg.data).tokenizer.vocab_size), init)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    command = ["--config", str(cfg), "--phase", "long", "--init", str(init), "phases.long.carry_optimizer=false",
               "train.keep_checkpoints=100"]  # fmt: skip
    train_here(*command, f"run.dir={straight}")
    shutil.copytree(straight, killed)
    for path in [killed / "model.safetensors", killed / "final_config.yaml", *(killed / "long").glob("*.*"),
                 killed / "long" / "checkpoints" / "step-00000006.ckpt"]:  # fmt: skip
        path.unlink(missing_ok=True)
    assert [p.name for p in (killed / "long" / "checkpoints").iterdir()] == ["step-00000003.ckpt"]
    out = train_here(*command, f"run.dir={killed}", "--resume").stdout
    assert "phase 'long': seq_len" in out and "; resumes at step 3 of " in out and not (killed / "short").exists(), out
    a, b = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs after resume"


def test_an_accelerator_whose_package_is_missing_is_named(tmp_path, tiny_text_dir, train_here):
    """trainer.accelerator=tpu without torch_xla: Lightning raises ModuleNotFoundError, which was a traceback."""
    import importlib.util

    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed")

    cfg = write_config(tmp_path, tiny_text_dir)
    proc = train_here("--config", cfg, f"run.dir={tmp_path / 'run'}", "trainer.accelerator=tpu", check=False)
    err = proc.stderr
    assert proc.returncode == 2
    assert "trainer: Lightning cannot run with trainer.accelerator=tpu" in err and "torch_xla" in err, err
    assert not (tmp_path / "run").exists()


def test_phase_without_its_previous_phase_is_refused_before_the_run_is_written(tmp_path, tiny_text_dir, train_here):
    """`--phase long` where 'short' has not finished (and no --init) was refused only after run.dir's config.yaml
    had been overwritten with the refused command's config and the phases from 'long' on deleted."""
    cfg = write_config(tmp_path, tiny_text_dir, phases=True)
    run = tmp_path / "run"
    proc = train_here("--config", cfg, f"run.dir={run}", "--phase", "long", check=False)
    err = proc.stderr
    assert proc.returncode == 2
    assert "--phase long: the previous phase 'short' has not finished" in err and "--init" in err, err
    assert not run.exists()


def test_a_model_no_machine_holds_is_refused_before_the_corpus_is_prepared(tmp_path, tiny_text_dir, train_here):
    """Not killed by the kernel once it has built its layers (exit 137, no word): refused, its size said, before the
    tokenizer is trained (the test's cache stays empty) and before 100 000 layers' position hooks are built."""
    cfg = write_config(tmp_path, tiny_text_dir)
    proc = train_here("--config", cfg, f"run.dir={tmp_path / 'run'}", "model.n_layers=100000", "model.d_model=4096",
                      "model.n_heads=32", check=False)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model.n_layers=100000, model.d_model=4096: 20,159.69G parameters (not counting the embedding" in proc.stderr
    assert "make the model smaller" in proc.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_running_out_of_memory_names_the_phase_and_what_to_change(tmp_path, tiny_text_dir, train_here, monkeypatch):
    """An out-of-memory error inside a phase (here made to happen at its 4th training step) is a message naming the
    phase, the step and the settings that save memory, exit 2, no traceback; the run resumes from its checkpoint."""
    import torch

    from minilm.model import GPT

    cfg = write_config(tmp_path, tiny_text_dir)
    run = tmp_path / "run"
    real_loss, calls = GPT.loss, []

    def loss(self, *args, **kwargs):
        calls.append(self.training)
        if sum(calls) == 4 and self.training:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total)")
        return real_loss(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "loss", loss)
    proc = train_here("--config", cfg, f"run.dir={run}", "train.ckpt_every=2", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "phase 'train' ran out of memory on cpu at step 3 (CUDA out of memory. Tried" in proc.stderr
    assert "--resume and model.activation_checkpointing=true" in proc.stderr
    monkeypatch.setattr(GPT, "loss", real_loss)
    train_here("--config", cfg, f"run.dir={run}", "train.ckpt_every=2", "model.activation_checkpointing=true",
               "--resume")
    assert (run / "model.safetensors").is_file()


@pytest.mark.parametrize("inner", ["sub", "pretrain", "pretrain/deeper"])
def test_a_run_dir_inside_another_run_is_refused_before_it_is_written(tmp_path, tiny_text_dir, train_here, inner):
    """run.dir=runs/tiny/sub trained a run inside another: evaluate.py, generate.py and compare_runs.py read a path
    up to two folders inside a run as that run, so the new run's phases were taken for the outer run's."""
    cfg = write_config(tmp_path, tiny_text_dir)
    outer = tmp_path / "outer"
    (outer / "pretrain").mkdir(parents=True)
    for name in ("config.yaml", "tokenizer.model"):
        (outer / name).write_text("")
    proc = train_here("--config", cfg, f"run.dir={outer / inner}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"run.dir {outer / inner} lies in the run {outer}" in proc.stderr and "outside it" in proc.stderr
    assert not (outer / inner / "config.yaml").exists() and not (tmp_path / "cache").exists()
