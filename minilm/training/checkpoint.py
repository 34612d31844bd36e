"""Checkpoints and weights on disk: atomic writes, safe loads, clear errors.

- Every write goes to a temporary file in the same directory, is fsynced, renamed over the target, and the
  directory entry is synced; a crash leaves either the old file or the new one, never half of one.
- Resumable checkpoints (Lightning's dict: model, optimizer, schedule, loops, our RNG state) are read with
  ``torch.load(weights_only=True)`` — never arbitrary pickle. Finished weights are safetensors.
- A truncated or corrupt checkpoint is reported and skipped in favour of the previous good one (none: the phase
  starts over, as the report says).
- Loading weights of a different shape names the mismatched tensors.
- No Lightning import (its CheckpointIO, ``lit_module.AtomicCheckpointIO``, lives with the trainer's adapter):
  evaluation, generation and export read weights without its seconds of imports.
- Finished weights record the ``model`` section they were trained with (safetensors metadata ``minilm.model``; a
  step checkpoint holds it in TRAINED_WITH): ``check_trained_with`` refuses them under another one. RoPE, ALiBi and
  NoPE weights have the same tensors, so a file copied into another run loaded silently under the other encoding.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch
from omegaconf import OmegaConf
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save
from torch import nn

from minilm.config import filled_model
from minilm.errors import MinilmError
from minilm.files import atomic_write

CKPT_PATTERN = re.compile(r"^step-(\d+)\.ckpt$")
# a step checkpoint's key: what its phase trains by (run_checks.what_trains), for --resume
TRAINED_WITH = "minilm_config"
MODEL_METADATA = "minilm.model"  # safetensors metadata: the model section the weights were trained with, as JSON
# model keys of kernels and memory savers, which give the same outputs: a run resumes with other values
# (run_checks.HOW_NOT_WHAT), and trained weights are read under others
SAME_OUTPUTS = ("loss_chunk_size", "activation_checkpointing", "sdpa_kernel")
# model keys that do not change what trained weights compute: those, and dropout (training alone). The others must
# be the same to read the weights as trained (init_std too: sinusoidal's default scale follows it).
NOT_WHAT_WEIGHTS_COMPUTE = (*SAME_OUTPUTS, "dropout")


def atomic_torch_save(obj: Any, path: Path) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write(Path(path), lambda f: f.write(buf.getbuffer()))


def load_checkpoint_dict(path: Path, map_location="cpu") -> dict:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, bad pickle opcode, unsafe global: all mean "not a good checkpoint"
        raise MinilmError(f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e)[:200]})") from None


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) sorted by step, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := CKPT_PATTERN.match(p.name))]
    return sorted(out)


def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    return ckpt_dir / f"step-{step:08d}.ckpt"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint named by ``checkpoint_path`` was written at."""
    return int(CKPT_PATTERN.match(path.name).group(1))


def load_latest_good_checkpoint(ckpt_dir: Path, log: Callable[[str], None] = print) -> tuple[Optional[Path], dict]:
    """The newest checkpoint that loads, and what it holds ((None, {}) when there is none); corrupt ones are
    reported and skipped (the previous good one wins), each report saying what comes next: the previous checkpoint,
    or, where none is left, the phase's start. Loading is the check, so a caller that reads the checkpoint takes it
    from here rather than loading it a second time."""
    found = list_checkpoints(ckpt_dir)
    for i in reversed(range(len(found))):
        path = found[i][1]
        try:
            ckpt = load_checkpoint_dict(path)
            problem = None if "state_dict" in ckpt else f"checkpoint {path} has no model state"
        except MinilmError as e:
            problem = str(e)
        if problem is None:
            return path, ckpt
        # (a message that promised "the previous checkpoint" where there was none hid that the phase starts over)
        then = f"falling back to the previous one, {found[i - 1][1].name}" if i else (
            "there is no earlier checkpoint, so the phase starts from its first step")
        log(f"warning: {problem}; {then}")
    return None, {}


