"""What a command may do with a run directory, decided before anything trains: the checks ``run_phases``
(minilm/training/phases.py) makes of a fresh run, ``--resume``, ``--phase P`` and ``--init W`` against what run.dir
holds, and ``check_run``, the same checks for a study's runs before the first one trains.

Every refusal comes before run.dir is written and, where it needs no data, before the corpus is prepared: an unknown
--phase, a run.dir that already holds a run without --resume or --phase, --phase after an unfinished phase without
--init, settings Lightning or the machine cannot run (``check_trainer``, ``_check_model_fits``, a phase longer than
its encoding allows), a finished phase the config now trains differently (``check_finished_phase``), an interrupted
phase's checkpoint the config cannot continue (its length, what it trains by, its global batch, its carried optimizer
moments, its data sampler, the --init weights it started from), a phase that --resume would start over from other
weights than it began from (its STARTED file), and a corpus whose tokenizer or held-out documents differ from those
the kept phases trained with. Where a phase was begun by ``--phase P --init W``, a plain --resume goes on with it as
it was begun (``resume_as_begun``). Also here: the run directory's layout as both read it (``phase_dir``,
``is_complete``, STARTED, CARRIED) and the --init weights a command starts from (``init_weights``,
``started_from_record``). Nothing here trains or writes to run.dir (``_check_with_data`` prepares the corpus, in its
cache); phases.py imports from this module, never the other way.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf

from minilm.config import filled_model, key_as_set, micro_batch_size, phase_config, phase_names, phase_steps
from minilm.errors import MinilmError
from minilm.files import TEMPORARY, same_bytes
from minilm.model.transformer import position_hooks
from minilm.positions import validate_position
from minilm.positions.base import tightest_limit
from minilm.positions.rotary import Xpos
from minilm.runs import (
    COMPLETE,
    HELD_OUT,
    WEIGHT_SUFFIXES,
    check_weights_file,
    is_run_dir,
    resolve_run,
    started_from_text,
)
from minilm.training.checkpoint import (
    SAME_OUTPUTS,
    TRAINED_WITH,
    checkpoint_step,
    latest_good_checkpoint,
    list_checkpoints,
    load_latest_good_checkpoint,
    read_weights_and_model,
)
from minilm.training.datamodule import PhaseData
from minilm.training.memory import check_model_fits_device, check_model_fits_host, processes_on_this_host
from minilm.training.precision import precision, trainer_device


# ------------------------------------------------------------------------------------- the run directory


# a step checkpoint's key: whether its phase started from the previous phase's AdamW moments (carry_optimizer), which
# the optimizer state it holds descends from: compared with the config on --resume, as complete.json's is
CARRIED = "minilm_carried_optimizer"
# in a phase's folder: its ``started_from``, written when it begins training from its first step (its checkpoints keep
# it only from the first one on): a --resume that starts it over must start it from the same weights (_check_begun_from)
STARTED = "started_from.json"


def phase_dir(run_dir: Path, phase: str) -> Path:
    return run_dir / phase


def is_complete(run_dir: Path, phase: str) -> bool:
    return (phase_dir(run_dir, phase) / COMPLETE).is_file()


def has_outputs(run_dir: Path, names: list[str]) -> bool:
    """Whether a phase has saved anything: a checkpoint, its outputs. The STARTED file a phase writes as it begins is
    not one: the same command run again after a kill before the first checkpoint starts over, as before that file
    existed (and --resume checks it: ``_check_begun_from``)."""
    return any(_saved_in(phase_dir(run_dir, n)) for n in names)


def _saved_in(pdir: Path) -> bool:
    """Whether ``pdir`` holds anything but its STARTED file (or that file's temporary, a kill inside its write)."""
    return pdir.is_dir() and any(_written_from(p.name) != STARTED for p in pdir.iterdir())


def _written_from(name: str) -> str:
    """The file ``name`` is, or is atomic_write's temporary of (.<name>.<pid>.tmp)."""
    return m.group(1) if (m := TEMPORARY.match(name)) else name


def optimizer_state_path(run_dir: Path, phase: str, carrying: str) -> Path:
    """Where finished phase ``phase`` left its AdamW moments for phase ``carrying`` (carry_optimizer)."""
    path = phase_dir(run_dir, phase) / "optimizer.pt"
    if not path.is_file():  # never a silent fresh optimizer where the config asks to carry one
        raise MinilmError(f"phases.{carrying}.carry_optimizer: phase '{phase}' left no optimizer state ({path} is "
                          f"missing); set phases.{carrying}.carry_optimizer=false, or retrain '{phase}' with --phase")
    return path


def is_primary_process() -> bool:
    """True in the one process that owns run.dir's bookkeeping (lock, config, tokenizer, final weights). The other
    ranks of a DDP run (started by Lightning's launcher, torchrun or SLURM) train and leave the files to it.
    Lightning reads the launcher's rank variables once, at import, into ``rank_zero_only.rank``. That is the rank
    on its node where several nodes are started by hand (Lightning's NODE_RANK, no global RANK): the first process
    of every node read 0 there, and each took the run lock on the shared run.dir ("in use by process ...")."""
    node = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
    return getattr(rank_zero_only, "rank", 0) == 0 and node.strip() in ("", "0")


def silent(msg: str) -> None:
    """The log of the DDP ranks other than rank 0."""


# ------------------------------------------------------------------------------- what the settings allow


def check_writable_dir(path: Path, setting: str = "run.dir") -> None:
    """Fail before any work if directory ``path`` cannot be created or written (checked without creating anything);
    the message names ``setting``, what gave the path (run.dir; a study's --out)."""
    existing = path.resolve()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise MinilmError(f"{setting} {path} is not writable ({existing} is not a writable directory); set "
                          f"{setting} to a writable path")


def check_not_inside_a_run(path: Path, setting: str = "run.dir") -> None:
    """Refuse a ``path`` one or two folders inside another run's directory (runs/tiny/sub, or a phase's
    runs/tiny/pretrain), where the scripts look for a run (``minilm.runs.run_dir_of``): the two runs' files mixed, a
    phase directory holding a run was read as that run (evaluate.py runs/tiny/pretrain evaluated the new run, not
    the phase), and removing or restarting the outer run took the inner one with it."""
    for parent in path.resolve().parents[:2]:
        if is_run_dir(parent):
            raise MinilmError(f"{setting} {path} lies in the run {parent} (its config.yaml, tokenizer.model): the two "
                              f"runs' files would be mixed, and the scripts read a run's folders as its own; set "
                              f"{setting} to a folder outside it")  # fmt: skip


def check_trainer(pcfg) -> int:
    """The ``trainer`` section and ``train.precision`` go to lightning.Trainer unchanged; build one with them, so
    that what Lightning refuses (an unknown accelerator or strategy, devices it cannot use) is an error naming the
    keys before run.dir is written, not a traceback when the first phase starts. Refused too, what Lightning would
    run but minilm cannot: a strategy that trains in processes it spawns or forks, and several nodes that nothing
    launched. Returns the number of processes that will train (devices x num_nodes: the world size)."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    tr = pcfg.trainer
    given = OmegaConf.to_container(tr, resolve=True)
    settings = ", ".join(f"trainer.{k}={v}" for k, v in given.items()) + f", train.precision={pcfg.train.precision}"
    try:
        with warnings.catch_warnings():  # (its word on replacing 16-mixed on a CPU: refused below instead)
            warnings.filterwarnings("ignore", message=".*AMP with fp16 is not supported on CPU.*")
            trainer = L.Trainer(accelerator=tr.accelerator, devices=tr.devices, strategy=tr.strategy,
                                num_nodes=tr.num_nodes, precision=precision(pcfg), logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)  # fmt: skip
    except (MisconfigurationException, ValueError, TypeError, RuntimeError, ImportError) as e:
        # ImportError: an accelerator whose package is missing (trainer.accelerator=tpu without torch_xla)
        raise MinilmError(f"trainer: Lightning cannot run with {settings}: {e}") from None
    sharded = _sharded_strategy(trainer.strategy)
    if sharded:
        raise MinilmError(f"trainer.strategy={tr.strategy}: {sharded} shards the model or its optimizer state across "
                          "devices, while minilm ends a phase in rank 0 alone (its weights, optimizer state for "
                          "carry_optimizer, evaluation) and resumes from single-file checkpoints; use "
                          "trainer.strategy=ddp (docs/scaling.md)")  # fmt: skip
    if trainer.precision != precision(pcfg):
        # Lightning replaces what the device cannot run (16-mixed on a CPU: bf16-mixed) with a warning, while the
        # log, config.yaml and the 16-mixed gradient-scaler handling (LitGPT) went by the precision asked for
        raise MinilmError(f"train.precision: {pcfg.train.precision} cannot train on the "
                          f"{type(trainer.accelerator).__name__} (trainer.accelerator={tr.accelerator}): Lightning "
                          f"would train in {trainer.precision} instead; set train.precision to auto, 32 or bf16-mixed "
                          "(16-mixed needs a CUDA GPU)")  # fmt: skip
    # the launcher Lightning detected (torchrun, SLURM, ...; LightningEnvironment: none, or its own), also where the
    # strategy has none: torchrun --nproc_per_node=2 with trainer.devices=1 ran two single-device trainings, each
    # writing the run's phase outputs as its global rank 0
    env = trainer._accelerator_connector.cluster_environment
    try:  # devices x num_nodes against the launcher's processes (torchrun's world size, SLURM's tasks per node):
        # Lightning checks it only when the first phase starts, a ValueError traceback after run.dir was written
        if env is not None:
            env.validate_settings(num_devices=trainer.num_devices, num_nodes=trainer.num_nodes)
    except (MisconfigurationException, ValueError) as e:
        raise MinilmError(f"trainer: {settings} do not match how the processes were launched: {e}") from None
    if isinstance(getattr(trainer.strategy, "launcher", None), _MultiProcessingLauncher):
        # ddp_spawn, ddp_fork, ddp_notebook: the fit runs in child processes and this one gets back the weights
        # only, not the step, checkpoints or validation loss: each phase ended "stopped at step 0"
        raise MinilmError(f"trainer.strategy={tr.strategy}: Lightning trains in processes it spawns or forks, and "
                          "minilm's phases need the training process's own state; use trainer.strategy=ddp (one "
                          "process per device, started by Lightning, torchrun or SLURM: docs/scaling.md)")  # fmt: skip
    manual = any(k in os.environ for k in ("MASTER_ADDR", "NODE_RANK", "GROUP_RANK"))  # Lightning's own multi-node
    if trainer.num_nodes > 1 and type(env) is LightningEnvironment and not manual:
        # no torchrun, SLURM, ... and no address of a head node: no other node can join, and the run waited for
        # them until the process group's timeout (30 minutes), then failed with a traceback
        raise MinilmError(f"trainer.num_nodes={tr.num_nodes}: this process was not started by torchrun or SLURM and "
                          "MASTER_ADDR / NODE_RANK are not set, so the processes of the other nodes cannot join it; "
                          "launch it on every node as docs/scaling.md shows, or set trainer.num_nodes=1")  # fmt: skip
    return trainer.world_size


def _sharded_strategy(strategy) -> Optional[str]:
    """The name of a strategy that shards the model or the optimizer state (FSDP, DeepSpeed ZeRO, model
    parallelism), else None. Lightning builds them on CUDA only, so on CPU they never get here."""
    import lightning.pytorch.strategies as S

    names = ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy")
    kinds = tuple(getattr(S, n) for n in names if hasattr(S, n))
    return type(strategy).__name__ if isinstance(strategy, kinds) else None


def _check_model_fits(cfg, world_size: int, vocab_size: int) -> None:
    """Refuse a model whose training state is larger than the machine, on the CPU, or than the GPU, on CUDA
    (minilm/training/memory.py); ``vocab_size`` 0: before the corpus is prepared, counting the model without its
    embedding and LM head."""
    device = trainer_device(cfg)  # (phases share the run's trainer section)
    if device == "cpu":
        check_model_fits_host(cfg.model, vocab_size, processes_on_this_host(world_size, cfg.trainer.num_nodes))
    elif device == "cuda":
        check_model_fits_device(cfg.model, vocab_size)


def _check_phases_fit(model_cfg, pcfgs: dict, phases=None) -> None:
    """Every phase's seq_len within the limits of the encoding of a model of ``model_cfg``, checked on its position
    hooks alone: before the corpus is prepared (a tokenizer trained for nothing) and run.dir is created, which the
    model, built with the tokenizer's vocabulary, comes after. ``phases``: the run config's, which the errors name
    keys as (a run without phases has no phases.train.seq_len)."""
    hooks = position_hooks(model_cfg)
    for n, pcfg in pcfgs.items():
        check_fits(hooks, pcfg, n, (phases or {}).get(n))


def check_fits(hooks: list, pcfg, phase: str, set_in=None) -> None:
    """The phase's seq_len within the limits of position ``hooks`` (a model's) as the phase configures them: a phase
    may give a rotary encoding new parameters (apply_phase), and xPos's limit follows its scale_base, so a module
    that would take new ones is measured on a copy configured with them; the hooks themselves are left as they are."""
    params = validate_position(pcfg.model.position, where=f"phases.{phase}.position")
    configured = []
    for m in hooks:
        if hasattr(m, "configure") and getattr(m, "params", params) != params:
            m = copy.deepcopy(m)  # (a rotary module: its frequency tables, not the model's weights)
            m.configure(params)
        configured.append(m)
    tightest = tightest_limit(configured)
    if tightest and pcfg.train.seq_len > tightest[0]:
        limit, keys = tightest
        key = key_as_set("train.seq_len", phase, set_in)
        raise_keys = ""
        if keys:  # the parameter as the config sets it (phases.b.position.scale_base), and the others beside it
            raise_keys = f"raise {' or '.join([key_as_set(f'model.position.{keys[0]}', phase, set_in), *keys[1:]])}, "
        raise MinilmError(
            f"{key}: {pcfg.train.seq_len} is longer than the {pcfg.model.position.name} encoding "
            f"supports ({limit} positions); shorten the phase, {raise_keys}or use an encoding that extrapolates "
            "(rope with scaling, alibi, ...)"
        )
    if pcfg.train.precision == "16-mixed":
        _check_xpos_fp16(configured, pcfg, phase, set_in)


FP16_MAX = 65504.0  # fp16's largest number, e^11.09


def _check_xpos_fp16(hooks: list, pcfg, phase: str, set_in) -> None:
    """xPos scales queries and keys by ζ^(±(n − center)/scale_base), center = (first + last position) // 2, so up to
    e^(ln(1/ζ_0) · ⌈(seq_len − 1)/2⌉ / scale_base) at a sequence's ends: under 16-mixed the scaled q and k are fp16,
    and a scale past fp16's largest number makes them inf (the loss NaN). docs/positions.md said so, and nothing
    refused it. (Only the scale alone is bounded here: large q or k overflow at shorter lengths, as the docs say.)"""
    for m in hooks:
        if not isinstance(m, Xpos) or m.decay_rate.numel() == 0:
            continue
        last = pcfg.train.seq_len - 1
        exponent = float(m.decay_rate.abs().max()) * (last - last // 2)  # the farthest position from the center
        if exponent > math.log(FP16_MAX):
            key = key_as_set("train.seq_len", phase, set_in)
            base = key_as_set("model.position.scale_base", phase, set_in)
            raise MinilmError(
                f"{key}: {pcfg.train.seq_len} with xpos under train.precision=16-mixed: xPos scales queries and keys "
                f"by up to e^{exponent:.1f} at this length, past fp16's largest number {FP16_MAX:g} (e^11.1), so "
                f"they overflow to inf and the loss is NaN; train with train.precision=bf16-mixed or 32, shorten the "
                f"phase, or raise {base} (now {m.params.scale_base:g})"
            )


# -------------------------------------------------------------------- what a command may do with run.dir


def nothing_to_resume(run_dir: Path, first: str) -> str:
    """What --resume says where no phase has saved anything: no run at all, or a run stopped before its first phase's
    first checkpoint (its config, tokenizer and TensorBoard files written, at most the phase's STARTED file): 'holds
    no run yet' was not true."""
    found = sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir()) if run_dir.is_dir() else []
    if not found:
        return f"--resume: {run_dir} holds no run yet; starting one"
    began = (phase_dir(run_dir, first) / STARTED).is_file()
    return (f"--resume: {run_dir} holds no checkpoint yet, only {', '.join(found)} (the run stopped before its first "
            f"phase {'saved its first checkpoint' if began else 'began training'}); nothing to resume, so phase "
            f"'{first}' starts from step 0")


