#!/usr/bin/env python
"""Train the variants of a study one after another and compare them: one command for one question.

    python scripts/study.py configs/studies/extension_tiny.yaml              # -> runs/studies/extension_tiny/
    python scripts/study.py configs/studies/extension_tiny.yaml --resume     # continue an interrupted study
    python scripts/study.py STUDY.yaml --only yarn,alibi --out /tmp/s phases.pretrain.steps=50   # for every variant
    python scripts/study.py STUDY.yaml --seeds 1,2,3          # each variant per seed; the tables give mean ± sd

A study file names the config every variant starts from and each variant's overrides (minilm/study.py, and
docs/extension.md "Studies"). Variants whose first phases are identical train them once. At the end
``<out>/study.md`` has a row per variant (its overrides, what it shared, the validation loss after each phase),
and ``compare.png`` / ``compare.md`` overlay each variant's last evaluation (with seeds: their means, and study.md
gives mean ± sample standard deviation and each variant's difference from the first, paired by seed; with one seed
it says that no difference can be called significant). ``tensorboard --logdir <out>`` shows all variants' curves.
"""

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import once_parser, run_cli  # noqa: E402
from minilm.errors import MinilmError  # noqa: E402


def main(args: argparse.Namespace) -> int:
    from minilm.study import check_seeds, load_study, run_study

    study = load_study(args.study)
    if args.seeds is not None:  # given empty ("--seeds ''"), an error: not silently the file's seeds
        study.seeds = check_seeds([_int_or_text(x) for x in args.seeds.split(",")], "--seeds")
    if args.out is not None and not args.out.strip():  # (an unset shell variable): not silently the default --out
        raise MinilmError(f"--out: a directory expected, got {args.out!r}; leave --out out for the default, "
                          f"runs/studies/{study.name}")  # fmt: skip
    out = Path(args.out) if args.out is not None else Path("runs") / "studies" / study.name
    only = None
    if args.only is not None:  # given empty, an error: an empty selection would train every variant
        only = [n.strip() for n in args.only.split(",")]
        if "" in only:  # an empty item ('yarn,', 'yarn,,alibi'): a name went missing, not to be dropped silently
            raise MinilmError(f"--only: comma-separated variant names expected, got {args.only!r} (an empty name); "
                              f"variants are: {', '.join(v.name for v in study.variants)}")
    run_study(study, out, extra=tuple(args.overrides), resume=args.resume, share=not args.no_share, only=only,
              again=_again(args))
    return 0


def _again(args: argparse.Namespace) -> str:
    """This command, continuing the study (--resume): the remedies of its refusals end with it."""
    words = ["python", "scripts/study.py", args.study]
    for flag, value in (("--out", args.out), ("--only", args.only), ("--seeds", args.seeds)):
        if value is not None:  # (--seeds=-1,2: "--seeds -1,2" is a flag without its value to argparse)
            words += [f"{flag}={value}"] if value.startswith("-") else [flag, value]
    words += ["--no-share"] * args.no_share + ["--resume", *args.overrides]
    return shlex.join(words)


def _int_or_text(text: str):
    try:
        return int(text)
    except ValueError:
        return text  # check_seeds names it


def parser() -> argparse.ArgumentParser:
    # (once_parser: --seeds 1,2 ... --seeds 3, a command edited from the shell history, trained seed 3 alone)
    p = once_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", help="a study YAML (configs/studies/*.yaml)")
    p.add_argument("overrides", nargs="*", help="overrides for every variant, e.g. trainer.accelerator=cpu")
    p.add_argument("--out", help="where the variants' run directories go (default runs/studies/<name>)")
    p.add_argument("--resume", action="store_true", help="continue: finished variants and phases are skipped")
    p.add_argument("--only", help="comma-separated variants to train now (the summary covers all finished ones)")
    p.add_argument("--seeds", help="comma-separated seeds: every variant trains once per seed (mean ± sd reported)")
    p.add_argument("--no-share", action="store_true", help="train every variant's phases itself, shared or not")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
