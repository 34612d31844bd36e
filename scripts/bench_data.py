#!/usr/bin/env python
"""Benchmark data preparation and sampling on the embedded corpus (or a config's sources).

    OMP_NUM_THREADS=1 python scripts/bench_data.py [--config X] [--num-proc N] [--out benchmarks/results] [--tag TAG]
        [key.sub=value ...] [--debug]

Prepares the corpus from scratch in a temporary cache directory (so nothing is reused), then reports reading,
tokenizer training and tokenization times, documents/s and tokens/s of tokenization, and the sampler's
batches/s at a few sequence lengths. The numbers in docs/data.md come from this script. Besides printing them it
writes ``<out>/<date>-cpu-<run.name>-data[-<tag>].{json,md}`` (as scripts/benchmark.py names its files): the
measurements with the date, the machine (CPU, the CPUs visible, the load average) and the versions of Python,
torch, sentencepiece and datasets; the markdown is the table docs/data.md shows. Bad input (a bad ``--tag``, an
``--out`` that cannot be written, a config error): message, exit code 2, before anything is measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/benchmark.py, for its result-file tools

REPO = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpus_visible() -> int:
    """The CPUs this process may run on, as ``nproc`` counts them (its affinity: taskset, a SLURM job's or a
    container's cpuset); ``os.cpu_count()`` counts the machine's (under ``taskset -c 0`` on 2 cores: 2, nproc 1)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity to ask: macOS, Windows)
        return os.cpu_count() or 1


def parser() -> argparse.ArgumentParser:
    from benchmark import file_tag  # (scripts/benchmark.py: the same rule for the result files' names)
    from minilm.cli import add_config_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_args(ap, required=False)  # without --config: the schema defaults (the embedded corpus)
    ap.add_argument("--num-proc", type=int, default=None, help="tokenization threads (default: data.num_proc)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="folder for the JSON and markdown")
    ap.add_argument("--tag", type=file_tag, default="", help="appended to the result files' names")
    return ap


def main(argv: list[str] | None = None) -> int:
    from minilm.cli import run_cli

    def command(args) -> None:  # (run_cli takes what it returns for the exit code)
        bench(args.config, args.overrides, args.num_proc, Path(args.out), args.tag)

    return run_cli(command, parser(), argv)


def _rate(n: float, seconds: float) -> float | None:
    """``n / seconds``; None where a tiny corpus took 0.00 s (the stats round to 10 ms)."""
    return n / seconds if seconds > 0 else None


def _per_s(n: float, seconds: float, spec: str = ",.0f") -> str:
    """``n / seconds`` formatted; a tiny corpus can take 0.00 s (the stats round to 10 ms)."""
    rate = _rate(n, seconds)
    return format(rate, spec) if rate is not None else "n/a (under 10 ms)"


def bench(config: str | None, overrides: list[str], num_proc: int | None, out: Path, tag: str = "") -> dict:
    """Measure, print and write the report (``<out>/<date>-cpu-<run.name>-data[-<tag>].{json,md}``); returns it."""
    from minilm.config import load_config
    from minilm.data import load_corpus
    from minilm.training.run_checks import check_writable_dir

    check_writable_dir(out, "--out")  # before minutes of measuring, not after them
    with tempfile.TemporaryDirectory(prefix="bench_data-") as tmp:
        given = list(overrides)
        overrides = given + [f"data.cache_dir={tmp}"]
        if num_proc is not None:  # 0 or less is refused by the config's check, not silently ignored
            overrides.append(f"data.num_proc={num_proc}")
        cfg = load_config(config, overrides)
        now = datetime.datetime.now(datetime.timezone.utc)
        t0 = time.time()
        corpus = load_corpus(cfg.data, progress=False)
        report = _preparation(cfg, corpus, time.time() - t0, now)
        report.update(config=config or "(defaults)", config_name="-".join(x for x in (cfg.run.name, "data", tag) if x),
                      overrides=given)  # fmt: skip
        report["sampler"] = _sampler_rows(cfg, corpus)
    _write(report, out, now)
    return report


def _preparation(cfg, corpus, wall: float, now: datetime.datetime) -> dict:
    """The machine and the corpus preparation's measurements (printed, and as the report's fields)."""
    import torch

    from benchmark import device_info, package_version

    device_name, slug = device_info(torch.device("cpu"))
    st = corpus.stats
    docs = st["train"]["docs"] + st["val"]["docs"]
    tokens = st["train"]["tokens"] + st["val"]["tokens"]
    tok_s = st["tokenize_seconds"]
    print(f"machine: {cpus_visible()} CPUs visible (nproc), {cpu_name()}, Python {platform.python_version()}")
    print(f"corpus: {docs} docs, {st['chars'] / 1e6:.1f} M chars, {tokens / 1e6:.2f} M tokens, "
          f"vocab {corpus.tokenizer.vocab_size}, num_proc {cfg.data.num_proc}")  # fmt: skip
    sample = min(cfg.data.tokenizer.sample_chars, st["chars"])  # the setting is an upper bound
    print(f"prepare (wall): {wall:.1f} s = read {st['read_seconds']} s + tokenizer training "
          f"{st['tokenizer_seconds']} s ({sample / 1e6:.1f} M chars sample) + tokenize "
          f"{tok_s} s + write")  # fmt: skip
    print(f"tokenize: {_per_s(docs, tok_s)} docs/s, {_per_s(tokens, tok_s)} tokens/s, "
          f"{_per_s(st['chars'] / 1e6, tok_s, '.2f')} M chars/s")  # fmt: skip
    cpu = st["tokenize_cpu_seconds"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"tokenize CPU time: {cpu} s over all threads ({_per_s(tokens, cpu)} tokens per CPU-second; on an idle "
          f"machine with {cfg.data.num_proc} free cores expect about {cpu / cfg.data.num_proc:.1f} s wall); "
          f"load average now {load:.1f}")  # fmt: skip
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "device": "cpu",
        "device_name": device_name,
        "device_slug": slug,
        "cpus_visible": cpus_visible(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average": None if load != load else round(load, 2),  # (NaN: no load average on this platform)
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sentencepiece": package_version("sentencepiece"),
        "datasets": package_version("datasets"),
        "num_proc": cfg.data.num_proc,
        "vocab_size": corpus.tokenizer.vocab_size,
        "docs": docs,
        "chars": st["chars"],
        "tokens": tokens,
        "tokenizer_sample_chars": sample,
        "prepare_wall_s": round(wall, 2),
        "read_s": st["read_seconds"],
        "tokenizer_s": st["tokenizer_seconds"],
        "tokenize_s": tok_s,
        "tokenize_cpu_s": cpu,
        "tokenize_docs_per_s": _rounded(_rate(docs, tok_s)),
        "tokenize_tokens_per_s": _rounded(_rate(tokens, tok_s)),
        "tokenize_tokens_per_cpu_s": _rounded(_rate(tokens, cpu)),
    }


def _sampler_rows(cfg, corpus) -> list[dict]:
    """The sampler's batches per second at 256 and 4096 tokens (batch 16, document masks), printed and as rows; a
    setting the corpus cannot fill is a skipped row."""
    from omegaconf import OmegaConf

    from minilm.data import make_sampler
    from minilm.errors import MinilmError

    rows = []
    for seq_len, long_fraction in ((256, 0.0), (4096, 0.0), (4096, 0.5)):
        data = cfg.data.copy()
        OmegaConf.set_readonly(data, False)
        data.long_fraction, data.document_mask, data.restart_positions = long_fraction, True, True
        label = f"sampler seq_len {seq_len} long_fraction {long_fraction} batch 16 (doc mask)"
        row = {"seq_len": seq_len, "long_fraction": long_fraction, "batch_size": 16}
        rows.append(row)
        try:
            s = make_sampler(corpus, "train", data, seq_len, 16, 0, "bench")
        except MinilmError as e:  # a small corpus has no batch of 16 x 4096 or no 4096-token document
            print(f"{label}: skipped, the corpus does not fit it ({e})")
            row.update(status="skipped", reason=str(e))
            continue
        n, t1 = 50, time.time()
        for i in range(n):
            s.batch(i)
        dt = time.time() - t1
        print(f"{label}: {n / dt:,.0f} batches/s, {n * 16 * seq_len / dt / 1e6:.2f} M tokens/s")
        row.update(status="ok", batches_per_s=round(n / dt, 1), tokens_per_s=round(n * 16 * seq_len / dt))
    return rows


def _write(report: dict, out: Path, now: datetime.datetime) -> None:
    from benchmark import result_stem
    from minilm.files import atomic_write_text

    stem = result_stem(report, out, now)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(f"{stem}.json"), json.dumps(report, indent=2) + "\n")  # (with_suffix cut a tag "v1.5")
    atomic_write_text(Path(f"{stem}.md"), f"# Data preparation: {report['config_name']} on {report['device_name']}\n\n"
                                          f"{markdown_table(report)}")  # fmt: skip
    print(f"wrote {stem}.json and .md")


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 1)