def _steps_setting(pcfg, phase: str, steps: int, set_in) -> str:
    """The setting that gives phase ``phase`` at least ``steps`` steps, by the key the config sets its length with
    (a phase's own phases.b.steps, or train.tokens): the advice to give it more steps named neither."""
    t = pcfg.train
    if t.tokens is not None:  # steps = ceil(tokens / (batch_size · seq_len))
        return f"{key_as_set('train.tokens', phase, set_in)}={steps * t.batch_size * t.seq_len}"
    return f"{key_as_set('train.steps', phase, set_in)}={steps}"


def _check_interrupted_phase(pcfg, phase: str, run_dir: Path, world_size: int, log: Callable[[str], None],
                             set_in=None, carried: Optional[bool] = None,
                             init: Optional[dict] = None,
                             unaided: bool = True) -> tuple[Optional[Path], Optional[dict]]:  # fmt: skip
    """--resume into a phase that has not finished: its newest good checkpoint (returned, with the state of the data
    sampler it saved; (None, None): the phase starts afresh) must be one the config can continue — within the
    phase's steps, trained by the same settings and the same global batch on ``world_size`` processes now
    (``_check_trained_with``; ``set_in`` as there), from the same start of its optimizer moments (``carried``:
    the config's carry_optimizer; None: not checked), and from the ``--init`` weights given now, if any
    (``init``: their ``_init_record``; ``_check_resumed_init``, with ``unaided``). Checked before the corpus is
    prepared; the sampler then by ``_check_resumed_sampler``."""
    ckpt, state = load_latest_good_checkpoint(phase_dir(run_dir, phase) / "checkpoints", log=lambda msg: None)
    if ckpt is None:
        return None, None
    if (at := checkpoint_step(ckpt)) > phase_steps(pcfg):
        # Lightning would restore step `at` >= max_steps, train nothing, and the phase would be marked finished
        # with more steps in its weights than its config and complete.json say
        more = _steps_setting(pcfg, phase, at, set_in)
        raise MinilmError(f"--resume: phase '{phase}' has a checkpoint at step {at} ({ckpt}), beyond the "
                          f"{phase_steps(pcfg)} steps the config now gives it; give it at least {at} steps ({more}), "
                          f"or retrain it with --phase {phase}")  # fmt: skip
    saved = state.get(PhaseData.__qualname__, {}).get("sampler")
    trained_world = saved.get("world_size") if saved is not None else None  # the processes that trained it
    _check_trained_with(state.get(TRAINED_WITH), pcfg, phase, ckpt, trained_world, world_size, set_in)
    # the checkpoint's optimizer state descends from the moments the phase started with, and continues whatever the
    # config says now: a carry_optimizer changed on --resume was ignored, and complete.json recorded the new value
    # (a later --resume then compared against that)
    if carried is not None and state.get(CARRIED, carried) != carried:  # (none saved: a checkpoint from before it)
        raise MinilmError(f"--resume: phase '{phase}' was interrupted training with phases.{phase}.carry_optimizer = "
                          f"{_shown(state[CARRIED])} ({ckpt}), the config now says {_shown(carried)}: its optimizer "
                          f"state continues the moments it started with; resume with the value it trained with, or "
                          f"retrain the phase with --phase {phase}")  # fmt: skip
    if init is not None:
        _check_resumed_init(state.get("minilm", {}).get("started_from"), init, phase, ckpt, unaided)
    if trained_world not in (None, world_size):
        log(f"phase '{phase}': interrupted on {trained_world} process(es), resumed on {world_size} with the same "
            f"global batch of {pcfg.train.batch_size * world_size} sequences: the same rows, schedule and optimizer "
            "state" + (f"; the dropout masks (model.dropout={pcfg.model.dropout}) are drawn per process, so they "
                       "differ from the original run's from here on" if pcfg.model.dropout else ""))
    return ckpt, saved


