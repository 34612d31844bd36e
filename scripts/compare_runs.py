#!/usr/bin/env python
"""Overlay the evaluations of several runs in one figure and one table: which encoding / method reaches furthest.

    python scripts/compare_runs.py runs/rope runs/alibi runs/learned --out /tmp/cmp
    python scripts/compare_runs.py runs/base/extend/eval-dynamic runs/base/extend/eval-yarn runs/base/extend/eval

Each argument is a run directory (its final phase's ``eval/``), a phase directory (its ``eval/``), an
evaluation directory holding results.json, or a results.json file; run scripts/evaluate.py first (with the same
--lengths for every run, so the table lines up). ``--label`` names the lines (default: run/phase[+method]).
Writes compare.png and compare.md to --out (default: the current directory).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import run_cli  # noqa: E402
from minilm.errors import MinilmError  # noqa: E402


def main(args: argparse.Namespace) -> int:
    from minilm.eval import compare, load_results
    from minilm.runs import find_results

    if args.label and len(args.label) != len(args.runs):
        raise MinilmError(f"--label: give one label per run ({len(args.runs)}), got {len(args.label)}")
    results = [load_results(find_results(Path(r))) for r in args.runs]
    labels = args.label or [r.get("label") or str(p) for r, p in zip(results, args.runs)]
    fig, table = compare(results, labels, Path(args.out))
    print(Path(table).read_text())
    print(f"figure: {fig}\ntable: {table}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run / phase / eval directories or results.json files")
    p.add_argument("--label", nargs="+", help="one label per run")
    p.add_argument("--out", default=".", help="output directory for compare.png and compare.md")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
