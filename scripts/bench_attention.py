#!/usr/bin/env python
"""The attention core alone, per encoding and length: forward + backward of rotate + the kernel ladder.

    python scripts/bench_attention.py --config configs/gpt2_small.yaml --lengths 1024,8192 \\
        [--encodings rope,alibi,t5,kerple,fire] [--tokens 16384] [--steps 10] [--warmup 3] [--device cuda|cpu] \\
        [--precision auto|32|bf16-mixed] [--compile|--no-compile] [--no-flex-table] [--flex-table-copies R] \\
        [--flex-split] [--kerple-forwards] [--no-cpu-fp32-backward] [--threads N] \\
        [--out benchmarks/results] [--tag TAG] [--update-docs] [key.sub=value ...]

What differs between encodings is this part of a layer: the projections, the MLP and the loss are the same for
all of them, so scripts/benchmark.py's whole-model ratios dilute it. Per (encoding, length) — length by length:
every encoding at the first length, then the next — this builds layer 0's ``Attention`` of the config with
``model.position.name`` set, random q (B, H, T, Dh), k and v (B, Hkv, T, Dh) that require gradients (bf16
under bf16-mixed, as the projections give them), positions 0..T−1 and a plain causal mask, and times
``pos.rotate`` + ``Attention.attend`` forward and backward (gradients of q, k, v and of the encoding's own
parameters) — on the rung ``Attention.kernel`` names: SDPA, FlexAttention (CUDA), SDPA with the bias as its mask,
or the fp32 reference. B = ``--tokens`` // T (at least 1); by default the config's tokens per micro-batch.
``--compile`` wraps the core in ``torch.compile(dynamic=False)`` in ``train.compile_mode`` (default: off;
FlexAttention's kernel is compiled either way on CUDA). The FlexAttention forms of the learned biases, to measure
what each changes in FlexAttention's backward (CUDA only: the CPU rungs read no tables; scripts/benchmark.py takes
the same flags): ``--no-flex-table`` gives T5 and KERPLE their direct score_mods instead of the per-distance
tables (``flex_distance_table`` in minilm/positions/bias.py); ``--flex-table-copies R`` gives each learned table
(T5's, KERPLE's, FIRE's) R copies that the score elements' atomic adds spread over (``FLEX_TABLE_COPIES``, the same
module); ``--flex-split`` has T5 attend to its near and far keys in two FlexAttention calls merged by their
log-sum-exp (``T5Bias.flex_parts``: atomic adds for the near keys alone); ``--kerple-forwards`` gives KERPLE's r1
and r2 their gradients from two extra FlexAttention forwards in backward, the kernel adding into nothing
(``Kerple.flex_coefficients``). ``--no-cpu-fp32-backward`` gives SDPA
on CPU in bf16 torch's own bf16 backward at every length (``CPU_FP32_BACKWARD_BELOW`` in
minilm/model/attention.py set to 0), to measure where the fp32 one pays.

Reports ms per forward + backward (median), tokens/s, the ratio to RoPE's tokens/s at the same length (when
``rope`` is among the encodings) and peak memory (as scripts/benchmark.py measures it). Writes
``<out>/<date>-<device>-<run.name>-attention[-<tag>].{json,md}`` after every measurement; ``--update-docs`` puts
the table in docs/performance.md. Failures and SIGINT are handled as in scripts/benchmark.py.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/benchmark.py, for its measuring tools

import benchmark as bench  # noqa: E402
import torch  # noqa: E402

from minilm.config import micro_batch_size  # noqa: E402
import minilm.model.attention as attention  # noqa: E402
from minilm.model.attention import AttentionMask  # noqa: E402
from minilm.model.transformer import Block  # noqa: E402
from minilm.training.compile import compiled  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="YAML experiment config (default: the schema defaults)")
    ap.add_argument("--lengths", type=bench.lengths_list, default=None,
                    help="comma-separated sequence lengths (default: train.seq_len)")  # fmt: skip
    ap.add_argument("--encodings", type=bench.names_list, default="rope,alibi,t5,kerple,fire",
                    help="comma-separated model.position.name")  # fmt: skip
    ap.add_argument("--tokens", type=bench.whole_number(1), default=None,
                    help="tokens per step, B = tokens // T (default: config's)")  # fmt: skip
    ap.add_argument("--steps", type=bench.whole_number(1), default=10, help="timed steps per measurement")
    ap.add_argument("--warmup", type=bench.whole_number(0), default=3,
                    help="untimed steps first (compilation happens here)")  # fmt: skip
    ap.add_argument("--precision", default=None, choices=["auto", "32", "bf16-mixed"], help="default: train.precision")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False, help="compile the core")
    bench.add_flex_form_args(ap)
    ap.add_argument("--cpu-fp32-backward", action=argparse.BooleanOptionalAction, default=True,
                    help="SDPA on CPU in bf16 takes its backward in fp32 at short lengths (default) or never")
    ap.add_argument("--threads", type=bench.whole_number(1), default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--device", type=bench.device_name, default=None, help="cuda | cpu (default: cuda when available)")
    ap.add_argument("--out", default=str(bench.REPO / "benchmarks" / "results"), help="folder for JSON and markdown")
    ap.add_argument("--update-docs", action="store_true", help="write the table into docs/performance.md")
    ap.add_argument("--tag", type=bench.file_tag, default="",
                    help="appended to the result files' names and the docs table's key")  # fmt: skip
    ap.add_argument("--note", default="", help="free text stored with the results")
    ap.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
    return ap.parse_intermixed_args(argv)  # overrides may follow flags, as train.py's (minilm.cli.run_cli)


def build_core(cfg, T: int, B: int, device, dtype, do_compile: bool):
    """(step, kernel name): ``step(i)`` runs the core forward and backward once on fixed random inputs."""
    torch.manual_seed(cfg.run.seed)
    attn = Block(cfg.model, 0).attn.to(device)
    H, Hkv, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(B, h, T, Dh, generator=g).to(device, dtype).requires_grad_() for h in (H, Hkv, Hkv))
    grad = torch.randn(B, H, T, Dh, generator=g).to(device, dtype)
    positions, mask = torch.arange(T, device=device).unsqueeze(0), AttentionMask()

    def core(q, k, v):
        qr, kr = attn.pos.rotate(q, k, positions, positions)
        return attn.attend(qr, kr, v, positions, positions, mask)

    # Every measurement starts with no compiled code, compiling the core or not: FlexAttention's kernel is one
    # process-wide torch.compile(flex_attention) (minilm/model/flex.py), static per shape, so the (encoding, length)
    # pairs of a run would pile up in its cache until dynamo's recompile limit (8) left the rest to run
    # flex_attention eagerly (the whole score matrix materialized: another kernel measured, or an OOM at 32K).
    torch._dynamo.reset()
    if do_compile:
        core = compiled(core, cfg.train, dynamic=False)
    leaves = [q, k, v, *attn.parameters()]

    def step(_i):
        core(q, k, v).backward(grad)
        for t in leaves:
            t.grad = None

    return step, attn.kernel(torch.device(device))


def measure(cfg, enc: str, T: int, B: int, args, device, dtype) -> dict:
    row = {"encoding": enc, "seq_len": T, "batch_size": B, "tokens_per_step": B * T}
    with bench.PeakMemory(device) as mem:
        step = None
        try:
            step, row["kernel"] = build_core(cfg, T, B, device, dtype, args.compile)
            times, _ = bench.time_steps(step, args.warmup, args.steps, device)
            row["peak_mem_mb"] = round(mem.peak_bytes() / 2**20, 1)
        except torch.OutOfMemoryError:
            return {**row, "status": "oom", "tokens_per_s": None, "peak_mem_mb": None}
        except Exception as e:  # one encoding's kernel or compiler failure must not lose the others
            row.update(status="error", error=bench._error_text(e), tokens_per_s=None, peak_mem_mb=None)
            bench.raise_if_device_lost(device, row["error"], f"{enc} T={T}", row)
            return row
        finally:
            step = None  # noqa: F841
            bench._free(device)
    ms = 1000 * statistics.median(times)
    return {**row, "status": "ok", "step_ms": [round(1000 * t, 3) for t in times], "ms": round(ms, 3),
            "tokens_per_s": round(1000 * B * T / ms, 1), "memory_kind": mem.kind}  # fmt: skip


def markdown_table(report: dict) -> str:
    head = (
        f"Device: {report['device_name']} · torch {report['torch']} · threads {report['threads']} · precision "
        f"{report['precision']} · compile {bench.compile_text(report)}"
        f"{bench.flex_forms_text(report)}"
        f"{'' if report.get('cpu_fp32_backward', True) else ' · no fp32 backward on CPU'} · "
        f"{report['date']} · config `{report['config']}` "
        f"{' '.join(report['overrides'])}{bench.position_overrides_text(report)} · attention core (rotate + kernel), "
        f"forward + backward, median of "
        f"{report['steps']} after {report['warmup']} warm-up · memory: {report['memory_kind']}"
    )
    if report.get("note"):
        head += f" · {report['note']}"
    if not report["complete"]:
        head += f" · **partial: stopped after {report['measured']} of {report['planned']} measurements**"
    lines = [head, "", "| encoding | kernel | T | B | ms | tokens/s | vs RoPE | peak mem (MB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    rope = {r["seq_len"]: r["tokens_per_s"] for r in report["results"] if r["encoding"] == "rope" and r["tokens_per_s"]}
    for r in report["results"]:
        ok = r["status"] == "ok"
        vs = f"{r['tokens_per_s'] / rope[r['seq_len']]:.2f}×" if ok and r["seq_len"] in rope else "–"
        cells = [r["encoding"], r.get("kernel", "–"), r["seq_len"], r["batch_size"], f"{r['ms']:,.2f}" if ok else
                 r["status"], f"{r['tokens_per_s']:,.0f}" if ok else "–", vs,
                 f"{r['peak_mem_mb']:,.0f}" if r.get("peak_mem_mb") is not None else "–"]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    errors = [f"- {r['encoding']} T={r['seq_len']}: `{r['error']}`" for r in report["results"] if r.get("error")]
    return "\n".join(lines + (["", "Failed:", *errors] if errors else [])) + "\n"


def _print_row(r: dict) -> None:
    if r["status"] == "ok":
        result = f"{r['ms']:10.2f} ms {r['tokens_per_s']:>14,.0f} tok/s  peak {r['peak_mem_mb']:,.0f} MB"
    else:
        result = f"{r['status']} {r.get('error', '')}"
    print(f"{r['encoding']:14s} {r.get('kernel', '?'):9s} T={r['seq_len']:<7d} B={r['batch_size']:<4d} {result}",
          flush=True)  # fmt: skip


def run(args) -> dict:
    base = bench.base_config(args)
    device, precision = bench.device_and_precision(args, base)
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    tokens = args.tokens or micro_batch_size(base.train) * base.train.seq_len
    # length by length (every encoding at the first length, then the next): a run stopped by its time limit keeps
    # whole lengths, each with RoPE to compare against, rather than every length of the first encodings
    planned = bench.plan(args, base)
    lengths = list(dict.fromkeys(T for _, T in planned))
    planned.sort(key=lambda p: lengths.index(p[1]))  # stable: encodings keep their order
    now = datetime.datetime.now(datetime.timezone.utc)
    report = bench.new_report(args, base, device, precision, args.compile, now, len(planned), kind="attention")
    report["cpu_fp32_backward"] = args.cpu_fp32_backward

    def measure_loop(done):
        configs = bench.encoding_configs(args, base)  # every one first: a misspelled encoding is exit 2 at once
        for enc, T in planned:
            row = measure(configs[enc], enc, T, max(1, tokens // T), args, device, dtype)
            report["results"].append(row)
            _print_row(row)
            done()

    # for this run only: set for good, it stayed 0 for every later run of the process (tests, a notebook) while
    # their reports said cpu_fp32_backward True
    below = attention.CPU_FP32_BACKWARD_BELOW if args.cpu_fp32_backward else 0
    with bench.flex_forms(args, report), mock.patch.object(attention, "CPU_FP32_BACKWARD_BELOW", below):
        return bench.run_measurements(report, measure_loop, Path(args.out), now, args.update_docs, markdown_table,
                                      title="Attention core")  # fmt: skip


def main(argv=None) -> int:
    """Exit codes as scripts/benchmark.py's: 0, 1 (a measurement failed), 2 (bad input), 130 (interrupted)."""
    return bench.exit_code(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