def _check_resumed_init(record: Optional[dict], init: dict, phase: str, ckpt: Path, unaided: bool) -> None:
    """--resume with --init (``init``: its ``_init_record``) into a phase whose checkpoint ``ckpt`` continues: the phase
    goes on from the checkpoint, whose weights replace the --init ones, so those must be the weights it started from
    (its ``record``, LitGPT's ``started_from``; None: a checkpoint of an older minilm, which records none: not
    checked). --init other weights was loaded, logged as loaded, then silently replaced. ``unaided``: whether --resume
    without --init is allowed here (the phase before it has finished, or there is none)."""
    if record is None or _same_start(record, init):
        return
    # the remedies that work: the recorded file where it still holds those weights (by its file: the path as given
    # may be relative to another working directory), else no --init where the phase may go without
    again = (f"resume it with --init {record['weights']}" if record["kind"] == "init" and _still_holds(record) else
             "resume it without --init" if unaided else "")  # fmt: skip
    anew = f"retrain it from these weights with --phase {phase} --init {init['init']} (without --resume)"
    raise MinilmError(f"--init {init['init']} (sha256 {init['sha256'][:12]}): phase '{phase}' was interrupted ({ckpt}) "
                      f"after it started from {started_from_text(record)}, and --resume continues it from that "
                      f"checkpoint, whose weights would replace these; {f'{again}, or {anew}' if again else anew}")


def _same_start(was: dict, now: dict) -> bool:
    """Whether two ``started_from`` records name the same weights: --init ones by the sha256 of the file where both
    record one (the file at the recorded path may have been overwritten since, its run retrained; a copy elsewhere
    holds the same weights), else by the file's resolved path (a record of a minilm from before the digest)."""
    if was["kind"] != "init" or now["kind"] != "init":
        return was == now
    if "sha256" in was and "sha256" in now:
        return was["sha256"] == now["sha256"]
    return was["weights"] == now["weights"]


def _check_resumed_sampler(corpus, pcfg, phase: str, ckpt: Path, saved: Optional[dict], world_size: int,
                           set_in=None) -> None:  # fmt: skip
    """The data sampler of interrupted phase ``phase`` (its state ``saved`` in checkpoint ``ckpt``; None: a checkpoint
    written before the sampler's identity was saved) must be the one the config draws from the corpus now (seed,
    sampling settings, corpus), checked before run.dir's config.yaml is rewritten. Lightning checks it again when it
    restores the checkpoint (PhaseData.load_state_dict). ``set_in``: the phase's own section of the run config (its
    errors name keys as the run config sets them)."""
    from minilm.data import make_sampler

    if saved is None:
        return
    t = pcfg.train
    sampler = make_sampler(corpus, "train", pcfg.data, t.seq_len, t.batch_size, pcfg.run.seed, phase,
                           world_size=world_size, set_in=set_in)  # fmt: skip
    try:
        sampler.load_state_dict(PhaseData.as_split_now(saved, sampler))
    except MinilmError as e:
        raise MinilmError(f"--resume: phase '{phase}' ({ckpt}): {e}") from None


