"""A study: several variants of one experiment, trained one after another and compared in one table and figure.

A study file (``configs/studies/*.yaml``) names a config every variant starts from and, per variant, what differs,
as command-line overrides::

    config: ../rope_yarn_tiny.yaml           # relative to the study file
    name: my_study                           # optional: <out> defaults to runs/studies/<name> (the file's stem)
    overrides: [train.log_every=20]          # optional: for every variant
    variants:
      yarn: []                               # the config as it is
      pi: ["phases.extend_512.position.scaling={rope_type: linear, factor: 4.0}"]
      alibi: [model.position.name=alibi]
      other: {config: ../alibi.yaml, overrides: [...]}   # a variant may start from another config

Each variant is an ordinary run directory ``<out>/<variant>/`` (``train.py --resume`` works on it, evaluate.py,
generate.py and export_hf.py read it). Variants whose first phases resolve to the same configs — the same model,
phase names, data, schedule, seed, position, evaluation and optimizer carrying — share them: those phases train
once, in the first such variant, and the later variants start from a copy of their finished phase directories
(hard links where the file system allows, checkpoints left out). Usually every RoPE variant shares the pretraining.

At the end, ``<out>/study.md`` and ``study.json`` list the overrides of every variant once (the study file's, the
command line's) and hold one row per variant (what it sets itself, what it shared, the validation loss after each
phase) and, from the evaluation of each variant's last evaluating phase (runs that have
not finished that phase do not count), ``compare.png`` / ``compare.md`` (minilm.eval.compare); with seeds, each
variant's difference from the first, paired by seed; with one seed, ``study.md`` says first that no difference can be
called significant. A study stopped at any moment continues with ``--resume``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shlex
import statistics
import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Optional

import yaml
from omegaconf import DictConfig, OmegaConf

from minilm.cli import raise_if_interrupted
from minilm.config import (Config, UniqueKeyLoader, filled_model, load_config, phase_config, phase_names,
                           yaml_problem)
from minilm.errors import ConfigError, MinilmError
from minilm.eval.report import SCALARS  # the per-length numbers of results.json
from minilm.runs import COMPLETE  # a finished phase's summary (the layout minilm.training.phases writes)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SUMMARY_FILES = ("study.md", "study.json", "compare.png", "compare.md")  # in <out>/, beside the variants' run dirs


@dataclass
class Variant:
    name: str
    config: Path  # the config it starts from
    overrides: list[str] = field(default_factory=list)  # the study's common overrides, then its own
    own: list[str] = field(default_factory=list)  # its own alone (the tables show the common ones once)


@dataclass
class Study:
    path: Path
    name: str
    variants: list[Variant]
    seeds: list[int] = field(default_factory=list)  # empty: one run per variant, with its config's run.seed
    overrides: list[str] = field(default_factory=list)  # the study file's for every variant (each Variant has them)
    config: Optional[Path] = None  # the study file's config (a variant may name another)


@dataclass(frozen=True)
class StudyRun:
    """One training of a study: a variant at a seed (None: the config's). Its run directory is ``<out>/<label>``."""

    variant: str
    seed: Optional[int]

    @property
    def label(self) -> str:
        return self.variant if self.seed is None else f"{self.variant}/seed{self.seed}"


def study_runs(study: Study) -> list[StudyRun]:
    """Every run, seed by seed: each seed's variants are all trained before the next seed's begin, so a study
    stopped early still compares every variant."""
    return [StudyRun(v.name, seed) for seed in (study.seeds or [None]) for v in study.variants]


# ------------------------------------------------------------------------------------------------- reading


def _overrides(value, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: a list of overrides 'key.sub=value' (as on train.py's command line) expected, "
                          f"got {value!r}")  # fmt: skip
    bad = [v for v in value if "=" not in v]
    if bad:
        raise ConfigError(f"{where}: override {bad[0]!r} must look like key.sub=value")
    return list(value)


def _config_path(study_file: Path, value, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: the path of a config YAML (relative to the study file) expected, got {value!r}")
    path = (study_file.parent / value).resolve()
    if not path.is_file():
        raise ConfigError(f"{where}: config file not found: {path}")
    return path


def load_study(path: str | Path) -> Study:
    """Read and check a study file; every error names the file and the key."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # a variant named twice is an error
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the study file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(path, e)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a study must be a mapping with 'config' and 'variants'")
    unknown = sorted(set(raw) - {"name", "config", "overrides", "variants", "seeds"})
    run_keys = [k for k in raw if k == "base" or k in {f.name for f in fields(Config)}]
    if run_keys and "variants" not in raw:  # (a run's config given for a study's: 'unknown key base' said no more)
        raise ConfigError(f"{path}: a run config (it has '{run_keys[0]}:'), not a study file (config:, variants:); "
                          f"train it with python train.py --config {path}, or name it in a study file's config: "
                          "(configs/studies/*.yaml)")  # fmt: skip
    if unknown:
        raise ConfigError(f"{path}: unknown key '{unknown[0]}'; a study takes: name, config, overrides, variants, "
                          "seeds")  # fmt: skip
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        # (without a name: key, the file's stem: 'name:' alone named a key the file does not have)
        given = f"got {name!r}" if "name" in raw else f"none given, and the file's name {name!r} is not one"
        raise ConfigError(f"{path}: name: letters, digits, '_', '-', '.' expected ({given}); it names the default "
                          "--out, runs/studies/<name>")  # fmt: skip
    config = _config_path(path, raw.get("config"), f"{path}: config")
    common = _overrides(raw.get("overrides"), f"{path}: overrides")
    variants = raw.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"{path}: variants: a mapping from variant name to its overrides expected, got "
                          f"{variants!r}")  # fmt: skip
    out = []
    for vname, spec in variants.items():
        where = f"{path}: variants.{vname}"
        if not isinstance(vname, str) or not _NAME.match(vname):
            raise ConfigError(f"{where}: a variant name is a directory name (letters, digits, '_', '-', '.')")
        if vname in SUMMARY_FILES:
            raise ConfigError(f"{where}: the name of a file the study writes ({', '.join(SUMMARY_FILES)}); rename it")
        if isinstance(spec, dict):
            extra = sorted(set(spec) - {"config", "overrides"})
            if extra:
                raise ConfigError(f"{where}: unknown key '{extra[0]}'; a variant takes: config, overrides")
            vconfig = _config_path(path, spec["config"], f"{where}.config") if "config" in spec else config
            own = _overrides(spec.get("overrides"), f"{where}.overrides")
        else:
            vconfig, own = config, _overrides(spec, where)
        out.append(Variant(vname, vconfig, common + own, own))
    return Study(path, name, out, check_seeds(raw.get("seeds"), f"{path}: seeds"), common, config)


def check_seeds(value, where: str) -> list[int]:
    """A study's seeds: distinct integers (or none given: the config's run.seed)."""
    if value is None:
        return []
    if not isinstance(value, list) or not value or not all(type(x) is int for x in value):
        raise ConfigError(f"{where}: a non-empty list of integer seeds expected, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: seeds must differ, got {value!r}")
    return list(value)


def check_common_overrides(study: Study) -> None:
    """The study file's ``overrides:`` (for every variant) alone on each config the variants start from: a bad one is
    named as set there, not as set in the first variant (whose own overrides may be none)."""
    for config in dict.fromkeys(v.config for v in study.variants) if study.overrides else []:
        try:
            load_config(config, study.overrides, f"study file {study.path}, overrides (every variant)")
        except ConfigError as e:  # (a variant's config of its own: which one)
            names = ", ".join(v.name for v in study.variants if v.config == config)
            which = "" if config == study.config else f" (for variant {names}, which starts from {config})"
            raise ConfigError(f"{e}{which}") from None


def run_config(study: Study, run: StudyRun, out_dir: Path, extra: list[str]) -> DictConfig:
    """The resolved config of one run of the study, its run directory ``out_dir/<label>``. ``extra``: overrides
    for every variant from the command line (after the study's own)."""
    variant = next(v for v in study.variants if v.name == run.variant)
    # (run.dir quoted: a path is YAML to an override, so '--out "a #b"' put every run in 'a', a comment cut off)
    own = [f"run.name={run.label.replace('/', '-')}", f"run.dir={json.dumps(str(out_dir / run.label))}"]
    own += [] if run.seed is None else [f"run.seed={run.seed}"]
    for item in variant.overrides + list(extra):  # the study sets these itself: a given one would be ignored
        key = item.partition("=")[0].strip()
        if key in ("run", "run.name", "run.dir") or (key == "run.seed" and run.seed is not None):
            where = "the command line" if item in extra else f"{study.path}: variant '{variant.name}'"
            raise ConfigError(f"{where}: override '{item}': a study names and places its runs itself (--out for the "
                              "directory" + (", seeds: for the seeds)" if key == "run.seed" else ")"))
    # each group of overrides named as what set it: a bad value in the study file is not '(set on the command line)'
    source = f"study file {study.path}, variant '{variant.name}'"
    try:
        return load_config(variant.config, variant.overrides, source,
                           more=[("command line", list(extra)), ("study's --out and seeds", own)])
    except ConfigError as e:  # (an error that already names the variant is not prefixed with it again)
        raise ConfigError(str(e) if source in str(e) else f"{study.path}: variant '{variant.name}': {e}") from None


# ------------------------------------------------------------------------------------------ shared phases


def phase_keys(cfg: DictConfig) -> list[str]:
    """One string per phase that is equal for two configs exactly when they train that phase and every earlier
    one alike: the model they are built with, and per phase its name, resolved config (without run.name and
    run.dir) and whether it carries the optimizer over. Position blocks are compared with their defaults filled in
    (``filled_model``): a variant spelling one out (``model.position.fraction=1.0``, ``model.n_kv_heads`` equal to
    n_heads) trains alike."""
    model = filled_model(OmegaConf.to_container(cfg.model, resolve=True))
    keys, parts = [], [yaml.safe_dump(_same_numbers(model), sort_keys=True)]
    for name in phase_names(cfg):
        pcfg = OmegaConf.to_container(phase_config(cfg, name), resolve=True)
        pcfg["run"].pop("name"), pcfg["run"].pop("dir")
        pcfg["model"] = filled_model(pcfg["model"])
        carry = bool(name in cfg.phases and cfg.phases[name].carry_optimizer)
        parts.append(yaml.safe_dump({"phase": name, "carry_optimizer": carry, "config": _same_numbers(pcfg)},
                                    sort_keys=True))  # fmt: skip
        keys.append("\n".join(parts))
    return keys


def _same_numbers(value):
    """``value`` (plain containers) with each integer a float where the float is exact: a position block is untyped,
    so ``factor=16`` stays 16 where the config says 16.0, which trains alike (and --resume compares them equal), but
    dumped as text they differed: two variants that train alike were not refused, nor their phases shared."""
    if isinstance(value, dict):
        return {k: _same_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_same_numbers(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**53:
        return float(value)
    return value


def check_variants_differ(study: Study, keys: dict[str, list[str]]) -> None:
    """Refuse two variants that train alike (``keys``: each run's ``phase_keys``; equal last keys: every phase resolves
    to the same config, at the same seed): one of them was meant to change something (an override left out, or one
    that sets what the config already says), and the study would train it again to report a difference of nothing."""
    seen: dict[str, str] = {}
    for r in study_runs(study):
        first = seen.setdefault(keys[r.label][-1], r.variant)
        if first != r.variant:
            raise ConfigError(f"{study.path}: variants '{first}' and '{r.variant}' train alike: every phase of theirs "
                              "resolves to the same config (their overrides and config files make no difference "
                              "between them); change one of them, or remove it")  # fmt: skip


def plan_sharing(keys: dict[str, list[str]]) -> dict[str, tuple[str, int]]:
    """variant -> (donor, number of leading phases copied from it): the earlier variant (in study order) with the
    longest run of equal leading phases, the first of those on a tie. Variants with no equal first phase are
    absent. A variant never shares its last phase: what it trains is what it is for."""
    names, plan = list(keys), {}
    for i, v in enumerate(names):
        donor, best = None, 0
        for u in names[:i]:
            n = 0
            while n < min(len(keys[u]), len(keys[v]) - 1) and keys[u][n] == keys[v][n]:
                n += 1
            if n > best:
                donor, best = u, n
        while donor in plan and plan[donor][1] >= best:  # name the variant that trained those phases
            donor = plan[donor][0]
        if donor is not None:
            plan[v] = (donor, best)
    return plan


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


COPYING = ".copying"  # the suffix of a phase being copied: <phase>.<pid>.copying


def remove_stale_copies(run_dir: Path, phase: Optional[str] = None) -> None:
    """The phase copies a kill cut short in ``run_dir`` (``copy_finished_phase``; of ``phase`` alone when given),
    of processes that no longer exist on this machine: a run that is never continued kept them for good."""
    from minilm.files import pid_alive

    for path in run_dir.glob(f"*{COPYING}") if run_dir.is_dir() else []:
        stem = path.name[: -len(COPYING)]  # <phase>.<pid>, or <phase> as minilm named it before the pid
        name, pid = stem.split(".", 1) if "." in stem else (stem, "")  # (a phase name has no dot: PHASE_NAME)
        if phase is not None and name != phase:
            continue
        if not pid or (pid.isdigit() and not pid_alive(int(pid))):
            shutil.rmtree(path, ignore_errors=True)


def copy_finished_phase(src: Path, dst: Path) -> None:
    """A finished phase directory (weights, config, optimizer moments, evaluation, complete.json) into another
    run, without its checkpoints; through a temporary name, so that an interruption leaves no half phase. Files are
    hard-linked, which is safe because minilm replaces files (write a temporary file, rename it) and never writes
    into one; temporary files an interrupted write left (``*.tmp``) are not copied: linked, a later write through
    that name in one run would land in the other's file. ``src`` has finished (``_loan`` checks it). The temporary
    name carries the process id: ``remove_stale_copies`` removes those of processes that have gone."""
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}{COPYING}")
    remove_stale_copies(dst.parent, dst.name)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("checkpoints", "*.tmp"), copy_function=_link_or_copy)
    shutil.rmtree(dst, ignore_errors=True)  # an unfinished phase of the same name, from an interrupted copy or run
    tmp.rename(dst)


# ---------------------------------------------------------------------------------------------- running


def run_study(study: Study, out_dir: Path, *, extra: tuple[str, ...] = (), resume: bool = False, share: bool = True,
              only: Optional[list[str]] = None, log: Callable[[str], None] = print,
              again: Optional[str] = None) -> Path:  # fmt: skip
    """Train every run of the study (of ``only`` those variants), in ``study_runs`` order, then write the summary.
    Returns ``out_dir``. ``again``: the command that continues this study (scripts/study.py's, with --resume), for
    the remedies of its refusals."""
    again = again or "run the study again with --resume"
    names = [v.name for v in study.variants]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise MinilmError(f"--only {unknown[0]}: no such variant in {study.path}; variants are: {', '.join(names)}")
    from minilm.training.run_checks import is_primary_process, silent

    if not is_primary_process():  # under DDP every rank runs the study alike: each line was printed once per rank
        log = silent  # (what goes wrong on another rank is raised there, and reaches the user from it)
    _open_out_dir(out_dir)
    _check_same_study(study, out_dir)
    runs = study_runs(study)
    todo = [r for r in runs if not only or r.variant in only]
    from minilm.eval.report import plural

    seeds = f" × {plural(len(study.seeds), 'seed')}" if study.seeds else ""  # ('1 runs (1 variants × 1 seeds)')
    log(f"study {study.name}: {plural(len(todo), 'run')} ({plural(len({r.variant for r in todo}), 'variant')}{seeds}) "
        f"into {out_dir}; first every run's config and data are checked")  # (seconds of silence otherwise)
    for what, items in (("the study file's", study.overrides), ("the command line's", list(extra))):
        if items:  # once here: each run's line names its variant's own
            log(f"study {study.name}: every variant with {what} overrides: {' '.join(items)}")
    if is_primary_process():  # (under DDP the other ranks come here once rank 0 holds the first run's lock)
        _check_not_in_use(todo, out_dir)
    cfgs, keys = _checked_configs(study, runs, out_dir, list(extra), again)

    # (under DDP the other ranks start this study anew once rank 0 has begun the first run: not their refusal)
    if not resume and is_primary_process() and any((out_dir / r.label).exists() for r in todo):
        raise MinilmError(f"{out_dir} already holds this study's runs; continue it ({again}), or choose another --out")
    plan = plan_sharing(keys) if share else {}
    labels = {r.label for r in todo}
    for r in todo:  # a donor that --only leaves out must have finished what it lends: refused before anything trains
        if r.label in plan and plan[r.label][0] not in labels:
            _loan(out_dir, r.label, cfgs[r.label], plan[r.label])
    _check_layout(study, out_dir, todo)
    _check_resumed_runs(out_dir, cfgs, todo, plan, again, data=False)  # before any corpus is prepared, what needs none
    _check_data(cfgs, todo)
    _check_resumed_runs(out_dir, cfgs, todo, plan, again, data=True)
    for line in study_phase_notes(out_dir, cfgs, todo):  # once each here, not once per run that trains it
        log(line)
    try:
        for r in todo:
            raise_if_interrupted()  # (a Ctrl-C swallowed by a finalizer: the next run did not start the study over)
            with _study_remedy(r.label, cfgs, again):
                _train_run(study, r, out_dir, cfgs[r.label], plan.get(r.label), log)
    finally:  # also when a run fails or is interrupted: the summary of what has finished
        if is_primary_process() and out_dir.is_dir():
            write_summary(study, out_dir, cfgs, log, extra=list(extra))
    return out_dir


def _check_not_in_use(runs, out_dir: Path) -> None:
    """A run of the study that another live process trains (its ``.lock`` held: another ``study.py`` into the same
    --out, or a ``train.py`` there) is refused before anything is checked: the refusal said "already holds this
    study's runs; continue it (--resume)", and --resume first noted that the run "starts from step 0" before
    refusing it as in use."""
    from minilm.files import is_locked

    for run in runs:
        lock = out_dir / run.label / ".lock"
        if is_locked(lock):
            raise MinilmError(f"{out_dir / run.label} is in use by another process (lock file {lock}): another study "
                              f"or train.py is training into {out_dir}; wait for it, stop it, or give this study "
                              "another --out")  # fmt: skip


def _open_out_dir(out_dir: Path) -> None:
    """Refuse an ``--out`` the runs could not be written to; remove what a killed study left half-written there."""
    from minilm.cli import check_home_expanded
    from minilm.files import remove_stale_temporaries
    from minilm.runs import run_dir_of
    from minilm.training.run_checks import check_writable_dir, is_primary_process

    check_home_expanded(out_dir, "--out")  # else each run's run.dir check advised run.dir=$HOME/..., refused here
    check_writable_dir(out_dir, "--out")  # else each run's run.dir check advises setting run.dir, refused here
    if (run := run_dir_of(out_dir)) is not None:  # its summary there, compare_runs.py and evaluate.py read the run
        where = "is" if run.resolve() == out_dir.resolve() else f"lies in {run}, which is"
        raise MinilmError(f"--out {out_dir} {where} a run directory (config.yaml, tokenizer.model): a study's runs and "
                          "its summary go in a folder of their own; choose another --out")
    if is_primary_process():  # a kill while the summary was written left its temporary file (.study.json.<pid>.tmp,
        remove_stale_temporaries(out_dir)  # compare.png's): never read, and beside the outputs for good otherwise
        for run_dir in [*out_dir.glob("*/"), *out_dir.glob("*/seed*/")]:  # and a phase copy cut short, in any run
            remove_stale_copies(run_dir)


def _check_same_study(study: Study, out_dir: Path) -> None:
    """Refuse an ``--out`` whose summary (study.json) is another study's: this study's summary would replace it, and
    the runs of both would share one folder, the other's no longer in any table."""
    try:
        other = json.loads((out_dir / "study.json").read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return  # none yet (or not a study's: no name to tell)
    if other is not None and other != study.name:
        raise MinilmError(f"{out_dir} holds study '{other}' ({out_dir / 'study.json'}); study '{study.name}' would "
                          "replace its summary there: choose another --out (or, for the same study under a new file "
                          f"name, set name: {other} in {study.path})")


def _checked_configs(study: Study, runs: list, out_dir: Path, extra: list[str], again: str) -> tuple[dict, dict]:
    """Every run's config (by label) and its phases' keys, each checked before anything trains; two variants that
    would train alike are refused."""
    try:
        check_common_overrides(study)
        cfgs = {r.label: run_config(study, r, out_dir, extra) for r in runs}  # every variant checked first
        keys = {label: phase_keys(c) for label, c in cfgs.items()}
        check_variants_differ(study, keys)
        return cfgs, keys
    except ConfigError as e:  # (checked before anything trains: the remedy is to correct it and run this again)
        end = " " if str(e).endswith((".", "?")) else ". "
        raise ConfigError(f"{e}{end}Nothing was trained; correct it, then: {again}") from None


def study_phase_notes(out_dir: Path, cfgs: dict[str, DictConfig], todo: list[StudyRun]) -> list[str]:
    """Each distinct warning or note (``phase_notes``: a warmup longer than its phase, say) on the phases the runs
    ``todo`` have not finished (trained or copied from another run), once, naming the runs it concerns unless it is
    every one of them: each run's own run_phases said it again (a study of 5 runs of 3 short phases printed the
    same 3 warnings 5 times)."""
    from minilm.training.phases import phase_notes
    from minilm.training.run_checks import is_complete

    runs: dict[str, list[str]] = {}
    for r in todo:
        names = phase_names(cfgs[r.label])
        for line in phase_notes(cfgs[r.label], [n for n in names if not is_complete(out_dir / r.label, n)]):
            runs.setdefault(line, []).append(r.label)
    return [line + ("" if len(todo) == 1 else " (every run)" if len(who) == len(todo) else f" (runs {', '.join(who)})")
            for line, who in runs.items()]


def _check_layout(study: Study, out_dir: Path, todo: list[StudyRun]) -> None:
    """Runs with seeds live in ``<variant>/seed<S>/``, without in ``<variant>/``: refuse to nest one layout in the
    other (a study run once without seeds, then with them, or the reverse)."""
    for r in todo:
        vdir = out_dir / r.variant
        other = (vdir / "config.yaml").is_file() if r.seed is not None else any(vdir.glob("seed*/config.yaml"))
        if other:
            raise MinilmError(f"{vdir} holds runs {'without' if r.seed is not None else 'with'} seeds; this study "
                              f"runs {'with' if r.seed is not None else 'without'} them: choose another --out")


def _check_data(cfgs: dict[str, DictConfig], todo: list[StudyRun]) -> None:
    """Prepare every run's data and build each phase's samplers before anything trains, as ``run_phases`` does for
    one run: a variant whose data fails (a missing file, no document long enough for its long_fraction) is refused
    now, not after the variants before it have trained. Preparation is cached, so the runs pay nothing twice."""
    from minilm.data import check_phase_data, load_corpus

    corpora = {}  # one load per distinct data section
    for r in todo:
        cfg = cfgs[r.label]
        try:
            key = OmegaConf.to_yaml(cfg.data)
            if key not in corpora:
                corpora[key] = load_corpus(cfg.data)
            for p in phase_names(cfg):
                check_phase_data(corpora[key], phase_config(cfg, p), p, cfg.phases.get(p))
        except MinilmError as e:
            raise type(e)(f"'{r.label}': {e}") from None


def _check_resumed_runs(out_dir: Path, cfgs: dict[str, DictConfig], todo: list[StudyRun], plan: dict, again: str,
                        data: bool) -> None:  # fmt: skip
    """Every run the study continues (its directory exists) checked as ``run_phases`` will check it at its turn: its
    finished phases against what its variant now trains, an interrupted phase's checkpoint, and the finished phases
    it will copy from its donor; with ``data``, also its samplers, tokenizer and held-out documents against the
    corpus. All before the first run trains, not after the hours of the runs before it. Every run whose finished
    phase the study now trains differently is named in one refusal, with one remedy for them all."""
    from minilm.training.run_checks import (
        ChangedPhaseError,
        carries_optimizer,
        check_finished_phase,
        check_run,
        is_complete,
    )

    changed = []
    for r in todo:
        run_dir, cfg = out_dir / r.label, cfgs[r.label]
        try:
            if run_dir.exists():
                check_run(cfg, resume=True, data=data)
            donor, k = plan.get(r.label, (None, 0))
            for p in [p for p in phase_names(cfg)[:k] if not is_complete(run_dir, p) and not data]:
                check_finished_phase(phase_config(cfg, p), p, out_dir / donor,  # what _train_run will copy
                                     f"'{r.label}' starts from '{donor}'", carries_optimizer(cfg, p),
                                     set_in=cfg.phases.get(p))  # fmt: skip
        except ChangedPhaseError as e:
            changed.append((r.label, e))
        except MinilmError as e:  # which run it is: no run has said so yet
            raise type(e)(f"'{r.label}': {e}") from None
    if changed:
        raise _changed_phases(changed, cfgs, again)


@contextlib.contextmanager
def _study_remedy(label: str, cfgs: dict[str, DictConfig], again: str):
    """A finished phase the study now trains differently (ChangedPhaseError) is refused with a study's remedy, the
    run's label first: its own advice names train.py's flags. Any other refusal while the run trains is prefixed
    with its label."""
    from minilm.training.phases import RunInUse
    from minilm.training.run_checks import ChangedPhaseError

    try:
        yield
    except ChangedPhaseError as e:
        raise _changed_phases([(label, e)], cfgs, again) from None
    except RunInUse as e:  # (train.py's remedy named run.dir, which a study's --out sets)
        raise MinilmError(f"'{label}': {e.in_use}; wait for it, stop it, or give this study another --out"
                          f"{e.gone}") from None
    except MinilmError as e:  # which run failed: run_phases names the phase, which every run of the study has
        raise type(e)(f"'{label}': {e}") from None


def _changed_phases(changed: list, cfgs: dict[str, DictConfig], again: str) -> MinilmError:
    """One refusal for the runs (label, ChangedPhaseError) whose finished phases the study now trains differently:
    the first difference in full, the other runs by name, and the commands that retrain them — the changed phase's
    directory and those of the phases after it removed, then the study continued (train.py's --phase, --init and
    run.name, which the error's own advice names, are not a study's)."""
    label, first = changed[0]
    others = [f"'{lb}' ({e.phase})" for lb, e in changed[1:]]
    remove = []
    for lb, e in changed:
        names = phase_names(cfgs[lb])
        run_dir = e.run_dir if e.run_dir is not None else Path(cfgs[lb].run.dir)
        later = names[names.index(e.phase):] if e.phase in names else [e.phase]
        remove += [str(run_dir / p) for p in later if (run_dir / p).exists()]
    also = f"; so do {', '.join(others)}" if others else ""
    fix = f"rm -r {' '.join(shlex.quote(p) for p in dict.fromkeys(remove))}" if remove else "remove those phases"
    return MinilmError(f"'{label}': {first.what}{also}. To retrain {'them' if others else 'it'} as the study file and "
                       f"command line now say, delete the changed phases and the phases after them, then continue the "
                       f"study: {fix} && {again}")


def _loan(out_dir: Path, label: str, cfg: DictConfig, shared: tuple[str, int]) -> list[str]:
    """The phases run ``label`` shares with its donor (``shared`` = (donor label, how many)) and has not got yet (a
    resumed run may have them); MinilmError if the donor has not finished them."""
    from minilm.training.run_checks import is_complete

    donor, k = shared
    missing = [p for p in phase_names(cfg)[:k] if not is_complete(out_dir / label, p)]
    if not all(is_complete(out_dir / donor, p) for p in missing):
        raise MinilmError(f"'{label}' shares {', '.join(missing)} with '{donor}', which has not finished "
                          f"{'them' if len(missing) > 1 else 'it'} in "
                          f"{out_dir / donor}; train that variant first (or all: drop --only)")  # fmt: skip
    return missing


def _train_run(study: Study, run: StudyRun, out_dir: Path, cfg: DictConfig, shared: Optional[tuple[str, int]],
               log: Callable[[str], None]) -> None:  # fmt: skip
    """One run: first a copy of the phases it shares with an earlier run (``shared`` = (donor label, how many)),
    then ``run_phases`` for the rest (resuming whatever is there)."""
    from minilm.training.phases import run_phases
    from minilm.training.run_checks import carries_optimizer, check_finished_phase, is_primary_process, phase_dir

    run_dir = out_dir / run.label
    if shared is not None and is_primary_process():
        donor, k = shared
        phases = phase_names(cfg)[:k]
        missing = _loan(out_dir, run.label, cfg, shared)
        for p in missing:  # the donor's weights must be what this run's config trains (not an older study's)
            check_finished_phase(phase_config(cfg, p), p, out_dir / donor, f"'{run.label}' starts from '{donor}'",
                                 carries_optimizer(cfg, p), set_in=cfg.phases.get(p))
        for p in missing:
            copy_finished_phase(phase_dir(out_dir / donor, p), phase_dir(run_dir, p))
        if missing:  # (a resumed run that has them copies nothing: not said)
            some = "" if missing == phases else f" (copied {', '.join(missing)}; it had the others)"
            log(f"study {study.name}: '{run.label}' starts from '{donor}' after {', '.join(phases)}{some}")
    if shared is not None:
        _wait_for_rank_zero()  # every rank must find the copied phases finished, or they would train different ones
    variant = next(v for v in study.variants if v.name == run.variant)
    own = " ".join(variant.own) or "no overrides of its own"
    other = "" if variant.config == study.config else f"config {variant.config}; "
    log(f"study {study.name}: '{run.label}' ({other}{own})")
    run_phases(cfg, resume=run_dir.exists(), log=log, notes=False)  # (run_study said them, once for every run)


def _wait_for_rank_zero() -> None:
    """Under DDP (every rank runs the whole study; only rank 0 writes), the other ranks wait here for rank 0. The
    process group outlives each phase's Trainer, so it exists from the first run's first phase on."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


# ---------------------------------------------------------------------------------------------- summary


def other_settings(results: dict, pcfg: DictConfig) -> dict[str, tuple]:
    """key -> (as evaluated, as the study now asks) for the evaluation settings of ``results`` (a results.json) that
    differ from its phase config's ``eval``: finished phases are not evaluated again on --resume, so raising
    eval.samples in the study file (or evaluate.py --samples into eval/) leaves numbers of other settings."""
    from minilm.eval import applied_extension
    from minilm.eval.report import SETTINGS_READ_BY

    ev = OmegaConf.to_container(pcfg.eval, resolve=True)
    seq_len = int(pcfg.train.seq_len)
    extension = applied_extension(ev["extension"], pcfg.model, seq_len) if ev["extension"] else None
    want = {"lengths": list(ev["lengths"]), "tasks": list(ev["tasks"]), "extension": extension}
    if not want["lengths"]:  # a phase that does not evaluate: evaluate.py chose the lengths, none are asked
        del want["lengths"]
    # each setting that changes a metric of the tasks asked (compare_runs' warnings read the same table); not stride,
    # whose default (L/2) no evaluate.py flag can ask for
    for key, (metrics, _, _) in SETTINGS_READ_BY.items():
        if key != "stride" and set(metrics) & set(want["tasks"]):
            # (seed: the run's, the text measured on; evaluate.py --seed may have chosen other)
            want[key] = int(pcfg.run.seed) if key == "seed" else ev[key]
    if "depths" in want:
        want["depths"] = [float(d) for d in want["depths"]]
    got = dict(results)
    if got.get("extension"):  # recorded before results.json held the filled-in defaults: compare them filled in
        got["extension"] = applied_extension(got["extension"], pcfg.model, int(got.get("train_seq_len") or seq_len))
    return {k: (got[k], v) for k, v in want.items() if k in got and got[k] != v}


def _val_losses(run_dir: Path, phases: list[str]) -> dict[str, Optional[float]]:
    out = {}
    for p in phases:
        f = run_dir / p / COMPLETE
        out[p] = json.loads(f.read_text()).get("val_loss") if f.is_file() else None
    return out


def _short(override: str, width: int = 100) -> str:
    """An override as a table cell: long ones (longrope's lists) cut, in full in study.json."""
    text = " ".join(override.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def mean_sd(values: list) -> Optional[dict]:
    """{mean, sd, n} of the numbers among ``values`` (None: not measured), sd the sample standard deviation (0 for
    one value); None if there are none."""
    xs = [float(x) for x in values if x is not None]
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def _cell(stat: Optional[dict], digits: int, n_seeds: int, sign: str = "") -> str:
    """A mean_sd as a table cell: the mean (``sign="+"``: signed, for differences), with seeds ± sd and (n=k) where
    runs are missing. A mean of one value has no spread: no ± (``± 0.00`` read as seeds that agreed exactly). A
    mean that rounds to zero is written without a sign: ``-0.0000`` (a tiny negative difference) read as a
    difference in one direction, which the digits shown do not say."""
    if stat is None:
        return "–"
    text = f"{stat['mean']:{sign}.{digits}f}"
    if float(text) == 0:
        text = f"{0.0:.{digits}f}"
    if n_seeds > 1:
        if stat["n"] > 1:
            text += f" ± {stat['sd']:.{digits}f}"
        if stat["n"] < n_seeds:
            text += f" (n={stat['n']})"
    return text


def _trained_by(phase_dir: Path) -> Optional[str]:
    """The run.name of the run that trained a finished phase (its config.yaml's; a phase copied from another run keeps
    that run's), None where it cannot be read."""
    try:
        return str(yaml.safe_load((phase_dir / "config.yaml").read_text())["run"]["name"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def evaluated_phase(cfg: DictConfig) -> str:
    """The phase whose evaluation stands for a run of the study: its last evaluating phase (``eval_lengths``), else
    its last phase (where scripts/evaluate.py writes)."""
    names = phase_names(cfg)
    return next((p for p in reversed(names) if phase_config(cfg, p).eval.lengths), names[-1])


def _variant_summary(study: Study, variant: Variant, out_dir: Path, cfgs: dict) -> tuple[dict, dict]:
    """(the variant's study.json entry, its runs' evaluation results by seed). A run's evaluation is its last
    evaluating phase's (the last phase if none evaluates: where scripts/evaluate.py writes), counted once that
    phase has finished: a run stopped after a shared phase holds that phase's evaluation, not the variant's."""
    from minilm.eval import load_results
    from minilm.training.run_checks import is_complete

    runs = [r for r in study_runs(study) if r.variant == variant.name]
    cfg = cfgs[runs[0].label]
    phases = phase_names(cfg)
    pcfgs = {p: phase_config(cfg, p) for p in phases}
    evaluated = evaluated_phase(cfg)
    per_run, by_seed = {}, {}
    labels = {str(c.run.name): label for label, c in cfgs.items()}
    for r in runs:
        # shared: its finished phases another run trained (their config.yaml names that run), as copied, not as this
        # invocation plans: a variant --only left untrained shares nothing yet, one trained with --no-share nothing
        # ever, and one that copied them before a --no-share --resume still holds the copies
        trained_by = {p: _trained_by(out_dir / r.label / p) for p in phases if is_complete(out_dir / r.label, p)}
        copied = [p for p, name in trained_by.items() if name not in (None, cfgs[r.label].run.name)]
        donor = trained_by[copied[0]] if copied else None
        per_run[r.label] = {"seed": r.seed, "shared": {"from": labels.get(donor, donor), "phases": copied} if copied
                            else None, "val_loss": _val_losses(out_dir / r.label, phases)}  # fmt: skip
        if is_complete(out_dir / r.label, evaluated):
            try:
                by_seed[r.seed] = load_results(out_dir / r.label / evaluated / "eval" / "results.json")
            except MinilmError:
                pass  # not evaluated (its evaluation failed, or scripts/evaluate.py has not run)
            else:
                # (each run's own config: the seeds' runs differ in run.seed, which the evaluation reads)
                differ = other_settings(by_seed[r.seed], phase_config(cfgs[r.label], evaluated))
                if differ:
                    per_run[r.label]["evaluated_with_other_settings"] = {k: {"evaluated": a, "study": b}
                                                                         for k, (a, b) in differ.items()}
    results = list(by_seed.values())
    evaluation = {key: {L: mean_sd([res.get(key, {}).get(L) for res in results])
                        for L in sorted({L for res in results for L in res.get(key, {})}, key=int)}
                  for key in SCALARS if any(res.get(key) for res in results)}  # fmt: skip
    entry = {"variant": variant.name, "config": str(variant.config), "overrides": variant.own,
             "runs": per_run, "val_loss": {p: mean_sd([x["val_loss"][p] for x in per_run.values()]) for p in phases},
             "not_validated": [p for p in phases if pcfgs[p].train.val_batches == 0],  # val_loss null by design
             "evaluated_phase": evaluated, "evaluation": evaluation}  # fmt: skip
    return entry, by_seed


def _numbers(entry: dict, results: dict, seed: Optional[int]) -> dict[str, float]:
    """One run's comparable numbers: "val_loss" (of the last phase) and "<metric>@<length>" of its evaluation."""
    run = next((x for x in entry["runs"].values() if x["seed"] == seed), None)
    last = list(run["val_loss"].values())[-1] if run is not None else None
    out = {} if last is None else {"val_loss": last}
    for key, by_length in (results.get(seed) or {}).items():
        if key in SCALARS and isinstance(by_length, dict):
            out.update({f"{key}@{L}": v for L, v in by_length.items() if v is not None})
    return out


def paired_differences(ref: tuple[dict, dict], other: tuple[dict, dict]) -> dict[str, dict]:
    """"val_loss" / "<metric>@<length>" -> mean_sd of (other − reference) over the seeds both have: within a seed
    both share the pretraining and read the same validation and evaluation text, so the paired difference is far
    less noisy than the two means (whose spread across seeds includes which text each seed drew)."""
    seeds = [run["seed"] for run in ref[0]["runs"].values()]
    diffs: dict[str, list] = {}
    for seed in seeds:
        a, b = _numbers(*ref, seed), _numbers(*other, seed)
        for key in a.keys() & b.keys():
            diffs.setdefault(key, []).append(b[key] - a[key])
    return {key: mean_sd(values) for key, values in sorted(diffs.items())}


def _averaged(results: list[dict], entry: dict, out_dir: Path) -> dict:
    """One results dict for compare(): the first run's description, each per-length number the mean over runs."""
    from minilm.eval.report import RETRIEVAL, prompts

    out = dict(results[0])
    for key, by_length in entry["evaluation"].items():
        out[key] = {L: stat["mean"] for L, stat in by_length.items() if stat is not None}
    # every run's lengths, which name compare.md's columns: the first run's alone left out a length only a later seed
    # was evaluated at (a study resumed with new eval_lengths), drawn in compare.png but in no column of compare.md
    out["lengths"] = sorted({int(L) for r in results for L in r.get("lengths", [])})
    # the prompts each mean accuracy counts: those of every run measured there (the first run's alone would
    # understate them, and a reader of compare.md weighs the accuracy by them)
    out["details"] = {task: {L: {"samples": sum(prompts(r, task, L) or 0 for r in results
                                                if r.get(task, {}).get(L) is not None)}
                             for L in out.get(task, {})}
                      for task in RETRIEVAL if task in out}  # fmt: skip
    if len(results) > 1:
        out["run"] = f"{out_dir.resolve() / entry['variant']} (mean of {len(results)} seeds)"  # as results.json's
        # the text of every seed averaged, not the first's alone: compare() warns when two means are of other seeds
        seeds = [r.get("seed") for r in results]
        if None in seeds:  # (an older results.json): not known
            out.pop("seed", None)
        else:
            out["seed"] = sorted(seeds)
    return out


def write_summary(study: Study, out_dir: Path, cfgs: dict, log: Callable[[str], None] = print,
                  extra: Optional[list[str]] = None) -> None:  # fmt: skip
    """study.json and study.md (per variant: what it sets and shares, validation loss per phase, its last
    evaluation; over seeds: mean ± sample sd, and the difference from the first variant paired by seed),
    compare.png / compare.md over the variants' last evaluations (their means). Runs not finished yet count with
    the phases they have finished. ``extra``: the overrides for every variant given on the study's command line
    (recorded: the study file alone does not say how its runs were trained)."""
    from minilm.eval import compare
    from minilm.files import atomic_write_text

    entries, averaged, by_seed = [], [], []
    for v in study.variants:
        entry, results = _variant_summary(study, v, out_dir, cfgs)
        entries.append(entry)
        by_seed.append(results)
        if results:
            averaged.append((v.name, _averaged(list(results.values()), entry, out_dir)))
    for entry, results in zip(entries[1:], by_seed[1:]):  # each variant against the first, seed by seed
        entry["vs_first"] = paired_differences((entries[0], by_seed[0]), (entry, results))
    date = datetime.datetime.now().isoformat("T", "seconds")
    report = {"study": str(study.path), "name": study.name, "date": date, "seeds": study.seeds, "out": str(out_dir),
              "config": str(study.config), "overrides": study.overrides, "command_line_overrides": list(extra or []),
              "variants": entries}  # fmt: skip
    atomic_write_text(out_dir / "study.json", json.dumps(report, indent=2))
    if averaged:
        compare([r for _, r in averaged], [n for n, _ in averaged], out_dir)
    atomic_write_text(out_dir / "study.md", _markdown(study, report, bool(averaged)))
    log(f"study {study.name}: {out_dir / 'study.md'}" + (f", {out_dir / 'compare.png'}" if averaged else ""))


# what study.md says first when each variant trained once: its tables invite reading a ranking into one draw
ONE_SEED = ("**One seed: no difference between the variants below can be called significant.** Each number is one "
            "draw: it also moves with the seed (the initialization, the data drawn, the validation and evaluation "
            "text), and one run per variant gives no spread to weigh a difference against. The tables show each "
            "variant's numbers side by side; to tell a difference from noise, run the study with several seeds "
            "(e.g. `--seeds 1,2,3`): study.md then gives mean ± sd and each variant's difference from the first, "
            "paired by seed.")


def _markdown(study: Study, report: dict, figure: bool) -> str:
    n = len(study.seeds) or 1
    entries = report["variants"]
    seeds = f"seeds {', '.join(map(str, study.seeds))}: mean ± sample sd" if n > 1 else (
        f"seed {study.seeds[0]}" if study.seeds else "one seed (the config's)")
    md = [f"# Study {study.name}", "", f"`{study.path}`, {report['date']}, {seeds}.", ""]
    if n == 1 and len(entries) > 1:  # (with seeds, the paired table at the end gives each difference its spread)
        md += [ONE_SEED, ""]
    # the overrides of every variant, once: each variant's own are in the table's 'own overrides' column
    for what, key in (("The study file's overrides", "overrides"),
                      ("Command-line overrides", "command_line_overrides")):  # fmt: skip
        if report.get(key):
            md += [f"{what} (every variant): " + " ".join(f"`{_short(o)}`" for o in report[key]) + ".", ""]
    phases = list(dict.fromkeys(p for e in entries for p in e["val_loss"]))
    md += ["| variant | own overrides | shared | " + " | ".join(f"val loss {p}" for p in phases) + " |",
           "|---|---|---|" + "---:|" * len(phases)]  # fmt: skip
    for e in entries:
        first = next(iter(e["runs"].values()))["shared"]
        shared = f"{', '.join(first['phases'])} from {first['from'].split('/')[0]}" if first else "–"
        cells = ["no validation" if p in e["not_validated"] else _cell(e["val_loss"].get(p), 4, n) for p in phases]
        own = [f"`{_short(o)}`" for o in e["overrides"]]
        if e["config"] != report.get("config"):  # a variant that starts from another config: which
            own.insert(0, f"config `{os.path.relpath(e['config'], Path(report['study']).resolve().parent)}`")
        md.append(f"| {e['variant']} | {'<br>'.join(own) or '–'} | {shared} | " + " | ".join(cells) + " |")
    # (a last phase that does not evaluate, eval_lengths: []: the numbers are of the last one that does)
    evaluated = list(dict.fromkeys(e["evaluated_phase"] for e in entries))
    which = ("last phase's evaluation" if all(e["evaluated_phase"] == list(e["val_loss"])[-1] for e in entries)
             else f"phase {evaluated[0]}'s evaluation" if len(evaluated) == 1
             else "evaluation of " + ", ".join(f"{e['variant']}: {e['evaluated_phase']}" for e in entries))  # fmt: skip
    for key in SCALARS:
        lengths = sorted({L for e in entries for L in e["evaluation"].get(key, {})}, key=int)
        if not lengths:
            continue
        md += ["", f"## {key} at each length ({which})", "",
               "| variant | " + " | ".join(lengths) + " |", "|---|" + "---:|" * len(lengths)]  # fmt: skip
        for e in entries:
            stats = e["evaluation"].get(key, {})
            md.append(f"| {e['variant']} | " + " | ".join(_cell(stats.get(L), 2, n) for L in lengths) + " |")
    other = [(e["evaluated_phase"], label, run["evaluated_with_other_settings"]) for e in entries
             for label, run in e["runs"].items() if run.get("evaluated_with_other_settings")]  # fmt: skip
    if other:
        md += ["", "## Evaluated with other settings than the study asks", "",
               "Finished phases are not evaluated again (on --resume, or after scripts/evaluate.py wrote into their "
               "eval/): these runs' numbers above are of other settings. The command after each measures them as "
               "the study asks; then `--resume` the study again for its tables.", ""]  # fmt: skip
        for phase, label, differ in other:
            what = "; ".join(f"{k} {json.dumps(d['evaluated'])} (study: {json.dumps(d['study'])})"
                             for k, d in differ.items())  # fmt: skip
            run = f"{report['out']}/{label}"  # (quoted: an --out with a space broke the command at it)
            md.append(f"- {label}: {what}: `python scripts/evaluate.py --run {shlex.quote(run)} --phase {phase}"
                      f"{_evaluate_flags(differ, f'{run}/{phase}')}`")
    if n > 1 and len(entries) > 1:
        md += _paired_table(entries, n)
    if figure:
        md += ["", "![compare](compare.png)"]
    return "\n".join(md) + "\n"


def _evaluate_flags(differ: dict, phase_dir: str) -> str:
    """The scripts/evaluate.py flags that set each differing setting to the study's value (the run's saved config,
    which evaluate.py reads, still holds the settings it was trained with). An --extension would be written beside
    eval/, so then --out names eval/ itself."""

    def extension(v):  # values as YAML scalars / flow lists without spaces, one shell word each
        params = [f"{k}={json.dumps(x, separators=(',', ':'))}" for k, x in v.items() if k != "name"] if v else []
        return " ".join([v["name"], *params]) if v else "none"

    from minilm.eval.report import SETTINGS_READ_BY

    flags = {"lengths": lambda v: f"--lengths {','.join(map(str, v))}", "tasks": lambda v: f"--tasks {','.join(v)}",
             "depths": lambda v: f"--depths {','.join(f'{d:g}' for d in v)}",
             "extension": lambda v: f"--extension {extension(v)} --out {shlex.quote(f'{phase_dir}/eval')}"}  # fmt: skip

    def flag(key, value):  # a number: the flag SETTINGS_READ_BY names for it
        return flags[key](value) if key in flags else f"{SETTINGS_READ_BY[key][2]} {value}"

    return "".join(" " + flag(k, d["study"]) for k, d in differ.items())


def _paired_table(entries: list[dict], n: int) -> list[str]:
    """Each variant minus the first, seed by seed (mean ± sample sd of the differences): last phase's validation
    loss and perplexity per length (study.json has every metric)."""
    first = entries[0]["variant"]
    ppl = sorted({k.split("@")[1] for e in entries[1:] for k in e.get("vs_first", {}) if k.startswith("ppl@")},
                 key=int)  # fmt: skip
    # (the first variant's last phase named only where it is every variant's: one from another config may end in
    # another phase, whose loss _numbers takes)
    lasts = {list(e["val_loss"])[-1] for e in entries}
    last = lasts.pop() if len(lasts) == 1 else "(each variant's last phase)"
    md = ["", f"## Difference from {first}, paired by seed", "",
          f"Within a seed every variant shares {first}'s pretraining (where it can) and reads the same validation "
          "and evaluation text, so these differences are much less noisy than the means above. Negative = better "
          f"than {first}.", "",
          _row(["variant", f"val loss {last}", *(f"ppl {L}" for L in ppl)]),
          "|---|---:|" + "---:|" * len(ppl)]  # fmt: skip
    for e in entries[1:]:  # (cells joined: with no ppl column, a trailing empty one broke the table's markdown)
        d = e.get("vs_first", {})
        md.append(_row([e["variant"], _cell(d.get("val_loss"), 4, n, "+"),
                        *(_cell(d.get(f"ppl@{L}"), 2, n, "+") for L in ppl)]))  # fmt: skip
    return md


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"
