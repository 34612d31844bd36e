"""Memory a run cannot do without, checked before it starts, and running out of memory said plainly.

``check_model_fits_host``: a model whose bare training state (fp32 weights and gradients, AdamW's two moments: 16
bytes per parameter) is larger than the machine's memory is refused before the corpus is prepared. Without it a
typo such as ``model.n_layers=12000`` had the kernel kill the process mid-start, with no word (exit status 137), and
``model.d_model=1048576`` ended in a torch allocator traceback. ``check_model_fits_device``: the same state against
the GPU's memory, when training on CUDA (every strategy minilm accepts keeps a whole copy per device: sharded ones
are refused): a model that can never fit was only found out by torch's ``OutOfMemoryError`` after the corpus was
prepared. Running out later (activations, at a length) is that error, which ``out_of_memory`` turns into a message
naming the phase, the step and what to change.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import torch
from omegaconf import OmegaConf

from minilm.errors import MinilmError

TRAINING_BYTES_PER_PARAM = 16  # fp32 weight + gradient + AdamW exp_avg + exp_avg_sq (4 bytes each)
SIZE_KEYS = "model.n_layers, model.d_model, model.d_ff"
OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError  # (torch.cuda's before 2.5)


def _one_block(model_cfg, vocab_size: int):
    """``GPT(model_cfg, vocab_size)`` with one block, on the meta device (nothing allocated): blocks are alike in size
    (a block's encoding differs by layer in behaviour, not in parameters), so a 100 000-layer typo costs one block's
    construction, not 100 000."""
    from minilm.model import GPT

    one = OmegaConf.create({**OmegaConf.to_container(model_cfg, resolve=True), "n_layers": 1})
    with torch.device("meta"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")  # vocab_size 0
        return GPT(one, vocab_size)


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def param_count(model_cfg, vocab_size: int) -> int:
    """The parameters of ``GPT(model_cfg, vocab_size)``, counted from a one-block model (``_one_block``)."""
    model = _one_block(model_cfg, vocab_size)
    return _numel(model) + (model_cfg.n_layers - 1) * _numel(model.blocks[0])


def position_param_count(model_cfg) -> int:
    """The parameters of ``GPT(model_cfg, ·)``'s position encoding (its embedding-side module and every layer's),
    counted from a one-block model (``_one_block``)."""
    model = _one_block(model_cfg, 0)
    return _numel(model.pos_emb) + model_cfg.n_layers * _numel(model.blocks[0].attn.pos)


MEMINFO = Path("/proc/meminfo")
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))  # v2, v1


def host_memory_bytes(meminfo: Path = MEMINFO, cgroup_limits=CGROUP_LIMITS) -> Optional[int]:
    """RAM plus swap, or the process's cgroup memory limit where that is lower; None where neither can be read
    (not Linux)."""
    sizes = []
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        sizes.append(sum(int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "SwapTotal") if k in fields))
    except (OSError, ValueError, IndexError):
        pass
    for limit in cgroup_limits:
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # v2 writes "max" for none
            sizes.append(int(text))
    sizes = [s for s in sizes if s > 0]
    return min(sizes) if sizes else None


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def check_model_fits_host(model_cfg, vocab_size: int, processes: int = 1) -> None:
    """Refuse a model whose training state, ``processes`` copies of it (DDP ranks on this machine), is larger than
    the machine's memory: it can never train here. ``vocab_size`` 0 counts the model without its embedding and
    head (a lower bound, before the tokenizer says its vocabulary), and the message says so."""
    total = host_memory_bytes()
    if total is not None:
        copies = f" × {processes} processes (trainer.devices)" if processes > 1 else ""
        _check_state_fits(model_cfg, vocab_size, processes, total, copies,
                          "this machine's {} of memory (RAM and swap, or the process's cgroup limit)",
                          "train on a larger machine")  # fmt: skip


def device_memory_bytes() -> Optional[int]:
    """The total memory of the CUDA device this process trains on, as torch reports it; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def check_model_fits_device(model_cfg, vocab_size: int) -> None:
    """Refuse a model whose training state is larger than the GPU's memory (each process trains a whole copy on its
    own device): it can never train there, whatever the batch or length. ``vocab_size`` as ``check_model_fits_host``."""
    total = device_memory_bytes()
    if total is not None:
        _check_state_fits(model_cfg, vocab_size, 1, total, " on each GPU", "this GPU's {}",
                          "train on a GPU with more memory (minilm keeps a whole copy per device: no sharded strategy)")


def _check_state_fits(model_cfg, vocab_size: int, copies: int, total: int, held: str, memory: str, or_: str) -> None:
    """The refusal of both checks: ``copies`` training states (``held``: where, in words) larger than ``total`` bytes
    (``memory``: whose, its size at ``{}``); ``or_``: the remedy besides a smaller model."""
    n = param_count(model_cfg, vocab_size)
    need = TRAINING_BYTES_PER_PARAM * n * copies
    if need <= total:
        return
    counted = " (not counting the embedding and LM head)" if vocab_size == 0 else ""
    # Most of them in the position encoding (a learned table of max_positions rows, Shaw's 2·max_distance + 1, ...):
    # the message named model.n_layers and model.d_model only, which were not what made the model too large
    position, keys, where = position_param_count(model_cfg), SIZE_KEYS, ""
    if 2 * position > n:
        block = OmegaConf.to_container(model_cfg.position, resolve=True)
        sizes = [f"model.position.{k}" for k, v in block.items() if isinstance(v, int) and not isinstance(v, bool)]
        keys = ", ".join(sizes) if sizes else "model.position"
        where = f", {position / 1e9:,.2f}G of them in the position encoding ({block['name']})"
    raise MinilmError(
        f"model.n_layers={model_cfg.n_layers}, model.d_model={model_cfg.d_model}: {n / 1e9:,.2f}G parameters"
        f"{counted}{where}; training holds {TRAINING_BYTES_PER_PARAM} bytes per parameter (fp32 weights and "
        f"gradients, AdamW's two moments){held}: {_gb(need)}, more than {memory.format(_gb(total))}; make the model "
        f"smaller ({keys}) or {or_}"
    )


def is_out_of_memory(e: BaseException) -> bool:
    """torch's CUDA out-of-memory error, or its CPU allocator failing (a RuntimeError it words its own way)."""
    if isinstance(e, (OUT_OF_MEMORY, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)


def out_of_memory(e: BaseException, phase: str, step: int, device: str) -> MinilmError:
    """The error a phase that ran out of memory ends with: where, torch's own first line, and what a resumed run
    may change (the settings that save memory with the same loss and gradients: docs/runs.md, "Interrupt and
    resume")."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return MinilmError(
        f"phase '{phase}' ran out of memory on {device} at step {step} ({first}); continue with --resume and "
        "model.activation_checkpointing=true or model.loss_chunk_size=4096 (the same loss and gradients in less "
        "memory), or restart the phase (--phase " + phase + ") with a smaller train.micro_batch_size or "
        "train.seq_len"
    )


def processes_on_this_host(world_size: int, num_nodes) -> int:
    """The training processes that share this machine's memory: the world size over the nodes."""
    return max(1, world_size // max(1, int(num_nodes or 1)))