def _rate_text(value: float | None, unit: str) -> str:
    return f"{value:,.0f} {unit}" if value is not None else "n/a (under 10 ms)"


def markdown_table(report: dict) -> str:
    """The measurements as docs/data.md's "Measured speed" table, under a line saying on what they were taken."""
    r = report
    load = f"{r['load_average']:.1f}" if r["load_average"] is not None else "unknown"
    head = (f"Machine: {r['device_name']} · {r['cpus_visible']} CPUs visible (nproc) · OMP_NUM_THREADS "
            f"{r['omp_num_threads'] or 'unset'} · load average {load} · Python {r['python']} · torch {r['torch']} · "
            f"sentencepiece {r['sentencepiece']} · datasets {r['datasets']} · {r['date']} · config `{r['config']}` "
            f"{' '.join(r['overrides'])} · data.num_proc {r['num_proc']}, vocab {r['vocab_size']}")  # fmt: skip
    lines = [head, "", f"| measurement ({r['docs']} docs, {r['chars'] / 1e6:.1f} M chars, {r['tokens'] / 1e6:.2f} M "
             f"tokens) | value |", "|---|---|",
             f"| tokenization CPU time (all threads) | {r['tokenize_cpu_s']} s → "
             f"{_rate_text(r['tokenize_tokens_per_cpu_s'], 'tokens per CPU-second')} |",
             f"| tokenization wall | {r['tokenize_s']} s → {_rate_text(r['tokenize_docs_per_s'], 'docs/s')}, "
             f"{_rate_text(r['tokenize_tokens_per_s'], 'tokens/s')} |",
             f"| tokenizer training on the {r['tokenizer_sample_chars'] / 1e6:.1f} M-char sample | "
             f"{r['tokenizer_s']} s |",
             f"| whole preparation (read + train + tokenize + write) | {r['prepare_wall_s']:.1f} s (read "
             f"{r['read_s']} s) |"]  # fmt: skip
    for row in r["sampler"]:
        what = (f"sampler, seq_len {row['seq_len']}, long_fraction {row['long_fraction']}, batch "
                f"{row['batch_size']} with doc mask + positions")
        value = (f"{row['batches_per_s']:,.0f} batches/s, {row['tokens_per_s'] / 1e6:.2f} M tokens/s"
                 if row["status"] == "ok" else f"skipped: {row['reason']}")  # fmt: skip
        lines.append(f"| {what} | {value} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
