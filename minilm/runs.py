"""Open a finished (or partly finished) run: the one loader evaluation, generation and export share.

A run directory (minilm/training/phases.py) holds ``config.yaml``, ``tokenizer.model``, ``model.safetensors``
(after the last phase) and ``<phase>/{model.safetensors, config.yaml}`` per finished phase. ``load_run`` takes
a run directory (optionally a phase), a phase directory, or a weights file inside either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from minilm.config import on_schema, phase_config, phase_names
from minilm.errors import MinilmError

HELD_OUT = "held_out.json"  # in run.dir: the corpus and the digest of the documents held out from training
COMPLETE = "complete.json"  # in a phase's folder, written last when it finishes (minilm.training.phases)


@dataclass
class LoadedRun:
    model: torch.nn.Module  # minilm.model.GPT, eval mode
    cfg: DictConfig  # the resolved config the weights were trained with (the phase's, if a phase)
    tokenizer: object  # minilm.data.Tokenizer
    run_dir: Path
    phase: Optional[str]  # None: the run's final weights
    weights: Path
    step: Optional[int] = None  # a step checkpoint's (.ckpt) step in its phase; None: a phase's finished weights
    # what the run records of the weights the phase started from, {"started_from": ...} (started_from_text), from the
    # phase's complete.json or the step checkpoint; {} where nothing records it (a run of an older minilm)
    record: dict = field(default_factory=dict)


WEIGHT_SUFFIXES = (".safetensors", ".ckpt")


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run (its config.yaml and tokenizer.model; a phase directory has the first alone)."""
    return (path / "tokenizer.model").is_file() and (path / "config.yaml").is_file()


def _find_run_dir(path: Path) -> Path:
    """The run directory ``path`` (a directory or a file, as the user gave it) is or lies in."""
    start = path if path.is_dir() else path.parent
    for p in [start, *start.parents][:3]:
        if is_run_dir(p):
            return p
    # (the path as given: for a file, its folder's name alone — 'configs' for configs/tiny.yaml — said nothing)
    raise MinilmError(f"{path} is not inside a minilm run directory (no config.yaml + tokenizer.model found in it or "
                      "the two folders above it); give a run directory, a phase directory or a weights file")


def run_dir_of(path: Path) -> Optional[Path]:
    """The run directory ``path`` is or lies in (``_find_run_dir``'s rule), None where it lies in none (a weights
    file from elsewhere)."""
    try:
        return _find_run_dir(Path(path))
    except MinilmError:
        return None


STUDY_SUMMARY = "study.json"  # in a study's folder (minilm.study), beside its runs


def study_run_dirs(folder: Path) -> Optional[list[tuple[str, Path]]]:
    """(label, run directory) of every run of the study whose folder is ``folder``, variant by variant, as its
    ``study.json`` lists them (``yarn``, or ``yarn/seed1`` with seeds); None if ``folder`` holds no study."""
    try:
        report = json.loads((Path(folder) / STUDY_SUMMARY).read_text())
        return [(label, Path(folder) / label) for v in report["variants"] for label in v["runs"]]
    except (OSError, ValueError, KeyError, TypeError):  # no study here (or a summary cut short: not one to read)
        return None


def study_label(run_dir: Path) -> Optional[str]:
    """The label of ``run_dir`` in the study it belongs to (its variant, and its seed: ``yarn/seed1``); None for a
    run of no study. A study's runs with seeds are all named ``seed<S>``: their folder names alone do not tell
    which variant each one is."""
    run_dir = Path(run_dir).resolve()
    for folder in run_dir.parents[:2]:
        for label, path in study_run_dirs(folder) or []:
            if path.resolve() == run_dir:
                return label
    return None


def _not_a_run(path: Path) -> Optional[str]:
    """What a folder that is no run holds instead, and what to give: a Hugging Face export (or a file in one), a
    study's folder, or a folder of runs."""
    from minilm.export import EXPORT_MARKER

    export = path if path.is_dir() else path.parent
    if (export / EXPORT_MARKER).is_file():  # (it said 'not inside a minilm run directory', and no more)
        return (f"{path} is a Hugging Face transformers export ({EXPORT_MARKER}), not a minilm run: load it with "
                f"transformers (AutoModelForCausalLM.from_pretrained('{export}')), or give the run it was exported "
                "from")
    if not path.is_dir():
        return None
    listed = study_run_dirs(path)
    runs = [(label, run) for label, run in listed or [] if (run / "config.yaml").is_file()]
    if listed and not runs:
        return (f"{path} is a study's folder ({STUDY_SUMMARY}) whose runs have not begun: run or --resume the study "
                "first")
    if runs:  # (those begun: study.json lists every variant's runs, also those --only has not trained yet)
        return (f"{path} is a study's folder ({STUDY_SUMMARY}), not a run: give one of its runs ("
                f"{', '.join(label for label, _ in runs[:6])}{', ...' if len(runs) > 6 else ''}), e.g. "
                f"{runs[0][1]}; scripts/compare_runs.py {path} compares them all")  # fmt: skip
    inside = sorted(p.name for p in path.iterdir() if (p / "config.yaml").is_file())
    if inside:
        return (f"{path} is a folder of runs ({', '.join(inside[:6])}{', ...' if len(inside) > 6 else ''}), not a run: "
                f"give one of them, e.g. {path / inside[0]}")
    return None


