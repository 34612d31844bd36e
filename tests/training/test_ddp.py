"""Two processes through Lightning's DDP strategy on CPU (gloo): train.py runs, only rank 0 writes the run
directory, and an interrupted DDP run resumes exactly. Each run starts two Python processes: slow on 2 cores."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import local_data_yaml, run_train

# precision 32: the tests compare 2 processes with 1 within fp32 rounding (auto is bf16-mixed on a CPU with a bf16 unit)
CONFIG = """
model: {{n_layers: 2, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, steps: 6, val_every: 0, val_batches: 2, log_every: 1, ckpt_every: 3, keep_checkpoints: 5,
        precision: "32"}}
optim: {{lr: 0.003, warmup_steps: 2}}
trainer: {{accelerator: cpu}}
"""


def train(config: Path, run_dir: Path, devices: int, batch_size: int, *extra: str,
          **kw) -> subprocess.CompletedProcess:  # fmt: skip
    strategy = "ddp" if devices > 1 else "auto"
    return run_train("--config", config, f"run.dir={run_dir}", f"trainer.devices={devices}",
                     f"trainer.strategy={strategy}", f"train.batch_size={batch_size}", *extra, timeout=900,
                     **kw)  # fmt: skip


@pytest.fixture(scope="module")
def ddp_config(tmp_path_factory) -> Path:
    """The tests' config, over a corpus of their own."""
    root = tmp_path_factory.mktemp("ddp")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(30):
        body = "\n".join(f"def f_{i}_{j}(x, y={j}):\n    return x + {j} * y\n" for j in range(6 + i % 5))
        (corpus / f"doc_{i:03d}.py").write_text(body)
    config = root / "exp.yaml"
    config.write_text(CONFIG.format(data=local_data_yaml(corpus, root / "cache", vocab_size=300)))
    return config


@pytest.fixture(scope="module")
def ddp_run(ddp_config, tmp_path_factory):
    """One finished two-process run (6 steps, per-device batch 2, checkpoints at step 3)."""
    config = ddp_config
    run_dir = tmp_path_factory.mktemp("ddp-run") / "run"
    proc = train(config, run_dir, devices=2, batch_size=2)
    return config, run_dir, proc


def weights(run_dir: Path) -> dict:
    return load_file(str(run_dir / "model.safetensors"))


@pytest.mark.slow
def test_ddp_run_writes_one_run_directory(ddp_run):
    _, run_dir, proc = ddp_run
    assert "GLOBAL_RANK: 1" in proc.stdout + proc.stderr  # really two processes
    for line in ("model: ", "phase 'train': seq_len 32, 6 steps of 2 sequences per process (4 in all)",
                 "phase 'train' finished", "done: "):  # said by rank 0 only  # fmt: skip
        assert proc.stdout.count(line) == 1, (line, proc.stdout[-3000:])
    assert "sync_dist=True" not in proc.stderr  # Lightning's advice for a loss the ranks had not averaged: they had
    assert (run_dir / "train" / "complete.json").is_file() and (run_dir / "model.safetensors").is_file()
    assert not (run_dir / ".lock").exists()
    assert [p.name for p in (run_dir / "train" / "checkpoints").iterdir()] == ["step-00000003.ckpt"]
    summary = json.loads((run_dir / "train" / "complete.json").read_text())
    assert summary["steps"] == 6 and summary["val_loss"] < 6.0


@pytest.mark.slow
def test_ddp_resume_is_exact(ddp_run, tmp_path):
    """Interrupt after the step-3 checkpoint (remove what the end of the phase wrote), --resume under DDP: the
    final weights equal the uninterrupted run's."""
    config, run_dir, _ = ddp_run
    resumed = interrupted_copy(run_dir, tmp_path / "run")
    proc = train(config, resumed, 2, 2, "--resume")
    assert "resumes at step" in proc.stdout
    a, b = weights(run_dir), weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def interrupted_copy(run_dir: Path, to: Path) -> Path:
    """A copy of a finished run as a kill after its step-3 checkpoint leaves it (what the phase's end wrote gone)."""
    shutil.copytree(run_dir, to)
    for name in ("train/complete.json", "train/model.safetensors", "train/optimizer.pt", "train/config.yaml",
                 "model.safetensors", "final_config.yaml"):  # fmt: skip
        (to / name).unlink(missing_ok=True)
    return to


