"""Run a config's phases in order, in one run directory, resumably.

Layout of ``run.dir``::

    config.yaml            the resolved run config        tokenizer.model   the tokenizer (self-contained runs)
    held_out.json          the documents held out from training (corpus, digest: checked by the evaluation)
    tb/                    TensorBoard, one step axis      model.safetensors the final weights (last phase)
    .lock                  pid of the process training here
    <phase>/checkpoints/step-XXXXXXXX.ckpt                 resumable state (last ``train.keep_checkpoints``)
    <phase>/model.safetensors, <phase>/config.yaml, <phase>/complete.json   written when the phase finishes
                           (complete.json: steps, seconds, val_loss, carried_optimizer, world_size, started_from)
    <phase>/started_from.json  the weights the phase began training from (its started_from), written at its first step

``apply_phase`` is the one function that changes the model between phases; ``run_phases`` is the loop. What a
command (a fresh run, --resume, --phase, --init) may do with run.dir is decided before anything trains, by the checks
of run_checks.py, which also holds the layout helpers both read (``phase_dir``, ``is_complete``, STARTED, CARRIED).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Optional

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf

from minilm.cli import raise_if_interrupted
from minilm.config import (
    micro_batch_size,
    phase_config,
    phase_names,
    phase_steps,
    save_config,
    scaling_warning,
    shorter_phase_note,
    warmup_warning,
)
from minilm.errors import MinilmError
from minilm.files import (
    LockHeld,
    atomic_write,
    atomic_write_text,
    is_file_at,
    lock_file,
    lock_text,
    pid_alive,
    remove_stale_temporaries,
    same_bytes,
)
from minilm.model import GPT
from minilm.positions import validate_position
from minilm.positions.rope_scaling import compute_rope
from minilm.runs import COMPLETE, HELD_OUT, run_dir_of, started_from_text
from minilm.training.checkpoint import (
    TRAINED_WITH,
    atomic_torch_save,
    checkpoint_path,
    checkpoint_step,
    latest_good_checkpoint,
    load_checkpoint_dict,
    load_weights,
    model_differences,
    prune_checkpoints,
    save_weights,
)
from minilm.training.memory import is_out_of_memory, out_of_memory
from minilm.training.datamodule import PhaseData
from minilm.training.lit_module import AtomicCheckpointIO, LitGPT
from minilm.training.optim import check_optimizer_params
from minilm.training.precision import auto_precision_note, cpu_precision_note, precision, trainer_device
from minilm.training.progress import progress_bar

# what a command may do with run.dir, checked before anything trains, and the layout of run.dir that both read
# (run_checks.py)
from minilm.training.run_checks import (
    CARRIED,
    STARTED,
    carries_optimizer,
    check_before_training,
    check_fits,
    has_outputs,
    init_weights,
    is_complete,
    is_primary_process,
    nothing_to_resume,
    optimizer_state_path,
    phase_dir,
    resume_as_begun,
    silent,
    started_from_record,
    what_trains,
)


# ------------------------------------------------------------------------------------------------ run lock


@contextmanager
def run_lock(run_dir: Path, log: Callable[[str], None] = print):
    """One training process per run directory; a stale lock left by a dead process is taken over.

    The lock file holds "pid host" and, while its process lives, an exclusive ``flock``: the kernel drops it when the
    process dies, so two processes that find the same stale lock cannot both take it over (each read the dead pid,
    each removed the file and created its own in turn: the second removed the first's fresh lock, and both trained
    into one run.dir). Who holds the flock decides; the pid and host are read for the message, and a lock of a live
    process without the flock (written by a minilm from before it) or of another host, where the flock may not
    reach, is respected as before. The file is locked through the descriptor opened on it and checked to still be
    the file at the path (the holder removes it on exit), so a process that opened it just before cannot lock a
    file that is gone while another creates the next one."""
    lock = run_dir / ".lock"
    host = socket.gethostname()
    me = f"{os.getpid()} {host}"
    try:
        fd, _ = lock_file(lock, mode=0o644)  # (no flock there: the pid and host alone decide)
    except LockHeld as e:
        raise _lock_in_use(run_dir, lock, e.text) from None
    holder = lock_text(fd)
    if holder and holder != me:
        pid_s, _, their_host = holder.partition(" ")
        if pid_s.isdigit() and (their_host != host or pid_alive(int(pid_s))):
            os.close(fd)
            raise _lock_in_use(run_dir, lock, holder, unsure=True)
        log(f"taking over a stale lock left by process {holder}")
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.encode(), 0)
    try:
        yield
    finally:
        try:
            if lock_text(fd) == me and is_file_at(fd, lock):
                lock.unlink()  # while still holding the flock: nobody takes over a file that is being removed
        except OSError:
            pass
        os.close(fd)


class RunInUse(MinilmError):
    """Another process holds the run's lock (``run_lock``); ``in_use`` says so without train.py's remedy (a study,
    whose runs' directories its --out places, gives its own), ``gone`` what to do where that process may be dead."""

    def __init__(self, in_use: str, gone: str):
        super().__init__(f"{in_use}; wait for it, stop it, or choose another run.dir{gone}")
        self.in_use, self.gone = in_use, gone


def _lock_in_use(run_dir: Path, lock: Path, holder: str, unsure: bool = False) -> MinilmError:
    """``unsure``: the lock is respected though no process holds its flock here (written on another host, where the
    flock may not reach; or by a pid of this host that is alive, which may be another process's since). A run
    killed on a machine that was lost, and requeued on another, met it for good, and the message did not say
    that the lock file is what keeps it out."""
    pid_s, _, host = holder.partition(" ")
    gone = (f"; if it no longer runs (it was killed, or its machine was lost), delete {lock} and run the command "
            "again") if unsure else ""
    return RunInUse(f"{run_dir} is in use by process {pid_s or '?'} on {host or '?'} (lock file {lock})", gone)


# ----------------------------------------------------------------------------------------- apply a phase


def apply_phase(model: GPT, pcfg, phase: str, log: Callable[[str], None], tb=None, step: int = 0,
                world_size: int = 1, started_from: str = "", resumes: Optional[Path] = None) -> str:  # fmt: skip
    """The one place a phase changes the model: position parameters (RoPE base, scaling) are set on every layer
    and verified against ``compute_rope``; limits of the encoding are checked against the phase's seq_len.
    Returns the transition message (also logged to the console and, as text, to TensorBoard); ``world_size``: the
    processes that train (train.batch_size is per process); ``started_from``: the weights the phase starts from, in
    words (minilm.runs.started_from_text), said in the message where given; ``resumes``: the step checkpoint the
    phase resumes from, said instead (at which step of how many: the phase's first line says where it goes on)."""
    check_phase_fits(model, pcfg, phase)
    params = validate_position(pcfg.model.position, where=f"phases.{phase}.position")
    built_with = validate_position(model.cfg.position)  # what modules without a `params` attribute still hold
    changed = []
    for layer, pos in enumerate(model.position_modules()):
        if getattr(pos, "params", built_with) == params:
            continue
        if not hasattr(pos, "configure"):
            raise MinilmError(
                f"phases.{phase}.position: encoding '{pcfg.model.position.name}' cannot change its parameters "
                "between phases"
            )
        pos.configure(params)
        changed.append(layer)
    _verify_rotary(model, params, phase)
    from minilm.eval.report import plural

    pos_desc = OmegaConf.to_container(pcfg.model.position, resolve=True)
    msg = (
        f"phase '{phase}': seq_len {pcfg.train.seq_len}, {plural(phase_steps(pcfg), 'step')} of "
        f"{plural(pcfg.train.batch_size, 'sequence')}"
        + (f" per process ({pcfg.train.batch_size * world_size} in all)" if world_size > 1 else "")
        + f", lr {pcfg.optim.lr} ({pcfg.optim.decay}), "
        f"long_fraction {pcfg.data.long_fraction}{_sampling_desc(pcfg.data)}, position {pos_desc}"
        + (f" (reconfigured {plural(len(changed), 'layer')})" if changed else "")
        + (f"; starts from {started_from}" if started_from else "")
        + (f"; resumes at step {checkpoint_step(resumes)} of {phase_steps(pcfg)} from {resumes}" if resumes else "")
    )
    log(msg)
    if tb is not None:
        tb.add_text("phases", msg, global_step=step)
    return msg


def _sampling_desc(data) -> str:
    """What else the phase's rows are, for its first line, said only where it is on (to keep the line short): each
    changes what the phase trains on, and a log without them did not say it (a phase's own data section may turn
    them on or off)."""
    syn = data.synthetic
    tasks = ", ".join(syn.tasks)
    return (
        (", document_mask" if data.document_mask else "")
        + (", restart_positions" if data.restart_positions else "")
        + (f", synthetic fraction {syn.fraction} (tasks {tasks}; loss {syn.loss})" if syn.fraction else "")
    )


def _verify_rotary(model: GPT, params, phase: str) -> None:
    """Every rotary layer's frequencies must equal compute_rope's for the phase's config."""
    for layer, pos in enumerate(model.position_modules()):
        if not hasattr(pos, "inv_freq") or not hasattr(pos, "rot_dim"):
            continue
        expected, factor = compute_rope(pos.rot_dim, params.base, params.scaling)
        if not torch.equal(pos.inv_freq.cpu(), expected) or pos.attention_factor != factor:
            raise MinilmError(f"phase '{phase}': layer {layer} rotary frequencies do not match the phase config")


def check_phase_fits(model: GPT, pcfg, phase: str, set_in=None) -> None:
    """The phase's seq_len within the limits of the model's encoding as the phase configures it (``check_fits``;
    ``set_in``: the run config's section of the phase, for the key the error names)."""
    check_fits([model.pos_emb, *model.position_modules()], pcfg, phase, set_in)


# -------------------------------------------------------------------------------------------- the loop


class _RunLogger(TensorBoardLogger):
    """One events file per process for the whole run, closed by ``run_phases``. Lightning closes its logger's
    writer at the end of every fit and validate and the next scalar opens a new file, several per phase, named by
    the second and a per-process counter: two opened in the same second around the tenth sort out of order
    (``….10`` before ``….9``), so TensorBoard read those steps out of order."""

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            self.experiment.flush()

    @rank_zero_only
    def close(self) -> None:
        if self._experiment is not None:
            self.experiment.close()


class _StepCheckpoint(L.Callback):
    """A resumable checkpoint every ``ckpt_every`` optimizer steps, atomically written; keeps the last k.

    A checkpoint at step s is what --resume continues after, so everything of step s must be on disk before it:
    TensorBoard drops only the steps after it (purge_step), and nothing is done again for s itself. At a step that
    is validated (every ``val_every``; 0: none inside fit) it is written after that validation: written before it
    (Lightning's order: batch end, then validation), a kill during the validation left the checkpoint and no
    validation point, and Lightning skips the validation of a step it resumes at. The step's training scalars are
    logged first (``LitGPT.end_step``: Lightning runs this batch end before the module's, where they were logged
    after the checkpoint), and the TensorBoard writer is flushed before each checkpoint (its buffer, up to two
    minutes of events, is lost with a kill)."""

    def __init__(self, ckpt_dir: Path, every: int, keep: int, val_every: int = 0, carried: bool = False):
        self.dir, self.every, self.keep, self.val_every = ckpt_dir, every, keep, val_every
        self.carried = carried  # the phase's carry_optimizer (CARRIED)
        self._after_validation: Optional[int] = None  # the step whose checkpoint waits for its validation

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[TRAINED_WITH] = what_trains(pl_module.cfg)  # compared with the config on --resume
        checkpoint[CARRIED] = self.carried

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        step = trainer.global_step
        if self.every and step % self.every == 0 and step < trainer.max_steps:
            if self.val_every and step % self.val_every == 0:
                self._after_validation = step
            else:
                pl_module.end_step(batch_idx)  # the step's scalars, before the checkpoint that ends it
                self._save(trainer, step)

    def on_validation_end(self, trainer, pl_module) -> None:
        fitting = trainer.state.fn == "fit" and not trainer.sanity_checking  # (not the validate() before the phase)
        if self._after_validation is not None and self._after_validation == trainer.global_step and fitting:
            self._after_validation = None
            self._save(trainer, trainer.global_step)

    def _save(self, trainer, step: int) -> None:
        _flush_events(trainer)
        trainer.save_checkpoint(checkpoint_path(self.dir, step), weights_only=False)  # full: resumable
        if trainer.is_global_zero:
            prune_checkpoints(self.dir, self.keep, step)


def _flush_events(trainer) -> None:
    """Write what the run's TensorBoard writer holds to its file (rank 0 writes the events)."""
    if trainer.is_global_zero and trainer.logger is not None:
        trainer.logger.experiment.flush()


def _open_run(cfg, pcfgs: dict, run_dir: Path, resume: bool, start_phase: Optional[str], primary: bool,
              init: Optional[dict] = None,
              log: Callable[[str], None] = print) -> tuple[Any, dict[str, Path], Optional[dict]]:  # fmt: skip
    """``check_before_training``, then create run.dir; returns what it does. ``init``: the --init weights'
    ``_init_record`` (None: no --init), as the checks take it."""
    opened = check_before_training(cfg, pcfgs, run_dir, resume, start_phase, primary, init, log)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MinilmError(f"run.dir {run_dir} cannot be created ({e.strerror}); set run.dir to a writable path")
    return opened


def _load_init(model: torch.nn.Module, weights: dict, init: str, trained: Optional[dict], pcfgs: dict, phase: str,
               before: Optional[str], tokenizer_file: str, log: Callable[[str], None]) -> None:
    """Load the --init ``weights`` (``trained``: the model section they record) into the model of ``phase``; weights
    of another model section start it all the same, and a note names each difference; weights of a run whose
    tokenizer is not this corpus's (``tokenizer_file``) too, with a warning. ``before``: the phase before ``phase``
    (None: it is the first), whose weights it would start from without --init: those are the weights compared with
    its model section, not ``phase``'s, which also holds the change the phase makes (a scaling block): the README's
    ``--phase extend_1k --init runs/rope_pi/pretrain`` was told its pretraining weights had another model config."""
    load_weights(model, weights, where=init)
    log(f"initial weights from {init}")
    if (source := run_dir_of(Path(init))) is not None and _other_file(source / "tokenizer.model", tokenizer_file):
        # (a vocabulary of the same size loads without a word, each embedding row then standing for another token)
        log(f"warning: these weights were trained with {source / 'tokenizer.model'}, another tokenizer than the one "
            f"this run's corpus is tokenized with ({tokenizer_file}): their embedding and output rows stand for other "
            f"tokens; they start phase '{phase}' all the same. Train with the data settings of {source} (its "
            "data.tokenizer and sources) if that is not what you meant")  # fmt: skip
    than = f"phase '{before}' trains with (where phase '{phase}' starts)" if before else f"phase '{phase}' trains with"
    if trained is not None and (differ := model_differences(trained, pcfgs[before or phase].model)):
        log(f"note: these weights were trained with another model config than {than}:\n  "
            + "\n  ".join(differ) + "\nthey start it all the same (what --init allows: a change of position "
            "encoding, say); check the config if that is not what you meant")  # fmt: skip


def _other_file(a: Path, b: str | Path) -> bool:
    """Whether two files hold other bytes (``same_bytes``); one that cannot be read: not known to, nothing to say."""
    try:
        return not same_bytes(a, b)
    except OSError:
        return False


def phase_notes(cfg, names) -> list[str]:
    """The warnings and notes on phases ``names`` of run config ``cfg`` (a warmup longer than the phase, a phase
    shorter than the one before, a RoPE scaling that contradicts the phases), each a line as logged before those
    phases train."""
    out = []
    for n in names:
        if msg := warmup_warning(cfg, n):
            out.append(f"warning: {msg}")
        if msg := shorter_phase_note(cfg, n):
            out.append(f"note: {msg}")
        if msg := scaling_warning(cfg, n):
            out.append(f"warning: {msg}")
    return out


def run_phases(
    cfg,
    *,
    resume: bool = False,
    start_phase: Optional[str] = None,
    init: Optional[str] = None,
    log: Callable[[str], None] = print,
    notes: bool = True,
) -> Path:
    """Train every phase of ``cfg`` in order; returns the run directory. ``notes``: log ``phase_notes`` of the
    phases that will train (a study says them once, before its first run, for all its runs: else each run
    repeated the same warning)."""
    run_dir = Path(cfg.run.dir)
    names = phase_names(cfg)
    pcfgs = {n: phase_config(cfg, n) for n in names}
    primary = is_primary_process()  # the other DDP ranks train, and leave run.dir's files to this one
    if not primary:  # every rank runs the phases alike, and each line was printed once per process; what goes wrong
        log = silent  # on another rank is raised there, and reaches the user from it
    start_phase, begun, read_begun = _what_resumes(run_dir, names, resume, start_phase, init, primary, log)
    init, weights, init_model, init_record = init_weights(init, begun, read_begun)
    corpus, resume_from, held_out = _open_run(cfg, pcfgs, run_dir, resume, start_phase, primary, init_record, log)
    start = names.index(start_phase) if start_phase else 0
    if notes:  # said before training, of what will train
        for line in phase_notes(cfg, [n for n in names[start:]
                                      if (start_phase and not resume) or not is_complete(run_dir, n)]):  # fmt: skip
            log(line)
    model = _new_model(cfg, pcfgs, corpus.tokenizer.vocab_size, log)
    # weights that do not fit are refused before run.dir is written and --phase deletes phases; a phase that resumes
    # from its checkpoint takes the checkpoint's weights (its start checked to be these: _check_resumed_init), and
    # the log said 'initial weights from W' just before 'resumes at step N ... from <checkpoint>'
    if weights is not None and names[start] not in resume_from:
        _load_init(model, weights, init, init_model, pcfgs, names[start], names[start - 1] if start else None,
                   corpus.tokenizer.model_file, log)
    weights = None  # (the model holds copies: not a second set of them through training)
    # an explicit restart retrains this phase and the ones after it (with --resume: continue an interrupted --phase
    # run). Every rank decides so from the command line, not from run.dir: rank 0 deletes their old outputs, and
    # under torchrun / SLURM the other ranks start with it and looked before it had: they found the phases complete
    # and skipped them (rank 0 then waited for them forever), or resumed an old checkpoint.
    restarts = set(names[start:]) if start_phase is not None and not resume else set()
    # the moments a phase that trains from its start carries from a phase finished before this command: refused
    # (another minilm's grouping of the parameters) before run.dir is written and --phase deletes phases
    carried = _carried_at_start(model, cfg, pcfgs, run_dir, start, restarts, resume_from)
    with run_lock(run_dir, log) if primary else nullcontext():
        if primary:
            _write_run_files(cfg, corpus, run_dir, names, held_out)
            _remove_phases(run_dir, restarts)
        offset = sum(phase_steps(pcfgs[n]) for n in names[:start])
        tb_logger = _run_logger(run_dir, names[start:], pcfgs, offset, resume_from,
                                restarted=resume or start_phase is not None)  # fmt: skip
        tokens = sum(_phase_tokens(pcfgs[n]) for n in names[:start])
        prev = names[start - 1] if start > 0 else None
        if prev is not None and init is None:
            _load_finished_phase(model, run_dir, prev, start_phase)
        try:
            for i, n in enumerate(names[start:], start):
                raise_if_interrupted()  # (a Ctrl-C swallowed by a finalizer after the last phase's steps)
                pcfg, steps = pcfgs[n], phase_steps(pcfgs[n])
                _wait_for_primary()
                if n not in restarts and is_complete(run_dir, n):
                    log(f"phase '{n}' is complete; skipping")
                    load_weights(model, phase_dir(run_dir, n) / "model.safetensors")
                else:
                    carry = carries_optimizer(cfg, n)
                    # (a phase resumed from its checkpoint takes the moments saved there)
                    opt_state = None if not carry or n in resume_from else (
                        carried.pop(n, None) or _carried_optimizer_state(model, pcfg, run_dir, prev, n))
                    began = started_from_record(names, i, start, init_record, cfg.run.seed)
                    _train_phase(model, corpus, pcfg, n, offset, steps, run_dir, tb_logger, opt_state, carry, log,
                                 tokens, fresh=n in restarts, started_from=began, set_in=cfg.phases.get(n))
                prev, offset, tokens = n, offset + steps, tokens + _phase_tokens(pcfg)
            if primary:
                save_weights(model, run_dir / "model.safetensors", pcfgs[names[-1]].model)
                save_config(pcfgs[names[-1]], run_dir / "final_config.yaml")
        except BaseException as e:
            if failed := _stop_launched_ranks(e):
                raise failed from e
            raise
        finally:
            tb_logger.close()
    log(f"done: {run_dir / 'model.safetensors'}")
    return run_dir


def _what_resumes(run_dir: Path, names: list, resume: bool, start_phase: Optional[str], init: Optional[str],
                  primary: bool, log) -> tuple[Optional[str], Optional[dict], bool]:  # fmt: skip
    """(the phase to start at, the --init record --resume goes on with where the phase it continues began with one,
    whether to read its weights: ``resume_as_begun``); says so where --resume finds nothing to resume ("always pass
    --resume", a requeued job, is fine, but the log says that nothing was resumed; not before an unknown --phase's
    error, as if the run were starting)."""
    begun, read = None, True
    if start_phase is not None and start_phase not in names:  # (refused by the checks that follow)
        return start_phase, begun, read
    if resume and init is None:
        start_phase, begun, read = resume_as_begun(run_dir, names, start_phase, log)
    if resume and primary and begun is None and not has_outputs(run_dir, names):
        log(nothing_to_resume(run_dir, names[0]))
    return start_phase, begun, read


def _remove_phases(run_dir: Path, restarted) -> None:
    """The outputs of the phases an explicit --phase retrains, every complete.json first: killed inside rmtree (file
    by file), a phase kept it beside deleted weights, which --resume took as finished, and one after it, not reached
    yet, as finished after an unfinished one."""
    for n in restarted:
        (phase_dir(run_dir, n) / COMPLETE).unlink(missing_ok=True)
    for n in restarted:
        shutil.rmtree(phase_dir(run_dir, n), ignore_errors=True)


def _compile_note(train) -> str:
    """The model line's word on compilation: none when off, the mode when not torch's default."""
    if not train.compile:
        return ""
    return ", compiled" + ("" if train.compile_mode == "default" else f" ({train.compile_mode})")


def _sdpa_note(model_cfg) -> str:
    """The model line's word on SDPA's kernel: none for torch's own choice."""
    return "" if model_cfg.sdpa_kernel == "auto" else f", SDPA kernel {model_cfg.sdpa_kernel} first (on CUDA)"


def _new_model(cfg, pcfgs: dict, vocab_size: int, log) -> GPT:
    """The run's model, initialized from run.seed, said in the log with the precision it trains in (its encoding's
    limits were checked against every phase before the corpus was prepared: ``_check_phases_fit``)."""
    torch.manual_seed(cfg.run.seed)
    model = GPT(cfg.model, vocab_size)
    first = next(iter(pcfgs.values()))  # phases share the run's trainer section and precision
    used, device = precision(first), trainer_device(first)
    log(f"model: {model.num_params() / 1e6:.2f}M non-embedding parameters, vocab {vocab_size}, precision {used}"
        + (auto_precision_note(device) if cfg.train.precision == "auto" else "") + _compile_note(cfg.train)
        + _sdpa_note(cfg.model) + cpu_precision_note(used, device))  # fmt: skip
    return model


def _write_run_files(cfg, corpus, run_dir: Path, names: list, held_out) -> None:
    """Rank 0's files of the run, under its lock and before any phase trains."""
    # what writes a kill cut short left beside the run's outputs (a step checkpoint's: prune_checkpoints)
    for d in [run_dir, *(p for n in names for p in (phase_dir(run_dir, n), phase_dir(run_dir, n) / "eval"))]:
        remove_stale_temporaries(d)
    save_config(cfg, run_dir / "config.yaml")
    # the run's final weights are its last phase's, saved again when every phase has finished: from now until then
    # (a phase appended, --phase, --resume) they were the old last phase's, read under the new one's config (a
    # run's evaluation reads its newest finished phase meanwhile: minilm.runs.resolve_run)
    for name in ("model.safetensors", "final_config.yaml"):
        (run_dir / name).unlink(missing_ok=True)
    # atomically: an evaluation of the finished phases may be reading it, and a copy cut short (disk full,
    # a kill) left a truncated tokenizer that made the whole run unreadable until the next resume
    tokenizer = Path(corpus.tokenizer.model_file).read_bytes()
    atomic_write(run_dir / "tokenizer.model", lambda f: f.write(tokenizer))
    # which documents were held out: an evaluation later, on a corpus prepared again (its files changed, or
    # another minilm split it otherwise), must not read documents the run trained on (minilm.eval.eval_data).
    # Written when the run starts on this corpus; a resumed run keeps the record of the split it trained
    # beside (_check_held_out_record)
    if held_out is not None:
        atomic_write_text(run_dir / HELD_OUT, json.dumps(held_out, indent=2) + "\n")


def _run_logger(run_dir: Path, names: list, pcfgs: dict, offset: int, resume_from, restarted: bool):
    """The run's TensorBoard logger (``tb/``), from the first phase of ``names`` that trains, at step ``offset``."""
    # --resume / --phase: the events the earlier process logged past the point training restarts from are
    # dropped by TensorBoard (a SessionLog.START at purge_step), so they are not drawn twice. A run that starts
    # writes one too, at step 0: TensorBoard (its plugin_event_accumulator, what `tensorboard --logdir` serves)
    # takes a run's first START for its start and only a later one for a restart, so the first resume's was
    # ignored and the steps logged after the checkpoint were drawn twice
    purge = _tensorboard_purge_step(run_dir, names, pcfgs, offset, resume_from) if restarted else 0
    return _RunLogger(save_dir=str(run_dir), name="tb", version="", default_hp_metric=False, purge_step=purge)


# the processes of the other ranks that Lightning's launcher started from this one (``python train.py`` with
# trainer.devices > 1: they run the whole command, as long as this process does), as _run_trainer finds them
_launched: list = []


def _stop_launched_ranks(error: BaseException) -> Optional[MinilmError]:
    """In the process that started the other ranks (Lightning's launcher), ended by ``error``: end them too, and say
    which one failed first where ``error`` is what that left this process with. Lightning ends them on Ctrl-C in
    ``fit`` alone. On an error of rank 0 (its evaluation between phases, a file it writes), the others were left in
    a collective that waited for it: they failed with a traceback of the backend's after the command had ended
    (gloo), or held their GPU until the process group's timeout, 30 minutes (NCCL). And a rank that failed, its
    error printed, ended rank 0's collective with such a traceback ("Connection closed by peer") and exit 1, in
    place of exit 2. Returns the error naming the rank that failed, or None (``error`` stands). Under torchrun or
    SLURM their launcher ends the ranks, and this process started none."""
    if not _launched:
        return None
    failed = None
    if not isinstance(error, (MinilmError, KeyboardInterrupt)):  # a collective another rank left, maybe: it exits
        deadline = time.monotonic() + 5.0  # as its sockets close, which is what ended the collective here
        while failed is None and time.monotonic() < deadline:
            failed = next(((r, p) for r, p in enumerate(_launched, 1) if p.poll()), None)
            time.sleep(0.05)
    for proc in _launched:
        if proc.poll() is None:
            proc.kill()  # (SIGKILL, as Lightning on Ctrl-C: a process blocked in a collective runs no handler)
            proc.wait()
    if failed is None:
        return None
    rank, proc = failed
    code = proc.returncode
    killed = next((s.name for s in signal.Signals if s == -code), f"signal {-code}")
    how = (f"was killed by {killed}" if code < 0 else "stopped with the error printed above"
           if code == 2 else f"failed with exit code {code} (its output is above)")  # fmt: skip
    return MinilmError(f"the process of local rank {rank} (pid {proc.pid}) {how}; the other ranks of the run were "
                       "stopped with it")


def _wait_for_primary() -> None:
    """Under DDP, hold every rank here until rank 0 has finished the previous phase: only rank 0 writes its files
    (weights, optimizer.pt, complete.json) and evaluates it, while the other ranks went straight on to the next
    phase, where one with carry_optimizer read optimizer.pt before rank 0 had written it ("left no optimizer
    state"). Every rank calls this at the same points (the process group exists once a phase has trained, on all
    ranks alike); a no-op in one process. Not after the last phase: nothing reads its files, and a rank waiting
    through a long final evaluation would meet the process group's timeout."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        nccl = torch.distributed.get_backend() == "nccl"  # (it would guess the device from the rank)
        torch.distributed.barrier(device_ids=[torch.cuda.current_device()] if nccl else None)


def _tensorboard_purge_step(run_dir: Path, names: list[str], pcfgs: dict, offset: int,
                            resume_from: dict[str, Path]) -> Optional[int]:  # fmt: skip
    """The first run step that training from here logs again: the step after the checkpoint the first unfinished
    phase resumes from (``resume_from``, as _open_run found it; its own steps up to the checkpoint were logged, and
    are not logged again), or the step after its start when it starts afresh (the previous phase's last step shares
    that step; the phase's validation before its first step is then logged a second time, with the same value).
    None when every phase is finished."""
    for n in names:
        if not is_complete(run_dir, n):
            ckpt = resume_from.get(n)
            at = offset + (checkpoint_step(ckpt) if ckpt else 0)
            return at + 1 if at else 0  # step 0 is the run's first event: nothing before it to keep
        offset += phase_steps(pcfgs[n])
    return None


def _load_finished_phase(model: GPT, run_dir: Path, phase: str, starting: Optional[str]) -> None:
    path = phase_dir(run_dir, phase) / "model.safetensors"
    if not is_complete(run_dir, phase):
        raise MinilmError(
            f"--phase {starting}: the previous phase '{phase}' has not finished in {run_dir}; run it first or give "
            "starting weights with --init PATH"
        )
    load_weights(model, path)


def _carried_optimizer_state(model: GPT, pcfg, run_dir: Path, phase: str, carrying: str) -> dict:
    """Finished phase ``phase``'s optimizer.pt for phase ``carrying`` (of config ``pcfg``), refused unless its moments
    are of ``model``'s parameters in the order the optimizer takes them (an older minilm grouped them otherwise)."""
    path = optimizer_state_path(run_dir, phase, carrying)
    carried = load_checkpoint_dict(path)
    shapes = {i: s["exp_avg"].shape for i, s in carried["state"].items() if "exp_avg" in s}
    check_optimizer_params({"names": carried.get("params"), "shapes": shapes}, model, pcfg.optim.weight_decay,
                           f"phases.{carrying}.carry_optimizer: {path}",
                           f"start its moments afresh with --phase {carrying} phases.{carrying}.carry_optimizer=false, "
                           "or retrain the phase before it")  # fmt: skip
    return carried


def _carried_at_start(model: GPT, cfg, pcfgs: dict, run_dir: Path, start: int, restarts: set,
                      resume_from: dict) -> dict[str, dict]:  # fmt: skip
    """The carried moments (``_carried_optimizer_state``) of the first phase from index ``start`` on that trains from
    its first step, where it carries them from a phase that finished before this command (the later ones carry
    them from phases this command trains), by phase name; empty where there is none."""
    names = list(pcfgs)
    for i, n in enumerate(names[start:], start):
        if n in restarts or not is_complete(run_dir, n):
            if carries_optimizer(cfg, n) and n not in resume_from:
                return {n: _carried_optimizer_state(model, pcfgs[n], run_dir, names[i - 1], n)}
            return {}
    return {}


def _phase_tokens(pcfg) -> int:
    """Tokens a phase trains on (per device): its steps times its own batch_size · seq_len."""
    return phase_steps(pcfg) * pcfg.train.batch_size * pcfg.train.seq_len


def _train_phase(model, corpus, pcfg, name, offset, steps, run_dir, tb_logger, carried_opt, carries: bool, log,
                 tokens_offset: int, fresh: bool = False, started_from: Optional[dict] = None,
                 set_in=None) -> None:  # fmt: skip
    """Train phase ``name``: from its newest good checkpoint, or from its start when it has none or is ``fresh``
    (restarted by --phase: its old checkpoints are being deleted by rank 0). ``carried_opt``: the AdamW moments it
    starts from (``carries``: the config's carry_optimizer; none are given to a phase resumed from a checkpoint).
    ``started_from``: the weights it starts from at its first step (``started_from_record``); a phase resumed from a
    checkpoint keeps the checkpoint's record (LitGPT). ``set_in``: the phase's section of the run's config (LitGPT)."""
    pdir = phase_dir(run_dir, name)
    ckpt_dir = pdir / "checkpoints"
    ckpt = None if fresh else latest_good_checkpoint(ckpt_dir, log)
    accum = pcfg.train.batch_size // micro_batch_size(pcfg.train)
    t = pcfg.train
    # Validation inside fit every val_every steps, else (val_every 0 or beyond the phase) once at its last step:
    # Lightning validates at the end of the epoch when given no interval, so a validate() after fit validated the
    # end twice.
    val_every = t.val_every if t.val_every and t.val_every <= steps else steps
    trainer = L.Trainer(
        max_steps=steps,
        max_epochs=1,  # one pass over the phase's batches = the whole phase
        accelerator=pcfg.trainer.accelerator,
        devices=pcfg.trainer.devices,
        strategy=pcfg.trainer.strategy,
        num_nodes=pcfg.trainer.num_nodes,
        precision=precision(pcfg),
        logger=tb_logger,
        callbacks=[_StepCheckpoint(ckpt_dir, t.ckpt_every, t.keep_checkpoints, val_every if t.val_batches else 0,
                                   carries),
                   progress_bar()],
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=False,
        enable_model_summary=False,
        accumulate_grad_batches=accum,
        val_check_interval=val_every * accum,
        limit_val_batches=0 if t.val_batches == 0 else None,  # none at all: not an empty loader Lightning warns of
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        # Validation under no_grad, as Lightning runs it inside fit whatever this says: under inference_mode the
        # first validate() gave the compiled loss inference tensors, and dynamo compiled it a third time for fit's
        # validation (a guard on the inputs' dispatch keys), on CPU as long as the training graph's own compile.
        inference_mode=False,
        use_distributed_sampler=False,
        log_every_n_steps=t.log_every,
        default_root_dir=str(pdir),
    )
    # (after the trainer, which knows the processes: the phase line gives the rows per step)
    # (resumed: the line names the checkpoint instead of the start, which is the checkpoint's record, read by fit)
    apply_phase(model, pcfg, name, log, tb_logger.experiment if ckpt is None else None, offset, trainer.world_size,
                started_from_text(started_from) if ckpt is None else "", ckpt)
    if ckpt is None and started_from is not None and trainer.is_global_zero:  # (a --phase restart deleted the folder)
        pdir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(pdir / STARTED, json.dumps(started_from, indent=2) + "\n")
    module = LitGPT(model, pcfg, total_steps=steps, step_offset=offset, phase=name, tokens_offset=tokens_offset,
                    started_from=started_from, set_in=set_in)  # fmt: skip
    module.initial_optimizer_state = carried_opt if ckpt is None else None
    data = PhaseData(corpus, pcfg, name)
    if ckpt is None:  # the loss before the phase's first step: the start of the curve (and, for an extension
        # phase, the cost of the new length untrained)
        _run_trainer(trainer, trainer.validate, name, module, datamodule=data, verbose=False)
    _run_trainer(trainer, trainer.fit, name, module, datamodule=data, ckpt_path=str(ckpt) if ckpt else None)
    if trainer.global_step < steps:
        raise MinilmError(f"phase '{name}' stopped at step {trainer.global_step} of {steps}; resume with --resume")
    if module.last_val_step != steps:  # fit did not validate the last step (not a multiple of val_every, or a
        # resume from a checkpoint at the phase's last step, when fit has no step left to run)
        _run_trainer(trainer, trainer.validate, name, module, datamodule=data, verbose=False)
    if trainer.is_global_zero:
        _finish_phase(model, pcfg, name, pdir, trainer, module, steps, module.phase_seconds(), carries, log)


def _run_trainer(trainer, run, phase: str, *args, **kwargs):
    """``trainer.fit`` / ``validate`` of ``phase``, with Ctrl-C reaching the caller as KeyboardInterrupt (the CLI then
    says how to continue, exit 130): Lightning catches it, shuts down and calls sys.exit(1), which ended a run
    silently. Running out of memory ends in a message naming the phase, the step and the settings that save memory
    (a torch traceback before)."""
    try:
        return run(*args, **kwargs)
    except SystemExit:
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    except Exception as e:
        if is_out_of_memory(e):
            raise out_of_memory(e, phase, trainer.global_step, str(trainer.strategy.root_device)) from e
        raise
    finally:
        if procs := getattr(trainer.strategy.launcher, "procs", None):  # (the first phase's trainer started them)
            _launched[:] = procs


def _finish_phase(model, pcfg, name, pdir, trainer, module, steps, seconds, carried: bool, log) -> None:
    pdir.mkdir(parents=True, exist_ok=True)  # absent when no step checkpoint was written (ckpt_every > steps)
    save_weights(model, pdir / "model.safetensors", pcfg.model)  # (records what load_run checks them against)
    save_config(pcfg, pdir / "config.yaml")
    # optimizer moments, for a next phase with carry_optimizer
    atomic_torch_save({"state": trainer.optimizers[0].state_dict()["state"], "params": module.optimizer_params()},
                      pdir / "optimizer.pt")  # fmt: skip
    if pcfg.eval.lengths:
        from minilm.eval import evaluate_phase

        evaluate_phase(model, pcfg, name, pdir, module.step_offset + steps, trainer.logger, log,
                       record={"started_from": module.started_from})  # fmt: skip
    val_loss = getattr(module, "last_val_loss", None)  # None: train.val_batches=0, no validation (null in JSON)
    # world_size: train.batch_size is per device; --resume on another device count compares the global batch
    # started_from: the weights the phase started from (a resumed one: as its checkpoint recorded them), which its
    # files did not say: retrained with --phase --init, it looked as if it had started from the phase before it
    summary = {"phase": name, "steps": steps, "seconds": round(seconds, 1), "val_loss": val_loss,
               "carried_optimizer": carried, "world_size": trainer.world_size, "started_from": module.started_from}
    atomic_write_text(pdir / COMPLETE, json.dumps(summary, indent=2))  # written last: marks the phase finished
    resumed = f" ({seconds - module.seconds_before:.0f}s of it since --resume)" if module.seconds_before else ""
    log(f"phase '{name}' finished in {seconds:.0f}s{resumed}, {_val_summary(pcfg, val_loss)}; it started from "
        f"{started_from_text(module.started_from)}")


def _val_summary(pcfg, val_loss: Optional[float]) -> str:
    """The end of a phase's last log line: its validation loss, or why it has none (not "val loss None")."""
    if val_loss is not None:
        return f"val loss {val_loss:.4f}"  # (complete.json keeps every digit)
    if pcfg.train.val_batches == 0:
        return "no validation (train.val_batches=0)"
    return "no validation loss"

