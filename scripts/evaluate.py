#!/usr/bin/env python
"""Evaluate a trained run: perplexity vs length, passkey / needle / key-value retrieval, figures and a report.

    python scripts/evaluate.py runs/tiny                                         # eval.lengths, or L/2 .. 8L
    python scripts/evaluate.py --run runs/rope_yarn_tiny --phase pretrain --lengths 128,256,512,1024
    python scripts/evaluate.py --run runs/tiny --lengths 256,512,1024 --extension dynamic factor=4
    python scripts/evaluate.py --run runs/tiny --extension self_extend group_size=4 window=64 --tasks ppl,passkey
    python scripts/evaluate.py --run runs/tiny --tasks ppl,passkey,needle,kv --samples 16 --out /tmp/eval

The run comes first or as ``--run RUN`` (the same). --extension takes a training-free method (logn, rerope,
self_extend, dca, rope_scaling) or a RoPE scaling rope_type (linear, ntk, dynamic, yarn, dynamic_yarn, llama3, ...)
with its parameters as key=value (``original_max_position_embeddings`` and logn's ``train_len`` default to the
training length).

Writes results.json, report.md and PNG figures to RUN/PHASE/eval[-METHOD]/ (a step checkpoint's to
RUN/PHASE/eval-step-NNNNNNNN[-METHOD]/; or --out) and logs scalars
``eval/ppl@L``, ``eval/passkey@L``, ... and the figures to RUN/tb (with --out: OUT/tb) at the weights' global step.
See docs/evaluation.md. Bad input: one message, exit code 2 (--debug for a traceback).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import add_run_args, once_parser, one_run, run_cli  # noqa: E402

# evaluate_run's arguments as this script's user gives them: an error about one names the flag (a value from the run's
# config keeps its key, eval.samples)
FLAGS = {"lengths": "--lengths", "tasks": "--tasks", "depths": "--depths", "samples": "--samples",
         "needles": "--needles", "batches": "--batches", "batch_tokens": "--batch-tokens", "stride": "--stride",
         "seed": "--seed", "device": "--device", "out": "--out"}  # fmt: skip


def _items(s: str, kind: str) -> list[str]:
    """The comma-separated items of ``s``; none at all is an error (an empty list would silently mean 'the
    config's value')."""
    items = [x.strip() for x in s.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind}, got {s!r}")
    return items


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in _items(s, "integers")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in _items(s, "numbers")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _names(s: str) -> list[str]:
    return _items(s, "names")


def main(args: argparse.Namespace) -> int:
    from minilm.errors import ConfigError
    from minilm.eval import evaluate_run, extension_from_flag

    one_run(args, "run", "evaluate.py RUN")
    extension = extension_from_flag(args.extension)  # (a bad one is refused before the run is read)

    changes = {"samples": args.samples, "depths": args.depths, "batches": args.batches, "seed": args.seed,
               "batch_tokens": args.batch_tokens, "stride": args.stride, "needles": args.needles}  # fmt: skip
    if args.no_sliding:
        if args.stride is not None:  # (a config may keep eval.stride while eval.sliding is off: not refused there)
            raise ConfigError("--stride: sets the sliding-window perplexity's stride, which --no-sliding skips; give "
                              "one of them")  # fmt: skip
        changes["sliding"] = False
    # --extension as typed: an error about it after the run is read begins with it, as extension_from_flag's do
    names = {**FLAGS, "extension": " ".join(["--extension", *(args.extension or [])])}
    _, out = evaluate_run(
        args.run,
        args.phase,
        lengths=args.lengths,
        tasks=args.tasks,
        extension=extension,
        out=args.out,
        device=args.device,
        tensorboard=not args.no_tb,
        names=names,
        **changes,
    )
    print(f"report: {out / 'report.md'}")  # (where nothing could be measured, evaluate_run raised: nothing written)
    return 0


def parser() -> argparse.ArgumentParser:
    p = once_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    usage="%(prog)s RUN [options]   (or --run RUN)")  # fmt: skip
    add_run_args(p, "run", "RUN", "run directory, phase directory or weights file")
    p.add_argument("--phase", help="evaluate this phase's weights (default: the run's final weights)")
    p.add_argument("--lengths", type=_ints, help="comma-separated context lengths, e.g. 256,512,1024")
    p.add_argument("--tasks", type=_names,
                   help="comma-separated: ppl,passkey,needle,kv (default: eval.tasks)")  # fmt: skip
    p.add_argument("--extension", nargs="+", metavar="METHOD [k=v]",
                   help="training-free method or rope_type + params; none: without the config's eval.extension")
    p.add_argument("--depths", type=_floats, help="comma-separated needle depths in [0, 1]")
    p.add_argument("--samples", type=int, help="retrieval samples per (length, depth)")
    p.add_argument("--needles", type=int, help="needles per needle prompt (1 asked + distractors)")
    p.add_argument("--batches", type=int, help="perplexity: batches of windows per length")
    p.add_argument("--batch-tokens", type=int, help="tokens per forward pass")
    p.add_argument("--stride", type=int,
                   help="sliding-window stride (default length/2); measures ppl_sliding even where the run's config "
                        "has eval.sliding: false")  # fmt: skip
    p.add_argument("--no-sliding", action="store_true", help="skip the sliding-window perplexity")
    p.add_argument("--seed", type=int, help="draws the perplexity windows and retrieval prompts (default: run.seed)")
    p.add_argument("--out", help="output directory (default RUN/PHASE/eval[-METHOD])")
    p.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda when available)")
    p.add_argument("--no-tb", action="store_true", help="do not log to TensorBoard (the run's tb/, or OUT/tb/)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