def _phase_steps_of(train: dict) -> int:
    """``phase_steps`` of a plain ``train`` section (as a checkpoint's TRAINED_WITH holds it)."""
    if train.get("tokens") is not None:
        return max(1, -(-train["tokens"] // (train["batch_size"] * train["seq_len"])))
    return train["steps"]


def _check_trained_with(trained: Optional[dict], pcfg, phase: str, ckpt: Path, trained_world: Optional[int] = None,
                        world_size: int = 1, set_in=None) -> None:  # fmt: skip
    """What the interrupted phase's checkpoint trained by (``what_trains``; None: a checkpoint written before it
    was saved there) must be what the config says now, but for the phase's length. Lightning restores the
    optimizer's lr, betas and weight decay and the schedule's base lr from the checkpoint, and the position settings
    would change under weights trained with the old ones: a changed value was silently ignored (or applied halfway),
    while config.yaml recorded it for the whole phase.

    ``train.batch_size`` is per process: what decides the rows of a step (the sampler plans the global batch) and
    what the schedule counts is the global batch, ``batch_size x world size``. The checkpoint's world size
    (``trained_world``; None: unknown, from before the sampler saved it, compared as this one) against this run's
    ``world_size``: 2 processes x 2 rows continue exactly as 1 x 4 (tests/training/test_ddp.py), while 1 x 2 would
    train the rest of the phase on half the rows per step under the schedule and optimizer state of 4. ``set_in``:
    the phase's own section of the run config, as ``check_finished_phase`` takes it."""
    if trained is None:
        return
    now = what_trains(pcfg)
    was_t, now_t = trained["train"], now["train"]
    trained_world = world_size if trained_world is None else trained_world
    diff = next((d for key in trained if (d := _first_difference(trained[key], now.get(key), key,
                                                                 (*PHASE_LENGTH, "train.batch_size")))), None)
    redo = f"or retrain the phase with --phase {phase}"
    if diff:
        key = key_as_set(diff[0], phase, set_in)
        raise MinilmError(f"--resume: phase '{phase}' was interrupted training with {key} "
                          f"= {_shown(diff[1])} ({ckpt}), the config now says {_shown(diff[2])}; resume with the value "
                          f"it trained with, {redo}")  # fmt: skip
    was_global, now_global = was_t["batch_size"] * trained_world, now_t["batch_size"] * world_size
    if was_global != now_global:  # named as set: train.batch_size=4 where the phase sets its own changed nothing
        key = key_as_set("train.batch_size", phase, set_in)
        fits = (f"{key}={was_global // world_size} on {world_size} process(es)"
                if was_global % world_size == 0 else f"{trained_world} process(es) and {key}="
                f"{was_t['batch_size']}")  # fmt: skip
        raise MinilmError(
            f"--resume: phase '{phase}' was interrupted training with a global batch of {was_global} sequences "
            f"({key} {was_t['batch_size']} x {trained_world} process(es)) ({ckpt}); the config now gives "
            f"{now_global} ({key} {now_t['batch_size']} x {world_size}). {key} is per device: "
            f"resume with {fits}, {redo}"
        )
    # Lightning restores its loop in micro-batches: at another count per step the restored position falls mid-step,
    # and steps mix rows of two batches (the size of a micro-batch is otherwise a how-not-what)
    was_micro = was_t["micro_batch_size"] or was_t["batch_size"]
    micro = micro_batch_size(pcfg.train)
    if was_t["batch_size"] // was_micro != now_t["batch_size"] // micro:
        accum, key = was_t["batch_size"] // was_micro, key_as_set("train.micro_batch_size", phase, set_in)
        raise MinilmError(
            f"--resume: phase '{phase}' was interrupted training with {key} = {was_micro!r} "
            f"({accum} micro-batch(es) per step of train.batch_size {was_t['batch_size']}) ({ckpt}), the config now "
            f"says {micro!r} ({now_t['batch_size'] // micro} of {now_t['batch_size']}); resume with "
            f"{key}={now_t['batch_size'] // accum}, {redo}"
        )
    # train.tokens is per device too: the same tokens at another batch_size is another number of steps, another lr
    # schedule (the phase's length may change on --resume, but by a change of the length, not of the device count)
    if was_t.get("tokens") is not None and was_t["tokens"] == now_t.get("tokens"):
        was_steps, now_steps = _phase_steps_of(was_t), phase_steps(pcfg)
        if was_steps != now_steps:
            raise MinilmError(
                f"--resume: phase '{phase}' was interrupted training {was_steps} steps (train.tokens {was_t['tokens']} "
                f"at train.batch_size {was_t['batch_size']}) ({ckpt}); at train.batch_size {now_t['batch_size']} "
                f"the same train.tokens gives {now_steps} steps, another lr schedule (train.tokens counts one "
                f"device's tokens); resume with train.tokens={was_steps * now_t['batch_size'] * now_t['seq_len']}, "
                f"{redo}"
            )


class ChangedPhaseError(MinilmError):
    """A finished phase that the config now trains differently (``check_finished_phase``): ``what`` says what
    differs, without train.py's remedy (a study gives its own); ``phase`` and ``run_dir`` name it."""

    def __init__(self, message: str, what: str = "", phase: str = "", run_dir: Optional[Path] = None):
        super().__init__(message)
        self.what, self.phase, self.run_dir = what or message, phase, run_dir


PHASE_LENGTH = ("train.steps", "train.tokens")  # may change on --resume (checked against the checkpoint's step)
TRAINED_BY = ("model", "data", "train", "optim")  # the sections a finished phase's weights depend on (and run.seed)
HOW_NOT_WHAT = {  # keys of those sections that change how a phase runs or is watched, not what it learns
    "data.num_proc", "data.cache_dir", "train.micro_batch_size", "train.precision", "train.compile",
    "train.compile_mode", "train.val_every", "train.val_batches", "train.log_every", "train.ckpt_every",
    "train.keep_checkpoints", "train.max_bad_steps",
    # kernels and memory savers with the same loss and gradients: what a run that ran out of memory resumes with
    *(f"model.{key}" for key in SAME_OUTPUTS),
}


def _first_difference(old, new, key: str, ignore: tuple[str, ...] = ()) -> Optional[tuple[str, object, object]]:
    """(dotted key, old value, new value) of the first leaf where two plain containers differ, or None. Leaves named
    in ``ignore`` are compared by the caller: skipped here, not filtered out of the result, where the first
    difference (train.batch_size sorts first in its section) hid every later one (train.seq_len, train.steps).
    Model sections are compared, and shown, with their defaults filled in (``filled_model``: n_kv_heads null is
    n_heads, one model; a scaling's beta_fast null is 32)."""
    if key == "model" and isinstance(old, dict) and isinstance(new, dict):
        old, new = filled_model(old), filled_model(new)
    if isinstance(old, dict) and isinstance(new, dict):
        # a block's "name" (the encoding's) first: the parameters of another encoding differ too, and the first of
        # them (model.position.base) was named where the user had changed model.position.name
        for k in sorted(set(old) | set(new), key=lambda k: (k != "name", str(k))):
            diff = _first_difference(old.get(k), new.get(k), f"{key}.{k}", ignore)
            if diff:
                return diff
        return None
    return None if old == new or key in HOW_NOT_WHAT or key in ignore else (key, old, new)


def what_trains(pcfg) -> dict:
    """The parts of a phase config its weights depend on: the TRAINED_BY sections and run.seed, as plain values."""
    plain = OmegaConf.to_container(pcfg, resolve=True)
    return {**{key: plain[key] for key in TRAINED_BY}, "run": {"seed": plain["run"]["seed"]}}


def carries_optimizer(cfg, phase: str) -> bool:
    """Whether ``phase`` of run config ``cfg`` starts from the previous phase's AdamW moments (its
    ``phases.<name>.carry_optimizer``; the config refuses it on the first phase, which has none to carry)."""
    return phase in cfg.phases and bool(cfg.phases[phase].carry_optimizer)


def check_finished_phase(pcfg, phase: str, run_dir: Path, flag: str, carried: bool,
                         world_size: Optional[int] = None, set_in=None) -> None:  # fmt: skip
    """--resume skips a finished phase, and --phase starts from the finished ones before it: refuse if the config
    now trains such a phase differently (its lr, data, position, whether it carries the optimizer (``carried``),
    ...), since keeping its old weights under the new config would be silently wrong. Evaluation, hardware and
    bookkeeping settings (HOW_NOT_WHAT) may change. ``world_size``: the processes this run trains on (None: not
    known, as ``train.batch_size`` is compared): a phase whose summary records its own is compared by its global
    batch (``batch_size x world size``; per device, ``train.batch_size`` may change with the device count), and by
    its number of steps where ``train.tokens`` (per device too) gives them. ``set_in``: the phase's own section of
    the run config (``cfg.phases[phase]``), where the refusal names a key the phase sets itself as it is set."""
    from minilm.runs import load_run_config

    path = phase_dir(run_dir, phase) / "config.yaml"
    if not path.is_file():
        return
    saved, now = what_trains(load_run_config(path)), what_trains(pcfg)
    summary_path = phase_dir(run_dir, phase) / COMPLETE
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    was, was_world = summary.get("carried_optimizer"), summary.get("world_size")
    split = was_world is not None and world_size is not None  # both known: compared as a global batch
    ignore = ("train.batch_size",) if split else ()
    diffs = [_first_difference(saved[key], now[key], key, ignore) for key in saved]
    batch, fits = None, ""  # another global batch, and the batch_size that keeps the phase's on this device count
    if split:
        was_t, now_t = saved["train"], now["train"]
        if (was_global := was_t["batch_size"] * was_world) != now_t["batch_size"] * world_size:
            key = key_as_set("train.batch_size", phase, set_in)
            batch = (f"the global batch ({key} x processes)", f"{was_t['batch_size']} x {was_world}",
                     f"{now_t['batch_size']} x {world_size}")  # fmt: skip
            diffs.append(batch)
            # (the usual cause: another device count with batch_size unchanged, which the remedy says how to keep)
            fits = (f"{key}={was_global // world_size} on {world_size} process(es)" if was_global % world_size == 0
                    else f"{was_world} process(es) and {key}={was_t['batch_size']}")  # fmt: skip
        elif was_t.get("tokens") is not None and _phase_steps_of(was_t) != phase_steps(pcfg):
            diffs.append((f"train.tokens (per device: at train.batch_size {was_t['batch_size']}, "
                          f"{_phase_steps_of(was_t)} steps)", was_t["tokens"],
                          f"{now_t['tokens']} ({phase_steps(pcfg)} steps at train.batch_size {now_t['batch_size']})"))
    if was is not None:  # None: finished before the summary recorded it
        diffs.append(None if was == carried else (f"phases.{phase}.carry_optimizer", was, carried))
    diff = next((d for d in diffs if d), None)
    if diff:
        what = (f"{flag}: phase '{phase}' finished with {key_as_set(diff[0], phase, set_in)} = {_shown(diff[1])} "
                f"({path}), the config now says {_shown(diff[2])}")  # fmt: skip
        keep = f"keep its global batch with {fits}, " if diff is batch else ""
        raise ChangedPhaseError(f"{what}; {keep}retrain it and the phases after it with --phase {phase}, start from "
                                "other weights with --init, or start a new run (run.name / run.dir)", what, phase,
                                Path(run_dir))  # fmt: skip


def _shown(value) -> str:
    """A config value in a message as YAML and the command line write it (false, null), else as Python's repr."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return repr(value)


def _check_command(names: list[str], run_dir: Path, resume: bool, start_phase: Optional[str], primary: bool,
                   init: Optional[dict]) -> None:  # fmt: skip
    """Refuse an unknown --phase, a run.dir that holds a run without --resume or --phase, and --phase without
    --init after an unfinished phase."""
    if start_phase is not None and start_phase not in names:
        raise MinilmError(f"--phase {start_phase}: no such phase; phases are: {', '.join(names)}")
    if primary and not resume and start_phase is None and has_outputs(run_dir, names):
        raise MinilmError(
            f"{run_dir} already holds a run; continue it with --resume, restart a phase with --phase NAME, or set "
            "run.name / run.dir to start a new one"
        )
    prev = names[names.index(start_phase) - 1] if start_phase is not None and names.index(start_phase) else None
    if prev is not None and init is None and not is_complete(run_dir, prev):  # refused before run.dir is written
        raise MinilmError(f"--phase {start_phase}: the previous phase '{prev}' has not finished in {run_dir}; run it "
                          "first or give starting weights with --init PATH")  # fmt: skip


def _check_phases_from(start: int, cfg, pcfgs: dict, run_dir: Path, resume: bool, start_phase, init,
                       world_size: int, log) -> dict[str, tuple[Path, Optional[dict]]]:  # fmt: skip
    """Check the phases from index ``start`` on against what run.dir holds, without the data: a finished one the
    config now trains differently (--resume), an interrupted one's checkpoint, the optimizer moments a carrying phase
    needs. Returns the checkpoint each interrupted phase continues from (--resume), with its sampler state (checked
    against the corpus by ``_check_resumed_sampler``)."""
    names, resume_from = list(pcfgs), {}
    pending = next((n for n in names[start:] if not is_complete(run_dir, n)), None)  # the phase --resume goes on with
    if resume:
        _check_finished_follow(names[start:], run_dir)
    for i, n in enumerate(names[start:], start):
        carry = carries_optimizer(cfg, n)
        if resume and is_complete(run_dir, n):
            check_finished_phase(pcfgs[n], n, run_dir, "--resume", carry, world_size, cfg.phases.get(n))
        elif resume:
            ckpt, sampler = _check_interrupted_phase(pcfgs[n], n, run_dir, world_size, log, cfg.phases.get(n), carry,
                                                     init if i == start else None, _goes_on_unaided(run_dir, names, i))
            if ckpt is not None:
                resume_from[n] = (ckpt, sampler)
            elif n == pending:  # trains from its first step again
                _check_begun_from(run_dir, n, started_from_record(names, i, start, init, cfg.run.seed),
                                  started_from_record(names, i, start, None, cfg.run.seed))  # fmt: skip
        if carry and init is not None and i == start:
            raise MinilmError(f"--init gives phase '{n}' weights only, but phases.{n}.carry_optimizer asks for the "
                              f"previous phase's optimizer moments; add phases.{n}.carry_optimizer=false")
        retrains = i == start if start_phase is not None and not resume else not is_complete(run_dir, n)
        if carry and retrains and is_complete(run_dir, names[i - 1]):
            optimizer_state_path(run_dir, names[i - 1], n)
    return resume_from


def _goes_on_unaided(run_dir: Path, names: list[str], i: int) -> bool:
    """Whether a plain --resume (no --phase, no --init) goes on with the interrupted phase ``names[i]``: it is the
    first phase, the phase before it has finished, or ``resume_as_begun`` goes on with it as it was begun by --init."""
    return i == 0 or is_complete(run_dir, names[i - 1]) or (
        _last_begun(run_dir, names) == names[i] and _init_begun(run_dir, names[i]) is not None)


def _check_begun_from(run_dir: Path, phase: str, now: dict, plain: dict) -> None:
    """--resume into ``phase``, interrupted before its first step checkpoint: it trains from its first step again,
    from the weights this command gives it (``now``: ``started_from_record``'s), which must be those it began from (its
    STARTED file; none: the phase never began, or an older minilm began it). Begun with --phase b --init X, a plain
    --resume (a requeued job's) retrained it from the previous phase's weights without a word. ``plain``: what the
    command would give it without --init."""
    path = phase_dir(run_dir, phase) / STARTED
    if not path.is_file():
        return
    try:
        was = json.loads(path.read_text())
        same = _same_start(was, now)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MinilmError(f"{path}: cannot be read ({e}); it records the weights phase '{phase}' began from: restore "
                          f"it, or retrain the phase with --phase {phase} (without --resume)") from None
    if not same:
        anew = f"--phase {phase}" + (f" --init {now['init']}" if now["kind"] == "init" else "")
        again = _begun_again(was, now, plain, phase)
        said = (f"Resume it as it was begun, with {again}, or retrain it from these weights with {anew} (without "
                "--resume)") if again else f"Retrain it from these weights with {anew} (without --resume)"
        raise MinilmError(f"--resume: phase '{phase}' began from {started_from_text(was)} ({path}) and "
                          f"{_interrupted_unsaved(run_dir, phase)}; this command would start it from "
                          f"{started_from_text(now)}. {said}")  # fmt: skip


def _interrupted_unsaved(run_dir: Path, phase: str) -> str:
    """How ``phase``, which --resume trains from its first step again, was left: interrupted before its first step
    checkpoint, or with only unreadable ones (truncated or corrupt: ``load_latest_good_checkpoint`` skipped them), which
    are named: "before its first step checkpoint" was said of a phase whose checkpoint a disk full had cut short."""
    ckpt_dir = phase_dir(run_dir, phase) / "checkpoints"
    bad = [p.name for _, p in list_checkpoints(ckpt_dir)]
    if not bad:
        return "was interrupted before its first step checkpoint"
    return (f"has no readable step checkpoint: {', '.join(bad)} in {ckpt_dir} {'is' if len(bad) == 1 else 'are'} "
            "unreadable (truncated or corrupt), so the phase starts over from its first step")


def _begun_again(was: dict, now: dict, plain: dict, phase: str) -> str:
    """The command that resumes ``phase`` from the weights it began from (``was``), where this run can still give
    them ("" where not: its --init file since overwritten or gone, the phase before it removed from the config); the
    refused command gives ``now``, and would give ``plain`` without --init."""
    if was["kind"] == "init":  # (by its file: the path as given may be relative to another working directory)
        return f"--resume --phase {phase} --init {was['weights']}" if _still_holds(was) else ""
    if now["kind"] == "init":
        return "--resume without --init" if _same_start(was, plain) else ""
    if was["kind"] == "fresh" and now["kind"] == "fresh":
        return f"--resume run.seed={was['seed']}"
    return ""  # (the phase it began after is not the one before it in the config now, or no longer exists)


def _still_holds(record: dict) -> bool:
    """Whether the weights file of an --init ``record`` still holds the weights it records (its sha256; a record
    without one: the file is there)."""
    file = Path(record["weights"])
    try:
        return file.is_file() and ("sha256" not in record or _sha256(file) == record["sha256"])
    except OSError:  # (unreadable: not weights to resume from)
        return False


def resume_as_begun(run_dir: Path, names: list[str], start_phase: Optional[str],
                     log: Callable[[str], None]) -> tuple[Optional[str], Optional[dict], bool]:  # fmt: skip
    """--resume without --init: the --phase and the --init record (its STARTED file's) it goes on with, where the phase
    it continues was begun by ``--phase P --init W`` (``_last_begun``) and W still holds the weights it records (by
    sha256), and whether to read W (True). Before its first step checkpoint such a phase was refused (the user had to
    remember and retype W); where the phases before it never ran, the first of them was trained instead, and where one
    had been interrupted before --phase P --init W was given, that one was resumed and P then trained from its
    weights, the command's start dropped without a word. Where W no longer holds them but a good step checkpoint of P
    does, and the phases before P have not finished, it goes on all the same, from the checkpoint, without reading W
    (False): it was refused, though nothing needed W. Else ``start_phase`` as given and None: a phase begun otherwise,
    --phase naming another, or W no longer those weights (``_check_begun_from`` then says what to do; a checkpoint, if
    any, continues the phase from the finished phase before it without them)."""
    began = _last_begun(run_dir, names)
    record = _init_begun(run_dir, began) if began is not None and start_phase in (None, began) else None
    if record is None:
        return start_phase, None, True
    path = phase_dir(run_dir, began) / STARTED
    if not _still_holds(record):
        never = [n for n in names[: names.index(began)] if not is_complete(run_dir, n)]
        ckpt = latest_good_checkpoint(phase_dir(run_dir, began) / "checkpoints", log=silent) if never else None
        if ckpt is not None:
            log(f"--resume: phase '{began}' began from {started_from_text(record)} ({path}), which "
                f"{record['weights']} no longer holds; its checkpoint {ckpt} continues it without them: going on as "
                f"--resume --phase {began}")  # fmt: skip
            return began, record, False
        if never:  # (else --resume goes on from the phase before it, and _check_begun_from refuses or a checkpoint
            # continues the phase) here the phases before it would train, which that command did not ask for
            raise MinilmError(f"--resume: phase '{began}' began from {started_from_text(record)} ({path}), which "
                              f"{record['weights']} no longer holds, and {', '.join(repr(n) for n in never)} before "
                              f"it {_left_as(run_dir, never)}, so --resume cannot go on as it was begun. Resume it "
                              f"with --resume --phase {began} --init FILE where FILE is a copy of those weights; "
                              f"retrain it from other weights with --phase {began} --init PATH (without --resume); or "
                              f"train the run from its first phase with --phase {names[0]}")  # fmt: skip
        return start_phase, None, True
    log(f"--resume: phase '{began}' began from {started_from_text(record)} ({path}); going on as --resume --phase "
        f"{began} --init {record['weights']}")  # fmt: skip
    return began, record, True


def _last_begun(run_dir: Path, names: list[str]) -> Optional[str]:
    """The phase a plain --resume goes on with where one was begun by --init: the last unfinished phase begun so (the
    last such command's), else the first unfinished phase that has begun (those before it finished, never run, or
    interrupted, as that command leaves them); None where no unfinished phase has begun."""
    unfinished = [n for n in names if not is_complete(run_dir, n)]
    by_init = [n for n in unfinished if _init_begun(run_dir, n) is not None]
    return by_init[-1] if by_init else next((n for n in unfinished if _begun(run_dir, n)), None)


def _left_as(run_dir: Path, phases: list[str]) -> str:
    """How the unfinished ``phases`` were left, in words: never run, or not finished (one of them interrupted)."""
    if not any(_begun(run_dir, n) for n in phases):
        return "never ran"
    return "has not finished" if len(phases) == 1 else "have not finished"


def _begun(run_dir: Path, phase: str) -> bool:
    """Whether ``phase`` has begun training: its STARTED file, a checkpoint or another output in its folder."""
    return _saved_in(phase_dir(run_dir, phase)) or (phase_dir(run_dir, phase) / STARTED).is_file()


def _init_begun(run_dir: Path, phase: str) -> Optional[dict]:
    """The --init record ``phase``'s STARTED file holds; None where it has none, records another start, or cannot be
    read (``_check_begun_from`` names it)."""
    try:
        record = json.loads((phase_dir(run_dir, phase) / STARTED).read_text())
        return record if record["kind"] == "init" and {"init", "weights"} <= set(record) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _check_finished_follow(names: list[str], run_dir: Path) -> None:
    """On --resume, a finished phase must follow finished phases only: one after a phase that is to train (a phase
    inserted before it in the config) was trained from other weights. It was skipped, so the new phase trained and
    was then thrown away, the run's weights those of the old chain, and TensorBoard's later curves purged."""
    pending = next((n for n in names if not is_complete(run_dir, n)), None)
    after = [n for n in names[names.index(pending) + 1:] if is_complete(run_dir, n)] if pending else []
    if after:
        raise MinilmError(f"--resume: phase '{pending}' has not finished, but {', '.join(repr(n) for n in after)} "
                          f"after it has, trained from other weights (was '{pending}' inserted before them?); retrain "
                          f"from it with --phase {pending} (it retrains the phases after it), or start a new run "
                          "(run.name / run.dir)")  # fmt: skip


def _check_finished_chain(names: list[str], run_dir: Path, kept: list[str], flag: str) -> None:
    """Each finished phase the run keeps (``kept``) must have started from the weights of the phase before it in the
    config now (its complete.json's ``started_from``; one begun from --init or fresh weights is not checked): a phase
    removed from the config, or the phases reordered, left a finished phase that trained after another one, which
    --resume skipped as finished, so the run's weights were those of a chain its config no longer describes."""
    for n in kept:
        path = phase_dir(run_dir, n) / COMPLETE
        try:
            began = json.loads(path.read_text()).get("started_from")
        except (OSError, ValueError, AttributeError):
            continue  # (read, and refused where unreadable, by the checks that need it)
        if not isinstance(began, dict) or began.get("kind") != "phase":
            continue
        i = names.index(n)
        before = names[i - 1] if i else None
        if began.get("phase") != before:
            now = f"after phase '{before}'" if before else "as its first phase, from fresh weights"
            raise MinilmError(f"{flag}: phase '{n}' finished after phase '{began.get('phase')}' ({path}), but the "
                              f"config now trains it {now}: its weights are not those the config describes; retrain "
                              f"it and the phases after it with --phase {n}, or start a new run "
                              "(run.name / run.dir)")  # fmt: skip


def check_run(cfg, *, resume: bool, data: bool = True) -> None:
    """What ``run_phases(cfg, resume=resume)`` refuses before it trains (with ``data=False``, what it refuses before it
    prepares the corpus), checked without touching run.dir and without a word: a study checks every run it continues
    with it before the first one trains."""
    pcfgs = {n: phase_config(cfg, n) for n in phase_names(cfg)}
    start_phase, begun, _ = resume_as_begun(Path(cfg.run.dir), list(pcfgs), None, silent) if resume else (
        None, None, True)
    args = (cfg, pcfgs, Path(cfg.run.dir), resume, start_phase)
    found = _check_without_data(*args, is_primary_process(), begun, silent)
    if data:
        _check_with_data(*args, found, silent)


def check_before_training(cfg, pcfgs: dict, run_dir: Path, resume: bool, start_phase: Optional[str], primary: bool,
               init: Optional[dict],
               log: Callable[[str], None]) -> tuple[Any, dict[str, Path], Optional[dict]]:  # fmt: skip
    """Refuse what cannot run, without touching run.dir: first what needs no data (``_check_without_data``), so that
    such a refusal prepares no corpus (a tokenizer trained, documents tokenized, for nothing); then the corpus and
    what needs it (``_check_with_data``). ``pcfgs``: each phase's config (``phase_config``), in order. Returns the
    corpus, on --resume the checkpoint each interrupted phase continues from, and the HELD_OUT record to write
    (None: keep the run's)."""
    found = _check_without_data(cfg, pcfgs, run_dir, resume, start_phase, primary, init, log)
    return _check_with_data(cfg, pcfgs, run_dir, resume, start_phase, found, log)


def _check_without_data(cfg, pcfgs: dict, run_dir: Path, resume: bool, start_phase: Optional[str], primary: bool,
                        init: Optional[dict], log: Callable[[str], None]) -> tuple[int, dict, list]:  # fmt: skip
    """An unknown --phase, a finished run without --resume, a phase longer than the encoding allows, a model section
    that differs from the run's on --resume, finished phases the config now trains differently, an interrupted
    phase's checkpoint, an --init the other settings contradict (run_phases reads the file before this). Returns
    the world size, ``_check_phases_from``'s checkpoints and the phases the run keeps (``_check_with_data`` checks
    the corpus against them)."""
    names = list(pcfgs)
    _check_command(names, run_dir, resume, start_phase, primary, init)
    check_writable_dir(run_dir)
    check_not_inside_a_run(run_dir)
    world_size = check_trainer(next(iter(pcfgs.values())))  # phases share the run's trainer section and precision
    _check_model_fits(cfg, world_size, vocab_size=0)  # before the position hooks of every layer are built
    _check_phases_fit(cfg.model, pcfgs, cfg.phases)
    if resume:
        _check_saved_model(cfg, run_dir)
    start = names.index(start_phase) if start_phase else 0
    # --phase: the weights it starts from are the earlier phases' finished ones; --resume keeps them all, also where it
    # goes on at a phase begun with --init (resume_as_begun), as a plain --resume into it checked them before
    if init is None or resume:
        for n in [n for n in names[:start] if is_complete(run_dir, n)]:
            check_finished_phase(pcfgs[n], n, run_dir, "--resume" if resume else f"--phase {start_phase}",
                                 carries_optimizer(cfg, n), world_size, cfg.phases.get(n))  # fmt: skip
    resume_from = _check_phases_from(start, cfg, pcfgs, run_dir, resume, start_phase, init, world_size, log)
    if init is None or resume:  # (after _check_phases_from: a phase inserted before finished ones is said so there)
        _check_finished_chain(names, run_dir, [n for n in (names if resume else names[:start])
                                               if is_complete(run_dir, n)],
                              "--resume" if resume else f"--phase {start_phase}")  # fmt: skip
    # phases trained on the split held_out.json records, which the run keeps: finished ones before the phase --phase
    # restarts, or on --resume every finished one and every checkpoint it continues from
    kept = [n for n in (names if resume else names[:start]) if is_complete(run_dir, n)] + list(resume_from)
    if init is not None and resume and start_phase is None and kept:  # said loaded, then replaced by them
        raise MinilmError(f"--init: --resume continues the run from its trained phases ({', '.join(kept)}), whose "
                          "weights replace the initial ones; drop --init, or retrain a phase from other weights with "
                          "--phase NAME --init PATH")  # fmt: skip
    return world_size, resume_from, kept


def _check_with_data(cfg, pcfgs: dict, run_dir: Path, resume: bool, start_phase: Optional[str],
                     found: tuple[int, dict, list],
                     log: Callable[[str], None]) -> tuple[Any, dict[str, Path], Optional[dict]]:  # fmt: skip
    """The corpus (bad data fails here), each phase's sampling from it, an interrupted phase's sampler, a tokenizer
    other than the one the kept phases trained with, a corpus that holds out other documents than those they trained
    beside. ``found``: what ``_check_without_data`` returned. Returns what ``check_before_training`` does."""
    from minilm.data import check_phase_data, load_corpus

    world_size, resume_from, kept = found
    names = list(pcfgs)
    corpus = load_corpus(cfg.data)
    _check_model_fits(cfg, world_size, corpus.tokenizer.vocab_size)
    for n in names[names.index(start_phase) if start_phase else 0:]:
        check_phase_data(corpus, pcfgs[n], n, cfg.phases.get(n))
    for n, (ckpt, sampler) in resume_from.items():
        _check_resumed_sampler(corpus, pcfgs[n], n, ckpt, sampler, world_size, cfg.phases.get(n))
    trains = not resume or not all(is_complete(run_dir, n) for n in names)
    flag = "--resume" if resume else f"--phase {start_phase}"
    _check_run_tokenizer(corpus, run_dir, kept, flag)
    record = _check_held_out_record(corpus, run_dir, kept, trains, flag, log)
    return corpus, {n: ckpt for n, (ckpt, _) in resume_from.items()}, record


def _check_saved_model(cfg, run_dir: Path) -> None:
    """--resume: the model section must be the one the run's saved config.yaml has (where it has one)."""
    from minilm.runs import load_run_config  # a run config that cannot be read is an error naming it

    saved = run_dir / "config.yaml"
    if not saved.exists():
        return
    old = load_run_config(saved)
    diff = _first_difference(OmegaConf.to_container(old.model, resolve=True),
                             OmegaConf.to_container(cfg.model, resolve=True), "model")  # fmt: skip
    if diff:
        key, was, now = diff
        raise MinilmError(f"--resume: {key} is {_shown(now)} here but {_shown(was)} in the run's saved {saved}: the "
                          "run trains one model; resume with the saved value, or train this one in another run.dir")


def _held_out(corpus) -> dict:
    """What run.dir's HELD_OUT records of the corpus a run trains on: its held-out split's documents and digest."""
    return {"corpus": corpus.cache_dir.name, "documents": corpus.val.n_docs, "digest": corpus.val.digest()}


def _check_run_tokenizer(corpus, run_dir: Path, kept: list[str], flag: str) -> None:
    """The weights of the ``kept`` phases read the token ids of the run's tokenizer.model; refuse a corpus whose
    tokenizer is another, before run.dir is written. The tokenizer is trained on the sources, so changed source files
    give another one: --resume then copied it over the run's (``_write_run_files``), and the run's evaluation and
    generation read the weights with the wrong ids; where the vocabulary's size changed too, the load of the weights
    failed after the copy. Where nothing trains as well: the run's files are not rewritten for nothing."""
    path = run_dir / "tokenizer.model"
    if not kept or not path.is_file():
        return
    try:
        same = same_bytes(path, corpus.tokenizer.model_file)
    except OSError as e:
        raise MinilmError(f"{path}: cannot be read ({e.strerror}); it is the tokenizer the run's weights were "
                          "trained with: restore it, or start a new run (run.name / run.dir)") from None
    if not same:
        raise MinilmError(f"{flag}: the tokenizer prepared now ({corpus.cache_dir}) is not the run's {path}, which "
                          f"phases {', '.join(kept)} trained with: the sources' files changed since (the tokenizer is "
                          "trained on them), or data.tokenizer did. Continue with the files and data settings the run "
                          "trained with, or start a new run (run.name / run.dir)")  # fmt: skip


def _check_held_out_record(corpus, run_dir: Path, kept: list[str], trains: bool, flag: str,
                           log: Callable[[str], None]) -> Optional[dict]:  # fmt: skip
    """The HELD_OUT record to write (None: keep the file as it is). It describes the split the run's weights trained
    beside, which an evaluation checks (minilm.eval.suite._check_held_out): while phases trained on it are ``kept``,
    it is never rewritten with the corpus as prepared now. A corpus whose held-out documents differ from the record
    (its source files changed, or another minilm splits or tokenizes them otherwise) is refused where training would
    go on (``trains``), as the sampler refuses another corpus under an interrupted phase's checkpoint; only said
    where nothing trains. Where there is no record (a run from before it; a study's run whose first phases were
    copied from another run of the study), the corpus now is recorded, as the best that is known."""
    now = _held_out(corpus)
    path = run_dir / HELD_OUT
    if not kept or not path.is_file():  # nothing trained on an earlier split is kept: the run (re)starts on this corpus
        return now
    try:
        record = json.loads(path.read_text())
        same = record["digest"] == now["digest"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MinilmError(f"{path}: cannot be read ({e}); it records the documents the run held out, for its "
                          "evaluation: restore it, or start a new run (run.name / run.dir)") from None
    if same:
        return None
    what = (f"the corpus prepared now ({corpus.cache_dir}) holds out other documents than the run did when it began "
            f"({path}: {record.get('documents', '?')} documents, of corpus {record.get('corpus', '?')}; now "
            f"{now['documents']}): its source files changed since, or this version of minilm splits or tokenizes them "
            "otherwise (minilm.data.prepare.FORMAT_VERSION)")  # fmt: skip
    if trains:
        raise MinilmError(f"{flag}: {what}. Phases {', '.join(kept)} trained beside the recorded split; going on would "
                          "train on documents it held out, and its evaluation could no longer tell the held-out "
                          "documents from trained ones. Continue with the source files and minilm the run trained "
                          "with, or start a new run (run.name / run.dir)")  # fmt: skip
    log(f"warning: {what}; every phase has finished, nothing trains, and {path} keeps the run's record")
    return None


# ---------------------------------------------------------------------------------------- --init weights


def init_weights(given: Optional[str], begun: Optional[dict],
                  read_begun: bool = True) -> tuple[Optional[str], Optional[dict], Optional[dict],
                                                    Optional[dict]]:  # fmt: skip
    """(the weights file, its weights, the model section they record, its ``_init_record``) of --init ``given``, or of
    the --init record ``begun`` that --resume goes on with (``resume_as_begun``: kept as recorded, its file just
    checked against its sha256; not read where ``read_begun`` is False: a checkpoint continues the phase, and the
    file no longer holds those weights); all None with neither. Read once, before the corpus is prepared and run.dir
    is written, so that a missing or unreadable file fails first."""
    if begun is not None:
        return begun["weights"], *(_read_init(begun["weights"]) if read_begun else (None, None)), begun
    if given is None:
        return None, None, None, None
    init = str(_init_weights_path(given))  # (logged as loaded: the phase's file)
    return init, *_read_init(init), _init_record(given, Path(init))


def _init_weights_path(init: str) -> Path:
    """The weights file ``--init`` names: a weights file (from anywhere), or the weights of a run or phase directory
    as evaluate.py finds them (``resolve_run``: a run's final weights, else its newest finished phase; a phase that
    has not finished is refused), or of another folder holding a model.safetensors. Another file
    (a run's config.yaml) was read as a checkpoint: 'checkpoint ... is unreadable (IndexError: ...)'."""
    path = Path(init)
    if not path.exists():  # (was 'no weights at PATH', the flag unnamed)
        raise MinilmError(f"--init {path}: no such file or directory; give a run directory, a phase directory or a "
                          f"{' / '.join(WEIGHT_SUFFIXES)} file")  # fmt: skip
    try:  # (a file is not given to resolve_run: --init takes weights from outside any run too)
        check_weights_file(path)
    except MinilmError as e:
        raise MinilmError(f"--init {e}") from None
    # an unfinished run, tb/, a folder of runs; and a run's or phase's directory, by the rule evaluate.py reads it
    # with (a phase without complete.json is refused: its weights file, given as such, is taken as it is)
    if path.is_dir() and (not (path / "model.safetensors").is_file() or is_run_dir(path) or is_run_dir(path.parent)):
        try:
            return resolve_run(path)[2]
        except MinilmError as e:
            raise MinilmError(f"--init: {e}") from None
    return path


def _read_init(init: str) -> tuple[dict, Optional[dict]]:
    """The --init weights and the model section they record; a file that cannot be read is an error naming --init
    (it said 'weights file X is unreadable', the flag that gave X unnamed)."""
    try:
        return read_weights_and_model(Path(init))
    except MinilmError as e:
        raise MinilmError(f"--init {e}") from None


def _init_record(given: str, found: Path) -> dict:
    """complete.json's ``started_from`` of a phase that starts from the --init weights: the path as given (a run or
    phase directory, a file, relative or not), the file it named (``found``: ``_init_weights_path``'s), absolute, and
    the sha256 of its bytes (hex): what the weights were, where the file is later overwritten or copied."""
    file = found / "model.safetensors" if found.is_dir() else found
    try:
        digest = _sha256(file)
    except OSError as e:
        raise MinilmError(f"--init {given}: {file} cannot be read ({e.strerror})") from None
    return {"kind": "init", "init": given, "weights": str(file.resolve()), "sha256": digest}


def _sha256(file: Path) -> str:
    """The sha256 of ``file``'s bytes (hex), read in chunks: a file of the size of the model, not a second copy of the
    weights in memory."""
    with open(file, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def started_from_record(names: list[str], i: int, start: int, init: Optional[dict], seed: int) -> dict:
    """complete.json's ``started_from`` of phase ``names[i]`` trained from its first step, by a command that starts at
    phase ``names[start]``: the --init weights (``init``: ``_init_record``'s) for the phase it starts at, else the
    previous phase's, else (the run's first phase) the model initialized from run.seed ``seed``."""
    if init is not None and i == start:
        return init
    if i > 0:
        return {"kind": "phase", "phase": names[i - 1]}
    return {"kind": "fresh", "seed": int(seed)}
