"""The evaluation suite: settings, the per-length loop, extensions at evaluation time, and the two entry points.

``evaluate`` runs every task at every length on one model and returns the results dict (report.py documents
its keys). ``evaluate_phase`` is what training calls at the end of a phase (``eval.lengths`` non-empty);
``evaluate_run`` is what scripts/evaluate.py calls on a finished run directory. Both write ``results.json``,
``report.md`` and the figures, and log scalars and images to the run's TensorBoard at the weights' global step.

Lengths the model cannot read (beyond a ``learned`` table's ``max_positions`` — any position module whose
``max_length()`` is not None) are reported in ``unsupported`` and not run; a task that fails at one length
(no held-out text that long, a prompt that does not fit, out of memory even one sequence per forward) is
reported in ``skipped`` and the suite goes on.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import yaml
from omegaconf import OmegaConf

from minilm.errors import ConfigError, MinilmError
from minilm.files import atomic_write_text, same_bytes
from minilm.eval.perplexity import bucket_curve, eval_documents, model_device, packed_doc_ids, perplexity
from minilm.eval.report import (
    SETTINGS_READ_BY,
    depth_key,
    log_tensorboard,
    make_output_dir,
    not_measured,
    plural,
    write_report,
)
from minilm.eval.retrieval import greedy_decode, make_samples, score_samples
from minilm.training.memory import is_out_of_memory  # (torch and omegaconf only: no Lightning)

TASKS = ("ppl", "passkey", "needle", "kv")
# the settings that change the numbers, beyond lengths, depths and samples, recorded in results.json under these names
# (compare_runs.py warns when the evaluations it compares differ in one: minilm.eval.report.SETTINGS_READ_BY)
RECORDED_SETTINGS = ("seed", "batches", "batch_tokens", "sliding", "stride", "needles")
_TASK_SEED = {"ppl": 0, "passkey": 1, "needle": 2, "kv": 3}  # each task draws from its own seeded stream


def _rng_seed(seed: int) -> int:
    """``run.seed`` / ``--seed`` as numpy's generators take it (non-negative): any integer is a seed, as for the
    training sampler (minilm.data.sampler), so a run trained with run.seed=-1 is evaluated too — it was a numpy
    traceback ('expected non-negative integer'). Seeds from 0 to 2**63 - 1 are themselves."""
    return int(seed) % 2**63


# ------------------------------------------------------------------------------------------------------ settings


def _is_int(value) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass
class EvalSettings:
    """The ``eval`` section (minilm.config.EvalConfig) as plain values, plus the seed (``run.seed``)."""

    lengths: List[int] = field(default_factory=list)
    batches: int = 4
    batch_tokens: int = 8192
    tasks: List[str] = field(default_factory=lambda: ["ppl", "passkey"])
    sliding: bool = True
    stride: Optional[int] = None
    depths: List[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    samples: int = 8
    needles: int = 4
    extension: Dict[str, Any] = field(default_factory=dict)
    seed: int = 1337

    @classmethod
    def from_config(cls, cfg, names: Optional[Mapping[str, str]] = None, **changes) -> "EvalSettings":
        """From a full (phase) config: its ``eval`` section and ``run.seed``; ``changes`` (not None) win. ``names``:
        how the caller's user gives the changes, which the errors name (``validate``)."""
        ev = OmegaConf.to_container(cfg.eval, resolve=True) if OmegaConf.is_config(cfg.eval) else dict(cfg.eval)
        values = cls.fields_of(ev)
        values["seed"] = int(cfg.run.seed)
        values.update({k: v for k, v in changes.items() if v is not None})
        settings = cls(**values)
        settings.validate(names=names)
        return settings

    @classmethod
    def fields_of(cls, values: Mapping[str, Any]) -> dict:
        """The entries of ``values`` that are settings (an ``eval`` section has keys of its own besides them)."""
        known = {f.name for f in fields(cls)}
        return {k: v for k, v in values.items() if k in known}

    def validate(self, where: str = "eval", names: Optional[Mapping[str, str]] = None) -> None:
        """Errors name ``where.KEY``, or ``names[KEY]`` for a value the user gave elsewhere: a phase's eval_lengths
        (its lengths), a script's flag (``--samples``). The stride's error names the lengths' too: the other value
        to change."""
        names = dict(names or {})

        def check(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"{names.get(key, f'{where}.{key}')}: {msg}")

        # the types first, as the schema types a config's values: settings built in Python (EvalSettings(samples=2.5),
        # depths=["0.5"]) passed, then failed with a TypeError deep in the scoring, after the run was loaded
        for key in ("lengths", "tasks", "depths"):
            check(isinstance(getattr(self, key), (list, tuple)), key, f"must be a list, got {getattr(self, key)!r}")
        for key in ("batches", "batch_tokens", "samples", "needles", "stride", "seed"):
            value = getattr(self, key)
            check(_is_int(value) or (key == "stride" and value is None), key, f"must be an integer, got {value!r}")
        # (sliding='no' or 0 from Python ran: a text turned the windows on, a 0 off with a stride given beside it)
        check(isinstance(self.sliding, bool), "sliding", f"must be true or false, got {self.sliding!r}")
        check(all(isinstance(d, numbers.Real) and not isinstance(d, bool) for d in self.depths), "depths",
              f"must be numbers in [0, 1], got {list(self.depths)}")  # fmt: skip
        check(all(_is_int(L) and L >= 2 for L in self.lengths), "lengths",
              f"must be integers >= 2, got {list(self.lengths)}")  # fmt: skip
        # results are keyed by length and by depth: a repeated one would be run twice and one of its cells lost
        check(len(set(self.lengths)) == len(self.lengths), "lengths", f"has repeats: {list(self.lengths)}")
        # none at all measured nothing: the end of a phase wrote an empty report, evaluate.py failed saying no reason
        check(len(self.tasks) > 0, "tasks", f"must name at least one task; allowed: {', '.join(TASKS)}")
        bad = [t for t in self.tasks if t not in TASKS]
        check(not bad, "tasks", f"unknown task(s) {bad}; allowed: {', '.join(TASKS)}")
        check(len(set(self.tasks)) == len(self.tasks), "tasks", f"has repeats: {list(self.tasks)}")  # ran twice
        check(self.batches >= 1, "batches", f"must be >= 1, got {self.batches}")
        check(self.batch_tokens >= 1, "batch_tokens", f"must be >= 1, got {self.batch_tokens}")
        check(self.stride is None or self.stride >= 1, "stride", f"must be >= 1 or null, got {self.stride}")
        shortest = min(self.lengths, default=None)
        of = f"the shortest of {names['lengths']}" if "lengths" in names else "the shortest length"
        check(self.stride is None or not self.sliding or shortest is None or self.stride <= shortest, "stride",
              f"must be <= {of} ({shortest}) for sliding windows, got {self.stride}")  # fmt: skip
        check(all(0 <= d <= 1 for d in self.depths) and len(self.depths) > 0, "depths",
              f"must be a non-empty list of numbers in [0, 1], got {list(self.depths)}")  # fmt: skip
        check(len({depth_key(d) for d in self.depths}) == len(self.depths), "depths",
              f"has repeats: {list(self.depths)}")  # the passkey / needle grids key depths by depth_key
        check(self.samples >= 1, "samples", f"must be >= 1, got {self.samples}")
        check(self.needles >= 1, "needles", f"must be >= 1, got {self.needles}")
        check(not self.extension or "name" in self.extension, "extension",
              f"needs a 'name' (a training-free method or a rope_type), got {dict(self.extension)}")  # fmt: skip


