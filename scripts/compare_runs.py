#!/usr/bin/env python
"""Overlay the evaluations of several runs in one figure and one table: which encoding / method reaches furthest.

    python scripts/compare_runs.py runs/pos_rope runs/pos_alibi runs/pos_learned --out /tmp/cmp
    python scripts/compare_runs.py runs/tiny/train/eval-dynamic runs/tiny/train/eval-yarn runs/tiny/train/eval

Each argument is a run directory (its last phase's ``eval/``; when that phase has none, the last phase's that
has one, said on stderr), a phase directory (its ``eval/``), an
evaluation directory holding results.json, or a results.json file; run scripts/evaluate.py first (with the same
--lengths for every run, so the table lines up). ``--label`` names the lines (default: run.name/phase[+method], a
study's run named as in its study, by its variant and seed: ``yarn/seed1/extend_2k``; runs of the same name by
their folders, with as many parent directories as it takes to tell them apart; a label or an evaluation given twice
is an error). A study's folder stands for its runs that have finished and have an evaluation (each seed's its own
line; as in the study's own compare.md, which has their means, a run stopped early is left out). Writes
compare.png and compare.md to --out (default: the current directory; not a study's folder, whose compare.png is the
study's own). Evaluations made with different settings that change the numbers (run.seed, --batches, --batch-tokens,
--stride, --samples, --depths, --needles), and perplexities of other tokenizers (another vocabulary size or tokenizer
file) or of other held-out documents, are named in a warning, on stderr and atop compare.md.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import check_home_expanded, once_parser, run_cli  # noqa: E402
from minilm.errors import MinilmError  # noqa: E402


def main(args: argparse.Namespace) -> int:
    from minilm.eval import compare, load_results
    from minilm.eval.report import setting_differences
    from minilm.runs import STUDY_SUMMARY, find_results

    if not args.runs:  # --label (nargs="+") takes every word after it, the runs too when they come after it
        took = f" (--label took all of: {' '.join(args.label)})" if args.label else ""
        raise MinilmError(f"no runs given{took}; write the runs first: compare_runs.py RUN RUN ... --label A B ...")
    check_home_expanded(args.out, "--out")
    if (Path(args.out) / STUDY_SUMMARY).is_file():  # (its study.md shows that compare.png, of the variants' means)
        raise MinilmError(f"--out {args.out}: a study's folder ({STUDY_SUMMARY}), whose compare.png and compare.md are "
                          "the study's own (each variant's mean over its seeds, shown in its study.md); choose "
                          "another --out")  # fmt: skip
    runs, given = map(list, zip(*study_runs(args.runs)))  # (each argument gives one run at least)
    if args.label and len(args.label) != len(runs):
        raise MinilmError(f"--label: give one label per run ({len(runs)}" + (f": {' '.join(map(str, runs))}"
                          if runs != args.runs else "") + f"), got {len(args.label)}")  # fmt: skip
    found = [find_results(Path(r)) for r in runs]
    check_distinct(runs, found, args.label, given)
    for r, path in zip(runs, found):
        if note := earlier_phase_note(Path(r), path):
            print(f"note: {note}", file=sys.stderr)
    results = [moved_run(load_results(path), path) for path in found]
    labels = args.label or distinct_labels(results, runs)
    fig, table = compare(results, labels, Path(args.out))
    print(Path(table).read_text())
    print(f"figure: {fig}\ntable: {table}")
    for warning in setting_differences(results, labels):  # (also at the top of the table) last, where it is seen
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def check_distinct(runs: list, found: list[Path], labels: list[str] | None, given: list | None = None) -> None:
    """Refuse an evaluation given twice (a run named twice, or a run and its study's folder) and a --label given to
    two runs: either drew two lines, and two rows, that a reader cannot tell apart. ``given``: the argument each run
    came from (a study's folder for its runs), which the refusal names."""
    seen: dict[Path, str] = {}
    for run, path, arg in zip(runs, found, given or runs):
        name = str(run) if str(arg) == str(run) else f"{run} (of study {arg})"
        if path.resolve() in seen:
            first = seen[path.resolve()]
            also = "" if first == name else f", also as {first}"
            raise MinilmError(f"{name}: the same evaluation ({path}) given twice{also}; give each run once")
        seen[path.resolve()] = name
    twice = next((label for label in labels or [] if labels.count(label) > 1), None)
    if twice is not None:
        raise MinilmError(f"--label: {twice!r} given twice ({' '.join(labels)}); each run needs its own label, which "
                          "names its line in the figure and its row in the table")  # fmt: skip


def earlier_phase_note(run: Path, found: Path) -> str | None:
    """What to say when a run directory stands for an earlier phase's evaluation than its last phase's (that one
    not evaluated, or its end-of-phase evaluation failed): the line was labelled by that phase, said nowhere else,
    and set beside other runs' last phases, trained at other lengths."""
    from minilm.runs import finish_command, phase_dir_of, phase_finished, run_phase_names
    from minilm.eval.suite import PHASE_ERROR

    if not (run / "config.yaml").is_file() or not found.is_relative_to(run) or phase_dir_of(run) is not None:
        return None  # (a phase directory, with a config.yaml of its own, stands for its own evaluation)
    last = run_phase_names(run)[-1]
    if found.parent == run / last / "eval" or found.parent == run:
        return None
    error = run / last / "eval" / PHASE_ERROR
    if not error.is_file() and not phase_finished(run, last):  # (evaluate.py --run would evaluate an earlier phase)
        return (f"{run}: its last phase '{last}' is not compared: it has not finished training; compared instead: "
                f"phase '{found.parent.parent.name}' ({found}); {finish_command(run, 'finish it')}")
    why = f"its evaluation failed ({error})" if error.is_file() else "it has no evaluation"
    return (f"{run}: its last phase '{last}' is not compared: {why}; compared instead: phase "
            f"'{found.parent.parent.name}' ({found}); scripts/evaluate.py --run {run} evaluates '{last}'")


def moved_run(results: dict, found: Path) -> dict:
    """``results`` (read from ``found``) with its ``run`` the run directory it now lies in, where the one it records
    holds no run any more (runs moved, or copied from the machine that trained them): compare.md named paths that
    were gone, and a study's runs, not found in their study, lost their labels (``yarn-seed1/ext``, not
    ``yarn/seed1/ext``). A relative ``run`` (a results.json of an older minilm recorded it as typed, relative to
    wherever that command ran) is the run directory it lies in too, else the recorded one resolved here: every run
    compare.md lists is an absolute path, as a results.json written now records it."""
    from minilm.runs import run_dir_of

    recorded = results.get("run")
    if not recorded:
        return results
    recorded, here = Path(str(recorded)), run_dir_of(found)
    if here is not None and (not recorded.is_absolute() or not (recorded / "config.yaml").is_file()):
        return {**results, "run": str(here.resolve())}
    if not recorded.is_absolute() and (recorded / "config.yaml").is_file():
        return {**results, "run": str(recorded.resolve())}
    return results


def study_runs(args: list[str]) -> list[tuple]:
    """(run, the argument it came from) for each argument, a study's folder replaced by its runs (as its study.json
    lists them) that have an evaluation: the study's runs compared. A run without one is left out, and said so; so is
    a run that has not finished the phase whose evaluation the study compares (minilm.study.evaluated_phase), or has
    no evaluation of it (its end-of-phase evaluation failed), as the study's own compare.md leaves it out: its earlier
    phase's evaluation stood beside the other variants' last ones."""
    from minilm.config import phase_names
    from minilm.runs import find_results, load_run_config, phase_finished, study_run_dirs
    from minilm.study import evaluated_phase

    out = []
    for arg in args:
        runs = study_run_dirs(Path(arg)) if not (Path(arg) / "config.yaml").is_file() else None
        if runs is None:
            out.append((arg, arg))
            continue
        found = []
        for label, run_dir in runs:
            try:
                of = find_results(run_dir).parent.parent.name  # the phase of its newest evaluation
                cfg = load_run_config(run_dir / "config.yaml")
            except MinilmError:
                print(f"note: {arg}: its run {label} has no evaluation yet; left out", file=sys.stderr)
                continue
            phase, names = evaluated_phase(cfg), phase_names(cfg)
            if not phase_finished(run_dir, phase):
                print(f"note: {arg}: its run {label} has not finished phase '{phase}' yet; left out", file=sys.stderr)
            elif of in names and names.index(of) < names.index(phase):
                print(f"note: {arg}: its run {label} has no evaluation of phase '{phase}' (scripts/evaluate.py --run "
                      f"{run_dir} --phase {phase}); left out", file=sys.stderr)  # fmt: skip
            else:
                found.append(run_dir)
        out += [(run_dir, arg) for run_dir in found]
        if not found:
            raise MinilmError(f"{arg}: a study's folder none of whose runs has finished with an evaluation yet (its "
                              f"runs: {', '.join(label for label, _ in runs)}); run or --resume the study first")
    return out


def distinct_labels(results: list[dict], args: list) -> list[str]:
    """Each evaluation's own label ("<run.name>/<phase>[ + method]"; the run directory's name in a results.json of
    an older minilm), a study's run named by its study label (``yarn/seed1/extend_2k``: its variant and seed, as
    study.json lists it); where several are equal, each lengthened by its run's parent directories until they
    differ, else the argument as given: lines of one name in the legend and the table cannot be told apart."""
    from minilm.runs import study_label

    labels = [r.get("label") or str(a) for r, a in zip(results, args)]
    runs = [Path(str(r.get("run", ""))) for r in results]
    names = [str(r.get("name") or run.name) for r, run in zip(results, runs)]  # what each label starts with
    for j, r in enumerate(results):  # "<run name>/...": the run's name in its study instead
        label = study_label(runs[j]) if r.get("run") and labels[j].startswith(names[j] + "/") else None
        if label:
            labels[j] = label + labels[j][len(names[j]):]
            names[j] = label
    for label in list(labels):
        same = [j for j, other in enumerate(labels) if other == label]
        if len(same) < 2:
            continue
        longer = {j: str(args[j]) for j in same}  # the fallback: a label not of the form <run name>/...
        if all(labels[j].startswith(names[j] + "/") for j in same):
            for depth in range(1, max(len(runs[j].parts) for j in same) + 1):
                tried = {j: "/".join(runs[j].parts[-depth:]).lstrip("/") + labels[j][len(names[j]):] for j in same}
                if len(set(tried.values())) == len(same):
                    longer = tried
                    break
        for j in same:
            labels[j] = longer[j]
    return labels


def parser() -> argparse.ArgumentParser:
    p = once_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    usage="%(prog)s RUN [RUN ...] [--label LABEL [LABEL ...]] [--out OUT]")  # fmt: skip
    # nargs="*": main says what went wrong when --label, given first, took the runs (argparse: "required: runs")
    p.add_argument("runs", nargs="*", help="run / phase / eval directories or results.json files (one at least)")
    p.add_argument("--label", nargs="+", help="one label per run (after the runs: it takes every word after it)")
    p.add_argument("--out", default=".", help="output directory for compare.png and compare.md")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