def latest_good_checkpoint(ckpt_dir: Path, log: Callable[[str], None] = print) -> Optional[Path]:
    """The newest checkpoint that loads (``load_latest_good_checkpoint``'s path)."""
    return load_latest_good_checkpoint(ckpt_dir, log)[0]


STALE_TMP = re.compile(r"^\.step-\d+\.ckpt\.(\d+)\.tmp$")  # atomic_write's temporary file of a checkpoint


def prune_checkpoints(ckpt_dir: Path, keep: int, written: Optional[int] = None) -> None:
    """Keep the last ``keep`` checkpoints (all with 0), and delete the temporary file of a checkpoint whose write
    another process did not finish (killed mid-write: nothing reads it, and it is as large as a checkpoint). One
    process writes a run's checkpoints (the run lock, rank 0), so another pid's temporary file is stale.

    ``written``: the step of the checkpoint just written. One of a later step is one a resumed phase skipped as
    unreadable (it resumes from the newest good one): it is deleted, and not counted among the last ``keep``, which
    it was as the newest by its name: with ``keep`` 1 every checkpoint the resumed phase wrote was deleted in its
    favour, and the next resume started the phase over."""
    found = list_checkpoints(ckpt_dir)
    if written is not None:
        for _, path in (stale := [(s, p) for s, p in found if s > written]):
            path.unlink(missing_ok=True)
        found = found[: len(found) - len(stale)]
    for _, path in found[: -keep or None] if keep > 0 else []:
        path.unlink(missing_ok=True)
    for path in ckpt_dir.iterdir() if ckpt_dir.is_dir() else []:
        if (m := STALE_TMP.match(path.name)) and int(m.group(1)) != os.getpid():
            path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ weights


def save_weights(model: nn.Module, path: Path, model_cfg: Optional[Mapping] = None) -> None:
    """safetensors, atomically; tied tensors are stored once (the first name that holds them). ``model_cfg``: the
    ``model`` section the weights were trained with (the phase's: apply_phase changes the model, not ``model.cfg``),
    recorded in the metadata for ``check_trained_with``."""
    seen: dict[int, str] = {}
    tensors = {}
    for name, t in model.state_dict().items():
        key = t.data_ptr() if t.numel() else id(t)
        if key in seen:
            continue
        seen[key] = name
        tensors[name] = t.detach().cpu().contiguous()
    metadata = {"format": "pt"}
    if model_cfg is not None:
        plain = OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg) else model_cfg
        metadata[MODEL_METADATA] = json.dumps(plain, sort_keys=True)
    data = save(tensors, metadata=metadata)
    atomic_write(Path(path), lambda f: f.write(data))


def read_weights(path: Path) -> dict:
    return read_weights_and_model(path)[0]


def read_weights_and_model(path: Path) -> tuple[dict, Optional[dict]]:
    """The weights of a safetensors file, a run or phase directory (its model.safetensors) or a checkpoint, and the
    model section they record (``recorded_model``; a step checkpoint's TRAINED_WITH), None where they record none."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise MinilmError(f"no weights at {path}")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path)), recorded_model(path)
        except (SafetensorError, OSError) as e:
            raise MinilmError(f"weights file {path} is unreadable: {e}") from None
    ckpt = load_checkpoint_dict(path)
    trained = ckpt.get(TRAINED_WITH)
    return _checkpoint_weights(ckpt), trained.get("model") if isinstance(trained, dict) else None


def _checkpoint_weights(ckpt: dict) -> dict:
    """The model's tensors of a Lightning checkpoint (``state_dict``, names without the LightningModule's
    ``model.``), or of a plain state dict."""
    state = ckpt.get("state_dict", ckpt)
    return {k.removeprefix("model."): v for k, v in state.items()}


def read_step_checkpoint(path: Path) -> tuple[dict, int, Optional[dict], dict]:
    """(weights, step in its phase, the model section it trained with or None, minilm's own state: LitGPT's
    ``on_save_checkpoint``, {} if none) of a step checkpoint, from one read of the file (it holds the optimizer state
    too, several times the weights): the step of its name (``step-00000020.ckpt``), or of its ``global_step`` when it
    was renamed (0 if it has none)."""
    ckpt = load_checkpoint_dict(Path(path))
    named = CKPT_PATTERN.match(Path(path).name)
    step = int(named.group(1)) if named else int(ckpt.get("global_step", 0))
    trained = ckpt.get(TRAINED_WITH)
    state = ckpt.get("minilm")
    return (_checkpoint_weights(ckpt), step, trained.get("model") if isinstance(trained, dict) else None,
            state if isinstance(state, dict) else {})  # fmt: skip


def recorded_model(path: Path) -> Optional[dict]:
    """The model section a safetensors file records (MODEL_METADATA); None when it records none (written before
    minilm recorded it, or by other software) or cannot be read (``read_weights`` then says why)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            text = (f.metadata() or {}).get(MODEL_METADATA)
        return json.loads(text) if text else None
    except (SafetensorError, OSError, ValueError):
        return None