def check_weights_file(path: Path) -> None:
    """Refuse a file that is not weights (a run's config.yaml), naming what is taken: a run or phase directory, or a
    file of WEIGHT_SUFFIXES. A directory passes."""
    if path.is_file() and path.suffix not in WEIGHT_SUFFIXES:
        raise MinilmError(f"{path}: not a weights file; give a run directory, a phase directory or a "
                          f"{' / '.join(WEIGHT_SUFFIXES)} file")


def resolve_run(path: str | Path, phase: Optional[str] = None) -> tuple[Path, Optional[str], Path]:
    """(run_dir, phase or None, weights file) for a run dir, a phase dir or a weights file."""
    path = Path(path)
    if not path.exists():
        raise MinilmError(f"{path}: no such run directory or checkpoint")
    if not (path / "config.yaml").is_file() and (instead := _not_a_run(path)):  # (a run holding a study is a run)
        raise MinilmError(instead)
    run_dir = _find_run_dir(path)
    names = run_phase_names(run_dir) if phase is not None else []
    if phase is not None and phase not in names:
        raise MinilmError(f"phase '{phase}': not a phase of {run_dir}; its phases: {', '.join(names)}")
    check_weights_file(path)
    # the phase a path inside the run names: its first component below run_dir (a step checkpoint lies deeper, in
    # <phase>/checkpoints/), none for the run's own final weights
    rel = path.relative_to(run_dir).parts
    if path.is_dir() and len(rel) > 1:
        raise MinilmError(f"{path}: not a run or phase directory; give {run_dir}, {run_dir / rel[0]} or a weights file")
    named = rel[0] if rel and (path.is_dir() or len(rel) > 1) else None
    if path != run_dir:  # a weights file or a phase directory: it names the phase, and another one is a mismatch
        if phase is not None and phase != (named or names[-1]):  # the final weights are the last phase's
            what = f"phase '{named}'" if named else "the run's final weights"
            raise MinilmError(f"{path} holds {what}, but phase '{phase}' was asked for (its config would not match "
                              f"those weights); give {run_dir} with the phase, or the path alone")  # fmt: skip
    if path.is_file():
        weights, phase = path, named
    elif path != run_dir:  # a phase directory
        if named not in (names := names or run_phase_names(run_dir)):  # tb/, or a folder of the user's
            raise MinilmError(f"{path}: not a phase directory: '{named}' is not a phase of {run_dir}; its phases: "
                              f"{', '.join(names)}")
        phase = named
        weights = run_dir / named / "model.safetensors"
    elif phase is not None:
        weights = run_dir / phase / "model.safetensors"
    else:
        weights = run_dir / "model.safetensors"
        if not weights.is_file():  # an unfinished run: its newest finished phase
            done = [p for p in run_phase_names(run_dir) if phase_finished(run_dir, p)]
            if not done:
                raise MinilmError(f"{run_dir} has no finished phase yet (no {COMPLETE}): {finish_command(run_dir)}"
                                  + _step_checkpoint_hint(run_dir))  # fmt: skip
            phase, weights = done[-1], run_dir / done[-1] / "model.safetensors"
    if not weights.is_file():  # (a phase asked for by name, or its directory: it said only "has it finished?")
        raise MinilmError(f"{weights}: not found: phase '{phase}' has not finished; "
                          f"{finish_command(run_dir, 'finish it')}" + _step_checkpoint_hint(run_dir, [phase]))
    if not path.is_file() and phase is not None and not phase_finished(run_dir, phase):
        # a phase asked for by name or by its directory, with weights but no complete.json: killed during its
        # end-of-phase evaluation (its weights are written before it), or being trained again (its old weights,
        # perhaps of another config). It loaded as if finished, though --resume trains it again and a run directory
        # alone skips it; the weights file itself, given as such, is taken as it is
        raise MinilmError(f"phase '{phase}' of {run_dir} has not finished (no {COMPLETE} beside {weights}): its "
                          "weights are written before its end-of-phase evaluation, and it was stopped after them, or "
                          f"is being trained again; {finish_command(run_dir, 'finish it')}; or, to use those weights "
                          f"as they are, give the file {weights}")  # fmt: skip
    return run_dir, phase, weights


