"""A study: several variants of one experiment, trained one after another and compared in one table and figure.

A study file (``configs/studies/*.yaml``) names a config every variant starts from and, per variant, what differs,
as command-line overrides::

    config: ../rope_yarn_tiny.yaml           # relative to the study file
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

At the end, ``<out>/study.md`` and ``study.json`` hold one row per variant (what it sets, what it shared, the
validation loss after each phase) and, from each variant's last evaluation, ``compare.png`` / ``compare.md``
(minilm.eval.compare). A study stopped at any moment continues with ``--resume``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import yaml
from omegaconf import DictConfig, OmegaConf

from minilm.config import load_config, phase_config, phase_names
from minilm.errors import ConfigError, MinilmError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class Variant:
    name: str
    config: Path  # the config it starts from
    overrides: list[str] = field(default_factory=list)  # the study's common overrides, then its own


@dataclass
class Study:
    path: Path
    name: str
    variants: list[Variant]


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
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the study file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a study must be a mapping with 'config' and 'variants'")
    unknown = sorted(set(raw) - {"name", "config", "overrides", "variants"})
    if unknown:
        raise ConfigError(f"{path}: unknown key '{unknown[0]}'; a study takes: name, config, overrides, variants")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{path}: name: letters, digits, '_', '-', '.' expected, got {name!r}")
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
        if isinstance(spec, dict):
            extra = sorted(set(spec) - {"config", "overrides"})
            if extra:
                raise ConfigError(f"{where}: unknown key '{extra[0]}'; a variant takes: config, overrides")
            vconfig = _config_path(path, spec["config"], f"{where}.config") if "config" in spec else config
            out.append(Variant(vname, vconfig, common + _overrides(spec.get("overrides"), f"{where}.overrides")))
        else:
            out.append(Variant(vname, config, common + _overrides(spec, where)))
    return Study(path, name, out)


def variant_config(study: Study, variant: Variant, out_dir: Path, extra: list[str]) -> DictConfig:
    """The variant's resolved config, its run directory ``out_dir/<variant>``. ``extra``: overrides for every
    variant from the command line (after the study's own)."""
    run = [f"run.name={variant.name}", f"run.dir={out_dir / variant.name}"]
    try:
        return load_config(variant.config, variant.overrides + list(extra) + run)
    except ConfigError as e:
        raise ConfigError(f"{study.path}: variant '{variant.name}': {e}") from None


# ------------------------------------------------------------------------------------------ shared phases


def phase_keys(cfg: DictConfig) -> list[str]:
    """One string per phase that is equal for two configs exactly when they train that phase and every earlier
    one alike: the model they are built with, and per phase its name, resolved config (without run.name and
    run.dir) and whether it carries the optimizer over."""
    keys, parts = [], [OmegaConf.to_yaml(cfg.model, resolve=True)]
    for name in phase_names(cfg):
        pcfg = OmegaConf.to_container(phase_config(cfg, name), resolve=True)
        pcfg["run"].pop("name"), pcfg["run"].pop("dir")
        carry = bool(name in cfg.phases and cfg.phases[name].carry_optimizer)
        parts.append(yaml.safe_dump({"phase": name, "carry_optimizer": carry, "config": pcfg}, sort_keys=True))
        keys.append("\n".join(parts))
    return keys


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


def copy_finished_phase(src: Path, dst: Path) -> None:
    """A finished phase directory (weights, config, optimizer moments, evaluation, complete.json) into another
    run, without its checkpoints; through a temporary name, so that an interruption leaves no half phase."""
    if not (src / "complete.json").is_file():
        raise MinilmError(f"{src}: the shared phase has not finished; run the study with --resume")
    tmp = dst.with_name(dst.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("checkpoints"), copy_function=_link_or_copy)
    shutil.rmtree(dst, ignore_errors=True)  # an unfinished phase of the same name, from an interrupted copy or run
    tmp.rename(dst)


# ---------------------------------------------------------------------------------------------- running


def run_study(study: Study, out_dir: Path, *, extra: tuple[str, ...] = (), resume: bool = False, share: bool = True,
              only: Optional[list[str]] = None, log: Callable[[str], None] = print) -> Path:  # fmt: skip
    """Train every variant (or ``only`` those) in study order, then write the summary. Returns ``out_dir``."""
    from minilm.training.phases import is_complete, is_primary_process, phase_dir, run_phases

    names = [v.name for v in study.variants]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise MinilmError(f"--only {unknown[0]}: no such variant in {study.path}; variants are: {', '.join(names)}")
    cfgs = {v.name: variant_config(study, v, out_dir, list(extra)) for v in study.variants}  # all checked first
    if not resume and any((out_dir / n).exists() for n in names if not only or n in only):
        raise MinilmError(f"{out_dir} already holds this study's runs; continue it with --resume, or choose --out")
    plan = plan_sharing({n: phase_keys(c) for n, c in cfgs.items()}) if share else {}
    for v in study.variants:
        n = v.name
        if only and n not in only:
            continue
        cfg, run_dir = cfgs[n], out_dir / n
        if n in plan and is_primary_process():
            donor, k = plan[n]
            shared = phase_names(cfg)[:k]
            if not all(is_complete(out_dir / donor, p) for p in shared):
                raise MinilmError(f"variant '{n}' shares {', '.join(shared)} with '{donor}', which has not finished "
                                  f"them in {out_dir / donor}; run that variant first (or all: drop --only)")  # fmt: skip
            for p in shared:
                if not is_complete(run_dir, p):
                    copy_finished_phase(phase_dir(out_dir / donor, p), phase_dir(run_dir, p))
            log(f"study {study.name}: variant '{n}' starts from '{donor}' after {', '.join(shared)}")
        log(f"study {study.name}: variant '{n}' ({' '.join(v.overrides) or 'the config as is'})")
        run_phases(cfg, resume=run_dir.exists(), log=log)
    if is_primary_process():
        write_summary(study, out_dir, cfgs, plan, log)
    return out_dir


# ---------------------------------------------------------------------------------------------- summary


def _val_losses(run_dir: Path, phases: list[str]) -> dict[str, Optional[float]]:
    out = {}
    for p in phases:
        f = run_dir / p / "complete.json"
        out[p] = json.loads(f.read_text()).get("val_loss") if f.is_file() else None
    return out


def _short(override: str, width: int = 100) -> str:
    """An override as a table cell: long ones (longrope's lists) cut, in full in study.json."""
    text = " ".join(override.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def write_summary(study: Study, out_dir: Path, cfgs: dict, plan: dict, log: Callable[[str], None] = print) -> None:
    """study.json and study.md (one row per variant), compare.png / compare.md over the variants' last
    evaluations. Variants not finished yet appear with what they have."""
    from minilm.eval import compare, load_results
    from minilm.runs import find_results
    from minilm.training.checkpoint import atomic_write_text

    rows, results, labels = [], [], []
    for v in study.variants:
        run_dir, phases = out_dir / v.name, phase_names(cfgs[v.name])
        donor, k = plan.get(v.name, (None, 0))
        rows.append({"variant": v.name, "config": str(v.config), "overrides": v.overrides,
                     "shared": {"from": donor, "phases": phases[:k]} if donor else None,
                     "val_loss": _val_losses(run_dir, phases)})  # fmt: skip
        try:
            results.append(load_results(find_results(run_dir)))
            labels.append(v.name)
        except MinilmError:
            pass  # not evaluated (yet)
    report = {"study": str(study.path), "name": study.name, "date": datetime.datetime.now().isoformat("T", "seconds"),
              "variants": rows}  # fmt: skip
    atomic_write_text(out_dir / "study.json", json.dumps(report, indent=2))
    md = [f"# Study {study.name}", "", f"`{study.path}`, {report['date']}", ""]
    phases = list(dict.fromkeys(p for r in rows for p in r["val_loss"]))
    md += ["| variant | overrides | shared | " + " | ".join(f"val loss {p}" for p in phases) + " |",
           "|---|---|---|" + "---:|" * len(phases)]  # fmt: skip
    for r in rows:
        shared = f"{', '.join(r['shared']['phases'])} from {r['shared']['from']}" if r["shared"] else "–"
        losses = [r["val_loss"].get(p) for p in phases]
        cells = ["–" if x is None else f"{x:.4f}" for x in losses]
        md.append(f"| {r['variant']} | {'<br>'.join(f'`{_short(o)}`' for o in r['overrides']) or '–'} | {shared} | "
                  + " | ".join(cells) + " |")  # fmt: skip
    if results:
        fig, table = compare(results, labels, out_dir)
        body = re.sub(r"^(#+) ", r"#\1 ", Path(table).read_text().strip(), flags=re.M)  # its headings under ours
        md += ["", "Each variant's last evaluation (`compare.png`, `compare.md`):", "", body]
    atomic_write_text(out_dir / "study.md", "\n".join(md) + "\n")
    log(f"study {study.name}: {out_dir / 'study.md'}" + (f", {out_dir / 'compare.png'}" if results else ""))