@pytest.mark.slow
def test_ddp_run_resumed_on_one_device_with_the_same_global_batch_is_exact(ddp_run, tmp_path):
    """2 devices x batch 2, interrupted, resumed on 1 device x batch 4: the same global batch, so the same rows,
    schedule and optimizer state. It was refused ("train.batch_size = 2 ..., the config now says 4"), while 1 x 2,
    half the global batch, was only warned of. Now 1 x 4 ends where the uninterrupted run does (within the float
    rounding of the all-reduce, as 2 x 2 and 1 x 4 from the start), and 1 x 2 is refused before anything changes."""
    config, run_dir, _ = ddp_run
    halved = interrupted_copy(run_dir, tmp_path / "halved")
    proc = train(config, halved, 1, 2, "--resume", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "global batch of 4 sequences (train.batch_size 2 x 2 process(es))" in proc.stderr
    assert "resume with train.batch_size=4 on 1 process(es)" in proc.stderr
    assert not (halved / "train" / "complete.json").exists()
    resumed = interrupted_copy(run_dir, tmp_path / "resumed")
    proc = train(config, resumed, 1, 4, "--resume")
    assert "resumes at step" in proc.stdout and "interrupted on 2 process(es), resumed on 1" in proc.stdout
    assert "differ from the original run" not in proc.stdout + proc.stderr
    a, b = weights(run_dir), weights(resumed)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


@pytest.mark.slow
def test_ddp_matches_one_process_with_the_same_global_batch(ddp_run, tmp_path):
    """2 devices x batch 2 vs 1 device x batch 4. The training rows are identical and so are the validation rows
    (tests/data/test_sampler.py proves both exactly); what remains is the order of the gradient all-reduce:
    final weights within 1.2e-7. The val losses must agree too — they differed by 2e-3 to 2e-2 while each rank
    validated the same batch-2 rows (a smaller, different set than one process's)."""
    config, run_dir, _ = ddp_run
    single = tmp_path / "single"
    train(config, single, devices=1, batch_size=4)
    two = json.loads((run_dir / "train" / "complete.json").read_text())["val_loss"]
    one = json.loads((single / "train" / "complete.json").read_text())["val_loss"]
    a, b = weights(run_dir), weights(single)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert abs(two - one) < 1e-4, (two, one)
    # the logged training loss too: it was rank 0's rows alone, another curve than one process's
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curves = []
    for run in (run_dir, single):
        acc = EventAccumulator(str(run / "tb"))
        acc.Reload()
        curves.append([e.value for e in acc.Scalars("train/loss")])
    assert len(curves[0]) == 6 and curves[0] == pytest.approx(curves[1], abs=1e-4), curves


@pytest.mark.slow
def test_a_study_under_ddp_shares_a_phase_exactly(ddp_run, tmp_path):
    """Every rank runs the whole study and only rank 0 copies a donor's phases. The other rank used to refuse the
    study ("already holds this study's runs") once rank 0 had begun; and had it gone on, it could start training a
    phase rank 0 had copied, the gradients of two different phases all-reduced together. The borrower must end
    where it ends trained alone."""
    config, _, _ = ddp_run
    study = tmp_path / "study.yaml"
    two_phases = "[trainer.devices=2, trainer.strategy=ddp, train.batch_size=2, phases.short.steps=3, " \
                 "phases.long.steps=3, phases.long.seq_len=64]"  # fmt: skip
    study.write_text(f"config: {config}\noverrides: {two_phases}\nvariants:\n  a: []\n  b: [phases.long.lr=0.001]\n")
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    proc = run_train(study, "--out", shared, script="scripts/study.py", timeout=900)
    assert "GLOBAL_RANK: 1" in proc.stdout + proc.stderr and "'b' starts from 'a'" in proc.stdout
    run_train(study, "--out", alone, "--only", "b", "--no-share", script="scripts/study.py", timeout=900)
    assert (shared / "study.md").is_file() and (shared / "b" / "long" / "complete.json").is_file()
    a, b = weights(shared / "b"), weights(alone / "b")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


SLOW_RANK_ZERO = """
import sys, time, runpy
sys.path.insert(0, {repo!r})
import minilm.training.phases as phases

save = phases.atomic_torch_save


def slow_save(obj, path):  # rank 0 writes a finished phase's optimizer.pt a while after the other rank is done
    time.sleep(3)
    save(obj, path)


phases.atomic_torch_save = slow_save
sys.argv[0] = {train!r}  # Lightning's launcher starts the other rank as train.py itself
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_ddp_carries_the_optimizer_rank_zero_writes(ddp_config, tmp_path, repo):
    """Only rank 0 writes a finished phase's optimizer.pt; rank 1 went straight on to the next phase and, with
    carry_optimizer, failed to find it ("left no optimizer state") while rank 0 was still writing it. Rank 0 is
    made slow to write it here, so the old race is lost every time."""
    config = ddp_config
    script = tmp_path / "slow_rank_zero.py"
    script.write_text(SLOW_RANK_ZERO.format(repo=str(repo), train=str(repo / "train.py")))
    run_dir = tmp_path / "run"
    proc = train(config, run_dir, 2, 2, "phases.short.steps=2", "phases.long.steps=2", "phases.long.seq_len=64",
                 "phases.long.carry_optimizer=true", check=False, script=str(script))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "GLOBAL_RANK: 1" in proc.stdout + proc.stderr
    assert json.loads((run_dir / "long" / "complete.json").read_text())["carried_optimizer"] is True


@pytest.mark.slow
def test_ddp_matches_one_process_when_rows_differ_in_targets(ddp_config, tmp_path):
    """Synthetic rows trained on their answer alone (a few targets each) beside corpus rows (seq_len targets): DDP
    averaged the ranks' mean losses, weighing a row by 1 / its rank's targets, so 2 x 2 rows trained 8e-3 apart in
    weights from 1 x 4 rows and validated 0.05 apart. The step's loss is now the mean over all its targets."""
    synthetic = ["train.seq_len=128", "data.synthetic.fraction=0.5", "data.synthetic.loss=answer",
                 "data.synthetic.tasks=[passkey]"]  # fmt: skip
    two, one = tmp_path / "two", tmp_path / "one"
    train(ddp_config, two, 2, 2, *synthetic)
    train(ddp_config, one, 1, 4, *synthetic)
    a, b = weights(two), weights(one)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    loss = [json.loads((run / "train" / "complete.json").read_text())["val_loss"] for run in (two, one)]
    assert abs(loss[0] - loss[1]) < 1e-4, loss


FAILING_RANK = """
import importlib.util, os, sys
sys.path.insert(0, {repo!r})
from minilm.errors import MinilmError
import minilm.training.lit_module as lit
import minilm.training.phases as phases

if int(os.environ.get("LOCAL_RANK", "0")) == {rank}:
    if {where!r} == "step":  # this rank fails in the phase's third step, the others in a collective with it
        step = lit.LitGPT.training_step

        def training_step(self, batch, batch_idx):
            if self.global_step == 2:
                raise MinilmError("rank {rank} cannot go on")
            return step(self, batch, batch_idx)

        lit.LitGPT.training_step = training_step
    else:  # rank 0 fails to finish the first phase (its files, its evaluation) while the others wait for it

        def finish_phase(*args, **kwargs):
            raise MinilmError("rank {rank} cannot finish the phase")

        phases._finish_phase = finish_phase
# train.py run from this file, which Lightning's launcher then starts as the other ranks too (sys.argv[0])
spec = importlib.util.spec_from_file_location("train", {train!r})
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
sys.exit(train.run_cli(train.main, train.parser()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("rank, where", [(1, "step"), (0, "finish")])
def test_an_error_on_one_rank_ends_every_rank_with_exit_2(ddp_config, tmp_path, repo, rank, where):
    """An error on one rank ends the run with its message and exit 2, without a traceback. Rank 1's error (printed,
    exit 2) ended rank 0's collective with gloo's "Connection closed by peer" traceback and exit 1; rank 0's error
    between phases left rank 1 waiting for it, to print that traceback after the command had ended (under NCCL it
    held its GPU for the process group's 30-minute timeout)."""
    script = tmp_path / "failing_rank.py"
    script.write_text(FAILING_RANK.format(repo=str(repo), train=str(repo / "train.py"), rank=rank, where=where))
    proc = train(ddp_config, tmp_path / "run", 2, 2, "phases.short.steps=3", "phases.long.steps=2",
                 check=False, script=str(script))  # fmt: skip
    assert "GLOBAL_RANK: 1" in proc.stdout + proc.stderr
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: rank {rank} cannot" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if rank:  # rank 0 says why it stopped
        assert "error: the process of local rank 1 (pid" in proc.stderr
        assert "stopped with the error printed above" in proc.stderr


def torchrun(log_dir: Path, script: Path, *args) -> tuple[subprocess.CompletedProcess, dict]:
    """``torchrun --nproc_per_node=2 SCRIPT ARGS`` with each rank's stdout and stderr in files of its own: returns
    torchrun's CompletedProcess and each rank's stderr, by rank."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                             "MASTER_PORT", "NODE_RANK", "SLURM_PROCID")}  # fmt: skip
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--log-dir", str(log_dir),
               "--redirects", "3", str(script), *map(str, args)]  # fmt: skip
    proc = subprocess.run(command, cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    stderr = {int(p.parent.name): p.read_text() for p in log_dir.glob("*/attempt_0/*/stderr.log")}
    assert sorted(stderr) == [0, 1], (proc.stderr[-3000:], list(log_dir.rglob("*")))
    return proc, stderr


@pytest.mark.slow
def test_an_error_before_training_under_torchrun_is_printed_once(ddp_config, tmp_path, repo):
    """Every rank torchrun starts meets a bad value found only once they run (a sharded strategy on a CPU): each
    printed the same message, once per process. Now the first rank to fail prints it and every rank exits 2."""
    proc, stderr = torchrun(tmp_path / "logs", repo / "train.py", "--config", ddp_config, f"run.dir={tmp_path / 'run'}",
                            "trainer.devices=2", "trainer.strategy=fsdp", "train.batch_size=2")  # fmt: skip
    said = [r for r, text in stderr.items() if "error: trainer: Lightning cannot run with" in text]
    assert len(said) == 1 and "".join(stderr.values()).count("error: ") == 1, stderr
    assert "Traceback" not in "".join(stderr.values()), stderr
    codes = [line.split(":")[1].split()[0] for line in proc.stderr.splitlines() if line.strip().startswith("exitcode")]
    assert codes == ["2", "2"], proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_error_on_one_rank_under_torchrun_is_not_followed_by_a_traceback(ddp_config, tmp_path, repo):
    """Rank 1 fails in a step under torchrun: it says why, and rank 0, whose collective with it ended with gloo's
    "Connection closed by peer", printed that RuntimeError's traceback too (torchrun ends the ranks itself, so no
    rank 0 of minilm's stops them and says which failed): now it stops without a word, the failing rank's message
    the only one."""
    script = tmp_path / "failing_rank.py"
    script.write_text(FAILING_RANK.format(repo=str(repo), train=str(repo / "train.py"), rank=1, where="step"))
    proc, stderr = torchrun(tmp_path / "logs", script, "--config", ddp_config, f"run.dir={tmp_path / 'run'}",
                            "trainer.devices=2", "trainer.strategy=ddp", "train.batch_size=2")  # fmt: skip
    assert proc.returncode != 0
    assert "error: rank 1 cannot go on" in stderr[1], stderr
    for text in stderr.values():
        assert "Traceback" not in text and "Connection closed" not in text, stderr
    assert "".join(stderr.values()).count("error: ") == 1, stderr
