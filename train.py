#!/usr/bin/env python
"""Train a GPT as one YAML describes it: every phase in order, resumable.

    python train.py --config configs/tiny.yaml [key.sub=value ...]
    python train.py --config configs/rope_yarn.yaml --resume        # continue an interrupted run
    python train.py --config configs/rope_yarn.yaml --phase extend_1k --init runs/base   # only some phases
"""

import argparse
import sys

from minilm.cli import Once, add_config_args, run_cli  # noqa: F401 (run_cli is used by tests)


def main(args: argparse.Namespace) -> int:
    from minilm.config import load_config, to_yaml

    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    from minilm.training.phases import run_phases

    run_phases(cfg, resume=args.resume, start_phase=args.phase, init=args.init)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p)
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--resume", action="store_true", help="continue the run in run.dir (finished phases skipped)")
    p.add_argument("--phase", action=Once,
                   help="(re)start at this phase; earlier phases must be finished, or use --init (with --resume: "
                        "continue an interrupted --phase run)")  # fmt: skip
    p.add_argument("--init", action=Once,
                   help="initial weights: a .safetensors / .ckpt file, a phase directory or a run directory")
    return p


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
