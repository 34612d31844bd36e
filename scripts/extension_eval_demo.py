#!/usr/bin/env python
"""Train a tiny RoPE model on CPU at length L, then evaluate it at L and 4L with no fine-tuning: plain
extrapolation vs RoPE scaling applied at evaluation time (dynamic NTK, YaRN, ...) vs the training-free methods.

    OMP_NUM_THREADS=1 python scripts/extension_eval_demo.py                  # L = 64, 300 steps, ~2-3 min
    python scripts/extension_eval_demo.py --seq-len 128 --steps 400 --threads 2

Uses the config's data section (default configs/tiny.yaml: the embedded standard-library corpus, prepared and
cached by ``minilm.data.load_corpus``) and a plain AdamW loop over ``minilm.model.GPT``. The methods are installed
with ``minilm.positions.training_free.install_extension``; none changes a weight.

Measured numbers (shared 2-core CPU, one seed each) are in docs/extension.md, "Measurement"; for example at
``--seq-len 32 --steps 600``, loss on positions >= L of 4L-token sequences: extrapolation 4.130, dynamic NTK 4.117,
YaRN (factor 4) 4.125, ReRoPE 4.058, Self-Extend 4.079.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import run_cli  # noqa: E402
from minilm.config import load_config  # noqa: E402
from minilm.data import load_corpus, make_sampler, validation_batches  # noqa: E402
from minilm.errors import ConfigError  # noqa: E402
from minilm.model import GPT  # noqa: E402
from minilm.positions.training_free import extension  # noqa: E402


def methods(L: int, factor: int) -> dict:
    """name -> (extension name, params) or None for plain RoPE; all set for a model trained at length L."""
    return {
        "extrapolation (plain RoPE)": None,
        f"PI (linear, factor {factor})": ("rope_scaling", {"rope_type": "linear", "factor": factor}),
        f"NTK-aware (ntk, factor {factor})": ("rope_scaling", {"rope_type": "ntk", "factor": factor}),
        "dynamic NTK": ("rope_scaling", {"rope_type": "dynamic", "factor": 1, "original_max_position_embeddings": L}),
        f"YaRN (factor {factor})": (
            "rope_scaling",
            {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L},
        ),
        "dynamic YaRN": ("rope_scaling", {"rope_type": "dynamic_yarn", "original_max_position_embeddings": L}),
        "log-n": ("logn", {"train_len": L}),
        f"ReRoPE (w={L // 2})": ("rerope", {"window": L // 2}),
        f"Self-Extend (G=4, w={L // 2})": ("self_extend", {"group_size": 4, "window": L // 2}),
        f"DCA (chunk={3 * L // 4}, local={L // 16})": ("dca", {"chunk_size": 3 * L // 4, "local_window": L // 16}),
    }


@torch.no_grad()
def evaluate(model: GPT, batches, start: int = 0) -> float:
    """Mean loss (nats/token) over the target positions >= start of every row."""
    total, count = 0.0, 0
    for b in batches:
        loss = model.loss(b["input_ids"], b["targets"], b.get("positions"), b.get("doc_ids"), reduction="none")
        keep = b["targets"][:, start:] != -100
        total += float(loss[:, start:][keep].sum())
        count += int(keep.sum())
    return total / count


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--seq-len", type=int, default=64, help="training length L")
    p.add_argument("--factor", type=int, default=4, help="evaluate at factor·L")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("overrides", nargs="*", help="config overrides (key.sub=value)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(args: argparse.Namespace) -> int:
    # factor 1 left no position past L to score: a ZeroDivisionError after the training
    for key, minimum in (("seq_len", 2), ("factor", 2), ("steps", 1), ("batch_size", 1), ("eval_batches", 1),
                         ("threads", 1)):  # fmt: skip
        if getattr(args, key) < minimum:
            raise ConfigError(f"--{key.replace('_', '-')}: must be >= {minimum}, got {getattr(args, key)}")
    if not (math.isfinite(args.lr) and args.lr > 0):  # a NaN or negative lr: AdamW's ValueError traceback; inf or
        # 0 trained on, to NaN losses or to the untrained model's, as if they were the methods' numbers
        raise ConfigError(f"--lr: must be a finite number > 0, got {args.lr}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    cfg = load_config(args.config, args.overrides)
    L, long = args.seq_len, args.factor * args.seq_len
    t0 = time.time()
    corpus = load_corpus(cfg.data)
    vocab = corpus.tokenizer.vocab_size
    model = GPT(cfg.model, vocab)
    print(f"model: {model.num_params() / 1e6:.2f}M non-embedding params, vocab {vocab}, "
          f"position {dict(cfg.model.position)}")  # fmt: skip
    for spec in methods(L, args.factor).values():  # each method installed once on the untrained model: one that
        if spec is not None:  # cannot apply (a model without RoPE, a bad parameter) fails now, not after training
            with extension(model, spec[0], **spec[1]):
                pass
    print(f"data ready in {time.time() - t0:.0f}s; training at L={L} for {args.steps} steps of {args.batch_size}")

    sampler = make_sampler(corpus, "train", cfg.data, L, args.batch_size, args.seed, "extension_demo")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 10)
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        b = sampler.batch(step)
        loss = model.loss(b["input_ids"], b["targets"], b.get("positions"), b.get("doc_ids"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  ({time.time() - t0:.0f}s)")
    model.eval()

    val = {n: validation_batches(corpus, cfg.data, n, max(1, args.batch_size // 4), args.eval_batches, args.seed)
           for n in (L, long)}  # fmt: skip
    print(f"\nheld-out loss (nats/token), no fine-tuning; trained at L={L}")
    print(f"{'method':44s} {'at L=' + str(L):>10s} {'at ' + str(args.factor) + 'L=' + str(long):>12s}"
          f" {'positions >= L':>15s}")  # fmt: skip
    for label, spec in methods(L, args.factor).items():
        if spec is None:
            scores = evaluate(model, val[L]), evaluate(model, val[long]), evaluate(model, val[long], start=L)
        else:
            with extension(model, spec[0], **spec[1]):
                scores = evaluate(model, val[L]), evaluate(model, val[long]), evaluate(model, val[long], start=L)
        print(f"{label:44s} {scores[0]:10.3f} {scores[1]:12.3f} {scores[2]:15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
