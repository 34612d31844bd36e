#!/usr/bin/env python
"""Export a trained run to a Hugging Face transformers directory (a Llama model) and check its logits.

    python scripts/export_hf.py RUN_DIR_OR_CHECKPOINT OUT_DIR [--phase NAME] [--no-verify]

Writes OUT_DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json, tokenizer.model,
minilm_export.json (the position block it came from)}, which ``transformers.AutoModelForCausalLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load. Before the files are moved into OUT_DIR (unless --no-verify) it loads
them back and prints the largest fp32 logit difference from minilm on random tokens at the training length and at
4x it; above 1e-4 it fails and OUT_DIR is left as it was. RoPE models only (any scaling transformers can express:
default, linear, dynamic, yarn, llama3, longrope; ntk and ntk_by_parts are rewritten exactly); anything else is
refused with a message naming it (exit code 2), as is an OUT_DIR that is a minilm run or phase directory, or any
other non-empty directory that is not an earlier export, and a run directory whose last phase has not
finished (it has no final weights: --phase NAME exports a finished phase). Needs
transformers (pip install -e ".[hf]"). See docs/export.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import check_home_expanded, once_parser, run_cli  # noqa: E402
from minilm.errors import MinilmError  # noqa: E402

TOLERANCE = 1e-4


def main(args: argparse.Namespace) -> int:
    from minilm.export import check_out_dir, check_run_finished, export_model, max_logit_difference
    from minilm.runs import load_run

    check_home_expanded(args.out_dir, "OUT_DIR")
    check_out_dir(Path(args.out_dir))  # a refused OUT_DIR before the run loads (export_model checks it again)
    check_run_finished(args.checkpoint, args.phase)  # an unfinished run has no final weights: --phase picks one
    run = load_run(args.checkpoint, phase=args.phase)
    L = int(run.cfg.train.seq_len)

    def verify(staged: Path) -> None:  # on the staged files: a failure leaves OUT_DIR as it was
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        diffs = max_logit_difference(run.model, staged, [L, 4 * L])
        report = ", ".join(f"T={T}: {d:.2e}" for T, d in diffs.items())
        print(f"max |logit difference| minilm vs transformers (fp32): {report}")
        worst = max(diffs.values())
        if worst > TOLERANCE:
            raise MinilmError(f"exported model differs from minilm by {worst:.2e} > {TOLERANCE} in the logits; "
                              f"nothing written to {args.out_dir}")  # fmt: skip

    out = export_model(run.model, run.cfg, run.tokenizer, args.out_dir, verify=None if args.no_verify else verify)
    print(f"exported {run.weights} -> {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = once_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="run directory, phase directory or model.safetensors")
    p.add_argument("out_dir", help="directory to write: new or empty (created if missing), or an earlier export "
                                   "(replaced)")
    p.add_argument("--phase", help="a phase of the run (default: its final weights)")
    p.add_argument("--no-verify", action="store_true", help="skip loading the export back to compare logits")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
