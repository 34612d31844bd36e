#!/usr/bin/env python
"""Benchmark data preparation and sampling on the embedded corpus (or a config's sources).

    OMP_NUM_THREADS=1 python scripts/bench_data.py [--config X] [--num-proc N] [key.sub=value ...] [--debug]

Prepares the corpus from scratch in a temporary cache directory (so nothing is reused), then reports reading,
tokenizer training and tokenization times, documents/s and tokens/s of tokenization, and the sampler's
batches/s at a few sequence lengths. The numbers in docs/data.md come from this script. Bad input: message,
exit code 2.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


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
    from minilm.cli import add_config_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_args(ap, required=False)  # without --config: the schema defaults (the embedded corpus)
    ap.add_argument("--num-proc", type=int, default=None, help="tokenization threads (default: data.num_proc)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from minilm.cli import run_cli

    return run_cli(lambda args: bench(args.config, args.overrides, args.num_proc), parser(), argv)


def _per_s(n: float, seconds: float, spec: str = ",.0f") -> str:
    """``n / seconds`` formatted; a tiny corpus can take 0.00 s (the stats round to 10 ms)."""
    return format(n / seconds, spec) if seconds > 0 else "n/a (under 10 ms)"


def bench(config: str | None, overrides: list[str], num_proc: int | None) -> None:
    from omegaconf import OmegaConf

    from minilm.config import load_config
    from minilm.data import load_corpus, make_sampler
    from minilm.errors import MinilmError

    with tempfile.TemporaryDirectory(prefix="bench_data-") as tmp:
        overrides = list(overrides) + [f"data.cache_dir={tmp}"]
        if num_proc is not None:  # 0 or less is refused by the config's check, not silently ignored
            overrides.append(f"data.num_proc={num_proc}")
        cfg = load_config(config, overrides)
        t0 = time.time()
        corpus = load_corpus(cfg.data, progress=False)
        wall = time.time() - t0
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
        for seq_len, long_fraction in ((256, 0.0), (4096, 0.0), (4096, 0.5)):
            data = cfg.data.copy()
            OmegaConf.set_readonly(data, False)
            data.long_fraction, data.document_mask, data.restart_positions = long_fraction, True, True
            label = f"sampler seq_len {seq_len} long_fraction {long_fraction} batch 16 (doc mask)"
            try:
                s = make_sampler(corpus, "train", data, seq_len, 16, 0, "bench")
            except MinilmError as e:  # a small corpus has no batch of 16 x 4096 or no 4096-token document
                print(f"{label}: skipped, the corpus does not fit it ({e})")
                continue
            n, t1 = 50, time.time()
            for i in range(n):
                s.batch(i)
            dt = time.time() - t1
            print(f"{label}: {n / dt:,.0f} batches/s, {n * 16 * seq_len / dt / 1e6:.2f} M tokens/s")


if __name__ == "__main__":
    sys.exit(main())