def validate_eval(eval_cfg, where: str = "eval", position=None, head_dim: Optional[int] = None,
                  train_len: Optional[int] = None, names: Optional[Mapping[str, str]] = None) -> None:  # fmt: skip
    """Check an ``eval`` config section (so a bad value fails when the config loads, not after training); with
    ``position`` (the config's ``model.position``, already checked), that its ``eval.extension`` fits the encoding,
    and with the model's ``head_dim`` and the training length ``train_len`` too, its rotary dimensions.
    ``names``: the keys given elsewhere than ``where.KEY`` (a phase's eval_lengths), as ``EvalSettings.validate``'s."""
    ev = OmegaConf.to_container(eval_cfg, resolve=True) if OmegaConf.is_config(eval_cfg) else dict(eval_cfg)
    EvalSettings(**EvalSettings.fields_of(ev)).validate(where, names)
    if ev.get("extension"):
        check_extension(dict(ev["extension"]), f"{where}.extension")
        if position is not None:
            _check_extension_fits(ev["extension"]["name"], position["name"], f"{where}.extension.name")
            if head_dim is not None and train_len is not None:
                _applied_params(ev["extension"], train_len, position, head_dim, f"{where}.extension")


def _applied_params(extension: Mapping[str, Any], train_len: int, position, head_dim: int,
                    where: str) -> tuple[str, dict]:  # fmt: skip
    """(name, parameters) of a checked extension block as applied to a model of ``position`` (its
    ``model.position``, a RoPE one) and ``head_dim`` trained at ``train_len``: ``_with_length_defaults``, then its
    scaling block (a rope_type's, or rope_scaling's) against the model's rotary dimensions. Its
    ``partial_rotary_factor`` is the model's own: which dimensions rotate is fixed by the weights, and the block
    replaces the model's own scaling block, which reset it to 1 where that one set it (PI with factor 1 changed
    the logits); a value of its own rotated other dimensions than those trained, another model, not an extension
    of this one. Longrope's lists of the wrong length passed the config, and each phase trained, then failed its
    evaluation naming model.position.scaling."""
    from minilm.positions import validate_position
    from minilm.positions.rope_scaling import parse_scaling, validate_scaling
    from minilm.positions.rotary import rotary_dim
    from minilm.positions.training_free import EXTENSIONS

    name, params = _with_length_defaults(extension, train_len)
    if name in EXTENSIONS and name != "rope_scaling":
        return name, params
    rope = validate_position(position)
    share = parse_scaling(rope.scaling)[1].partial_rotary_factor  # the model's: its scaling block's, else 1
    given = params.get("partial_rotary_factor", share)
    if given != share:
        raise ConfigError(f"{where}.partial_rotary_factor: must be the model's own ({share:g}), got {given:g}: it "
                          "sets which dimensions rotate, which the weights were trained with (model.position.scaling."
                          "partial_rotary_factor; model.position.fraction), and an extension rescales their "
                          "frequencies only; leave it out")  # fmt: skip
    if share != 1:
        params["partial_rotary_factor"] = share
    scaling = params if name == "rope_scaling" else {"rope_type": name, **params}
    validate_scaling(scaling, rotary_dim(head_dim, rope.fraction), where)
    return name, params


def _check_extension_fits(name: str, position_name: str, where: str) -> None:
    """Every extension needs a plain RoPE model: the training-free methods remap Rope's rotation
    (minilm.positions.training_free.supports; xPos's rotate is not it) and a rope_type becomes its scaling block. An
    ALiBi config with an eval.extension trained whole phases, then failed each one's evaluation (eval/error.txt)."""
    from minilm.positions import REGISTRY
    from minilm.positions.training_free import supports

    if not supports(REGISTRY[position_name].attention):
        raise ConfigError(f"{where}: {name!r} needs a RoPE model (model.position.name: rope); this model's "
                          f"encoding is {position_name!r}")  # fmt: skip