def phase_finished(run_dir: Path, phase: str) -> bool:
    """Whether ``phase`` of the run has finished: its ``complete.json``, written after everything else of the phase
    (minilm.training.phases), beside its weights. Its weights alone are not: they are written before its evaluation
    (``eval_lengths``), and a phase killed during it — or one resumed since, with another length — kept weights the
    run's --resume trains again, which were read as the run's newest finished phase."""
    return (run_dir / phase / COMPLETE).is_file() and (run_dir / phase / "model.safetensors").is_file()


def started_from_text(record: Optional[dict]) -> str:
    """The weights a phase started from, as its ``complete.json`` records them (``started_from``), in words: the
    ``--init`` path as given, the weights file it named and the first 12 hex digits of the file's sha256 (none in a
    record of an older minilm), the previous phase's, or the run's fresh initialization (run.seed); None: not
    recorded (a phase resumed from a checkpoint written before minilm recorded it)."""
    if record is None:
        return "weights its checkpoint does not record (written by an older minilm)"
    if record["kind"] == "init":
        said = [record["weights"]] if record["weights"] != record["init"] else []
        said += [f"sha256 {record['sha256'][:12]}"] if "sha256" in record else []
        return f"--init {record['init']}" + (f" ({', '.join(said)})" if said else "")
    if record["kind"] == "phase":
        return f"the weights of phase '{record['phase']}'"
    return f"fresh weights (run.seed {record['seed']})"


def phase_dir_of(path: Path) -> Optional[tuple[Path, str]]:
    """(run directory, phase) when ``path`` is a phase directory of a run: it holds a config.yaml too (its phase's),
    so it read as a run whose only phase is 'train'."""
    path = Path(path)
    if not (path / "config.yaml").is_file() or not (path.parent / "config.yaml").is_file():
        return None
    try:
        names = run_phase_names(path.parent)
    except MinilmError:  # (a parent whose config cannot be read is no run of ours)
        return None
    return (path.parent, path.name) if path.name in names else None


def finish_command(run_dir: Path, what: str = "finish its first phase") -> str:
    """The remedy for a run with no finished phase: nothing can be evaluated before one finishes."""
    import shlex  # (run.dir given: the saved config's is where the run was made, which a moved run is not in)

    words = ["python", "train.py", "--config", str(run_dir / "config.yaml"), f"run.dir={run_dir}", "--resume"]
    return f"{what} with: {shlex.join(words)}"


def _step_checkpoint_hint(run_dir: Path, phases: Optional[List[str]] = None) -> str:
    """'; or give a step checkpoint, the newest: PATH' where an unfinished run (or one of ``phases``) has one (a
    weights file it takes)."""
    from minilm.training.checkpoint import CKPT_PATTERN, checkpoint_step

    for name in reversed(phases or run_phase_names(run_dir)):  # the latest phase that has any, its latest step
        ckpts = [c for c in (run_dir / name / "checkpoints").glob("*.ckpt") if CKPT_PATTERN.match(c.name)]
        if ckpts:
            newest = max(ckpts, key=checkpoint_step)
            return f"; or give a step checkpoint, the newest: {newest} (phase '{name}', step {checkpoint_step(newest)})"
    return ""


