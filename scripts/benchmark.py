#!/usr/bin/env python
"""Training-step throughput of a config: tokens/s, MFU and peak memory, optionally against a Hugging Face peer.

    python scripts/benchmark.py --config configs/gpt2_small.yaml --lengths 1024,8192 \\
        [--encodings rope,alibi,t5,kerple,fire] [--steps 10] [--warmup 3] [--repeats 1] [--batch-size B] \\
        [--peer [--peer-precision 32|bf16-mixed]] [--peak-tflops 989] [--threads 2] [--precision auto|32|bf16-mixed] \\
        [--compile|--no-compile] [--profile] [--no-flex-table] [--flex-table-copies R] [--flex-split] \\
        [--kerple-forwards] [--trainer] [--out benchmarks/results] [--update-docs] [key.sub=value ...]

One step = forward + backward + gradient clipping + AdamW step on random tokens (B, T) — the work of one
optimizer step of ``train.py`` without Lightning, the data loader and logging. The model is ``GPT(cfg.model, V)``
with V = ``data.tokenizer.vocab_size`` and, per ``--encodings`` entry, ``model.position.name`` set to it (the
encoding's default parameters, and the ``model.position.*`` and ``phases.P.position.*`` overrides it takes:
``model.position.num_buckets=64`` reaches T5 and not RoPE; one that no listed encoding takes is exit 2). Per
sequence length T the batch is ``--batch-size`` or, by default, as many sequences as keep the config's tokens per
micro-batch (``train.micro_batch_size`` · ``train.seq_len``), at least 1.

``--peer`` trains, in the same process, on the same device and the same way (same batch, optimizer, precision,
compile setting), the same-shaped ``transformers.LlamaForCausalLM`` (attn_implementation="sdpa": RMSNorm, SwiGLU,
RoPE, no biases, same d_model / layers / heads / kv heads / FFN width / vocab / tying / RoPE base) and reports
minilm's tokens/s over the peer's. Only for the ``rope`` encoding (the peer has no other; --peer measuring no rope
is an error, and so is a ``model.mlp`` other than swiglu). Needs the ``hf`` extra (transformers). With
``--repeats R`` the two alternate R times, so a shared machine's load falls on both alike; tokens/s always come
from the median step time over all timed steps of all repeats. A second ratio comes from ``paired_ratio``: both
models side by side, one step each in turn, median of the per-pair ratios. ``--peer-precision`` trains the peer in
another precision than minilm: on a CPU, say, minilm at ``auto`` (bf16-mixed where the CPU has AMX or AVX512-BF16)
against the peer in fp32, its faster precision on an AMX Xeon.

MFU (PaLM, Chowdhery et al. 2022, appendix B): model FLOPs per token = 6·N + 12·L·d·T, where
N = the parameters that take part in a matmul — every parameter except the input embedding table, the LM head
counted even when it is tied to the embedding (its matmul costs 2·V·d FLOPs per token forward, as in nanoGPT's
estimate) — L layers, d = d_model, T the sequence length (12·L·d·T: the attention scores and the weighted sum,
forward and backward, counted without the causal halving, as PaLM and nanoGPT do). MFU = FLOPs/token · tokens/s /
peak. Peak: ``--peak-tflops``, by default the device's dense bf16 peak (``PEAK_BF16_TFLOPS``: 989 TFLOP/s for an
H100 or H200 SXM, 756 for an H100 PCIe, 835 for the NVL boards); on CPU and on other devices MFU is reported only
when ``--peak-tflops`` is given.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` from before the model is built to the end of the timed
steps (weights, gradients, AdamW state, activations). On CPU the peak resident set size over the same span minus
the resident size before it (Linux ``VmHWM`` reset through /proc/self/clear_refs; malloc_trim first so memory
freed by an earlier measurement does not hide the growth); it includes allocator slack, so read it as an
estimate. The JSON names which (``memory_kind``).

``--no-flex-table``, ``--flex-table-copies R``, ``--flex-split`` and ``--kerple-forwards`` choose the FlexAttention
forms of the learned biases (CUDA only: T5's and KERPLE's direct score_mods, R copies of every learned table, T5 in
near and far parts, KERPLE's coefficients' gradients by extra forwards; minilm/positions/bias.py,
docs/performance.md "Learned biases in FlexAttention's backward") for every model of the run, to measure on the
whole step what scripts/bench_attention.py measures on the attention core.

``--trainer`` adds a row ``minilm-trainer`` per measurement: the same steps (same model, batches, optimizer,
precision, compile setting) run as a training phase runs them, ``LitGPT`` in a Lightning ``Trainer`` — its
hooks, the batches moved to the device by Lightning, a log every ``train.log_every`` steps (the loop's only reads
from the device) — against the plain loop's row: what ``train.py``'s loop costs beyond the step. The loop runs
ahead of the device between logs, so it is timed whole: each repeat gives one step time, the mean of its
timed steps (no profile for this row).

``--profile`` runs 3 more steps of each measurement under ``torch.profiler`` and writes its table of the operators
and kernels that took the most time (self time on the device: CUDA kernels on a GPU, operators on CPU) to
``<out>/<date>-<device>-<run.name>[-<tag>]-profiles/<impl>-<encoding>-<T>.txt``: where a step's time goes, which
the tokens/s alone do not say. The timed steps are not profiled.

Writes ``<out>/<date>-<device>-<run.name>[-<tag>].json`` and ``.md``; ``--update-docs`` also replaces this device and
config's table in docs/performance.md (between ``<!-- benchmark:KEY -->`` markers; added at the end if absent; a
marker alone, doubled or out of order is exit 2 before the first measurement).
All three are rewritten after every (encoding, length), so a run stopped by SIGINT keeps what it measured
(``"complete": false``, the table marked partial; exit 130). A measurement that raises (a compiler or kernel
failure) becomes a row with status "error" and the message, and the run goes on (exit 1 at the end) — unless the
failure took the CUDA context with it (an illegal memory access): then its row is written, the results are marked
partial and the run stops (exit 1), since every later CUDA call of the process would fail too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import importlib.metadata
import json
import platform
import re
import signal
import statistics
import sys
import threading
import time
import traceback
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from minilm.config import load_config, micro_batch_size  # noqa: E402
from minilm.export import llama_rope_kwargs, llama_shape  # noqa: E402
from minilm.training.compile import compiled  # noqa: E402  (the trainer's torch.compile, train.compile_mode)
from minilm.training.optim import make_adamw  # noqa: E402  (the trainer's optimizer, fused where torch has it)
from minilm.training.precision import cpu_bf16_unit, resolve_precision  # noqa: E402
from minilm.cli import quiet_libraries, set_up_process  # noqa: E402
from minilm.errors import MinilmError  # noqa: E402
from minilm.files import atomic_write_text  # noqa: E402
from minilm.model.transformer import position_hooks  # noqa: E402
from minilm.positions import REGISTRY, validate_position  # noqa: E402
from minilm.positions.base import tightest_limit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "performance.md"
# Dense bf16 tensor-core peaks by device name, the first key the name contains: the PCIe and NVL boards run lower
# clocks and power than the SXM ones ("NVIDIA H100 80GB HBM3"), and the same 989 would understate their MFU.
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H200 NVL": 835.0, "H100": 989.0, "H200": 989.0,
                    "A100": 312.0}  # fmt: skip


# --------------------------------------------------------------------------------------------- arguments


def whole_number(least: int):
    """An argparse ``type``: an int of at least ``least`` (argparse's own message names the option: exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse


def lengths_list(text: str) -> str:
    """An argparse ``type``: comma-separated sequence lengths, each at least 1 (kept as the text)."""
    for item in text.split(","):
        whole_number(1)(item.strip())
    return text


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value < float("inf"):  # (inf gave an MFU of 0.0 % without a word)
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def names_list(text: str) -> str:
    """An argparse ``type``: comma-separated names, none empty (``--encodings ,`` said 'unknown encoding None')."""
    if any(not item.strip() for item in text.split(",")):
        raise argparse.ArgumentTypeError(f"comma-separated names, none of them empty, expected; got {text!r}")
    return ",".join(item.strip() for item in text.split(","))


def file_tag(text: str) -> str:
    """An argparse ``type``: a tag for the result files' names: letters, digits, '.', '_', '-', beginning and ending
    with a letter, digit or '_' (a '/' wrote into a folder of that name; '.' wrote ``...-tiny-..json``)."""
    if not re.fullmatch(r"(\w([\w.-]*\w)?)?", text):
        raise argparse.ArgumentTypeError(f"letters, digits, '.', '_' and '-', beginning and ending with a letter, "
                                         f"digit or '_', expected (it ends the result files' names), got "
                                         f"{text!r}")  # fmt: skip
    return text


def device_name(text: str) -> str:
    """An argparse ``type``: ``cpu``, ``cuda`` or ``cuda:N``."""
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    return text


def add_flex_form_args(ap: argparse.ArgumentParser) -> None:
    """The FlexAttention forms of the learned biases (``flex_forms``), for both benchmark scripts."""
    ap.add_argument("--flex-table", action=argparse.BooleanOptionalAction, default=True,
                    help="T5 and KERPLE read per-distance tables in FlexAttention (default) or their direct form")
    ap.add_argument("--flex-table-copies", type=whole_number(1), default=1,
                    help="copies of each learned Flex table, spreading the backward's atomic adds (default 1)")
    ap.add_argument("--flex-split", action="store_true",
                    help="T5 in two FlexAttention parts, near and far keys (T5Bias.flex_parts)")
    ap.add_argument("--kerple-forwards", action="store_true",
                    help="KERPLE's r1, r2 take their gradients from two extra FlexAttention forwards, not the "
                         "kernel's atomic adds (Kerple.flex_coefficients)")  # fmt: skip


@contextlib.contextmanager
def flex_forms(args, report: dict):
    """The learned biases' FlexAttention forms ``args`` ask for, set for the run and restored after it (class and
    module attributes of minilm/positions/bias.py, which every model the run builds reads), and recorded in
    ``report``."""
    from unittest import mock

    from minilm.positions import bias

    forms = [(bias.T5Bias, "flex_distance_table", args.flex_table),
             (bias.Kerple, "flex_distance_table", args.flex_table),
             (bias, "FLEX_TABLE_COPIES", args.flex_table_copies),
             (bias.T5Bias, "flex_split", args.flex_split),
             (bias.Kerple, "flex_coefficient_forwards", args.kerple_forwards)]  # (owner, attribute, value)
    report.update(flex_table=args.flex_table, flex_table_copies=args.flex_table_copies, flex_split=args.flex_split,
                  kerple_forwards=args.kerple_forwards)  # fmt: skip
    with contextlib.ExitStack() as stack:
        for owner, name, value in forms:
            stack.enter_context(mock.patch.object(owner, name, value))
        yield


def flex_forms_text(report: dict) -> str:
    """The table head's word on the FlexAttention forms, when not the defaults."""
    copies = report.get("flex_table_copies", 1)
    return (("" if report.get("flex_table", True) else " · no Flex tables")
            + (f" · Flex tables in {copies} copies" if copies > 1 else "")
            + (" · T5 in near/far parts" if report.get("flex_split") else "")
            + (" · KERPLE's coefficients by extra forwards" if report.get("kerple_forwards") else ""))  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="YAML experiment config (default: the schema defaults)")
    ap.add_argument("--lengths", type=lengths_list, default=None,
                    help="comma-separated sequence lengths (default: train.seq_len)")  # fmt: skip
    ap.add_argument("--encodings", type=names_list, default=None,
                    help="comma-separated model.position.name values (default: config's)")  # fmt: skip
    ap.add_argument("--steps", type=whole_number(1), default=10, help="timed steps per measurement")
    ap.add_argument("--warmup", type=whole_number(0), default=3, help="untimed steps first (compilation happens here)")
    ap.add_argument("--repeats", type=whole_number(1), default=1,
                    help="measurements per (encoding, length); median reported")  # fmt: skip
    ap.add_argument("--batch-size", type=whole_number(1), default=None,
                    help="sequences per step (default: config's tokens)")  # fmt: skip
    ap.add_argument("--peer", action="store_true", help="also train the same-shaped HF LlamaForCausalLM (rope only)")
    ap.add_argument("--peak-tflops", type=positive_float, default=None,
                    help="device peak for MFU (default: known GPUs, bf16)")  # fmt: skip
    ap.add_argument("--threads", type=whole_number(1), default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--precision", default=None, choices=["auto", "32", "bf16-mixed"], help="default: train.precision")
    ap.add_argument("--peer-precision", default=None, choices=["auto", "32", "bf16-mixed"],
                    help="the peer's precision (default: minilm's)")  # fmt: skip
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="default: train.compile")
    ap.add_argument("--profile", action="store_true", help="profile 3 more steps per measurement (module docstring)")
    ap.add_argument("--trainer", action="store_true",
                    help="also time minilm's step through train.py's loop, Lightning and all (row minilm-trainer)")
    add_flex_form_args(ap)
    ap.add_argument("--device", type=device_name, default=None, help="cuda | cpu (default: cuda when available)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="folder for the JSON and markdown")
    ap.add_argument("--update-docs", action="store_true", help="write the table into docs/performance.md")
    ap.add_argument("--tag", type=file_tag, default="",
                    help="appended to the result files' names and the docs table's key")  # fmt: skip
    ap.add_argument("--note", default="", help="free text stored with the results (e.g. 'machine shared')")
    ap.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
    args = ap.parse_intermixed_args(argv)  # overrides may follow flags, as train.py's (minilm.cli.run_cli)
    if args.peer_precision and not args.peer:
        ap.error("--peer-precision needs --peer")
    return args


# ------------------------------------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory over a span: CUDA allocator peak, or on CPU the resident-set high-water mark's growth."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kind = "cuda_max_memory_allocated" if device.type == "cuda" else "cpu_peak_rss_delta"

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = 0
        else:
            _malloc_trim()
            self.reset_ok = _reset_rss_peak()
            self.base = _proc_status_kb("VmRSS") * 1024
            if not self.reset_ok:
                self.kind = "cpu_peak_rss_delta_since_process_start"
        return self

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        return max(0, _proc_status_kb("VmHWM") * 1024 - self.base)

    def __exit__(self, *exc):
        return False


def _proc_status_kb(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux


def _reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: VmHWM := VmRSS
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# ------------------------------------------------------------------------------------------------- models


def flops_per_token(n_matmul_params: int, n_layers: int, d_model: int, seq_len: int) -> int:
    """6·N + 12·L·d·T (module docstring)."""
    return 6 * n_matmul_params + 12 * n_layers * d_model * seq_len


def matmul_params(model: torch.nn.Module, input_embedding: torch.nn.Parameter, head: torch.nn.Parameter) -> int:
    """Every parameter but the input embedding table, the LM head counted once even when tied to it."""
    n = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    n -= input_embedding.numel()
    if head is input_embedding:
        n += head.numel()
    return n


def build_minilm(mcfg, vocab: int, device):
    from minilm.model import GPT

    model = GPT(mcfg, vocab).to(device)
    return model, lambda x, y: model.loss(x, y), matmul_params(model, model.tok_emb.weight, model.lm_head.weight)


def build_peer(mcfg, vocab: int, max_len: int, device):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise MinilmError("--peer needs Hugging Face transformers: pip install -e '.[hf]'") from e
    config = LlamaConfig(  # the same shape as minilm's model, default RoPE with its base, whatever the encoding
        vocab_size=vocab,
        **llama_shape(mcfg),
        max_position_embeddings=max_len,
        **llama_rope_kwargs({"rope_type": "default", "rope_theta": float(mcfg.position.get("base", 10000.0))}),
        use_cache=False,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).to(device)
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight

    def loss_fn(x, y):  # HF shifts labels itself: give it the input as labels (T−1 predicted tokens per row)
        return model(input_ids=x, labels=x, use_cache=False).loss

    return model, loss_fn, matmul_params(model, emb, head)


# -------------------------------------------------------------------------------------------- measurement


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fixed_batches(vocab: int, T: int, B: int) -> list[torch.Tensor]:
    """The two (B, T + 1) random token batches every step of a measurement trains on, alternately (on the host)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    return [torch.randint(0, vocab, (B, T + 1), generator=g) for _ in range(2)]


def build_step(impl, cfg, T, B, device, amp_dtype, do_compile):
    """The model of ``impl`` ("minilm" or "hf_llama"), its optimizer and a ``step(i)`` closure doing one training
    step on one of two fixed random batches. Returns (step, matmul_params)."""
    vocab = cfg.data.tokenizer.vocab_size
    torch.manual_seed(cfg.run.seed)
    if impl == "minilm":
        model, loss_fn, n_mm = build_minilm(cfg.model, vocab, device)
    else:
        model, loss_fn, n_mm = build_peer(cfg.model, vocab, T, device)
    model.train()
    opt = make_adamw(model, cfg.optim)
    # Each measurement compiles afresh and static, as a training phase does at its one length: else earlier
    # encodings' and lengths' graphs pile up toward dynamo's recompile limit (8), past which the rest runs eagerly,
    # and from the second length on T would be dynamic. Uncompiled too: an eager model's FlexAttention kernel is
    # one process-wide torch.compile(flex_attention) (minilm/model/flex.py) with the same limit.
    torch._dynamo.reset()
    if do_compile:
        loss_fn = compiled(loss_fn, cfg.train, dynamic=False)
    batches = [seq.to(device) for seq in fixed_batches(vocab, T, B)]
    clip = cfg.optim.grad_clip
    params = [p for p in model.parameters() if p.requires_grad]

    def step(i):
        seq = batches[i % len(batches)]
        x, y = seq[:, :-1], seq[:, 1:]
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(x, y) if impl == "minilm" else loss_fn(x, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, n_mm


def time_steps(step, warmup: int, steps: int, device) -> tuple[list[float], Any]:
    """``step(i)`` ``warmup`` times untimed, then ``steps`` times timed, the device synchronized around each:
    (seconds per timed call, the last call's result)."""
    for i in range(warmup):
        step(i)
    _sync(device)
    times, out = [], None
    for i in range(steps):
        t0 = time.perf_counter()
        out = step(i)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times, out


def trainer_steps(cfg, T, B, device, amp_dtype, do_compile, warmup: int, steps: int) -> tuple[float, float, int]:
    """``build_step``'s minilm steps as a training phase runs them: ``LitGPT`` in a Lightning ``Trainer`` over the
    same two batches (on the host, as the data loader gives them) at the same constant lr, one micro-batch per step,
    no validation, checkpoints, logger or progress bar: the plain loop's steps, to its loss. Timed from the first
    step after ``warmup`` to the end of the fit, the device synchronized at both ends only. Returns (seconds per
    timed step, the last logged loss, matmul params)."""
    import copy

    import lightning as L
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader

    from minilm.training.lit_module import LitGPT

    pcfg = copy.deepcopy(cfg)
    OmegaConf.set_readonly(pcfg, False)
    pcfg.train.merge_with({"seq_len": T, "batch_size": B, "micro_batch_size": None, "compile": do_compile})
    pcfg.optim.merge_with({"warmup_steps": 0, "decay": "constant"})  # the plain loop's lr: optim.lr throughout
    quiet_libraries()  # Lightning's notices, as train.py silences them
    torch.manual_seed(cfg.run.seed)
    torch._dynamo.reset()
    model, _, n_mm = build_minilm(cfg.model, cfg.data.tokenizer.vocab_size, device)
    module = LitGPT(model, pcfg, total_steps=warmup + steps)
    rows = [{"input_ids": seq[:, :-1], "targets": seq[:, 1:]}
            for seq in fixed_batches(cfg.data.tokenizer.vocab_size, T, B)]  # fmt: skip
    clock = {}

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == warmup and "start" not in clock:
                _sync(device)
                clock["start"] = time.perf_counter()

        def on_train_end(self, trainer, pl_module):
            _sync(device)
            clock["end"] = time.perf_counter()

    trainer = L.Trainer(max_steps=warmup + steps, accelerator="gpu" if device.type == "cuda" else device.type,
                        devices=1, precision="32-true" if amp_dtype is None else "bf16-mixed", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[Clock()])  # fmt: skip
    with warnings.catch_warnings():  # (no validation here, by design)
        warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
        order = [*range(warmup), *range(steps)]  # time_steps's: step(i) for the warm-up, then again from 0
        trainer.fit(module, DataLoader([rows[i % 2] for i in order], batch_size=None))
    return (clock["end"] - clock["start"]) / steps, module.logged_loss, n_mm


PROFILE_STEPS = 3
PROFILE_ROWS = 30


def profile_steps(step, device, title: str) -> str:
    """``PROFILE_STEPS`` more calls of ``step`` under torch.profiler (after the timed ones: warm, compiled): the
    ``PROFILE_ROWS`` operators and kernels with the most self time on the device (CPU operators on CPU), as
    torch prints them, under ``title``."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=activities) as prof:
        for i in range(PROFILE_STEPS):
            step(i)
        _sync(device)
    table = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                      row_limit=PROFILE_ROWS, max_name_column_width=90)  # fmt: skip
    return f"{title}: {PROFILE_STEPS} steps, by self {'CUDA' if cuda else 'CPU'} time\n\n{table}"


def write_profile(step, device, args, impl: str, encoding: str, T: int, B: int) -> str:
    """``profile_steps`` of a measured step into ``args.profile_dir``: its path relative to ``args.out`` (beside the
    JSON, wherever that is read), or "failed: ..." — a profiler that fails (no CUPTI, say) loses no measurement."""
    try:
        text = profile_steps(step, device, f"{impl} {encoding} T={T} B={B}")
    except Exception as e:
        return f"failed: {_error_text(e)}"
    path = Path(args.profile_dir) / f"{impl}-{encoding}-{T}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return str(path.relative_to(args.out))


def _error_text(e: Exception) -> str:
    """Print the traceback (the log keeps it) and return the exception's one-line summary for the report."""
    traceback.print_exc()
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        with contextlib.suppress(RuntimeError):  # a lost CUDA context (DeviceLost) fails this too
            torch.cuda.empty_cache()


class DeviceLost(Exception):
    """A measurement's failure took the CUDA context with it (an illegal memory access, a device-side assert):
    every later CUDA call in the process fails, so the run stops. ``row``: that measurement's error row for the
    results, or None (the interleaved peer ratio, which has none); ``where``: which measurement, in words."""

    def __init__(self, error: str, where: str, row: Optional[dict] = None):
        super().__init__(error)
        self.error, self.where, self.row = error, where, row


def raise_if_device_lost(device, error: str, where: str, row: Optional[dict] = None) -> None:
    """After a measurement failed: raise DeviceLost when the CUDA context no longer answers. (On the H100 an illegal
    memory access at 128K tokens left the freeing after it failing with the same error, which ended the run
    without its error row.)"""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:
        raise DeviceLost(error, where, row) from None


def measure(impl, cfg, encoding, T, B, args, device, amp_dtype, do_compile, peak_flops) -> dict:
    """One measurement: build, warm up, time ``args.steps`` steps. Returns a result row."""
    row = {"impl": impl, "encoding": encoding, "seq_len": T, "batch_size": B, "tokens_per_step": B * T}
    step = None
    with PeakMemory(device) as mem:
        try:
            if impl == "minilm-trainer":  # one time per repeat: the loop is timed whole (trainer_steps)
                seconds, loss, n_mm = trainer_steps(cfg, T, B, device, amp_dtype, do_compile, args.warmup, args.steps)
                times = [seconds]
            else:
                step, n_mm = build_step(impl, cfg, T, B, device, amp_dtype, do_compile)
                times, loss = time_steps(step, args.warmup, args.steps, device)
                loss = float(loss.detach())
            row["peak_mem_mb"] = round(mem.peak_bytes() / 2**20, 1)
            row["memory_kind"] = mem.kind
            row["loss"] = round(loss, 4)
            if args.profile_dir and step is not None:
                row["profile"] = write_profile(step, device, args, impl, encoding, T, B)
        except torch.OutOfMemoryError:
            row.update(status="oom", tokens_per_s=None, mfu=None, peak_mem_mb=None, memory_kind=mem.kind)
            return row
        except Exception as e:  # a kernel or compiler failure for one encoding must not lose the other rows
            row.update(status="error", error=_error_text(e), tokens_per_s=None, mfu=None, peak_mem_mb=None,
                       memory_kind=mem.kind)  # fmt: skip
            raise_if_device_lost(device, row["error"], f"{impl} {encoding} T={T}", row)
            return row
        finally:
            step = None  # noqa: F841 (free the model before the next measurement)
            _free(device)
    tps = B * T / statistics.median(times)
    fpt = flops_per_token(n_mm, cfg.model.n_layers, cfg.model.d_model, T)
    row.update(
        status="ok",
        step_ms=[round(1000 * t, 2) for t in times],
        tokens_per_s=round(tps, 1),
        matmul_params=n_mm,
        flops_per_token=fpt,
        mfu=fpt * tps / peak_flops if peak_flops else None,
    )
    return row


def paired_ratio(cfg, T, B, args, device, amps: dict, do_compile) -> dict:
    """minilm's speed over the peer's from *interleaved* steps: both models live side by side and take one step
    each in turn, ``steps · repeats`` times after the warm-up, so a load change hits both within milliseconds.
    The ratio is the median over pairs of peer_time / minilm_time — steadier on a shared or noisy machine than
    the ratio of two separately measured medians."""
    ours = peer = None
    try:
        ours, _ = build_step("minilm", cfg, T, B, device, amps["minilm"], do_compile)
        peer, _ = build_step("hf_llama", cfg, T, B, device, amps["hf_llama"], do_compile)
        for i in range(args.warmup):
            ours(i)
            peer(i)
        _sync(device)
        pairs = []
        for i in range(args.steps * args.repeats):
            t0 = time.perf_counter()
            ours(i)
            _sync(device)
            t1 = time.perf_counter()
            peer(i)
            _sync(device)
            pairs.append((t1 - t0, time.perf_counter() - t1))
    except torch.OutOfMemoryError:
        return {"status": "oom"}
    except Exception as e:
        row = {"status": "error", "error": _error_text(e)}
        raise_if_device_lost(device, row["error"], f"the interleaved peer ratio at T={T}")
        return row
    finally:
        ours = peer = None  # noqa: F841
        _free(device)
    return {
        "status": "ok",
        "pairs": len(pairs),
        "ratio": round(statistics.median(p / m for m, p in pairs), 3),
        "minilm_ms": round(1000 * statistics.median(m for m, _ in pairs), 2),
        "peer_ms": round(1000 * statistics.median(p for _, p in pairs), 2),
    }


def median_row(rows: list[dict], peak_flops) -> dict:
    """One row for the repeats of a measurement: tokens/s from the median of all their timed steps (robust to
    load spikes on a shared machine), each repeat's own tokens/s, the largest peak memory."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return rows[0]
    med = dict(ok[0])
    med["step_ms"] = [t for r in ok for t in r["step_ms"]]
    med["step_ms_median"] = statistics.median(med["step_ms"])
    med["tokens_per_s"] = round(1000 * med["tokens_per_step"] / med["step_ms_median"], 1)
    med["mfu"] = med["flops_per_token"] * med["tokens_per_s"] / peak_flops if peak_flops else None
    med["tokens_per_s_repeats"] = [r["tokens_per_s"] for r in ok]
    med["peak_mem_mb"] = max(r["peak_mem_mb"] for r in ok)
    return med


# ------------------------------------------------------------------------------------------------- output


def device_info(device) -> tuple[str, str]:
    """(human name, file-name slug). A CPU's name says its bf16 unit, which decides ``auto``'s precision there and
    bf16's speed (minilm/training/precision.py): two CPUs of one model name may differ in it (AMD EPYC)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        name = f"CPU ({name}, {cpu_bf16_unit() or 'no bf16 unit'})"
    slug = "cpu" if device.type == "cpu" else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return name, slug


def _peer_precision(report: dict) -> str:
    """The table head's " (peer: P)" where the peer trained in another precision than minilm."""
    peer = report.get("peer_precision")
    return f" (peer: {peer})" if peer and peer != report["precision"] else ""


def compile_text(report: dict) -> str:
    """The table's compile setting: True or False, and the mode when compiled in another than the default."""
    mode = report.get("compile_mode", "default")
    return f"{report['compile']}{f' ({mode})' if report['compile'] and mode != 'default' else ''}"


def markdown_table(report: dict) -> str:
    head = (
        f"Device: {report['device_name']} · torch {report['torch']} · threads {report['threads']} · "
        f"precision {report['precision']}{_peer_precision(report)} · compile {compile_text(report)}"
        f"{flex_forms_text(report)} · "
        f"{report['date']} · config `{report['config']}` {' '.join(report['overrides'])}"
        f"{position_overrides_text(report)} · {report['steps']} steps "
        f"after {report['warmup']} warm-up, × {report['repeats']} alternating repeats, median step · "
        f"memory: {report['memory_kind']}"
    )
    if report.get("note"):
        head += f" · {report['note']}"
    if not report.get("complete", True):
        head += f" · **partial: stopped after {report['measured']} of {report['planned']} measurements**"
    lines = [
        head,
        "",
        "| impl | encoding | T | B | tokens/s | MFU | peak mem (MB) | vs RoPE | vs peer | vs peer, interleaved |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    # issue #8's bias-encoding target reads against RoPE at the same length and batch: minilm's rope row
    rope = {(r["seq_len"], r["batch_size"]): r["tokens_per_s"] for r in report["results"]
            if r["impl"] == "minilm" and r["encoding"] == "rope" and r.get("tokens_per_s")}  # fmt: skip
    ratios = {(r["encoding"], r["seq_len"]): r["ratio"] for r in report["ratios"]}
    paired = {(r["encoding"], r["seq_len"]): (r.get("paired") or {}).get("ratio") for r in report["ratios"]}
    for r in report["results"]:
        tps = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else r["status"]
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "–"
        mem = f"{r['peak_mem_mb']:,.0f}" if r.get("peak_mem_mb") is not None else "–"
        ratio = ratios.get((r["encoding"], r["seq_len"])) if r["impl"] == "minilm" else None
        ratio = f"{ratio:.2f}×" if ratio else "–"
        pair = paired.get((r["encoding"], r["seq_len"])) if r["impl"] == "minilm" else None
        pair = f"{pair:.2f}×" if pair else "–"
        base = rope.get((r["seq_len"], r["batch_size"]))
        vs_rope = "–"
        if r["impl"] == "minilm" and r["encoding"] != "rope" and base and r.get("tokens_per_s"):
            vs_rope = f"{r['tokens_per_s'] / base:.2f}×"
        cells = [r["impl"], r["encoding"], r["seq_len"], r["batch_size"], tps, mfu, mem, vs_rope, ratio, pair]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    errors = [f"- {r['impl']} {r['encoding']} T={r['seq_len']}: `{r['error']}`"
              for r in report["results"] if r.get("error")]  # fmt: skip
    errors += [f"- interleaved ratio at T={r['seq_len']}: `{r['paired']['error']}`" for r in report["ratios"]
               if r["paired"].get("error")]  # fmt: skip
    if errors:
        lines += ["", "Failed:", *errors]
    profiles = [f"- {r['impl']} {r['encoding']} T={r['seq_len']}: `{r['profile']}`" for r in report["results"]
                if r.get("profile")]  # fmt: skip
    if profiles:
        lines += ["", f"Profiles (--profile: torch.profiler, {PROFILE_STEPS} steps after the timed ones; beside this "
                      "file):", *profiles]  # fmt: skip
    return "\n".join(lines) + "\n"


def docs_markers(report: dict) -> tuple[str, str]:
    """The begin and end markers of this device and config's table in docs/performance.md."""
    key = f"{report['device_slug']}-{report['config_name']}"
    return f"<!-- benchmark:{key}:begin -->", f"<!-- benchmark:{key}:end -->"


def marked_span(text: str, report: dict, path: Path) -> Optional[tuple[int, int]]:
    """(start, end) in ``text`` of this device and config's table, its markers included; None where neither marker
    is there (the table is then added at the end). One marker alone, either twice, or the end before the begin is
    an error naming the file and line: replacing from the first begin to the first end anywhere had cut out or
    doubled the text between them, and appending had left the stray marker for the next run to meet."""
    begin, end = docs_markers(report)
    found = {m: [x.start() for x in re.finditer(re.escape(m), text)] for m in (begin, end)}
    if not found[begin] and not found[end]:
        return None
    if len(found[begin]) == len(found[end]) == 1 and found[begin][0] < found[end][0]:
        return found[begin][0], found[end][0] + len(end)
    where = ", ".join(f"{path}:{text.count(chr(10), 0, i) + 1} {m}" for m in (begin, end) for i in found[m])
    raise MinilmError(f"--update-docs: {path} must hold this table's markers once each, begin before end, or "
                      f"neither; found {where}: mend or remove them by hand")  # fmt: skip


def update_docs(report: dict, md: str, path: Path) -> None:
    """Replace (or append) the block between this device and config's markers in docs/performance.md."""
    begin, end = docs_markers(report)
    block = f"{begin}\n{md}{end}"
    text = path.read_text() if path.exists() else "# Performance\n"
    span = marked_span(text, report, path)
    if span:
        text = text[: span[0]] + block + text[span[1] :]
    else:
        text = text.rstrip("\n") + f"\n\n### {report['device_name']} — {report['config_name']}\n\n{block}\n"
    atomic_write_text(path, text)


# --------------------------------------------------------------------------------------------------- main


def device_and_precision(args, base) -> tuple[torch.device, str]:
    """The device (--device, else CUDA when available), with --threads applied, and the precision: --precision,
    else train.precision, "auto" resolved as the trainer does (minilm/training/precision.py)."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MinilmError(f"--device {args.device}: CUDA is not available here (torch {torch.__version__})")
    if args.threads:
        torch.set_num_threads(args.threads)
    return device, resolve_precision(args.precision or base.train.precision, device.type)


def _setup(args, base):
    """(device, precision per impl, autocast dtype per impl, compile, peak TFLOP/s or None) for a run."""
    device, precision = device_and_precision(args, base)
    peer_precision = resolve_precision(args.peer_precision, device.type) if args.peer_precision else precision
    precisions = {"minilm": precision, "minilm-trainer": precision, "hf_llama": peer_precision}
    amps = {impl: torch.bfloat16 if p == "bf16-mixed" else None for impl, p in precisions.items()}
    do_compile = base.train.compile if args.compile is None else args.compile
    peak = args.peak_tflops
    if peak is None and device.type == "cuda" and precision == "bf16-mixed":
        name, _ = device_info(device)
        peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return device, precisions, amps, do_compile, peak


def _print_row(impl: str, enc: str, T: int, B: int, r: dict) -> None:
    print(
        f"{impl:14s} {enc:10s} T={T:<7d} B={B:<4d} "
        + (f"{r['tokens_per_s']:>12,.0f} tok/s" if r["status"] == "ok" else r["status"])
        + (f"  MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "")
        + (f"  peak {r['peak_mem_mb']:,.0f} MB" if r.get("peak_mem_mb") is not None else "")
        + (f"  {r['error']}" if r.get("error") else ""),
        flush=True,
    )


def plan(args, base) -> list[tuple[str, int]]:
    """The (encoding, length) pairs a run measures, in order."""
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [base.train.seq_len]
    encodings = args.encodings.split(",") if args.encodings else [base.model.position.name]
    return [(enc, T) for enc in encodings for T in lengths]


def position_parameter(item: str) -> Optional[str]:
    """The position parameter an override sets, in the run's block or a phase's (``model.position.num_buckets=64``:
    ``num_buckets``; ``phases.extend.position.scaling.factor=4``: ``scaling``; a whole ``model.position={...}`` or
    ``phases.P.position={...}`` block: the empty string); None for an override of any other key."""
    parts = [part.strip() for part in item.partition("=")[0].split(".")]
    if parts[:2] == ["model", "position"]:
        return ".".join(parts[2:]).partition(".")[0]
    if parts[0] == "phases" and parts[2:3] == ["position"]:
        return ".".join(parts[3:]).partition(".")[0]
    return None


def _parameter_key(item: str) -> str:
    """The override's key up to the parameter it sets (``phases.P.position.scaling.factor=4``:
    ``phases.P.position.scaling``), to name it in a message."""
    parts = [part.strip() for part in item.partition("=")[0].split(".")]
    return ".".join(parts[:3 if parts[0] == "model" else 4])


def split_overrides(args) -> tuple[list[str], dict[str, list[str]]]:
    """(the overrides every config of the run takes, the position ones of each ``--encodings`` entry).

    Without ``--encodings`` every override is of the first kind. With it, a position parameter, of the run's block
    (``model.position.*``) or a phase's (``phases.P.position.*``), belongs to the encodings that take it: each entry's
    config sets ``model.position.name`` and then the parameters its encoding takes (``model.position.num_buckets=64``
    reaches t5, not rope; ``phases.P.position.scaling.factor=4`` reaches rope, not alibi), and the base config, the
    config's own encoding, gets none (RoPE refused T5's ``num_buckets``). A parameter no listed encoding takes,
    ``model.position.name`` (--encodings sets it) and a whole position block are usage errors, before anything is
    measured."""
    if not args.encodings:
        return list(args.overrides), {}
    encodings = list(dict.fromkeys(args.encodings.split(",")))
    for enc in encodings:  # a misspelled name: the registry's message, before any parameter is blamed
        if enc not in REGISTRY:
            validate_position({"name": enc})
    takes = {enc: [f.name for f in fields(REGISTRY[enc].params)] for enc in encodings}
    common, per_encoding = [], {enc: [] for enc in encodings}
    for item in args.overrides:
        key = position_parameter(item)
        if key is None:
            common.append(item)
        elif key in ("", "name"):
            raise MinilmError(f"{item.partition('=')[0].strip()}: --encodings sets model.position.name for each of its "
                              f"encodings; give their parameters one by one (model.position.KEY=VALUE or "
                              f"phases.PHASE.position.KEY=VALUE, each reaching the encodings that take it), or drop "
                              f"--encodings")  # fmt: skip
        elif not (takers := [enc for enc in encodings if key in takes[enc]]):
            listing = "; ".join(f"{enc} takes: {', '.join(takes[enc]) or '(none)'}" for enc in encodings)
            raise MinilmError(f"{_parameter_key(item)}: no encoding of --encodings {','.join(encodings)} takes "
                              f"this parameter ({listing}); add one that does to --encodings, or drop the override")
        else:
            for enc in takers:
                per_encoding[enc].append(item)
    return common, per_encoding


def base_config(args):
    """The run's config without the ``--encodings`` entries' own position parameters (``split_overrides``)."""
    return load_config(args.config, split_overrides(args)[0])


def position_override_notes(report: dict) -> list[str]:
    """Which encodings each position override reached, for those that not all of the run's encodings take."""
    per_encoding = report.get("position_overrides") or {}
    notes = []
    for item in dict.fromkeys(i for items in per_encoding.values() for i in items):
        takers = [enc for enc, items in per_encoding.items() if item in items]
        if len(takers) < len(per_encoding):
            notes.append(f"{item} reached {', '.join(takers)} only")
    return notes


def position_overrides_text(report: dict) -> str:
    """The table head's word on the position overrides that reached only some encodings (empty: none)."""
    notes = position_override_notes(report)
    return f" ({'; '.join(notes)})" if notes else ""


def encoding_configs(args, base) -> dict:
    """The config of each ``--encodings`` entry (``base``'s overrides, ``model.position.name`` set, then the position
    parameters that encoding takes: ``split_overrides``), every one loaded before the first measurement: a
    misspelled name, or a length beyond what a bounded encoding (learned positions, xPos) supports, is a usage
    error (exit 2) at once, not after the encodings before it were measured."""
    if not args.encodings:
        configs = {base.model.position.name: base}
    else:
        common, per_encoding = split_overrides(args)
        configs = {enc: load_config(args.config, [*common, f"model.position.name={enc}", *own])
                   for enc, own in per_encoding.items()}  # fmt: skip
    longest = max(T for _, T in plan(args, base))
    for enc, cfg in configs.items():  # a bounded encoding's too-long length was an error row, exit 1, at its turn
        tightest = tightest_limit(position_hooks(cfg.model))
        if tightest and longest > tightest[0]:
            limit, keys = tightest
            raise_key = f"raise {' or '.join([f'model.position.{keys[0]}', *keys[1:]])}, " if keys else ""
            raise MinilmError(f"{'--lengths' if args.lengths else 'train.seq_len'}: {longest} is longer than the {enc} "
                              f"encoding supports ({limit} positions); {raise_key}measure shorter lengths, or leave "
                              f"{enc} out of --encodings")  # fmt: skip
    return configs


def measure_all(args, base, device, amps: dict, do_compile, peak_flops, report: dict, done) -> None:
    """Every planned (encoding, length): minilm and, for RoPE with --peer, the peer, alternating per repeat. Appends
    the median rows and the minilm / peer ratios (separate and interleaved) to ``report`` and calls ``done()``
    after each pair (``run_measurements``)."""
    tokens = micro_batch_size(base.train) * base.train.seq_len
    configs = encoding_configs(args, base)
    for enc, T in plan(args, base):
        cfg = configs[enc]
        B = args.batch_size or max(1, tokens // T)
        impls = ["minilm"] + (["minilm-trainer"] if args.trainer else []) + (["hf_llama"] if args.peer and
                                                                             enc == "rope" else [])
        runs = {i: [] for i in impls}
        for _ in range(args.repeats):  # alternate, so load on a shared machine falls on both
            for impl in impls:
                runs[impl].append(measure(impl, cfg, enc, T, B, args, device, amps[impl], do_compile, peak_flops))
        rows = {i: median_row(r, peak_flops) for i, r in runs.items()}
        for i in impls:
            report["results"].append(rows[i])
            _print_row(i, enc, T, B, rows[i])
        if "hf_llama" in rows and rows["minilm"]["status"] == rows["hf_llama"]["status"] == "ok":
            ratio = rows["minilm"]["tokens_per_s"] / rows["hf_llama"]["tokens_per_s"]
            paired = paired_ratio(cfg, T, B, args, device, amps, do_compile)
            report["ratios"].append({"encoding": enc, "seq_len": T, "ratio": round(ratio, 3), "paired": paired})
            print(f"minilm / peer at T={T}: {ratio:.2f}x (separate runs); "
                  f"{paired.get('ratio', 0):.2f}x (interleaved steps, median of {paired.get('pairs')})",
                  flush=True)  # fmt: skip
        done()


def run(args) -> dict:
    """Measure, writing the report after every (encoding, length); ``report["complete"]`` is True at the end."""
    base = base_config(args)
    planned = plan(args, base)
    measured = list(dict.fromkeys(enc for enc, _ in planned))
    if args.peer and "rope" not in measured:  # (measured without a word of the peer, it was silently left out)
        raise MinilmError(f"--peer: the peer (LlamaForCausalLM) is compared with minilm's rope encoding only, and this "
                          f"run measures {', '.join(measured)}: add rope to --encodings, or drop --peer")
    if args.peer and base.model.mlp != "swiglu":  # (the peer was a SwiGLU of gelu's 4·d_model width: another model)
        raise MinilmError(f"--peer: the peer (LlamaForCausalLM) has a SwiGLU MLP, and model.mlp is "
                          f"{base.model.mlp!r}: set model.mlp=swiglu, or drop --peer")  # fmt: skip
    device, precisions, amps, do_compile, peak = _setup(args, base)
    now = datetime.datetime.now(datetime.timezone.utc)
    report = new_report(args, base, device, precisions["minilm"], do_compile, now, len(planned))
    report.update(
        transformers=package_version("transformers"),
        repeats=args.repeats,
        peak_tflops=peak,
        flops_per_token="6*N + 12*L*d*T; N = all parameters but the input embedding (LM head counted once)",
        ratios=[],
    )
    if args.peer:
        report["peer_precision"] = precisions["hf_llama"]
    args.profile_dir = f"{result_stem(report, Path(args.out), now)}-profiles" if args.profile else None
    peak_flops = peak * 1e12 if peak else None
    with flex_forms(args, report):
        return run_measurements(
            report, lambda done: measure_all(args, base, device, amps, do_compile, peak_flops, report, done),
            Path(args.out), now, args.update_docs,
        )  # fmt: skip


def package_version(name: str) -> Optional[str]:
    """An installed package's version, without importing it (transformers' import takes seconds); None: absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def setup_line(report: dict) -> str:
    """The device and versions a run measures on, printed first (scripts/gpu_session.sh's check reads them)."""
    cuda = f" (CUDA {report['cuda']})" if report.get("cuda") else ""
    return (f"{report['device_name']} · torch {report['torch']}{cuda} · lightning {report.get('lightning')} · "
            f"omegaconf {report.get('omegaconf')} · python {report['python']} · threads {report['threads']}")


def new_report(args, base, device, precision: str, do_compile: bool, now, planned: int, kind: str = "") -> dict:
    """The fields both scripts' reports carry (device, versions, config, settings), with no results yet.
    ``kind`` (e.g. "attention") goes between the config's run name and the tag in the files' and table's name."""
    name, slug = device_info(device)
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "device": device.type,
        "device_name": name,
        "device_slug": slug,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # the CUDA torch was built with (None: a CPU build)
        "lightning": package_version("lightning"),
        "omegaconf": package_version("omegaconf"),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "config": args.config or "(defaults)",
        "config_name": "-".join(x for x in (base.run.name, kind, args.tag) if x),
        "overrides": list(args.overrides),
        "position_overrides": split_overrides(args)[1],  # each --encodings entry's position overrides
        "precision": precision,
        "compile": do_compile,
        "compile_mode": base.train.compile_mode,
        "steps": args.steps,
        "warmup": args.warmup,
        "memory_kind": PeakMemory(device).kind,
        "note": args.note,
        "planned": planned,
        "measured": 0,
        "complete": False,
        "results": [],
    }


def run_measurements(report: dict, measure_loop, out: Path, now, update: bool, table=None, title="Benchmark"):
    """Run ``measure_loop(done)``, which appends to ``report["results"]`` and calls ``done()`` after each
    measurement: the report (JSON, markdown, with ``update`` the docs table) is written then, so a run stopped
    part-way leaves what it measured, and once more at the end with ``complete`` True. SIGINT becomes
    ``StoppedEarly``, saying how far the run got and where its results are."""
    table = table or markdown_table
    _check_out(out)
    if update and DOCS.exists():  # before the first measurement, not after it (minutes of GPU time on)
        marked_span(DOCS.read_text(), report, DOCS)
    print(setup_line(report), flush=True)
    for note in position_override_notes(report):  # not silently: the other encodings do not take it
        print(f"{note}: the other encodings do not take it", flush=True)

    def done():
        report["measured"] += 1
        write_report(report, out, now, update, table, title)
        if SIGINT_SEEN.is_set():  # a SIGINT that a measurement swallowed (say, as a compile worker's error)
            raise KeyboardInterrupt

    try:
        measure_loop(done)
    except KeyboardInterrupt:  # SIGINT (Ctrl-C, `timeout -s INT`): what was measured is already written
        where = f"in {result_stem(report, out, now)}.json" if report["measured"] else "none written"
        raise StoppedEarly(f"interrupted after {report['measured']} of {report['planned']} measurements; "
                          f"results {where}") from None  # fmt: skip
    except DeviceLost as e:  # the failed measurement's row, then stop: nothing later can run in this process
        if e.row is not None:
            report["results"].append(e.row)
            report["measured"] += 1
        write_report(report, out, now, update, table, title)
        raise StoppedEarly(f"{e.where} failed and took the CUDA context with it ({e.error}); stopped after "
                          f"{report['measured']} of {report['planned']} measurements, results in "
                          f"{result_stem(report, out, now)}.json: measure the rest in a new process",
                          exit_code=1) from None  # fmt: skip
    report["complete"] = True
    write_report(report, out, now, update, table, title)
    updated = f"; updated {DOCS}" if update else ""
    print(f"wrote {result_stem(report, out, now)}.json and .md{updated}")
    return report


def _check_out(out: Path) -> None:
    """--out a folder that can be written, before the first measurement: a file there (or a path under one) was a
    FileExistsError traceback once the first measurement had run, minutes of GPU time on."""
    from minilm.training.run_checks import check_writable_dir

    check_writable_dir(out, "--out")


def result_stem(report: dict, out: Path, now) -> Path:
    return out / f"{now.strftime('%Y-%m-%d')}-{report['device_slug']}-{report['config_name']}"


def write_report(report: dict, out: Path, now, update: bool, table=None, title: str = "Benchmark") -> None:
    """The JSON and markdown (``table(report)``, default ``markdown_table``) under ``out``, and with ``update``
    the table in docs/performance.md. The memory kind is the rows' (the CPU one says when it could not reset)."""
    if report["results"]:
        report["memory_kind"] = report["results"][0].get("memory_kind", report["memory_kind"])
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(report, out, now)
    atomic_write_text(Path(f"{stem}.json"), json.dumps(report, indent=2) + "\n")  # (with_suffix cut a tag "v1.5")
    md = (table or markdown_table)(report)
    heading = f"# {title}: {report['config_name']} on {report['device_name']}"
    atomic_write_text(Path(f"{stem}.md"), f"{heading}\n\n{md}")
    if update:
        update_docs(report, md, DOCS)


SIGINT_SEEN = threading.Event()


def _on_sigint(signum, frame):
    SIGINT_SEEN.set()
    signal.default_int_handler(signum, frame)


@contextlib.contextmanager
def sigint_flag():
    """Within: SIGINT still raises KeyboardInterrupt, and also sets SIGINT_SEEN, which the measuring loops check
    after each measurement (a measurement's own ``except Exception`` may have swallowed the signal's effect)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class StoppedEarly(Exception):
    """The run was stopped part-way (SIGINT: exit 130; a lost device: 1); its message says how far it got and where
    the results are."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


def exit_code(run_fn, args) -> int:
    """Run ``run_fn(args)`` (this script's ``run`` or bench_attention's) as a command: exit 0; 1 when a
    measurement failed (its row says "error" and why; the traceback is in the output above), or failed and took
    the CUDA context with it (the run stops there); 2 on bad input; 130 when interrupted, with the measurements
    finished so far written."""
    set_up_process()  # as train.py does (run_cli), before torch starts its worker threads
    try:
        with sigint_flag():
            report = run_fn(args)
    except MinilmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except StoppedEarly as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    failed = [r for r in report["results"] if r["status"] == "error"]
    failed += [r["paired"] for r in report.get("ratios", []) if r["paired"].get("status") == "error"]
    if failed:
        print(f"{len(failed)} measurement(s) failed: {'; '.join(r['error'] for r in failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    return exit_code(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