def default_lengths(train_seq_len: int) -> List[int]:
    """Half the training length up to 8x it, by powers of two: where extrapolation shows or breaks."""
    return [max(2, train_seq_len // 2)] + [train_seq_len * 2**k for k in range(4)]


def parse_extension(tokens: Sequence[str]) -> Dict[str, Any]:
    """``["dynamic", "factor=4"]`` -> ``{"name": "dynamic", "factor": 4}`` (values parsed as YAML scalars, as a config
    file's are: ``factor=4e0`` is 4.0)."""
    from minilm.config import UniqueKeyLoader

    if not tokens:
        return {}
    name, *rest = tokens
    out: Dict[str, Any] = {"name": name}
    for item in rest:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--extension {name}: parameter '{item}' must look like key=value")
        if key in out:  # the last one won without a word (window=64 window=32 ran with 32); name too
            raise ConfigError(f"--extension {name}: parameter '{key}' given twice; give it once")
        try:
            out[key] = yaml.load(value, Loader=UniqueKeyLoader)  # (YAML 1.1 read 4e0 as a string)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or type(e).__name__
            raise ConfigError(f"--extension {name}: parameter '{item}': the value does not parse as YAML ({problem}); "
                              "give a number, true/false, a word or a [list]") from None  # fmt: skip
    return out


def extension_from_flag(words: Optional[Sequence[str]]) -> Dict[str, Any]:
    """The words of evaluate.py's / generate.py's ``--extension METHOD [key=value ...]`` as an extension block
    (``{}`` without the flag), checked before a run is loaded; an error begins with the flag as given, as the user
    typed it (the block's own checks name its keys, extension.yarn.factor, which no command line has)."""
    if not words:
        return {}
    extension = parse_extension(words)
    if extension["name"] == NO_EXTENSION:
        _check_plain(extension, f"--extension {NO_EXTENSION}")
        return extension
    try:
        check_extension(extension)
    except ConfigError as e:
        raise ConfigError(f"--extension {' '.join(words)}: {e}") from None
    return extension


def _check_plain(extension: Mapping[str, Any], where: str) -> None:
    """``{"name": "none"}``, the plain model, takes no parameters (they would be ignored)."""
    extra = " ".join(f"{k}={v}" for k, v in extension.items() if k != "name")
    if extension.get("name") == NO_EXTENSION and extra:
        raise ConfigError(f"{where} takes no parameters, got {extra}")


# ---------------------------------------------------------------------------------------------------- extensions


def _check_extension_name(name: str, where: str) -> None:
    from minilm.positions.rope_scaling import ROPE_SCALING
    from minilm.positions.training_free import EXTENSIONS

    if name not in EXTENSIONS and name not in ROPE_SCALING:
        raise ConfigError(
            f"{where}.name: unknown method {name!r}; training-free methods: {', '.join(EXTENSIONS)}; RoPE scalings "
            f"(rope_type): {', '.join(ROPE_SCALING)}"
        )


def _with_length_defaults(extension: Mapping[str, Any], train_len: int) -> tuple[str, dict]:
    """(name, parameters) of an extension block whose name is known, with the parameters that default to the
    training length filled in where absent: ``original_max_position_embeddings`` (scalings that have it) and
    logn's ``train_len``."""
    from minilm.positions.rope_scaling import ROPE_SCALING

    name = extension["name"]
    params = {k: v for k, v in extension.items() if k != "name"}
    rope_type = params.get("rope_type") if name == "rope_scaling" else name  # the training-free rope_scaling too
    if name == "logn":
        params.setdefault("train_len", train_len)
    elif isinstance(rope_type, str) and rope_type in ROPE_SCALING and "original_max_position_embeddings" in {
        f.name for f in fields(ROPE_SCALING[rope_type].params)
    }:
        params.setdefault("original_max_position_embeddings", train_len)
    return name, params


def applied_extension(extension: Mapping[str, Any], model_cfg, train_len: int) -> Dict[str, Any]:
    """A checked extension block ``{name, ...params}`` as ``apply_extension`` applies it to a model of ``model_cfg``
    (its ``model`` section) trained at ``train_len``: with ``original_max_position_embeddings`` / logn's
    ``train_len`` filled in where absent, and a model's own scaling ``partial_rotary_factor`` carried (what the
    report and generate.py show; they left the carried factor out)."""
    from minilm.config import head_dim

    name, params = _applied_params(extension, train_len, model_cfg.position, head_dim(model_cfg), "extension")
    return {"name": name, **params}


def check_extension(extension: Mapping[str, Any], where: str = "extension") -> None:
    """Check an extension block ``{name, ...params}`` without a model, so a bad parameter in ``eval.extension``
    fails when the config loads rather than after training. Errors name ``where.<key>``. The parameters filled
    in from the training length at evaluation time (``original_max_position_embeddings``, logn's ``train_len``)
    get a placeholder here when absent; what needs the model's size (longrope's list lengths) is checked by
    ``validate_eval`` given it, and again when applied."""
    from minilm.positions.rope_scaling import parse_scaling
    from minilm.positions.training_free import EXTENSIONS

    _check_extension_name(extension["name"], where)
    name, params = _with_length_defaults(extension, train_len=2)  # any valid length: a placeholder
    if name in EXTENSIONS:
        EXTENSIONS[name].from_params(params, where)
        return
    if "rope_type" in params:
        raise ConfigError(f"{where}.rope_type: not a parameter here; the rope_type is the name ({name!r})")
    try:
        parse_scaling({"rope_type": name, **params}, named_apart=True)
    except ConfigError as e:
        raise ConfigError(f"{where}.{e}") from None


def apply_extension(model, model_cfg, vocab_size: int, extension: Mapping[str, Any], train_seq_len: int,
                    where: str = "extension", flag: Optional[str] = None):  # fmt: skip
    """Apply a training-free method to a trained model for evaluation. Returns ``(model, undo)``.

    - a method of ``minilm.positions.training_free.EXTENSIONS`` (logn, rerope, self_extend, dca, rope_scaling) is
      installed on the model's attention layers; ``undo()`` removes it;
    - a ``rope_type`` of ``minilm.positions.rope_scaling.ROPE_SCALING`` (linear, ntk, dynamic, yarn, ...) becomes
      the model's ``model.position.scaling`` block: a new GPT is built with it and the weights copied (the model
      passed in is untouched; ``undo`` does nothing).

    Defaults taken from the training length when not given: ``original_max_position_embeddings`` (scalings that
    have it) and logn's ``train_len``. Errors name the block's keys under ``where`` (``eval.extension.name``); with
    ``flag``, the command-line words it came from (the scripts' ``--extension logn``), they begin with those
    instead, as ``extension_from_flag``'s do."""
    if flag is None:
        return _apply_extension(model, model_cfg, vocab_size, extension, train_seq_len, where)
    # said of the flag itself: extension.name is a key no command line has
    _check_extension_fits(extension["name"], model_cfg.position.name, flag)
    try:
        return _apply_extension(model, model_cfg, vocab_size, extension, train_seq_len, where)
    except ConfigError as e:
        raise ConfigError(f"{flag}: {e}") from None


def _apply_extension(model, model_cfg, vocab_size: int, extension: Mapping[str, Any], train_seq_len: int,
                     where: str):  # fmt: skip
    from minilm.positions.training_free import EXTENSIONS, install_extension, remove_extension

    _check_extension_name(extension["name"], where)
    check_extension(extension, where)
    # by the encoding's name: a learned table's layers said their encoding was 'Identity'
    _check_extension_fits(extension["name"], model_cfg.position.name, f"{where}.name")
    # before the model is built: a longrope block's lists of the wrong length named model.position.scaling
    from minilm.config import head_dim

    name, params = _applied_params(extension, train_seq_len, model_cfg.position, head_dim(model_cfg), where)
    if name in EXTENSIONS:
        install_extension(model, name, **params)
        return model, lambda: remove_extension(model)
    from minilm.model import GPT
    from minilm.positions import validate_position

    mcfg = OmegaConf.to_container(model_cfg, resolve=True)
    mcfg["position"] = {**mcfg["position"], "scaling": {"rope_type": name, **params}}
    validate_position(mcfg["position"], where=where)
    scaled = GPT(OmegaConf.create(mcfg), vocab_size)
    scaled.load_state_dict(model.state_dict())  # the same architecture: every tensor by name, strictly
    scaled.to(model_device(model)).eval()
    return scaled, lambda: None


def resolve_device(device: Optional[str], name: str = "device") -> str:
    """``device`` checked (cpu, cuda, cuda:N; None: cuda when available, else cpu), so a typo or a GPU that is
    not there is one message rather than a traceback from deep inside torch. ``name``: how the caller's user gives
    it, which the errors name (the scripts: ``--device``)."""
    if device is None:  # (an empty one is an error: --device '' took the default without a word)
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"{name}: must be cpu, cuda or cuda:N, got {device!r}")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{name}: {device!r} asked for, but this machine has no usable CUDA GPU; use cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{name}: {device!r} asked for, but this machine has {count} CUDA GPU(s)")
    return device


def _model_limit(model) -> Optional[tuple[int, tuple[str, ...]]]:
    """``tightest_limit`` of the model's position modules (a stub model of the tests may have none)."""
    from minilm.positions.base import tightest_limit

    mods = [getattr(model, "pos_emb", None)] + [getattr(b.attn, "pos", None) for b in getattr(model, "blocks", [])]
    return tightest_limit(m for m in mods if m is not None and hasattr(m, "max_length"))


def length_limit(model) -> Optional[int]:
    """The longest sequence the model's position modules can read (None: unbounded)."""
    tightest = _model_limit(model)
    return tightest[0] if tightest else None


def _limit_keys(model) -> str:
    """The parameters that raise the tightest module's limit, as an unsupported length names them: ``, model.position.
    scale_base or gamma`` (xPos), ``, model.position.max_positions`` (learned); empty for a module that names none."""
    keys = (_model_limit(model) or (None, ()))[1]
    return f", model.position.{' or '.join(keys)}" if keys else ""


# -------------------------------------------------------------------------------------------------------- data


@dataclass
class EvalData:
    """What the tasks read: the tokenizer, the held-out split (a ``minilm.data.TokenStore``), the prompt style, and
    how the evaluated phase's packed rows were trained (``data.document_mask`` / ``data.restart_positions``): the
    perplexity of the packed held-out stream is measured so too."""

    tokenizer: Any
    val: Any
    style: str = "code"
    document_mask: bool = False
    restart_positions: bool = False


def eval_data(cfg, run_dir: Optional[Path] = None) -> EvalData:
    """The held-out split of the corpus a run trained on (prepared again if the cache is gone), and the prompt
    style of ``cfg.data``. With ``run_dir``, the corpus is the run's (its saved run-level ``data`` section, as
    phases.py loads it once for every phase) and its tokenizer must be the run's ``tokenizer.model``: token ids
    of another tokenizer would be evaluated as garbage."""
    from minilm.data import load_corpus, synthetic_style

    run_cfg = cfg
    if run_dir is not None and (Path(run_dir) / "config.yaml").is_file():
        run_cfg = _run_config(Path(run_dir))
    tok_file = Path(run_dir) / "tokenizer.model" if run_dir is not None else None
    data_cfg = run_cfg.data
    if tok_file is not None and tok_file.is_file() and data_cfg.tokenizer.model_file is not None:
        # the run's copy of the data.tokenizer.model_file it trained with (the same bytes, and the corpus is keyed by
        # them): the file the config names may have been moved or deleted since, which stopped every evaluation
        data_cfg = copy.deepcopy(data_cfg)
        OmegaConf.set_readonly(data_cfg, False)
        data_cfg.tokenizer.model_file = str(tok_file)
    # a corpus prepared again is said, with its progress: data.cache_dir is relative to the working directory, and
    # evaluate.py run from another one than training prepared the whole corpus there again, in silence
    corpus = load_corpus(data_cfg, progress=True)
    same = tok_file is None or not tok_file.is_file() or same_bytes(corpus.tokenizer.model_file, tok_file)
    if not same:
        raise MinilmError(
            f"the corpus prepared for this run's data config ({corpus.cache_dir}) has another tokenizer than the "
            f"run ({tok_file}): the source files changed since training, or this version of minilm prepares the "
            "data differently (its held-out split or tokenizer training; minilm.data.prepare.FORMAT_VERSION). To "
            "evaluate anyway, set data.tokenizer.model_file to the run's tokenizer.model in its config.yaml; the "
            "held-out documents may then differ from those held out in training"
        )
    if run_dir is not None:
        _check_held_out(corpus, Path(run_dir))
    sampled = sampled_sources(run_cfg)
    val = corpus.val.only(sampled)
    if val.n_tokens == 0:
        raise MinilmError(
            f"no held-out documents in the sources the run trains on ({', '.join(sampled)}): documents are held out "
            "by a hash of their names, data.val_fraction of them and at least one per source of two or more "
            "documents; a source of one document has none"
        )
    return EvalData(corpus.tokenizer, val, synthetic_style(cfg.data), bool(cfg.data.document_mask),
                    bool(cfg.data.document_mask and cfg.data.restart_positions))  # (cfg: the phase's)


def _check_held_out(corpus, run_dir: Path) -> None:
    """The documents held out now must be those the run held out (recorded in run.dir when it trained; runs from
    before the record are not checked). A corpus prepared again — source files changed, or another minilm that
    splits or tokenizes otherwise (minilm.data.prepare.FORMAT_VERSION) — may hold out documents the run trained on,
    with the very same tokenizer."""
    from minilm.runs import HELD_OUT

    path = run_dir / HELD_OUT
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text())["digest"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MinilmError(f"{path}: cannot be read ({e}); it records the documents the run held out") from None
    if recorded != corpus.val.digest():
        raise MinilmError(
            f"the documents held out by the corpus prepared now ({corpus.cache_dir}) are not those the run held out "
            f"in training ({path}): the source files changed since training, or this version of minilm prepares the "
            "data differently (minilm.data.prepare.FORMAT_VERSION). Evaluated on them, the run would be scored on "
            "documents it may have trained on; evaluate with the minilm and source files it trained with"
        )


def sampled_sources(run_cfg) -> List[str]:
    """The sources a run trains on: weight > 0 in its data section or in any phase's. The evaluation reads their
    held-out documents only: a source kept at weight 0 (the embedded stdlib beside one's own text) is prepared,
    tokenized and held out like the others, and perplexity and retrieval filler read its code as if the model had
    trained on it. One set for every phase, so that the phases of a run are measured on the same text."""
    from minilm.config import phase_config, phase_names
    from minilm.data import parse_sources

    weights = {n: s.weight for n, s in parse_sources(run_cfg.data.sources).items()}
    for name in phase_names(run_cfg):
        for n, s in parse_sources(phase_config(run_cfg, name).data.sources).items():
            weights[n] = max(weights.get(n, 0.0), s.weight)
    return [n for n, w in weights.items() if w > 0]


def _run_config(run_dir: Path):
    """The run's config as saved, its ``data.sources`` exactly as saved. (Merging a saved config onto the schema
    defaults would add the default ``embedded`` source back to a run that trained on other sources, and the corpus
    — and its cache key — would differ from the one the run trained on.)"""
    from minilm.runs import load_run_config  # (on_schema keeps the saved sources and drops a removed one's null)

    return load_run_config(run_dir / "config.yaml")


# -------------------------------------------------------------------------------------------------------- suite


def _is_too_long(err: Exception) -> bool:
    try:
        from minilm.positions.absolute import SequenceTooLong
    except ImportError:  # pragma: no cover
        return False
    return isinstance(err, SequenceTooLong)


def _free_cached_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _data_digests(data: EvalData) -> dict:
    """What the perplexities were measured in and on, for compare(): the sha256 of the tokenizer's model file
    (``tokenizer_sha256``) and of the held-out documents as tokenized (``val_sha256``). Runs of two tokenizers of one
    vocabulary size, or of other held-out documents, drew no warning: only the vocabulary sizes were recorded."""
    from minilm.data.tokenizer import file_digest

    out = {}
    model_file = getattr(data.tokenizer, "model_file", None)
    if model_file is not None and Path(model_file).is_file():
        out["tokenizer_sha256"] = file_digest(model_file)
    if callable(getattr(data.val, "digest", None)):
        out["val_sha256"] = data.val.digest()
    return out


def evaluate(model, data: EvalData, settings: EvalSettings, *, meta: Optional[dict] = None,
             log: Callable[[str], None] = print) -> dict:  # fmt: skip
    """Every task of ``settings`` at every length; returns the results dict (see minilm/eval/report.py)."""
    settings.validate()  # settings built in Python are checked too: samples=0 was an IndexError after the scoring
    if not settings.lengths:  # (eval.lengths: [] means no end-of-phase evaluation; evaluate_run takes default ones)
        raise ConfigError("eval.lengths: empty, so there is nothing to evaluate; give the lengths to evaluate at, "
                          "EvalSettings(lengths=[128, 256, ...])")  # fmt: skip
    meta = dict(meta or {})
    res: Dict[str, Any] = {**meta, "lengths": list(settings.lengths), "tasks": list(settings.tasks),
                           "depths": [float(d) + 0.0 for d in settings.depths], "samples": settings.samples,
                           **{key: getattr(settings, key) for key in RECORDED_SETTINGS},
                           "vocab_size": getattr(data.tokenizer, "vocab_size", None),
                           **_data_digests(data)}  # fmt: skip
    keys = []
    if "ppl" in settings.tasks:
        keys += ["ppl", "loss"] + (["ppl_sliding"] if settings.sliding else [])
        res["per_position_loss"] = {}
    for task in ("passkey", "needle", "kv"):
        if task in settings.tasks:
            keys.append(task)
    for k in keys:
        res[k] = {}
    for task in ("passkey", "needle"):
        if task in settings.tasks:
            res[f"{task}_grid"] = {}
    res.update(details={t: {} for t in settings.tasks}, unsupported={}, skipped={t: {} for t in settings.tasks},
               examples={t: [] for t in settings.tasks if t != "ppl"})  # fmt: skip
    limit = length_limit(model)
    was_training = model.training
    model.eval()
    try:
        for L in settings.lengths:
            key = str(L)
            for k in keys:
                res[k][key] = None
            if limit is not None and L > limit:
                res["unsupported"][key] = (f"longer than the position encoding supports ({limit} positions"
                                           f"{_limit_keys(model)})")  # fmt: skip
                log(f"eval: length {L} unsupported (limit {limit})")
                continue
            for task in settings.tasks:
                t0 = time.perf_counter()
                try:
                    _run_task(model, data, settings, L, task, res, log)
                except MinilmError as e:
                    if _is_too_long(e):
                        res["unsupported"][key] = str(e)
                    else:
                        res["skipped"][task][key] = str(e)
                    log(f"eval: {task} at {L} not measured: {e}")
                    continue
                except Exception as e:  # (torch's CUDA error, or its CPU allocator's RuntimeError)
                    if not is_out_of_memory(e):
                        raise
                    _free_cached_memory()
                    res["skipped"][task][key] = "out of memory, even one sequence at a time"
                    log(f"eval: {task} at {L} skipped: out of memory")
                    continue
                log(f"eval: {task} at {L}: {_summary(res, task, key)} ({time.perf_counter() - t0:.1f}s)")
    finally:
        model.train(was_training)
    return res


def _summary(res: dict, task: str, key: str) -> str:
    if task == "ppl":
        out = f"ppl {res['ppl'][key]:.3f}"
        if res.get("ppl_sliding", {}).get(key) is not None:
            out += f", sliding {res['ppl_sliding'][key]:.3f}"
        return out
    return f"accuracy {res[task][key]:.3f}"


def _batch_size(settings: EvalSettings, L: int) -> int:
    return max(1, settings.batch_tokens // L)


def _run_task(model, data: EvalData, s: EvalSettings, L: int, task: str, res: dict, log) -> None:
    """One task at one length, ``batch_tokens // L`` sequences per forward; out of memory, again with half as
    many per forward. What is measured (the windows, the prompts) does not depend on that chunking, so the numbers
    stay those of the settings — lowering eval.batch_tokens instead would also draw fewer perplexity windows."""
    chunk = _batch_size(s, L)
    while True:
        try:
            if task == "ppl":
                return _ppl(model, data, s, L, res, chunk)
            return _retrieval(model, data, s, L, task, res, chunk)
        except Exception as e:
            if chunk == 1 or not is_out_of_memory(e):
                raise
            _free_cached_memory()
            chunk //= 2
            log(f"eval: {task} at {L}: out of memory; again with {chunk} sequence(s) per forward")


def _ppl(model, data: EvalData, s: EvalSettings, L: int, res: dict, chunk: int) -> None:
    key = str(L)
    docs, source = eval_documents(data.val, L)
    n = s.batches * _batch_size(s, L)  # windows measured: the settings' (chunk only splits them into forwards)
    bs = chunk
    seed = [_rng_seed(s.seed), _TASK_SEED["ppl"], L]
    # the packed stream of a run trained with document masks is scored with them, as its packed rows were trained:
    # without them the model met attention across documents (and positions running on) it never saw in training
    masked = source == "packed" and data.document_mask
    mask = dict(doc_index=[packed_doc_ids(data.val)], restart_positions=data.restart_positions) if masked else {}
    r = _finite(perplexity(model, docs, L, mode="windows", n_windows=n, batch_size=bs, seed=seed, source=source,
                           **mask))  # fmt: skip
    rs = None
    if s.sliding:  # both modes measured before either is recorded: a failure leaves the length unmeasured, whole
        rs = _finite(perplexity(model, docs, L, mode="sliding", n_windows=n, batch_size=bs, stride=s.stride,
                                seed=seed, source=source, **mask))  # fmt: skip
    res["ppl"][key], res["loss"][key] = r.ppl, r.loss
    pos, val = bucket_curve(r.per_position)
    res["per_position_loss"][key] = {"positions": pos, "loss": val}
    res["details"]["ppl"][key] = {"windows": r.to_dict()}
    if rs is not None:
        res["ppl_sliding"][key] = rs.ppl
        res["details"]["ppl"][key]["sliding"] = rs.to_dict()


def _non_finite(value) -> MinilmError:
    return MinilmError(f"non-finite model outputs (loss or answer log-probability {value}): NaN or overflowing "
                       "logits — a diverged checkpoint, or an overflow at this length")  # fmt: skip


def _finite(r):
    """A PplResult, checked: a NaN loss would otherwise be written as a number (or break strict JSON), and so
    would an infinite perplexity (a finite mean loss above ~709 nats)."""
    if not math.isfinite(r.loss):
        raise _non_finite(r.loss)
    if not math.isfinite(r.ppl):
        raise MinilmError(f"perplexity overflows: mean loss {r.loss:.4g} nats per token — overflowing logits, a "
                          "diverged checkpoint or a blow-up at this length")  # fmt: skip
    return r


def _retrieval(model, data: EvalData, s: EvalSettings, L: int, task: str, res: dict, chunk: int) -> None:
    key = str(L)
    bs = chunk
    tok = data.tokenizer
    cells = list(s.depths) if task != "kv" else [None]
    n = s.samples if task != "kv" else s.samples * len(s.depths)
    exact, acc, lp = [], [], []
    grid = {}  # depth -> accuracy, stored once every cell has been scored
    example = None
    for depth in cells:
        # each depth's prompts from a stream of its own, keyed by the depth itself (its grid key): keyed by its place
        # in eval.depths, a cell's prompts changed with the depths beside it (configs/passkey_tiny.yaml's model at 96,
        # 20 prompts: depth 0.5 scored 0.60 under --depths 0.5 and 0.75 under --depths 0,0.5) and with their order
        cell = 0 if depth is None else int.from_bytes(depth_key(depth).encode(), "little")
        rng = np.random.default_rng([_rng_seed(s.seed), _TASK_SEED[task], L, cell])
        samples = make_samples(task, tok, data.val.tokens, L, n, rng, depth=depth if depth is not None else 0.5,
                               style=data.style, needles=s.needles)  # fmt: skip
        sc = score_samples(model, samples, bs)
        if not np.isfinite(sc.logprob).all():  # argmax over NaN logits would score as a plain miss
            raise _non_finite(float(sc.logprob[~np.isfinite(sc.logprob)][0]))
        exact.append(sc.exact)
        acc.append(sc.token_acc)
        lp.append(sc.logprob)
        if task != "kv":
            grid[depth_key(depth)] = float(sc.exact.mean())
        if example is None or (depth is not None and abs(depth - 0.5) < abs(example[0] - 0.5)):
            example = (depth if depth is not None else 0.5, samples[0], bool(sc.exact[0]))
    exact, acc, lp = np.concatenate(exact), np.concatenate(acc), np.concatenate(lp)
    if task != "kv":
        res[f"{task}_grid"][key] = grid
    res[task][key] = float(exact.mean())
    res["details"][task][key] = {"samples": int(len(exact)), "token_accuracy": float(acc.mean()),
                                 "answer_logprob": float(lp.mean())}  # fmt: skip
    depth, (prompt, answer), ok = example
    greedy = greedy_decode(model, prompt, len(answer))
    res["examples"][task].append({"length": L, "depth": None if task == "kv" else depth, "answer": tok.decode(answer),
                                  "greedy": tok.decode(greedy), "exact": ok})  # fmt: skip


# -------------------------------------------------------------------------------------------------- entry points


def _meta(cfg, run_dir, phase, step, extension, weights: Optional[Path] = None,
          phase_step: Optional[int] = None, record: Optional[Mapping[str, Any]] = None) -> dict:  # fmt: skip
    """What results.json says of the weights it measured; ``step``: the run's global step (TensorBoard's axis);
    ``weights``: the file evaluated, when given by path; ``phase_step``: a step checkpoint's step in its phase;
    ``record``: what the run records of where the phase's weights started (``{"started_from": ...}``, or {})."""
    if extension:  # as applied: with the parameters filled in from the training length, so the report says them
        extension = applied_extension(extension, cfg.model, int(cfg.train.seq_len))
    # a step checkpoint by its step in the phase, as its file (step-00000005.ckpt) and folder are named: labelled by
    # the global step, a later phase's checkpoint read 'extend_512 @ step 25' of a phase of 10 steps
    at = f" @ step {phase_step}" if phase_step is not None else ""
    # labelled by run.name, not the folder's name: a study's runs with seeds all sit in folders named seed<S>, and
    # their reports and figures were titled 'seed1/extend' alike; a study names each run '<variant>-seed<S>'
    name = str(cfg.run.name)
    # absolute paths: as typed (run.dir=runs/x, --run ../runs/x) a results.json read from elsewhere, or compared with
    # scripts/compare_runs.py from another folder, did not say which run it measured
    return {
        "run": str(Path(run_dir).resolve()), "name": name, "phase": phase, "step": int(step),
        **({"phase_step": int(phase_step)} if phase_step is not None else {}),
        "label": f"{name}/{phase}{at}" + (f" + {extension['name']}" if extension else ""),
        **({"weights": str(Path(weights).resolve())} if weights is not None else {}),
        **(record or {}),
        "extension": extension or None,
        "position": OmegaConf.to_container(cfg.model.position, resolve=True),
        "train_seq_len": int(cfg.train.seq_len),
    }  # fmt: skip


NO_EXTENSION = "none"  # --extension none: the plain model, without the config's eval.extension
PHASE_ERROR = "error.txt"  # what a failed end-of-phase evaluation leaves in RUN/PHASE/eval/


def _extension_text(meta: Mapping[str, Any]) -> str:
    """The end of an evaluation's first line: the extension as applied (the parameters taken from the training length
    included), as the report records it; the line said nothing of it, so what ran was read only in the report."""
    return f", with extension {json.dumps(meta['extension'])}" if meta.get("extension") else ""


def _tb_prefix(extension: Mapping[str, Any]) -> str:
    return f"eval-{extension['name']}" if extension else "eval"


def evaluate_phase(model, pcfg, phase_name: str, phase_dir, global_step: int, logger=None,
                   log: Callable[[str], None] = print, record: Optional[Mapping[str, Any]] = None) -> dict:  # fmt: skip
    """End-of-phase evaluation (minilm/training/phases.py): ``pcfg.eval`` at ``pcfg.eval.lengths``; writes
    ``phase_dir/eval/`` and logs to TensorBoard at ``global_step``, in ``logger.log_dir`` (the run's ``tb/``), in an
    events file of its own that a later evaluation into the same folder replaces (``_to_tensorboard``). ``record``:
    where the phase's weights started, for results.json (``_meta``).

    Bad input found only now (an ``eval`` setting, a held-out split too small) is logged and written to
    ``phase_dir/eval/error.txt`` instead of raised: the phase's weights are already saved and the phase still
    completes; ``scripts/evaluate.py`` can evaluate it once the input is fixed."""
    phase_dir = Path(phase_dir)
    try:
        return _evaluate_phase(model, pcfg, phase_name, phase_dir, global_step, logger, log, record)
    except MinilmError as e:
        atomic_write_text(phase_dir / "eval" / PHASE_ERROR, f"{e}\n")
        log(f"phase '{phase_name}': evaluation failed: {e} (the phase itself is complete; fix the input and run "
            f"scripts/evaluate.py --run {phase_dir.parent} --phase {phase_name})")
        return {}


def _evaluate_phase(model, pcfg, phase_name: str, phase_dir: Path, global_step: int, logger, log,
                    record: Optional[Mapping[str, Any]]) -> dict:  # fmt: skip
    settings = EvalSettings.from_config(pcfg)
    data = eval_data(pcfg, phase_dir.parent)
    meta = _meta(pcfg, phase_dir.parent, phase_name, global_step, settings.extension, record=record)
    log(f"phase '{phase_name}': evaluating at lengths {settings.lengths} ({', '.join(settings.tasks)})"
        + _extension_text(meta))
    target, undo = model, lambda: None
    if settings.extension:
        target, undo = apply_extension(model, pcfg.model, data.tokenizer.vocab_size, settings.extension,
                                       pcfg.train.seq_len, "eval.extension")  # fmt: skip
    try:
        results = evaluate(target, data, settings, meta=meta, log=log)
    finally:
        undo()
    figures = write_report(results, phase_dir / "eval")
    _clear_phase_error(phase_dir / "eval", phase_dir)
    if logger is not None:  # (the run's TensorBoard logger: its folder, tb/; a file of the evaluation's own there)
        _to_tensorboard(Path(logger.log_dir), results, figures, global_step, _tb_prefix(settings.extension),
                        f"{phase_name}.eval")  # fmt: skip
    log(f"phase '{phase_name}': evaluation written to {phase_dir / 'eval'}")
    return results


def _clear_phase_error(out_dir: Path, phase_dir: Path) -> None:
    """A failed end-of-phase evaluation leaves its message in ``phase_dir/eval/error.txt``; once an evaluation has
    been written there, the message is stale (it would contradict the report beside it)."""
    if out_dir.resolve() == (phase_dir / "eval").resolve():
        (out_dir / PHASE_ERROR).unlink(missing_ok=True)


def _check_out(out, flag: str) -> None:
    """An evaluation's given output directory: not empty (it took the default folder), no unexpanded '~', not a run's
    or a phase's own directory."""
    from minilm.cli import check_home_expanded

    if not str(out).strip():
        raise ConfigError(f"{flag}: empty; give an output directory, or leave {flag} out for RUN/PHASE/eval[-METHOD]/")
    check_home_expanded(out, flag)
    if any((Path(out) / f).is_file() for f in ("config.yaml", "complete.json")):
        # its files beside the run's, its scalars in the run's own tb/ (OUT/tb), and a run directory's results.json
        # then stood for the run's evaluation in compare_runs.py (find_results), in place of its last phase's
        raise ConfigError(f"{flag}: {out} is a minilm run or phase directory (it holds config.yaml); the evaluation's "
                          "results.json, report.md, figures and tb/ would be mixed with the run's files: give another "
                          f"directory, or leave {flag} out for RUN/PHASE/eval[-METHOD]/")  # fmt: skip


def _check_given(given: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """What ``evaluate_run`` was given that is wrong whatever the run, refused before the run is loaded (its weights
    and config, seconds to minutes): the settings by ``EvalSettings.validate`` with the others at their defaults,
    which pass it (what depends on the run, a stride against the config's lengths, is checked again with it), an
    empty ``out`` (it took the default folder) and ``none``'s parameters."""
    EvalSettings(**EvalSettings.fields_of({k: v for k, v in given.items() if v is not None})).validate(names=names)
    if given["out"] is not None:
        _check_out(given["out"], names.get("out", "out"))
    _check_plain(given["extension"] or {}, f"extension {NO_EXTENSION!r}")


def _check_setting_names(changes: Mapping[str, Any]) -> None:
    """``evaluate_run``'s keyword arguments beyond its own must be settings: a misspelled one (``strid=4``) was a
    TypeError from ``EvalSettings.__init__``, a class the caller never named, raised after the run was loaded."""
    import difflib

    settings = [f.name for f in fields(EvalSettings) if f.name not in ("lengths", "tasks", "extension")]
    for key in changes:
        if key not in settings:
            close = difflib.get_close_matches(key, settings, n=1)
            raise ConfigError(f"evaluate_run: unknown setting {key!r}" + (f"; did you mean {close[0]!r}?" if close
                              else "") + f" (its settings: {', '.join(settings)})")  # fmt: skip


def global_step(cfg, phase: str, in_phase: Optional[int] = None) -> int:
    """Optimizer steps from the start of the run to the end of ``phase`` (the TensorBoard step axis), or to step
    ``in_phase`` of it (a step checkpoint's: ``LoadedRun.step``)."""
    from minilm.config import phase_config, phase_names, phase_steps

    names = phase_names(cfg)
    before = sum(phase_steps(phase_config(cfg, n)) for n in names[: names.index(phase)])
    return before + (phase_steps(phase_config(cfg, phase)) if in_phase is None else in_phase)


def evaluate_run(
    path,
    phase: Optional[str] = None,
    *,
    lengths: Optional[Sequence[int]] = None,
    tasks: Optional[Sequence[str]] = None,
    extension: Optional[Mapping[str, Any]] = None,
    out: Optional[str | Path] = None,
    device: Optional[str] = None,
    tensorboard: bool = True,
    log: Callable[[str], None] = print,
    names: Optional[Mapping[str, str]] = None,
    **changes,
) -> tuple[dict, Path]:
    """Evaluate a run directory (or a phase of it) as scripts/evaluate.py does; returns (results, out_dir).
    ``changes`` override other ``eval`` settings (samples, depths, batches, batch_tokens, sliding, stride, ...).
    Default lengths: ``eval.lengths`` of the run's config, else half to eight times the training length. Written
    to ``RUN/PHASE/eval/`` (with the config's own ``eval.extension`` too, as at the end of the phase), or to
    ``RUN/PHASE/eval-METHOD/`` with an ``extension`` given here, or to ``out``. ``extension={"name": "none"}``
    evaluates without the config's ``eval.extension`` (to ``eval-none/``). TensorBoard: the run's ``tb/``, or
    ``out/tb/`` with ``out``. ``names``: how the caller's user gives these arguments (scripts/evaluate.py: its
    flags, ``{"samples": "--samples", ...}``), which an error about a value given here names; a value from the run's
    config is named by its key (``eval.samples``)."""
    from minilm.config import phase_names
    from minilm.runs import load_run, load_run_config

    # tasks=[] is refused, not the config's (an empty list of lengths is the default ones, as eval.lengths: [] is)
    # (as given, checked below: int() made lengths=[64.5] a 64 without a word)
    lengths, tasks = list(lengths) if lengths else None, list(tasks) if tasks is not None else None
    _check_setting_names(changes)
    if changes.get("stride") is not None and changes.get("sliding") is False:  # (it ignored the stride without a word)
        stride, sliding = (names or {}).get("stride", "stride"), (names or {}).get("sliding", "sliding")
        raise ConfigError(f"{stride}={changes['stride']} sets the sliding-window perplexity's stride, which "
                          f"{sliding}=False skips; give one of them")  # fmt: skip
    if changes.get("stride") is not None and changes.get("sliding") is None:
        # a stride asks for the sliding windows: on a run whose config has eval.sliding: false, --stride 16 measured
        # no ppl_sliding, without a word (and the script has no flag to turn them on)
        changes = {**changes, "sliding": True}
    given = {"lengths": lengths, "tasks": tasks, "extension": extension or None, "device": device, "out": out,
             **changes}  # fmt: skip
    names = {k: name for k, name in (names or {}).items() if given.get(k) is not None}  # the config's: their keys
    _check_given(given, names)
    device = resolve_device(device, name=names.get("device", "device"))
    loaded = load_run(path, phase, map_location=device)
    cfg = loaded.cfg
    run_cfg = load_run_config(loaded.run_dir / "config.yaml")
    phase = loaded.phase or phase_names(run_cfg)[-1]
    plain = bool(extension) and extension.get("name") == NO_EXTENSION  # not even the config's eval.extension
    settings = _run_settings(cfg, lengths, tasks, {} if plain else dict(extension) if extension else None, names,
                             changes)  # fmt: skip
    for line in _unread_settings(changes, settings, names):
        log(line)
    mid_phase = loaded.step is not None  # a step checkpoint (load_run read its step with its weights)
    step = global_step(run_cfg, phase, loaded.step)
    data = eval_data(cfg, loaded.run_dir)
    model = loaded.model
    if settings.extension:  # named as given: the caller's flag (names), else this argument, else the config's key
        model, _ = apply_extension(model, cfg.model, loaded.tokenizer.vocab_size, settings.extension,
                                   cfg.train.seq_len, "extension" if extension else "eval.extension",
                                   names.get("extension"))  # fmt: skip
    out_dir = Path(out) if out else _run_out_dir(loaded, phase, extension)
    at = f"step {step}" + (f", step {loaded.step} of the phase" if mid_phase else "")
    meta = _meta(cfg, loaded.run_dir, phase, step, settings.extension, loaded.weights, loaded.step, loaded.record)
    log(f"evaluating {loaded.weights} (phase {phase}, {at}) at lengths {settings.lengths} on {device}"
        + _extension_text(meta))
    results = _evaluate_into(out_dir, model, data, settings, meta, log)
    figures = write_report(results, out_dir)
    _clear_phase_error(out_dir, loaded.run_dir / phase)
    if tensorboard:
        # --out: a side evaluation (other lengths, samples, settings). In the run's tb/ its scalars would sit at
        # the same step and under the same tags as the phase's own evaluation, one curve of two measurements.
        prefix = f"eval-{NO_EXTENSION}" if plain else _tb_prefix(settings.extension)
        _to_tensorboard(out_dir / "tb" if out else loaded.run_dir / "tb", results, figures, step, prefix,
                        f"{phase}.{out_dir.name}")  # fmt: skip
    log(f"written: {out_dir / 'results.json'}, {out_dir / 'report.md'}, {plural(len(figures), 'figure')}")
    return results, out_dir


def _unread_settings(changes: Mapping[str, Any], settings: EvalSettings, names: Mapping[str, str]) -> List[str]:
    """A note for each setting given to ``evaluate_run`` that no metric of its tasks reads (``--stride 8 --tasks
    passkey``: accepted and unused, without a word), naming the metrics that would read it."""
    measured = {m for t in settings.tasks for m in ((("ppl", "ppl_sliding") if settings.sliding else ("ppl",))
                                                    if t == "ppl" else (t,))}  # fmt: skip
    notes = []
    for key, (metrics, _, _) in SETTINGS_READ_BY.items():
        if changes.get(key) is not None and not measured & set(metrics):
            notes.append(f"note: {names.get(key, key)} {changes[key]} has no effect: it is read by "
                         f"{', '.join(metrics)}, and the tasks measured are {', '.join(settings.tasks)}")
    return notes


def _run_settings(cfg, lengths, tasks, extension, names: Mapping[str, str], changes: Mapping[str, Any]) -> EvalSettings:
    """``evaluate_run``'s settings: the run's config's ``eval`` with what was given here (``extension``: {} for none
    at all), the lengths defaulting to half to eight times the training length, checked."""
    # the lengths given here replace the config's before anything is checked against them: a --stride was checked
    # against the config's eval.lengths, and refused, though the lengths evaluated were --lengths
    settings = EvalSettings.from_config(cfg, lengths=lengths, tasks=tasks, extension=extension, names=names,
                                        **changes)  # fmt: skip
    if not settings.lengths:
        settings = replace(settings, lengths=default_lengths(cfg.train.seq_len))
    settings.validate(names=names)
    return settings


def _run_out_dir(loaded, phase: str, extension: Optional[Mapping[str, Any]]) -> Path:
    """Where ``evaluate_run`` writes without ``out``: RUN/PHASE/eval/, eval-METHOD/ with an extension given to it,
    eval-step-N/ (and eval-step-N-METHOD/) for a step checkpoint."""
    # an extension asked for here sits next to the phase's own evaluation; the config's eval.extension IS the
    # phase's own evaluation, written to eval/ as at the end of the phase. A step checkpoint's evaluation is not the
    # phase's: it went to eval/, replacing the evaluation of the phase's final weights, and said the phase's step
    suffix = f"-{extension['name']}" if extension else ""
    stem = f"eval-{loaded.weights.stem}" if loaded.step is not None else "eval"
    return loaded.run_dir / phase / f"{stem}{suffix}"


def _evaluate_into(out_dir: Path, model, data, settings: EvalSettings, meta: dict, log) -> dict:
    """``evaluate``'s results for ``out_dir``, made first (before the evaluation, not after it); a folder made here
    is removed again, empty, when the evaluation fails or measures nothing."""
    new_dir = not out_dir.exists()
    make_output_dir(out_dir)
    try:
        results = evaluate(model, data, settings, meta=meta, log=log)
        if all(v is None for task in TASKS for v in results.get(task, {}).values()):  # keep what the folder holds
            raise MinilmError(f"nothing could be measured at any length, so nothing was written to {out_dir}: "
                              + "; ".join(not_measured(results)))
    except BaseException:  # (Ctrl-C too) an eval-METHOD/ made for it and left empty read as an evaluation there
        if new_dir and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    return results


# marks the events file of an evaluation: events.out.tfevents.<time>.<host>.<pid>.<n>.minilm-eval.<phase>.<folder>
EVAL_EVENTS = ".minilm-eval."


def _to_tensorboard(tb_dir: Path, results: dict, figures, step: int, prefix: str, key: str) -> None:
    """Log an evaluation to ``tb_dir`` in an events file of its own, named by ``key`` (``PHASE.FOLDER``: the phase
    and the folder it was written to), replacing the file an earlier evaluation into that folder wrote. Appended to
    the same tags at the same step, a second evaluation (other settings, or the same one again after a kill) gave
    TensorBoard two values for one step, and its curves zig-zagged between them; the folder's results.json is
    replaced, and its events are now too. (A TensorBoard already running keeps what it has read until restarted.)"""
    from torch.utils.tensorboard import SummaryWriter

    suffix = EVAL_EVENTS + key
    for old in tb_dir.glob("events.out.tfevents.*"):
        if old.name.endswith(suffix):
            old.unlink(missing_ok=True)
    writer = SummaryWriter(str(tb_dir), filename_suffix=suffix)
    try:
        log_tensorboard(writer, results, figures, step, prefix=prefix)
    finally:
        writer.close()