def load_run_config(path: Path) -> DictConfig:
    """The saved, resolved config on the schema (open mappings as saved: see ``minilm.config.on_schema``). One that
    cannot be read (truncated, edited by hand) is an error naming it: it was a YAML or OmegaConf traceback in
    evaluate / generate / export and in train.py --resume."""
    try:
        cfg = on_schema(OmegaConf.load(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, OmegaConfBaseException, ValueError, TypeError) as e:
        msg = " ".join(line.strip() for line in str(e).splitlines() if line.strip())[:300]  # YAML: problem, line
        raise MinilmError(f"{path}: not a readable run config ({type(e).__name__}: {msg}); train.py writes it "
                          "(a run's config.yaml, a phase's in its directory): restore it, or retrain") from None
    OmegaConf.set_readonly(cfg, True)
    return cfg


def run_phase_names(run_dir: Path) -> list[str]:
    """The phases of the run saved in ``run_dir``, in order."""
    return phase_names(load_run_config(Path(run_dir) / "config.yaml"))


def run_config(run_dir: Path, phase: Optional[str]) -> DictConfig:
    cfg = load_run_config(run_dir / "config.yaml")
    if phase is None:
        return phase_config(cfg, phase_names(cfg)[-1])
    return phase_config(cfg, phase)


def load_run(path: str | Path, phase: Optional[str] = None, map_location: str = "cpu") -> LoadedRun:
    from minilm.data import Tokenizer
    from minilm.model import GPT
    from minilm.training.checkpoint import check_trained_with, load_weights, read_step_checkpoint, recorded_model

    run_dir, phase, weights = resolve_run(path, phase)
    run_cfg = load_run_config(run_dir / "config.yaml")
    trained_in = phase or phase_names(run_cfg)[-1]  # (the run's final weights: its last phase's)
    cfg = phase_config(run_cfg, trained_in)
    # (its errors named data.tokenizer.model_file, a key the run may not set: say whose file it is)
    tokenizer = Tokenizer(run_dir / "tokenizer.model", where="the run's tokenizer (the token ids its weights were "
                          "trained with; the prepared corpus it trained on, corpus-*/tokenizer.model under its "
                          "data.cache_dir, holds a copy)")  # fmt: skip
    step, source = None, weights
    if weights.suffix == ".ckpt":  # a step checkpoint, read once: its weights, its step, the model it trained
        source, step, trained, state = read_step_checkpoint(weights)
        record = {"started_from": state["started_from"]} if "started_from" in state else {}
    else:
        trained = recorded_model(weights)
        record = _started_from_record(run_dir / trained_in / COMPLETE)
    # (before the model is built: a config that is not theirs may not even build, or fail on shapes less clearly)
    config = f"{run_dir / 'config.yaml'}" + (f" (phase '{phase}')" if phase else " (its last phase)")
    check_trained_with(trained, cfg.model, weights, config)
    model = GPT(cfg.model, tokenizer.vocab_size)
    load_weights(model, source, where=str(weights))
    return LoadedRun(model.to(map_location).eval(), cfg, tokenizer, run_dir, phase, weights, step, record)


def _started_from_record(complete: Path) -> dict:
    """``{"started_from": ...}`` of a phase's complete.json; {} where it has none (written by an older minilm) or
    cannot be read (a phase's weights are read without it: what it records is said, never guessed)."""
    try:
        summary = json.loads(complete.read_text())
    except (OSError, ValueError):
        return {}
    return {"started_from": summary["started_from"]} if isinstance(summary, dict) and "started_from" in summary else {}


def find_results(path: str | Path) -> Path:
    """The ``results.json`` an evaluation wrote, for a run directory (its last phase with an evaluation), a phase
    directory, an evaluation directory or the file itself."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / "results.json").is_file():
        return path / "results.json"
    if (path / "eval" / "results.json").is_file():
        return path / "eval" / "results.json"
    if (path / "config.yaml").is_file():  # a run directory: its last phase with an evaluation
        for phase in reversed(run_phase_names(path)):
            if (path / phase / "eval" / "results.json").is_file():
                return path / phase / "eval" / "results.json"
    if not path.is_dir():
        raise MinilmError(f"{path}: no such file or directory (a run, a phase, an eval directory or a results.json)")
    if (phase := phase_dir_of(path)) is not None:  # its config.yaml is its phase's: not a run of one phase 'train'
        run_dir, name = phase
        if not phase_finished(run_dir, name):
            raise MinilmError(f"{path}: phase '{name}' of {run_dir} has not finished, so it has no evaluation; "
                              f"{finish_command(run_dir, 'continue the run')}")  # fmt: skip
        raise MinilmError(f"{path}: phase '{name}' of {run_dir} has no evaluation (no eval/results.json); run "
                          f"scripts/evaluate.py --run {run_dir} --phase {name} first")  # fmt: skip
    if not (path / "config.yaml").is_file():  # not a run: a folder of runs (a study's variant, runs/) is not one
        runs = sorted(p.name for p in path.iterdir() if (p / "config.yaml").is_file())
        if runs:
            raise MinilmError(f"{path}: not a run but a folder of runs ({', '.join(runs[:5])}"
                              f"{', ...' if len(runs) > 5 else ''}); name them: {path}/{runs[0]} ...")
        raise MinilmError(f"{path}: not a run directory (no config.yaml) and no results.json in it")
    if not any(phase_finished(path, p) for p in run_phase_names(path)):  # evaluate.py would refuse
        raise MinilmError(f"{path}: no evaluation, and no finished phase to evaluate yet; {finish_command(path)}, then "
                          f"scripts/evaluate.py --run {path}")  # fmt: skip
    others = sorted(str(f.parent) for p in run_phase_names(path) for f in (path / p).glob("eval-*/results.json"))
    if others:  # (--extension's and a step checkpoint's: "no results.json found" while there were some)
        raise MinilmError(f"{path}: none of its phases has its own evaluation (eval/results.json); name one of "
                          f"its other evaluations ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}), or "
                          f"run scripts/evaluate.py --run {path}")  # fmt: skip
    raise MinilmError(f"{path}: no results.json found; run scripts/evaluate.py --run {path} first")