def check_trained_with(trained: Optional[Mapping], model_cfg, weights: Path, config: str) -> None:
    """Weights that record the model section they were trained with (``trained``; None: they record none, and load
    as before) must be read under the same one, but for NOT_WHAT_WEIGHTS_COMPUTE: the same tensor names and shapes
    do not make the same model (a RoPE run's weights under an ALiBi config computed something else, silently).
    ``config`` names where ``model_cfg`` comes from, for the message."""
    if trained is None:
        return
    if differ := model_differences(trained, model_cfg):
        raise MinilmError(f"{weights}: these weights were trained with another model config than {config}:\n  "
                          + "\n  ".join(differ) + "\nthey were copied from another run or phase (or its config.yaml "
                          "was edited); read them with the config they were trained with")  # fmt: skip


def model_differences(trained: Mapping, model_cfg) -> list[str]:
    """A line for each key of the model section that computes something (not NOT_WHAT_WEIGHTS_COMPUTE) where the
    ``trained`` one differs from ``model_cfg``: ``model.KEY: trained with X, the config says Y``."""
    now = OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg) else dict(model_cfg)
    keys = [k for k in trained if k in now and k not in NOT_WHAT_WEIGHTS_COMPUTE]  # (a key newer than the file: no)
    same = filled_model(dict(trained)), filled_model(now)  # n_kv_heads null and = n_heads build one model
    return [f"model.{k}: trained with {json.dumps(trained[k], sort_keys=True)}, the config says "
            f"{json.dumps(now[k], sort_keys=True)}" for k in keys if same[0][k] != same[1][k]]  # fmt: skip


def load_weights(model: nn.Module, source: Path | dict, where: str = "") -> None:
    """Load weights by name; a missing, extra or differently shaped tensor is an error naming it. Tied tensors
    stored once are accepted under either name."""
    state = read_weights(source) if not isinstance(source, dict) else source
    own = model.state_dict()
    label = f" from {where or source}" if not isinstance(source, dict) or where else ""
    shape_errors = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and own[k].shape != v.shape
    ]
    unexpected = sorted(set(state) - set(own))
    tied = _tied_names(model)
    missing = sorted(k for k in set(own) - set(state) if not any(t in state for t in tied.get(k, ())))
    problems = shape_errors + [f"{k}: not in the model" for k in unexpected] + [f"{k}: missing" for k in missing]
    if problems:
        listing = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise MinilmError(f"weights{label} do not fit this model (different shape or config?):\n  {listing}{more}")
    model.load_state_dict(state, strict=False)


def _tied_names(model: nn.Module) -> dict[str, tuple[str, ...]]:
    by_ptr: dict[int, list[str]] = {}
    for name, t in model.state_dict().items():
        if t.numel():
            by_ptr.setdefault(t.data_ptr(), []).append(name)
    return {n: tuple(o for o in names if o != n) for names in by_ptr.values() for n in names}
