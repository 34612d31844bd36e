"""The typed config schema and the one loader.

Three layers, one merge (the lingua / OmegaConf structured-config pattern):

    dataclass defaults  <  YAML chain (a YAML may name a ``base:`` YAML, relative to itself)  <  CLI dotlist

Unknown keys and wrong types are errors naming the key and the layer (file or command line) that set it; value
checks run once, in ``validate``; the loaded config is read-only. Values derived from others are computed in
this module only (``ffn_dim``, ``phase_config``, ``phase_names``), so a grep for a key finds its one meaning.

Two parts of the schema are open mappings validated by their owners rather than by a dataclass here:
``model.position`` (``name`` plus that encoding's parameters, checked by ``minilm.positions``) and
``data.sources`` (source name -> ``{kind, weight, ...}``, checked by ``minilm.data``).

Merge rule for ``model.position``: a layer that sets a different ``name`` starts a fresh position block, so
``model.position.name=alibi`` on the command line does not inherit RoPE's ``base`` from the YAML, nor the phases'
RoPE scaling blocks (every phase's ``position`` starts fresh too: same schedule, new encoding). Likewise a
``scaling`` block (in ``model.position`` or a phase's ``position``, and a phase's over the run's) that names a
different ``rope_type`` replaces the inherited one: PI does not inherit YaRN's ``original_max_position_embeddings``.
A source under ``data.sources`` that names a different ``kind`` replaces the inherited one, too. ``NAME: null``
removes an inherited source (``data.sources``) or phase (``phases``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import re
import typing
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from minilm.errors import ConfigError, DataError
from minilm.files import atomic_write_text

# --------------------------------------------------------------------------------------------------- schema


@dataclass
class RunConfig:
    name: str = "run"
    dir: str = "runs/${run.name}"  # where everything of this run goes
    seed: int = 1337


@dataclass
class ModelConfig:
    n_layers: int = 4  # transformer blocks (pre-norm attention + MLP: minilm/model/transformer.py)
    d_model: int = 256  # residual stream width; head_dim = d_model / n_heads (even for rope / xpos: pairs rotate)
    n_heads: int = 4  # query heads; must divide d_model
    n_kv_heads: Optional[int] = None  # grouped-query attention; None = n_heads (plain multi-head)
    d_ff: Optional[int] = None  # None: 8/3·d_model rounded up to 64 for swiglu, 4·d_model for gelu (ffn_dim)
    mlp: str = "swiglu"  # swiglu | gelu
    norm_eps: float = 1e-5  # epsilon of every RMSNorm (before attention, before the MLP, the final one)
    # the LM head is the token embedding matrix (Press & Wolf 2017); false: a (vocab, d_model) matrix of its own,
    # counted among the non-embedding parameters the run logs
    tie_embeddings: bool = True
    # in [0, 1): on the embeddings and on each residual branch's output (attention, MLP), in training only; none on
    # the attention probabilities (FlexAttention has none, and every kernel computes the same attention)
    dropout: float = 0.0
    # > 0: every matrix starts N(0, init_std), the residual branches' output projections (attention wo, MLP w_out)
    # N(0, init_std / sqrt(2·n_layers)) (GPT-2)
    init_std: float = 0.02
    # rows of (B·T) per LM-head + cross-entropy chunk (minilm/model/loss.py): the (B·T, vocab) logits are never
    # whole in memory; None = the plain path (whole logits, then F.cross_entropy). Same loss and gradients.
    loss_chunk_size: Optional[int] = None
    # recompute each block's activations in backward (torch.utils.checkpoint, training only): less memory for
    # long sequences at ~1/3 more compute. Same gradients.
    activation_checkpointing: bool = False
    # SDPA's kernel on CUDA for the encodings without a score term (RoPE family, absolute, none): "auto" leaves
    # torch's order (flash, efficient, math, cuDNN); a named one (SDPA_KERNELS) goes first, the others stay behind it
    # for inputs it cannot take. The same attention in every kernel; CPU runs its own kernel whatever this says.
    sdpa_kernel: str = "auto"
    # ``name`` picks the encoding from minilm.positions.REGISTRY; the other keys are its parameters.
    position: Dict[str, Any] = field(default_factory=lambda: {"name": "rope"})


@dataclass
class TokenizerConfig:
    type: str = "bpe"  # bpe | unigram (sentencepiece model types)
    vocab_size: int = 4096
    byte_fallback: bool = True
    model_file: Optional[str] = None  # an existing sentencepiece .model instead of training one
    sample_chars: int = 10_000_000  # characters of the mixture the tokenizer is trained on


SYNTHETIC_LOSSES = ("all", "answer")  # data.synthetic.loss: the values the schema and the sampler accept


@dataclass
class SyntheticConfig:
    fraction: float = 0.0  # share of each batch replaced by generated retrieval sequences
    tasks: List[str] = field(default_factory=lambda: ["passkey", "kv"])  # passkey | kv (minilm.data.synthetic)
    style: str = "auto"  # code | text | auto (code when an embedded source is present)
    loss: str = "all"  # one of SYNTHETIC_LOSSES: targets on every token of a synthetic row, or its answer tokens only


@dataclass
class DataConfig:
    # source name -> {kind: embedded | files | hf, weight: float, ...kind-specific keys}; NAME: null removes one
    sources: Dict[str, Any] = field(default_factory=lambda: {"embedded": {"kind": "embedded", "weight": 1.0}})
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    cache_dir: str = "data/cache"
    val_fraction: float = 0.02  # share of documents held out (by a hash of the document's name)
    num_proc: int = 2  # sentencepiece threads encoding the documents (minilm/data/prepare.py: _tokenize)
    # sampling (a phase may override these under its own ``data:``)
    long_fraction: float = 0.0  # share of sequences drawn as windows of long documents
    long_min_tokens: Optional[int] = None  # a "long" document has at least this many tokens; None = seq_len
    document_mask: bool = False  # attend only within each packed document
    restart_positions: bool = False  # positions restart at 0 in each packed document (needs document_mask)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class OptimConfig:
    lr: float = 1e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # final lr = lr · min_lr_ratio
    warmup_steps: int = 100
    decay: str = "cosine"  # cosine | linear | constant
    weight_decay: float = 0.1  # applied to matrices only (not norms, biases, position tables: training/optim.py)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping


@dataclass
class TrainConfig:
    seq_len: int = 256
    batch_size: int = 16  # sequences per optimizer step (per device)
    # None = batch_size; smaller values accumulate gradients: each batch's rows are split, so only memory and
    # time change (the same rows are trained on and validated on)
    micro_batch_size: Optional[int] = None
    steps: int = 1000
    # when set, wins over steps: steps = ceil(tokens / (batch_size · seq_len)) (a steps given in a later layer is an
    # error: _check_run_length)
    tokens: Optional[int] = None
    # auto: bf16-mixed on GPU and on CPUs with AMX or AVX512-BF16, else 32 (minilm/training/precision.py)
    precision: str = "auto"  # auto | 32 | bf16-mixed | 16-mixed
    compile: bool = False
    # torch.compile's mode when compile is on: default | max-autotune-no-cudagraphs (inductor times its GEMM and
    # kernel configurations on the device at the first step: longer compiles). The CUDA-graph modes are not offered.
    compile_mode: str = "default"
    val_every: int = 100  # steps between validations (0: only at the end)
    val_batches: int = 8  # validation batches of batch_size rows (per device)
    log_every: int = 10
    ckpt_every: int = 100  # steps between resumable checkpoints (0: only at phase end)
    keep_checkpoints: int = 2  # the newest k step checkpoints of a phase are kept (0: all of them)
    max_bad_steps: int = 0  # steps with a NaN/inf loss or gradient skipped before the phase stops (0: none)


@dataclass
class TrainerConfig:
    """Passed through to lightning.Trainer."""

    accelerator: str = "auto"
    devices: Any = "auto"
    strategy: str = "auto"
    num_nodes: int = 1


@dataclass
class EvalConfig:
    """The evaluation suite (minilm/eval, docs/evaluation.md); checked by ``minilm.eval.validate_eval``."""

    lengths: List[int] = field(default_factory=list)  # end-of-phase evaluation lengths; empty = none
    batches: int = 4  # perplexity: batches of windows per length and mode
    batch_tokens: int = 8192  # tokens per forward pass: a batch holds max(1, batch_tokens // length) sequences
    tasks: List[str] = field(default_factory=lambda: ["ppl", "passkey"])  # ppl | passkey | needle | kv
    sliding: bool = True  # ppl also in sliding windows (ppl_sliding); ppl itself is non-overlapping windows
    stride: Optional[int] = None  # sliding-window step in tokens; None = length // 2
    depths: List[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # passkey / needle depths
    samples: int = 8  # retrieval samples per (length, depth) cell; kv: samples x len(depths) per length
    needles: int = 4  # needle task: needles per prompt (one asked for, the rest distractors)
    extension: Dict[str, Any] = field(default_factory=dict)  # {name: METHOD, ...params}: applied at evaluation


@dataclass
class PhaseConfig:
    """One training phase: states only what changes from the run's ``train`` / ``optim`` / ``data`` / model
    position. ``None`` means "as the run's defaults"."""

    seq_len: Optional[int] = None
    steps: Optional[int] = None  # the phase's length: steps or tokens (giving both is an error), else the run's
    tokens: Optional[int] = None
    batch_size: Optional[int] = None
    micro_batch_size: Optional[int] = None
    lr: Optional[float] = None
    min_lr_ratio: Optional[float] = None
    warmup_steps: Optional[int] = None
    decay: Optional[str] = None
    position: Dict[str, Any] = field(default_factory=dict)  # merged onto model.position (e.g. base, scaling)
    data: Dict[str, Any] = field(default_factory=dict)  # merged onto data (long_fraction, sources, ...)
    carry_optimizer: bool = False  # weights always carry; optimizer state only if asked; schedule restarts
    eval_lengths: Optional[List[int]] = None


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # phase name -> PhaseConfig, run in order; empty = one phase named "train" with the run's defaults; NAME: null
    # removes an inherited phase
    phases: Dict[str, PhaseConfig] = field(default_factory=dict)


DEFAULT_PHASE = "train"
# A phase trains in run.dir/<name>/ and ``--phase NAME`` deletes that directory first: a name must be one plain
# directory name that no file or directory of the run itself uses ('..' once deleted the runs next to the run).
PHASE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
RESERVED_PHASE_NAMES = ("tb",)  # run.dir/tb holds the TensorBoard events of every phase
PRECISIONS = ("auto", "32", "bf16-mixed", "16-mixed")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")  # train.compile_mode
SDPA_KERNELS = ("auto", "flash", "cudnn", "efficient")  # model.sdpa_kernel
DECAYS = ("cosine", "linear", "constant")
MLPS = ("swiglu", "gelu")

# ---------------------------------------------------------------------------------------------------- loading


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error: plain YAML keeps the last value
    silently, so a duplicated section or key would drop settings without a word; and that a scalar is read as the
    command line reads it (OmegaConf's YAML rules, below)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor': SafeLoader merges it, the own keys win
                continue  # (constructed as a key, it was "could not determine a constructor for the tag")
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark,
                )  # fmt: skip
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def resolve(self, kind, value, implicit):
        """A plain scalar that YAML 1.1 reads as a base-60 number is the text it looks like (below)."""
        if kind is yaml.ScalarNode and implicit[0] and BASE_60.fullmatch(value):
            return "tag:yaml.org,2002:str"
        return super().resolve(kind, value, implicit)


# YAML 1.1 reads 1:30 as the base-60 (sexagesimal) integer 90 and 1:30.5 as 90.5, in a file as on the command line
# (OmegaConf's loader): eval.lengths=[1:2] became [62] and train.steps: 1:30 ninety steps, without a word. Such a
# value is read as the text it looks like (YAML 1.2 has no base-60 numbers), so a number key refuses it naming the
# key, and a string key keeps it (run.name: 12:30). The command line's values are quoted so (_read_as_in_a_file).
BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


# A file and the command line read a value alike. PyYAML reads YAML 1.1, where a float needs a dot and a signed
# exponent: ``factor: 4e0`` (and 1e-3, 1.0e5) was a string, refused in an open block such as a scaling block or taken
# as a name, while ``factor=4e0`` on the command line, which OmegaConf parses with YAML 1.2's floats, was the number.
# Every float YAML 1.2 and Python read is one here too (OmegaConf's pattern); and a date is text, as there (PyYAML
# made 2024-01-01 a datetime.date, which OmegaConf cannot hold: a traceback).
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
                  |[-+]?\.[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)
UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in UniqueKeyLoader.yaml_implicit_resolvers.items()
}


def _read_yaml(path: Path, chain: List[Path]) -> List[tuple[str, DictConfig]]:
    """The YAML chain root-first: [(label, layer), ...]; ``base:`` is relative to the file naming it."""
    where = f" (named by 'base:' in {chain[-1]})" if chain else ""
    try:
        path = path.resolve()
    except (RuntimeError, OSError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ConfigError(f"config {path}{where} cannot be resolved: {e}") from None
    if path in chain:
        cycle = " -> ".join(str(p) for p in chain + [path])
        raise ConfigError(f"config 'base:' chain has a cycle: {cycle}")
    if not path.exists():
        raise ConfigError(f"config file not found: {path}{where}")
    if not path.is_file():
        raise ConfigError(f"config {path}{where} is not a file (a YAML file is expected)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}{where}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{path}{where}: cannot be read ({e.strerror})") from None
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(path, e, text)) from None
    if raw is None:  # (it trained the schema's defaults, 1000 steps into runs/run, without a word)
        raise ConfigError(f"{path}{where}: holds no config (empty, or only comments): a truncated or wrong file? give "
                          f"its keys, or 'base: FILE' to extend one ('{{}}' for the schema's defaults alone)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config must be a mapping of sections, got {type(raw).__name__}")
    if "variants" in raw and "config" in raw:  # (it said: bad config key 'config')
        raise ConfigError(f"{path}{where}: a study file (config:, variants:), not a run config: run it with python "
                          f"scripts/study.py {path}")  # fmt: skip
    base = raw.pop("base", None)
    layers: List[tuple[str, DictConfig]] = []
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(f"{path}: 'base' must be a path to a YAML file, got {base!r}")
        layers = _read_yaml(path.parent / base, chain + [path])
    glued = _glued_colon(raw)
    if glued:
        line = next((i for i, t in enumerate(text.splitlines(), 1) if glued[1] in t), None)
        _check_glued_colon(raw, f"in {path}" + (f", line {line}" if line else ""))
    layers.append((str(path), OmegaConf.create(raw)))
    return layers


def yaml_problem(path: Path, e: yaml.YAMLError, text: str = "") -> str:
    """A YAML error as one line naming the file, the line and column of the problem and what it is: PyYAML's own
    text spans four or more lines and names the file '<unicode string>' (the text was read first). A tab where
    YAML reads indentation gets the fix (YAML indents with spaces only)."""
    mark = getattr(e, "problem_mark", None)
    at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    context = getattr(e, "context", None)
    what = f"{problem} ({context})" if context and context not in problem else problem
    row = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
    tab = r"'\t'" in problem or "\t" in row[: mark.column + 1 if mark is not None else 0]  # (problem: a repr)
    hint = "; replace the tab with spaces (YAML indents with spaces only)" if tab else ""
    return f"{path}{at}: not valid YAML: {what}{hint}"


KEY_PART = re.compile(r"\[\d+\]|[^.\[\]]+")  # the parts of a dotted key with list items: a.b[2].c -> a, b, [2], c


def yaml_line(path: Path, key: str) -> Optional[int]:
    """The line of the dotted ``key`` (list items as ``[i]``) in the YAML file ``path``, 1-based: an error about a
    value a file set says where in the file. None where the file cannot be read or does not hold the key."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for part in KEY_PART.findall(key):
        if isinstance(node, yaml.SequenceNode) and part.startswith("["):
            i = int(part[1:-1])
            node = node.value[i] if i < len(node.value) else None
            line = None if node is None else node.start_mark.line + 1
        elif isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            node, line = (pair[1], pair[0].start_mark.line + 1) if pair else (None, None)
        else:
            return None
        if node is None:
            return None
    return line


def _file_line(label: str, key: str) -> str:
    """', line N' where ``label`` names a YAML file of the chain (as _read_yaml labels them) that holds ``key``."""
    path = Path(label.removeprefix("in "))
    line = yaml_line(path, key) if path.suffix in (".yaml", ".yml") and path.is_file() else None
    return f", line {line}" if line else ""


# 'kind:files' (no space after the colon) is one plain scalar in YAML, so '{kind:files}' is a mapping holding the key
# 'kind:files' with no value, and the error came later and elsewhere ("kind: must be one of ..., got None")
_GLUED_COLON = re.compile(r"[A-Za-z_][\w.-]*:[^\s:].*")


def _glued_colon(node: Any, key: str = "") -> Optional[tuple[str, str]]:
    """(dotted key of the mapping, its key) of the first key written 'name:value' with no space after the colon (a
    key with no value), in a plain container or an OmegaConf one; None where there is none."""
    if isinstance(node, (dict, DictConfig)):
        items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else node.items()
        for k, v in items:
            if v is None and isinstance(k, str) and _GLUED_COLON.fullmatch(k):
                return key, k
            found = _glued_colon(v, f"{key}.{k}" if key else str(k))
            if found:
                return found
    elif isinstance(node, (list, ListConfig)):  # (iterating a ListConfig resolves its items: a traceback where one
        # is an interpolation of a key of the config, which the command line's layer alone does not hold)
        for i, v in enumerate(OmegaConf.to_container(node, resolve=False) if isinstance(node, ListConfig) else node):
            found = _glued_colon(v, f"{key}[{i}]")
            if found:
                return found
    return None


def _check_glued_colon(layer: Any, label: str) -> None:
    """Refuse a flow mapping written without a space after a colon (``data.sources.mine={kind:files}``), naming
    the key, where it was set (``label``) and the fix, before the config reads 'kind:files' as a key."""
    found = _glued_colon(layer)
    if found:
        key, glued = found
        name, _, value = glued.partition(":")
        raise ConfigError(f"{key or 'config'}: '{glued}' is read as one key with no value ({label}): YAML needs a "
                          f"space after the colon of a mapping; write '{name}: {value}'")  # fmt: skip


def _scaling_type(block: Any) -> Optional[str]:
    """The ``rope_type`` a position block's ``scaling`` names (None: no scaling block, or none named)."""
    scaling = block.get("scaling") if isinstance(block, (dict, DictConfig)) else None
    return scaling.get("rope_type") if isinstance(scaling, (dict, DictConfig)) else None


def _fresh_scaling(old: Any, new: Any) -> None:
    """A ``scaling`` block that names another ``rope_type`` replaces the one in ``old`` instead of merging onto it:
    linear scaling must not inherit YaRN's ``original_max_position_embeddings``."""
    new_type = _scaling_type(new)
    if new_type is not None and _scaling_type(old) not in (None, new_type):
        old["scaling"] = None


def _fresh_sources(old: Any, new: Any) -> None:
    """A source that names another ``kind`` replaces the one of that name in ``old`` instead of merging onto it:
    ``data.sources.mine={kind: files, paths: [...]}`` over a YAML's ``mine: {kind: embedded, max_docs: 100}`` kept
    max_docs (read 100 files), and over an hf source failed on its ``path``."""
    if not isinstance(new, DictConfig) or not isinstance(old, DictConfig):
        return
    for name, source in new.items_ex(resolve=False):
        kind = source.get("kind") if isinstance(source, DictConfig) else None
        before = old.get(name)
        if kind is not None and isinstance(before, DictConfig) and before.get("kind") != kind:
            old[name] = {}


def _shape_errors(node: DictConfig, prefix: str = "") -> List[str]:
    """Keys of a layer whose value has the wrong shape for the schema: not a mapping where a section or mapping is
    expected (``model.position=[1]`` was a traceback), not a list where a list is (OmegaConf's message for
    ``eval.lengths=128`` named no shape: "AnyNode is not a ListConfig")."""
    out = []
    for k, v in node.items_ex(resolve=False):
        key = f"{prefix}{k}"
        t = _schema_type(key)
        if t is None or OmegaConf.is_interpolation(node, k):
            continue
        shown = OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
        if dataclasses.is_dataclass(t) or typing.get_origin(t) is dict:
            if isinstance(v, DictConfig):
                out += _shape_errors(v, key + ".")
            else:
                # (data.sources given as a list of sources, as other frameworks take them: say the mapping's shape)
                what = (" (a name for each source: data.sources.NAME={kind: files, paths: [...]})"
                        if key == "data.sources" else "")  # fmt: skip
                out.append(f"'{key}' must be a mapping of keys{what}, got {shown!r}")
        elif typing.get_origin(t) is list and v is not None and not isinstance(v, ListConfig):
            out.append(f"'{key}' must be a list such as [a, b], got {shown!r}")
        elif t is bool and not isinstance(v, bool) and (isinstance(v, (int, float)) or _number_text(v)):
            out.append(f"'{key}' must be true or false, got {shown!r}")  # OmegaConf reads any nonzero number as true
    return out


def _number_text(value: Any) -> bool:
    """A string OmegaConf would read as a number (``compile: "2"``, which it then reads as true)."""
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _check_new_phase(cfg: DictConfig, name: str, phase: DictConfig, label: str) -> None:
    """A YAML file whose base already has phases may add one, but a phase it adds that sets neither its length nor
    its seq_len is most likely a misspelled name of a base phase (``extend_1K`` for ``extend_1k``): merged as
    written it would append a phase of the run's defaults and train it after the others, and the phase meant would
    train unchanged. A name that differs from a base phase's in case alone is that phase misspelled, whatever it sets
    (``extend_2K: {steps: 5}``, the commonest edit, appended a fifth phase at the run's seq_len)."""
    same = next((n for n in cfg.phases if n.lower() == name.lower()), None)
    if same is not None:
        raise ConfigError(f"{label}: phases.{name}: not a phase of its base (phases: {', '.join(cfg.phases)}); did "
                          f"you mean '{same}'? Phase names are case-sensitive.")  # fmt: skip
    if any(phase.get(key) is not None for key in ("seq_len", "steps", "tokens")):
        return
    close = difflib.get_close_matches(name, list(cfg.phases), n=1, cutoff=0.6)
    raise ConfigError(
        f"{label}: phases.{name}: not a phase of its base (phases: {', '.join(cfg.phases)})"
        + (f"; did you mean '{close[0]}'?" if close else "")
        + " A new phase must set its seq_len, or its steps or tokens."
    )


def _drop_phases(cfg: DictConfig, layer: DictConfig, label: str) -> DictConfig:
    """``phases.NAME: null`` removes phase NAME inherited from an earlier layer (a base YAML, the --config file), as
    ``data.sources.NAME: null`` removes a source: a merge cannot delete keys, and the null was refused as "must be a
    mapping". Returns the layer without those entries; a name that is not a phase yet is an error (a misspelling would
    otherwise remove nothing)."""
    given = OmegaConf.select(layer, "phases", default=None, throw_on_resolution_failure=False)
    gone = [n for n, v in given.items_ex(resolve=False) if v is None] if isinstance(given, DictConfig) else []
    if not gone:
        return layer
    for name in gone:
        if name not in cfg.phases:
            close = difflib.get_close_matches(name, list(cfg.phases), n=1, cutoff=0.6)
            have = f"its phases are: {', '.join(cfg.phases)}" if len(cfg.phases) else "it has no phases"
            raise ConfigError(f"{label}: phases.{name}: null removes an inherited phase, and there is no phase "
                              f"'{name}' to remove ({have})" + (f"; did you mean '{close[0]}'?" if close else ""))
    layer = copy.deepcopy(layer)
    for name in gone:
        del cfg.phases[name]
        del layer.phases[name]
    return layer


def _merge_layer(cfg: DictConfig, layer: DictConfig, label: str, dotlist: bool = False) -> DictConfig:
    layer = _drop_phases(cfg, layer, label)
    wrong = _shape_errors(layer)
    if wrong:
        raise ConfigError(f"{label}: {'; '.join(wrong)}")
    new_name = OmegaConf.select(layer, "model.position.name", default=None, throw_on_resolution_failure=False)
    if new_name is not None and new_name != cfg.model.position.get("name"):
        cfg.model.position = {}  # a different encoding starts from a fresh parameter block, and so does every
        for phase in cfg.phases.values():  # phase's: its position overrides were the old encoding's parameters
            phase.position = {}
    _fresh_scaling(cfg.model.position,
                   OmegaConf.select(layer, "model.position", default=None, throw_on_resolution_failure=False))
    _fresh_sources(cfg.data.sources,
                   OmegaConf.select(layer, "data.sources", default=None, throw_on_resolution_failure=False))
    layer_phases = OmegaConf.select(layer, "phases", default=None, throw_on_resolution_failure=False)
    if isinstance(layer_phases, DictConfig):
        for name, phase in layer_phases.items_ex(resolve=False):
            if name in cfg.phases and isinstance(phase, DictConfig):
                _fresh_scaling(cfg.phases[name].position, phase.get("position"))
            elif not dotlist and len(cfg.phases) and isinstance(phase, DictConfig):
                _check_new_phase(cfg, name, phase, label)
    try:  # in place: OmegaConf.merge would deep-copy the config first, once per layer (a bad layer fails the load)
        cfg.merge_with(layer)
        return cfg
    except (OmegaConfBaseException, TypeError, ValueError) as e:  # TypeError: a list onto a mapping (phases)
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        value = getattr(e, "value", None)
        if isinstance(value, str) and BASE_60.fullmatch(value) and not isinstance(yaml.safe_load(value), str):
            msg += (f" ({value} is read as text, not as YAML 1.1's base-60 number {yaml.safe_load(value)}: write "
                    f"the number meant)")  # fmt: skip
        if isinstance(e, ConfigKeyError) and "Did you mean" not in msg:
            msg += _elsewhere(cfg, key) + _phase_keys_hint(key)
        where = label if dotlist else label + _file_line(label, key)
        raise ConfigError(f"{where}: bad config key '{key}': {msg}") from None


def _elsewhere(cfg: DictConfig, key: str) -> str:
    """Where a key of that name does live, when it is in another section: OmegaConf suggests names within the
    section only, so ``train.seed`` got no hint toward ``run.seed``."""
    parts = key.split(".")
    if parts[0] == "phases":  # (a phase's keys are their own schema's; its errors say what it takes)
        return ""
    found = [f"{section}.{parts[-1]}" for section, sub in cfg.items_ex(resolve=False)
             if section != parts[0] and isinstance(sub, DictConfig) and parts[-1] in sub]  # fmt: skip
    return f"; did you mean {' or '.join(found)}?" if found else ""


def _phase_keys_hint(key: str) -> str:
    """What phase keys there are, for an unknown key ``phases.NAME.KEY``; for a model key, that a phase cannot change
    the model (OmegaConf said only "Key 'model' not in 'PhaseConfig'")."""
    parts = key.split(".")
    if len(parts) != 3 or parts[0] != "phases":
        return ""
    takes = ", ".join(f.name for f in dataclasses.fields(PhaseConfig))
    if parts[2] == "model" or parts[2] in {f.name for f in dataclasses.fields(ModelConfig)}:
        return (f"; a phase cannot change the model (its weights carry over from the phase before); only its position "
                f"parameters change, under phases.{parts[1]}.position (a phase takes: {takes})")
    return f"; a phase takes: {takes}"


COMMAND_LINE = "command line"


def load_config(path: Optional[str | Path] = None, overrides: Optional[List[str]] = None,
                source: str = COMMAND_LINE, more: Sequence[tuple[str, List[str]]] = ()) -> DictConfig:  # fmt: skip
    """Defaults < YAML chain < CLI dotlist (``key.sub=value``); validated and read-only. ``source`` says where the
    overrides came from, for the errors that name it ("command line"; a study passes "study file X, variant 'Y'");
    ``more``: further (source, overrides) groups merged after them, in order (a study's own command line)."""
    cfg = OmegaConf.structured(Config)
    layers: List[tuple[str, DictConfig]] = []  # (label, layer), for naming the file that set a bad value
    if path is not None and not str(path).strip():  # Path("") is the working directory
        raise ConfigError("config: the path of a YAML file is expected, got an empty string")
    if path is not None:
        for label, layer in _read_yaml(Path(path), []):
            cfg = _merge_layer(cfg, layer, label)
            layers.append((f"in {label}", layer))
    for where, items in [(source, overrides), *more]:
        if items:
            cfg, dot = _merge_overrides(cfg, list(items), where, path)
            layers.append((_overrides_label(where), dot))
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise _unresolved(cfg, e, layers) from None
    _drop_null_sources(cfg.data)
    _typed_position_values(cfg)
    _check_run_length(cfg, layers)
    OmegaConf.set_readonly(cfg, True)  # before validating: the phase configs its checks build are kept (phase_config)
    try:
        validate(cfg)
    except ConfigError as e:  # value checks name the key; say which layer gave it (a base YAML, the command line)
        raise ConfigError(f"{e}{_set_where(str(e), layers, cfg)}") from None
    return cfg


def _unresolved(cfg: DictConfig, e: OmegaConfBaseException, layers: List[tuple[str, DictConfig]]) -> ConfigError:
    """An interpolation that cannot be resolved (``${run.nam}``, ``${oc.env:UNSET}``, a text for a number key) as one
    line naming the key, the interpolation as written and the layer (file and line, or command line) that set it:
    OmegaConf's message spanned four lines of its internals (reference_type=..., object_type=...) and named no file."""
    key = getattr(e, "full_key", None) or ""
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    absent = object()
    raw = _unresolved_value(cfg, key, absent)
    written = f"{raw!r} " if isinstance(raw, str) else ""
    # (not _set_where: OmegaConf.select resolves, and so skipped the layer that set the interpolation)
    where = next((f" (set {label}{_file_line(label, key)})" for label, layer in reversed(layers)
                  if key and _unresolved_value(layer, key, absent) is not absent), "")  # fmt: skip
    if not key:  # (OmegaConf names no key when a whole list or mapping is one: eval.lengths=${train.seq_len})
        given = [f"{k}={v!r} {label}" for label, layer in layers for k, v in _interpolations(layer)]
        where = f" (the interpolations given: {'; '.join(given)})" if given else ""
    return ConfigError(f"{key or 'config'}: {written}cannot be resolved: {reason}{where} (an interpolation names a key "
                       "of the config, e.g. ${run.name}, or an environment variable, ${oc.env:NAME})")


def _interpolations(node: Any, key: str = "") -> List[tuple[str, str]]:
    """(dotted key, text) of each value of ``node`` (a config layer, interpolations unresolved) that holds one."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, dict):
        return [found for k, v in node.items() for found in _interpolations(v, f"{key}.{k}" if key else str(k))]
    if isinstance(node, list):
        return [found for i, v in enumerate(node) for found in _interpolations(v, f"{key}[{i}]")]
    return [(key, node)] if isinstance(node, str) and "${" in node else []


def _unresolved_value(node: DictConfig, key: str, absent: Any) -> Any:
    """The value of the dotted ``key`` (list items as ``[i]``) in ``node`` as written, interpolations unresolved;
    ``absent`` where ``node`` does not hold it."""
    value: Any = OmegaConf.to_container(node, resolve=False)
    for part in KEY_PART.findall(key):
        if isinstance(value, list) and part.startswith("[") and int(part[1:-1]) < len(value):
            value = value[int(part[1:-1])]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return absent
    return value


def _check_run_length(cfg: DictConfig, layers: List[tuple[str, DictConfig]]) -> None:
    """train.tokens, once set, decides the run's length over train.steps (the schema's default steps must not count),
    so a ``train.steps`` that a later layer gives than the last one giving the tokens is not used: ``train.steps=5``
    on a YAML with ``train: {tokens: ...}`` trained the tokens' steps without a word. Refused, as a phase giving both
    is (``_build_phase_config``). Both in one layer stay as they were: a saved config.yaml holds both, and reloads."""
    if cfg.train.tokens is None:
        return

    def last(key: str) -> int:
        return max((i for i, (_, layer) in enumerate(layers)
                    if OmegaConf.select(layer, key, default=None, throw_on_resolution_failure=False) is not None),
                   default=-1)  # fmt: skip

    if last("train.steps") > last("train.tokens"):
        raise ConfigError(
            f"train.steps: {cfg.train.steps}{_set_where('train.steps: ', layers)} is not used: train.tokens = "
            f"{cfg.train.tokens}{_set_where('train.tokens: ', layers)} sets the run's length and wins over it; give "
            "one of them (on the command line: train.tokens=null to train by steps)"
        )


def _typed_position_values(cfg: DictConfig) -> None:
    """A position parameter quoted in YAML (``eps: "1e-2"``) as the number its encoding reads it as, in the run's
    block and each phase's (minilm.positions.typed_values): validation took it for a float, but --print-config and
    the saved config.yaml kept the text."""
    from minilm.positions import typed_values

    name = cfg.model.position.get("name")
    blocks = [cfg.model.position] + [p.position for p in cfg.phases.values() if isinstance(p, DictConfig)]
    for block in blocks:
        if isinstance(block, DictConfig):
            for key, value in typed_values(block.get("name", name), block).items():
                block[key] = value


def _overrides_label(source: str) -> str:
    """Where a group of overrides was set, as the errors say it: 'on the command line', 'in study file S, ...'."""
    return f"on the {source}" if source == COMMAND_LINE else f"in {source}"


def _merge_overrides(cfg: DictConfig, overrides: List[str], source: str, path: Any) -> tuple[DictConfig, DictConfig]:
    """(cfg with the dotlist ``overrides`` merged, the dotlist as a config); errors begin with ``source``."""
    for item in overrides:
        key = item.partition("=")[0]
        if "=" not in item or not all(part.strip() for part in key.split(".")):
            hint = " (a config file is given with --config FILE)" if item.endswith((".yaml", ".yml")) else ""
            raise ConfigError(f"{source}: override '{item}' must look like key.sub=value{hint}")
    overrides = [_keep_string(_read_as_in_a_file(item)) for item in overrides]
    try:
        dot = _dotlist(overrides)
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        bad = next((item for item in overrides if not _parses(item)), None)
        where = f"override '{bad}'" if bad else "overrides"
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]  # (not the scanner's marks)
        # YAML reads the { of ${...} inside brackets or braces as a mapping: eval.lengths=[${train.seq_len}]
        inner = bad is not None and re.search(r"[\[{,]\s*\$\{", bad.partition("=")[2]) is not None
        fix = ("; quote an interpolation inside a list or mapping, eval.lengths=['${train.seq_len}', 512]" if inner
               else " with a space after each colon")  # fmt: skip
        raise ConfigError(f"{source}: cannot parse {where}: {problem} (values are YAML: write "
                          f"'key={{a: 1, b: [x, y]}}'{fix})") from None
    _check_glued_colon(dot, _overrides_label(source))
    _check_phase_names(cfg, dot, path, source)
    try:
        cfg = _merge_layer(cfg, dot, source, dotlist=True)
    except ConfigError as e:
        raise ConfigError(f"{e}{_empty_value_hint(str(e), overrides)}") from None
    _check_shadowed(cfg, dot, source)
    return cfg, dot


def _empty_value_hint(message: str, overrides: List[str]) -> str:
    """Where a null was refused for a key (``Incompatible value 'None'``) that an override gave with nothing after
    its '=' (``run.dir=$UNSET``, expanded by the shell to ``run.dir=``): the message named the key and a None that the
    user never typed."""
    key = re.search(r"bad config key '([^']+)': Incompatible value 'None'", message)
    empty = [item for item in overrides if key and item.partition("=")[0] == key.group(1)
             and not item.partition("=")[2].strip()]  # fmt: skip
    return f" ('{empty[-1]}' gives no value after '=': an unset shell variable? give the value)" if empty else ""


def _dotlist(overrides: List[str]) -> DictConfig:
    """The overrides as one config, in order, as ``OmegaConf.from_dotlist`` reads them, except that a source or a
    scaling block given again with another ``kind`` / ``rope_type`` replaces the earlier one, as it replaces the
    YAML's (``_merge_layer``): two overrides of one source on a command line merged, so ``data.sources.a={kind:
    embedded, max_docs: 5}`` then ``data.sources.a={kind: files, paths: [x]}`` read 5 files."""
    # Each item is parsed twice, on purpose: ``one`` (the item alone) says which block it sets, so that an earlier
    # block of another kind is dropped before the item lands; the item then lands by ``merge_with_dotlist``, which is
    # what ``from_dotlist`` does. Merging ``one`` instead is not the same: it refused an index into a list an earlier
    # item set (``eval.lengths=[128, 256] eval.lengths.1=512``: "Cannot merge incompatible container types") and
    # ignored a later ``key=???``; landing the parsed value by ``OmegaConf.update`` needs the key split as OmegaConf
    # splits it (its private, version-dependent ``_find_eq``: escaped ``\=`` / ``\.`` in keys).
    dot = OmegaConf.create()
    for item in overrides:
        one = OmegaConf.from_dotlist([item])
        _fresh_sources(OmegaConf.select(dot, "data.sources", default=None),
                       OmegaConf.select(one, "data.sources", default=None))  # fmt: skip
        phases = one.get("phases")
        for where in ["model.position"] + [f"phases.{n}.position" for n in (phases if isinstance(phases, DictConfig)
                                                                              else {})]:  # fmt: skip
            _fresh_scaling(OmegaConf.select(dot, where, default=None), OmegaConf.select(one, where, default=None))
        dot.merge_with_dotlist([item])
    return dot


def _set_where(message: str, layers: List[tuple[str, DictConfig]],
               cfg: Optional[DictConfig] = None) -> str:  # fmt: skip
    """' (set in FILE)' / ' (set on the command line)' for the key a check's message starts with (every check
    here and in minilm.positions / minilm.eval writes 'key: what is wrong'): the last layer that gives that key, a
    null included (``model.position.base=null`` is the command line's, not the YAML's that gave 10000.0). Empty where
    no layer gives it (a schema default, or a key no config has). With ``cfg`` (the
    loaded config), a layer whose value is not the one ``cfg`` holds is not named: a scaling block of another
    rope_type replaces the earlier one (``_fresh_scaling``), so the YAML's dropped ``factor`` did not set the
    ``factor: required`` that the new block lacks: that value is said to be dropped instead; a required key no layer
    gave that ``cfg`` lacks (``original_max_position_embeddings: required``) names the block given without it. A key
    that has a default gets nothing: RoPE's ``fraction: 1 rotates every dimension ...`` said the position block set
    on the command line "lacks it", as if the user should have given it."""
    key = KEY_PREFIX.match(message)
    if not key:
        return ""
    absent = object()
    final = absent if cfg is None else OmegaConf.select(cfg, key.group(1), default=absent,
                                                        throw_on_resolution_failure=False)  # fmt: skip
    dropped = ""
    for i in reversed(range(len(layers))):
        label, layer = layers[i]
        given = OmegaConf.select(layer, key.group(1), default=absent, throw_on_resolution_failure=False)
        if given is absent:
            continue
        if cfg is None or _kept(layer, key.group(1), given, final, absent):
            return f" (set {label}{_file_line(label, key.group(1))}){_reset_block(key.group(1), layers, i, cfg)}"
        if final is absent and not dropped and not OmegaConf.is_config(given):  # why a value given is missing
            why = _name_change(key.group(1), layers, i, len(layers)) or _replaced_by(key.group(1), layers[i + 1:])
            dropped = f" (the {given!r} set {label} was dropped: {why})"
    if dropped or cfg is None or final is not absent or not re.match(r"(required|missing)\b", message[key.end():]):
        return dropped  # (a parameter's default that no layer gives: no block "lacks" it, nothing to name)
    return _lacking_block(key.group(1), layers)


def _name_change(key: str, layers: List[tuple[str, DictConfig]], i: int, upto: int) -> str:
    """Why a position parameter (``model.position.*``, ``phases.P.position.*``) that layer ``i`` gave is gone: a
    ``model.position.name`` other than the one in effect there, set by a layer after it up to ``upto`` (excluded),
    which started every position block afresh (``_merge_layer``). Empty where none did. The message blamed the
    block given later (``phases.P.position.scaling given on the command line replaced the block``) instead."""
    parts = key.split(".")
    if parts[:2] != ["model", "position"] and not (parts[0] == "phases" and parts[2:3] == ["position"]):
        return ""
    name = ModelConfig().position["name"]
    for j, (label, layer) in enumerate(layers[:upto]):
        given = OmegaConf.select(layer, "model.position.name", default=None, throw_on_resolution_failure=False)
        if given is None or given == name:
            continue
        if j > i:
            return (f"model.position.name={given} set {label} started a fresh position block, in the run and in every "
                    f"phase, with none of the parameters given for '{name}'")  # fmt: skip
        name = given
    return ""


def _reset_block(key: str, layers: List[tuple[str, DictConfig]], j: int, cfg: Optional[DictConfig]) -> str:
    """For a position parameter that layer ``j`` gave onto a block an earlier layer gave too, where a change of
    ``model.position.name`` in between (or in layer ``j``) emptied that block first, and ``cfg``'s block lacks keys
    the earlier one gave (a YaRN ``rope_type``): ``factor=8`` landed on an empty scaling block, and the error about it
    (``not a parameter of rope_type 'default'``) did not say why."""
    parent = key.rpartition(".")[0]
    final = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False) if cfg else None
    for i in range(j):
        label, layer = layers[i]
        block = OmegaConf.select(layer, parent, default=None, throw_on_resolution_failure=False)
        if isinstance(block, DictConfig) and isinstance(final, DictConfig) and any(k not in final for k in block):
            why = _name_change(key, layers, i, j + 1)
            if why:
                return f"; the {parent} block set {label}{_file_line(label, parent)} was dropped: {why}"
    return ""


def _lacking_block(key: str, layers: List[tuple[str, DictConfig]]) -> str:
    """' (the B block set in FILE, line N lacks it)' for a ``key`` the loaded config lacks: the nearest block above it,
    below a section (``model``, ``phases.P``), that a layer gives, the last such layer named. A required key's message
    named no file: a long chain of base files left the user to search for the block."""
    parent = key.rpartition(".")[0]
    while parent.count(".") >= 1 + parent.startswith("phases."):
        for label, layer in reversed(layers):
            if isinstance(OmegaConf.select(layer, parent, default=None, throw_on_resolution_failure=False), DictConfig):
                return f" (the {parent} block set {label}{_file_line(label, parent)} lacks it)"
        parent = parent.rpartition(".")[0]
    return ""


def _replaced_by(key: str, later: List[tuple[str, DictConfig]]) -> str:
    """Which of the ``later`` layers replaced the block that held ``key`` (the last that gives a block above it)."""
    absent = object()
    parent = key.rpartition(".")[0]
    while parent:
        for label, layer in reversed(later):
            if OmegaConf.select(layer, parent, default=absent, throw_on_resolution_failure=False) is not absent:
                return f"the {parent} given {label} replaced the block that held it"
        parent = parent.rpartition(".")[0]
    return "a later layer replaced the block that held it"


def _kept(layer: DictConfig, key: str, given: Any, final: Any, absent: Any) -> bool:
    """Whether the value a layer gives ``key`` is still the loaded config's ``final`` one (absent: the key was
    dropped). A mapping is kept if each key it gives is (other layers add theirs); an interpolation, which the
    layer alone cannot resolve, and a text the schema converted (``lr: "1e-3"``, ``compile: "yes"``) count as
    kept."""
    if final is absent:
        return False
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(layer, parent, default=None, throw_on_resolution_failure=False) if parent else layer
    if isinstance(node, DictConfig) and last in node and OmegaConf.is_interpolation(node, last):
        return True
    if isinstance(given, DictConfig):
        return isinstance(final, DictConfig) and all(
            _kept(given, k, given.get(k), final.get(k, absent), absent) for k in given.keys())
    if OmegaConf.is_config(given) or OmegaConf.is_config(final):
        try:
            given, final = (OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                            for v in (given, final))  # fmt: skip
        except OmegaConfBaseException:
            return True
    if isinstance(given, str) and not isinstance(final, str):
        try:
            given = yaml.safe_load(given)
        except yaml.YAMLError:
            return True
        # a text the schema reads as a float: 1e-3 (a string to YAML 1.1), nan and inf (strings to YAML 1.2)
        if isinstance(final, float) and _number_text(given):
            given = float(given)
    if isinstance(given, float) and isinstance(final, float) and math.isnan(given) and math.isnan(final):
        return True  # (nan != nan: an lr of .nan was said set by no layer, its message named no file)
    return given == final  # (10000 == 10000.0 and 1 == True, as the schema converts them)


KEY_PREFIX = re.compile(r"([A-Za-z_][\w-]*(?:\.[\w-]+)*): ")


@functools.cache
def _type_hints(cls: type) -> dict:
    """``typing.get_type_hints`` of a schema class, evaluated once: it parses every annotation string again on each
    call (``from __future__ import annotations``), and a load asked it hundreds of times, a third of its time."""
    return typing.get_type_hints(cls)


def _schema_type(key: str) -> Any:
    """The schema's type of a dotted key (None where the schema does not type it: open mappings, unknown keys)."""
    t: Any = Config
    for part in key.split("."):
        if t is PhaseConfig and part == "data":  # an open mapping merged onto the data section: typed as that one
            t = DataConfig  # (phases.x.data.document_mask=2 was read as true)
        elif dataclasses.is_dataclass(t):
            t = _type_hints(t).get(part)
        elif typing.get_origin(t) is dict:  # phases: name -> PhaseConfig
            t = typing.get_args(t)[1]
        else:
            return None
        args = typing.get_args(t)
        if typing.get_origin(t) is typing.Union and len(args) == 2 and type(None) in args:  # Optional[X] -> X
            t = next(a for a in args if a is not type(None))
    return t


def _read_as_in_a_file(item: str) -> str:
    """``key=value`` rewritten so that OmegaConf's loader reads each plain scalar of the value as a config file's
    loader does: one that YAML 1.1 reads as a base-60 number quoted, read as the text (``BASE_60``:
    ``eval.lengths=[1:2]`` is ``eval.lengths=['1:2']``); a float written with a leading dot and an unsigned exponent
    (``DOT_FLOAT``: .5e6) as 0.5e6, the float it is in a file, except for a string key. The scalars are found by
    YAML's own parser (their positions in the value), not by pattern over the whole text; a value it cannot parse is
    left for OmegaConf to report."""
    key, eq, raw = item.partition("=")
    try:
        root = yaml.compose(raw, Loader=UniqueKeyLoader)
    except yaml.YAMLError:
        return item
    spans, dots, todo = [], [], [root]
    while todo:
        node = todo.pop()
        if isinstance(node, yaml.ScalarNode):
            if node.style is None and BASE_60.fullmatch(node.value):
                spans.append((node.start_mark.index, node.end_mark.index))
            elif node.style is None and DOT_FLOAT.fullmatch(node.value) and _schema_type(key) is not str:
                dots.append(node.start_mark.index + (node.value[0] in "+-"))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            todo.extend(n for pair in node.value for n in pair)
    for start, end in sorted([*spans, *((at, None) for at in dots)], reverse=True):
        raw = f"{raw[:start]}0{raw[start:]}" if end is None else f"{raw[:start]}'{raw[start:end]}'{raw[end:]}"
    return f"{key}{eq}{raw}"


# YAML 1.2 (and Python) read .5e6 as a float; OmegaConf's loader, as YAML 1.1, wants a signed exponent after a leading
# dot and read it as the text '.5e6': a typed key converted it, but a position parameter refused it ("got the string
# '.5e6'; write it without quotes", of a value never quoted). _read_as_in_a_file writes it 0.5e6 for OmegaConf.
DOT_FLOAT = re.compile(r"[-+]?\.[0-9]+(?:_[0-9]+)*[eE][0-9]+")


def _keep_string(item: str) -> str:
    """A command-line value for a string key is the text as typed: YAML would read run.name=007 as the int 7 (and
    yes as True, 1e3 as 1000.0), which the schema then stored as '7'; 'run.dir=/tmp/a #b' as '/tmp/a' (' #b' a
    comment, cut without a word) and 'run.dir=/tmp/a: b' as a mapping (refused: "Cannot convert 'DictConfig'")."""
    key, raw = item.split("=", 1)
    if _schema_type(key) is not str:
        return item
    try:
        value = OmegaConf.from_dotlist([f"v={raw}"]).v
    except (OmegaConfBaseException, yaml.YAMLError):
        return item
    cut = isinstance(value, str) and re.search(r"\s#", raw) is not None and "#" not in value
    other = isinstance(value, (bool, int, float, DictConfig)) or cut
    return f"{key}={json.dumps(raw)}" if other else item


def _check_shadowed(cfg: DictConfig, dot: DictConfig, source: str = COMMAND_LINE) -> None:
    """A command-line run key that every phase sets for itself changes nothing: ``train.steps=5`` on a config whose
    phases give their steps (the natural smoke test of configs/rope_yarn_tiny.yaml) trained 300, 60 and 30 steps
    without a word. Refused, naming the phase keys to set."""
    phases = cfg.phases
    if not len(phases) or not isinstance(dot, DictConfig):
        return
    for section in ("train", "optim", "eval"):
        given = dot.get(section)
        for key in given if isinstance(given, DictConfig) else ():
            own = "eval_lengths" if (section, key) == ("eval", "lengths") else key
            if own != "eval_lengths" and PHASE_TO_SECTION.get(key) != section:
                continue
            # a phase's steps or tokens each set its length: either one shadows both run keys
            keys = ("steps", "tokens") if own in ("steps", "tokens") else (own,)
            if all(any(phase[k] is not None for k in keys) for phase in phases.values()):
                per_phase = ", ".join(f"phases.{n}.{own}=..." for n in phases)
                raise ConfigError(f"{source}: {section}.{key} changes nothing here: every phase sets its own "
                                  f"{' or '.join(keys)}; set it per phase ({per_phase})")  # fmt: skip


def _check_phase_names(cfg: DictConfig, dot: DictConfig, path: Any, source: str = COMMAND_LINE) -> None:
    """Where the YAML declares phases, a command-line key under ``phases.`` must name one of them: a misspelled
    ``phases.extend_1K.steps=100`` would otherwise append a phase of its own and train it after the others. (A config
    without phases may declare them on the command line.)"""
    given = dot.get("phases") if isinstance(dot, DictConfig) else None
    if not len(cfg.phases) or not isinstance(given, DictConfig):
        return
    for name in given:
        if name not in cfg.phases:
            raise ConfigError(
                f"{source}: phases.{name}: no such phase in {path}; its phases are: "
                f"{', '.join(cfg.phases)} (a new phase is declared in the YAML file)"
            )


def _parses(item: str) -> bool:
    try:
        OmegaConf.from_dotlist([item])
    except (OmegaConfBaseException, yaml.YAMLError):
        return False
    return True


def on_schema(resolved: Any) -> DictConfig:
    """A resolved config (a plain container or a loaded YAML) on the schema, writable. The open mappings
    (``data.sources``, ``model.position``) are taken as given, not merged onto their defaults: a merge would
    re-add the default ``embedded`` source to a config that removed it."""
    given = OmegaConf.create(resolved)
    cfg = OmegaConf.merge(OmegaConf.structured(Config), given)
    cfg.data.sources = given.data.sources
    _drop_null_sources(cfg.data)  # a default source the config removed is saved as NAME: null (to_yaml)
    cfg.model.position = given.model.position
    return cfg


def _drop_null_sources(data: DictConfig) -> None:
    """``data.sources.NAME: null`` removes a source inherited from a base YAML (a merge cannot delete keys)."""
    for name in [n for n, v in data.sources.items() if v is None]:
        del data.sources[name]


def to_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML that loads back to the same config (``--print-config``, every saved config.yaml).
    A default source the config removed is written as ``NAME: null``: the loader merges ``data.sources`` onto the
    schema's default, so without it the default ``embedded`` source came back on reloading."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    sources = plain.get("data", {}).get("sources")
    if isinstance(sources, dict):
        sources.update({name: None for name in DataConfig().sources if name not in sources})
    return OmegaConf.to_yaml(plain)


def save_config(cfg: DictConfig, path: Path) -> None:
    """Write the resolved config atomically (temporary file, fsync, rename: minilm.files)."""
    atomic_write_text(Path(path), to_yaml(cfg))


# ------------------------------------------------------------------------------------------- derived values


def ffn_dim(model: DictConfig) -> int:
    if model.d_ff is not None:
        return model.d_ff
    if model.mlp == "swiglu":  # keep the parameter count of a 4·d GELU MLP (LLaMA), rounded to 64
        return 64 * ((int(8 * model.d_model / 3) + 63) // 64)
    return 4 * model.d_model


def head_dim(model: DictConfig) -> int:
    return model.d_model // model.n_heads


def filled_model(model: Dict[str, Any]) -> Dict[str, Any]:
    """A plain model section with the values its ``None`` defaults stand for spelled out: ``n_kv_heads`` (None =
    n_heads), ``d_ff`` (None = ``ffn_dim``'s width) and the position block's parameters (``filled_position``). Two
    sections that build the same model are equal so: ``--resume`` and ``--init`` (minilm.training.run_checks), the
    weights' own record (minilm.training.checkpoint) and a study's shared phases compare them filled. A section
    whose values do not validate is filled where it can be."""
    from minilm.positions import filled_position

    filled = dict(model)
    if filled.get("n_kv_heads") is None and "n_heads" in filled:
        filled["n_kv_heads"] = filled["n_heads"]
    if "d_ff" in filled and {"d_model", "mlp"} <= filled.keys():
        try:
            filled["d_ff"] = ffn_dim(OmegaConf.create({k: filled[k] for k in ("d_ff", "d_model", "mlp")}))
        except (TypeError, ValueError, OmegaConfBaseException):
            pass
    if isinstance(filled.get("position"), dict):
        filled["position"] = filled_position(filled["position"])
    return filled


def phase_names(cfg: DictConfig) -> List[str]:
    return list(cfg.phases.keys()) if len(cfg.phases) else [DEFAULT_PHASE]


PHASE_TO_SECTION = {
    "seq_len": "train", "steps": "train", "tokens": "train", "batch_size": "train", "micro_batch_size": "train",
    "lr": "optim", "min_lr_ratio": "optim", "warmup_steps": "optim", "decay": "optim",
}  # fmt: skip


def key_as_set(key: str, phase: str, set_in) -> str:
    """A phase config's dotted ``key`` as the run config sets it: ``phases.<phase>.<key>`` where the phase's own
    section ``set_in`` (``cfg.phases.get(phase)``; None: not known, or a run without phases) gives it (a phase's lr
    is optim.lr in its config, phases.long.lr in the run's), else ``key`` itself. Messages about a phase name keys
    with it, so that the advice is what the user sets (``phases.b.data.long_fraction=0.5``)."""
    section, _, rest = key.partition(".")
    if PHASE_TO_SECTION.get(rest) == section or (section == "model" and rest.startswith("position.")):
        own = rest
    elif section == "data":
        own = key
    else:
        return key
    return f"phases.{phase}.{own}" if set_in is not None and OmegaConf.select(set_in, own) is not None else key


def _inherited(e: ConfigError, name: str, own: str, run: str, set_in: DictConfig,
               held: Optional[DictConfig]) -> ConfigError:  # fmt: skip
    """``e``, an error of phase ``name``'s checks, naming the key as the config sets it. The checks name the phase's
    keys ``own.KEY`` (phases.NAME.micro_batch_size); a KEY that the phase's own section ``set_in`` does not give but
    its config's section ``held`` holds (None: any KEY) is the run's ``run.KEY`` (train.micro_batch_size), inherited
    and broken by what the phase sets (its batch_size): phases.NAME.KEY is then no key of the config, so the user
    could not find it, nor _set_where the file that set it. Any other error is ``e`` itself."""
    key, _, msg = str(e).partition(": ")
    sub = key.removeprefix(f"{own}.")
    unheld = held is not None and OmegaConf.select(held, sub) is None
    if sub == key or OmegaConf.select(set_in, sub) is not None or unheld:
        return e
    return ConfigError(f"{run}.{sub}: in phase '{name}' (which inherits it): {msg}")


# id(a read-only run config) -> {phase name: its phase config}; an entry goes with its config (weakref.finalize)
_PHASE_CONFIGS: Dict[int, Dict[str, DictConfig]] = {}


def phase_config(cfg: DictConfig, name: str) -> DictConfig:
    """The full, read-only config a phase trains with: the run's config with the phase's overrides applied.

    For a read-only config (what ``load_config`` returns) each phase's is built once and the same object returned
    after: a study asked for every phase of every run about three times, at ~30 ms each (a copy of the whole run
    config, then the phase's validation). Change a copy of the result, never the result."""
    if not OmegaConf.is_readonly(cfg) or (name == DEFAULT_PHASE and not len(cfg.phases)):
        return _build_phase_config(cfg, name)  # (the latter is cfg itself: kept, it would keep cfg alive for good)
    built = _PHASE_CONFIGS.get(id(cfg))
    if built is None:
        built = _PHASE_CONFIGS[id(cfg)] = {}
        weakref.finalize(cfg, _PHASE_CONFIGS.pop, id(cfg), None)
    if name not in built:
        built[name] = _build_phase_config(cfg, name)
    return built[name]


def _build_phase_config(cfg: DictConfig, name: str) -> DictConfig:
    if name == DEFAULT_PHASE and not len(cfg.phases):
        return cfg
    if name not in cfg.phases:
        raise ConfigError(f"no phase named '{name}'; phases are: {', '.join(phase_names(cfg))}")
    phase = cfg.phases[name]
    if phase.steps is not None and phase.tokens is not None:  # which one was meant cannot be guessed
        raise ConfigError(
            f"phases.{name}: gives both steps ({phase.steps}) and tokens ({phase.tokens}); a phase's length is one "
            f"of them: remove the other (on the command line: phases.{name}.steps=null or phases.{name}.tokens=null)"
        )
    pos = OmegaConf.to_container(cfg.model.position, resolve=True)
    overrides = OmegaConf.to_container(phase.position, resolve=True)
    if "name" in overrides and overrides["name"] != pos["name"]:
        raise ConfigError(
            f"phases.{name}.position.name: a phase cannot change the encoding "
            f"({pos['name']} -> {overrides['name']}); weights carry over between phases"
        )
    _fresh_scaling(pos, overrides)
    merged = _merged_phase(cfg, phase, name, pos, overrides)
    _validate_phase(cfg, merged, phase, name)
    OmegaConf.set_readonly(merged, True)
    return merged


def _merged_phase(cfg: DictConfig, phase: DictConfig, name: str, pos: dict, overrides: dict) -> DictConfig:
    """A writable copy of the run's config with phase ``name``'s keys set (its ``position`` ``overrides`` merged
    onto the run's ``pos``) and no phases."""
    # A copy of the run's config (on the schema, validated) with the phase's keys set: rebuilding it on the schema
    # from a plain container took ~5x as long, and a study asks for every phase of every run three times.
    merged = copy.deepcopy(cfg)
    OmegaConf.set_readonly(merged, False)
    merged.phases = {}
    for key, section in PHASE_TO_SECTION.items():
        if phase[key] is not None:
            merged[section][key] = phase[key]
    if phase.steps is not None and phase.tokens is None:  # a phase's own step count beats a run-level budget
        merged.train.tokens = None
    if phase.eval_lengths is not None:
        merged.eval.lengths = list(phase.eval_lengths)
    merged.model.position = OmegaConf.to_container(OmegaConf.merge(pos, overrides), resolve=True)
    try:
        merged.data = OmegaConf.merge(merged.data, phase.data)
        _drop_null_sources(merged.data)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"phases.{name}.data: bad key '{key}': {str(e).splitlines()[0]}") from None
    return merged


def _validate_phase(cfg: DictConfig, merged: DictConfig, phase: DictConfig, name: str) -> None:
    """Check phase ``name``'s config ``merged`` as the run's is checked; an error in a value the phase inherits
    names the run's key it comes from (``_inherited``)."""
    _check_phase_data(cfg, merged, name)
    try:
        _validate_train(merged, where=f"phases.{name}")
    except ConfigError as e:  # a value the phase inherits (micro_batch_size, against its batch_size) is the run's
        raise _inherited(e, name, f"phases.{name}", "train", phase, merged.train) from None
    from minilm.positions import validate_position  # positions imports nothing from config

    try:
        validate_position(merged.model.position, where=f"phases.{name}.position", head_dim=head_dim(merged.model),
                          base=cfg.model.position, n_layers=merged.model.n_layers)  # fmt: skip
    except ConfigError as e:  # a value the phase inherits (scaling lists, against its fraction) is model.position's
        raise _with_original_length(_inherited(e, name, f"phases.{name}.position", "model.position", phase.position,
                                               merged.model.position), cfg, name) from None  # fmt: skip
    from minilm.eval import validate_eval

    # a phase's own lengths are its eval_lengths (phases.NAME.eval is no key of the config)
    names = {"lengths": f"phases.{name}.eval_lengths"} if phase.eval_lengths is not None else None
    try:
        validate_eval(merged.eval, where=f"phases.{name}.eval", position=merged.model.position,
                      head_dim=head_dim(merged.model), train_len=merged.train.seq_len,
                      names=names)  # fmt: skip
    except ConfigError as e:  # any other eval key is the run's, which it inherits (its stride, against eval_lengths)
        raise _inherited(e, name, f"phases.{name}.eval", "eval", OmegaConf.create(), None) from None


def _with_original_length(e: ConfigError, cfg: DictConfig, name: str) -> ConfigError:
    """``e``, where it says phase ``name``'s scaling block lacks ``original_max_position_embeddings``, with the value
    a staged extension means there: the length the last phase before it trained at without scaling (the unscaled
    model's context, which every later scaling is relative to: configs/rope_yarn.yaml gives 256, its pretraining's,
    to both extensions). Any other error, or no such phase, is ``e`` itself."""
    if not re.search(r"\.scaling\.original_max_position_embeddings: required for rope_type '\w+'$", str(e)):
        return e
    # the phases before it, as they train (validated before this one): a scaling block merged from the run's or
    # replaced by the phase's, rope_type default (no scaling), the run's seq_len where a phase sets none
    before = [phase_config(cfg, p) for p in list(cfg.phases)[: list(cfg.phases).index(name)]]
    plain = [(p, pcfg) for p, pcfg in zip(cfg.phases, before)
             if (_scaling_type(pcfg.model.position) or "default") == "default"]  # fmt: skip
    if not plain:
        return e
    phase, pcfg = plain[-1]
    return ConfigError(f"{e}; to extend the model phase '{phase}' trained without scaling, give the length it "
                       f"trained at: original_max_position_embeddings: {pcfg.train.seq_len}")


# data keys the corpus is prepared from, once for the run (minilm.data.prepare.load_corpus reads the run's): a phase
# that set one was accepted, trained on the run's, and recorded its own value in its config.yaml
CORPUS_KEYS = ("tokenizer", "cache_dir", "val_fraction", "num_proc")


def _check_phase_data(cfg: DictConfig, merged: DictConfig, name: str) -> None:
    """A phase may re-weight the run's sources (the sampler reads the weights) and change how rows are drawn
    (long_fraction, document_mask, synthetic, ...) but not add or re-define a source, nor change a ``CORPUS_KEYS``
    setting: the corpus and its tokenizer are prepared once, from the run's data section."""
    for key in CORPUS_KEYS:
        run, now = cfg.data[key], merged.data[key]
        if isinstance(run, DictConfig):  # the tokenizer block: name the key that differs
            key = next((f"{key}.{k}" for k in run if run[k] != now[k]), key)
            run, now = OmegaConf.select(cfg.data, key), OmegaConf.select(merged.data, key)
        if run != now:
            raise ConfigError(f"phases.{name}.data.{key}: {now!r} here, {run!r} for the run: the corpus and its "
                              "tokenizer are prepared once, from the run's data section, so a phase cannot change "
                              f"{key}; set it in the run's data section (a phase may change the sources' weights, "
                              "long_fraction, long_min_tokens, document_mask, restart_positions and synthetic)")
    for src, spec in merged.data.sources.items():
        if src not in cfg.data.sources:
            raise ConfigError(
                f"phases.{name}.data.sources.{src}: a phase cannot add a source; declare it in the run's "
                "data.sources with weight 0 and raise its weight in this phase"
            )
        changed = {k for k in set(spec) | set(cfg.data.sources[src]) if k != "weight"
                   and spec.get(k) != cfg.data.sources[src].get(k)}
        if changed:
            raise ConfigError(f"phases.{name}.data.sources.{src}.{sorted(changed)[0]}: a phase may change only "
                              "a source's weight")


def phase_steps(pcfg: DictConfig) -> int:
    """Optimizer steps of a phase: ``train.steps``, or ``train.tokens`` spread over batch_size · seq_len."""
    t = pcfg.train
    if t.tokens is not None:
        per_step = t.batch_size * t.seq_len
        return max(1, -(-t.tokens // per_step))
    return t.steps


def warmup_warning(cfg: DictConfig, name: str) -> Optional[str]:
    """What to tell the user when phase ``name`` of run config ``cfg`` ends before its lr warmup does (None when it
    does not): the lr then never reaches ``lr`` and never decays (``lr_lambda``). A warning, not an error: a short
    smoke run of a config (``train.steps=20`` on configs/tiny.yaml, whose warmup is 40 steps) is a normal thing to
    do; what must not happen is a long run that silently trains at a fraction of its peak lr."""
    pcfg = phase_config(cfg, name)
    steps, warmup = phase_steps(pcfg), pcfg.optim.warmup_steps
    if warmup <= steps:
        return None
    phased = name in cfg.phases
    own = phased and cfg.phases[name].warmup_steps is not None
    w_key = f"phases.{name}.warmup_steps" if own else "optim.warmup_steps"
    length = next((f"phases.{name}.{k}" for k in ("steps", "tokens") if phased and cfg.phases[name][k] is not None),
                  "train.tokens" if pcfg.train.tokens is not None else "train.steps")  # fmt: skip
    where = f"phase '{name}'" if phased else "the run"
    return (f"{w_key} = {warmup} is longer than {where} ({steps} step{'s' * (steps != 1)} from {length}): its lr "
            f"rises only to {steps / warmup:.0%} of the peak {pcfg.optim.lr} and never decays; lower the warmup or "
            "train longer if that is not what you meant")


def shorter_phase_note(cfg: DictConfig, name: str) -> Optional[str]:
    """One line for phase ``name`` of run config ``cfg`` when it trains at a shorter seq_len than the phase before it
    (None otherwise). A note, not an error: a short-sequence stage after a long one is a recipe of its own (annealing
    on short data); but a phase that forgot its seq_len trains at the run's train.seq_len, which after an extension
    phase is shorter without a word, and a 512 typed for 5120 reads like any other number."""
    names = phase_names(cfg)
    at = names.index(name)
    if at == 0:
        return None
    prev = names[at - 1]
    length, before = phase_config(cfg, name).train.seq_len, phase_config(cfg, prev).train.seq_len
    if length >= before:
        return None
    key = f"phases.{name}.seq_len" if cfg.phases[name].seq_len is not None else "train.seq_len: it sets none"
    return (f"phase '{name}' trains at seq_len {length} ({key}), shorter than the {before} of phase '{prev}' before "
            "it; fine for a short-sequence stage, else set its seq_len")


# rope_types whose factor s stretches the unscaled model's length L to s·L, the length they are meant to train and run
# at (PI, NTK-aware, NTK-by-parts, YaRN: s = L'/L in their papers); llama3 (Llama 3.1 trains at 16·L with s = 8),
# longrope and the dynamic types name no such length
TARGET_LENGTH_TYPES = ("linear", "ntk", "ntk_by_parts", "yarn")


def scaling_warning(cfg: DictConfig, name: str) -> Optional[str]:
    """What to tell the user when phase ``name``'s RoPE scaling contradicts the run's phases (None when it does not):
    its ``original_max_position_embeddings`` is not the seq_len of the last phase before it that trained without
    scaling (the unscaled model's length, which every scaling is relative to), or the phase trains beyond the
    factor × that length its rope_type stretches positions to. A warning, not an error: an ablation may mean it."""
    names = phase_names(cfg)
    if name not in cfg.phases or names.index(name) == 0:
        return None
    pcfg = phase_config(cfg, name)
    rope_type = _scaling_type(pcfg.model.position)
    plain = [(p, phase_config(cfg, p)) for p in names[: names.index(name)]]
    plain = [(p, c.train.seq_len) for p, c in plain if (_scaling_type(c.model.position) or "default") == "default"]
    if rope_type in (None, "default") or not plain:  # (no phase trained unscaled: the weights came with --init)
        return None
    unscaled, length = plain[-1]
    scaling = pcfg.model.position.scaling
    original = scaling.get("original_max_position_embeddings")
    set_in = cfg.phases[name]
    if original is not None and original != length:
        key = key_as_set("model.position.scaling.original_max_position_embeddings", name, set_in)
        return (f"{key} = {original}, but the model trained without scaling at seq_len {length} (phase "
                f"'{unscaled}'): the scaling is relative to that length; set original_max_position_embeddings: "
                f"{length} if that is not what you meant")
    factor, seq_len, relative_to = scaling.get("factor"), pcfg.train.seq_len, original or length
    if rope_type in TARGET_LENGTH_TYPES and factor is not None and seq_len > factor * relative_to:
        key = key_as_set("model.position.scaling.factor", name, set_in)
        return (f"phase '{name}' trains at seq_len {seq_len}, beyond the {factor:g} × {relative_to} = "
                f"{factor * relative_to:g} tokens that {rope_type} with {key} = {factor:g} stretches the "
                f"unscaled model's positions to (phase '{unscaled}' trained at {length}); set factor: "
                f"{seq_len / relative_to:g} if that is not what you meant")
    return None


def micro_batch_size(train: DictConfig) -> int:
    return train.micro_batch_size or train.batch_size


# ------------------------------------------------------------------------------------------------ validation


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {msg}")


def _validate_train(cfg: DictConfig, where: Optional[str] = None) -> None:
    """Checks of train/optim values; ``where`` labels keys of a phase (phases.NAME) instead of train./optim."""
    t, o = cfg.train, cfg.optim
    w_opt = where or "optim"
    where = where or "train"
    _check(t.seq_len >= 1, f"{where}.seq_len", f"must be >= 1, got {t.seq_len}")
    _check(t.batch_size >= 1, f"{where}.batch_size", f"must be >= 1, got {t.batch_size}")
    _check(t.micro_batch_size is None or t.micro_batch_size >= 1, f"{where}.micro_batch_size",
           f"must be >= 1 or null (= batch_size), got {t.micro_batch_size}")  # fmt: skip
    mb = micro_batch_size(t)
    _check(
        t.batch_size % mb == 0,
        f"{where}.micro_batch_size",
        f"must divide batch_size ({t.batch_size}), got {mb}",
    )
    _check(t.steps is None or t.steps >= 1, f"{where}.steps", f"must be >= 1, got {t.steps}")
    _check(t.tokens is None or t.tokens >= 1, f"{where}.tokens", f"must be >= 1, got {t.tokens}")
    for key in ("log_every",):
        _check(t[key] >= 1, f"{where}.{key}", f"must be >= 1, got {t[key]}")
    for key in ("val_every", "val_batches", "ckpt_every", "keep_checkpoints", "max_bad_steps"):
        _check(t[key] >= 0, f"{where}.{key}", f"must be >= 0, got {t[key]}")
    _check(t.precision in PRECISIONS, f"{where}.precision", f"must be one of {PRECISIONS}, got {t.precision!r}")
    _check(t.compile_mode in COMPILE_MODES, "train.compile_mode",
           f"must be one of {COMPILE_MODES}, got {t.compile_mode!r}")  # fmt: skip
    _check(o.decay in DECAYS, f"{w_opt}.decay", f"must be one of {DECAYS}, got {o.decay!r}")
    _check(0 < o.lr < math.inf, f"{w_opt}.lr", f"must be > 0 and finite, got {o.lr}")
    _check(0 <= o.min_lr_ratio <= 1, f"{w_opt}.min_lr_ratio", f"must be in [0, 1], got {o.min_lr_ratio}")
    _check(o.warmup_steps >= 0, f"{w_opt}.warmup_steps", f"must be >= 0, got {o.warmup_steps}")
    # the rest are run-level only (a phase does not override them), checked here so torch.optim.AdamW never sees
    # a value it rejects (a traceback when the first phase starts) or one that silently means something else
    for key in ("beta1", "beta2"):
        _check(0 <= o[key] < 1, f"optim.{key}", f"must be in [0, 1), got {o[key]}")
    for key in ("weight_decay", "eps"):
        _check(0 <= o[key] < math.inf, f"optim.{key}", f"must be >= 0 and finite, got {o[key]}")
    _check(o.grad_clip >= 0, "optim.grad_clip", f"must be >= 0 (0 disables clipping), got {o.grad_clip}")


def _validate_data(d: DictConfig, where: str = "data") -> None:
    """Value checks of the data section, its sources by minilm.data.parse_sources (which loading runs again): here,
    so that a source's error says which file set the key, as every other check's does."""
    from minilm.data.sources import parse_sources

    try:
        parse_sources(d.sources)
    except DataError as e:  # its messages start with data.sources (a phase's: phases.NAME.data.sources)
        raise ConfigError(where + str(e).removeprefix("data")) from None
    tok = d.tokenizer
    _check(tok.type in ("bpe", "unigram"), f"{where}.tokenizer.type", f"must be bpe or unigram, got {tok.type!r}")
    _check(tok.sample_chars >= 1, f"{where}.tokenizer.sample_chars", f"must be >= 1, got {tok.sample_chars}")
    # (an empty path was read as null: a tokenizer trained on the corpus, without a word, where a file was meant)
    _check(tok.model_file is None or tok.model_file.strip() != "", f"{where}.tokenizer.model_file",
           f"must be the path of a sentencepiece .model or null (train one on the corpus), got {tok.model_file!r}")
    _check(d.num_proc >= 1, f"{where}.num_proc", f"must be >= 1, got {d.num_proc}")
    _check(0 <= d.long_fraction <= 1, f"{where}.long_fraction", f"must be in [0, 1], got {d.long_fraction}")
    _check(
        d.long_min_tokens is None or d.long_min_tokens >= 2,
        f"{where}.long_min_tokens",
        f"must be >= 2 or null (= seq_len), got {d.long_min_tokens}",
    )
    _check(
        not d.restart_positions or d.document_mask,
        f"{where}.restart_positions",
        "needs document_mask: true (positions restart per document only when attention is masked per document)",
    )
    syn = d.synthetic
    _check(0 <= syn.fraction < 1, f"{where}.synthetic.fraction", f"must be in [0, 1), got {syn.fraction}")
    bad = [t for t in syn.tasks if t not in ("passkey", "kv")]
    _check(not bad, f"{where}.synthetic.tasks", f"unknown task(s) {bad}; allowed: passkey, kv")
    _check(
        syn.fraction == 0 or len(syn.tasks) > 0, f"{where}.synthetic.tasks", "must not be empty when fraction > 0"
    )
    _check(
        syn.style in ("auto", "code", "text"),
        f"{where}.synthetic.style",
        f"must be auto, code or text, got {syn.style!r}",
    )
    _check(syn.loss in SYNTHETIC_LOSSES, f"{where}.synthetic.loss", f"must be all or answer, got {syn.loss!r}")


def validate(cfg: DictConfig) -> None:
    """Every key's value checked against what it allows (raises ConfigError naming the key): the run's paths, the
    model, data, training, position and evaluation sections, then each phase."""
    _validate_paths(cfg)
    seed = cfg.run.seed  # torch's generators take a 64-bit seed: a larger one was a traceback at the model's init
    _check(-(2**63) <= seed < 2**63, "run.seed", f"must be a 64-bit integer, in [-2^63, 2^63 - 1], got {seed}")
    _validate_model(cfg.model)
    d = cfg.data
    _check(d.tokenizer.vocab_size >= 64, "data.tokenizer.vocab_size", f"must be >= 64, got {d.tokenizer.vocab_size}")
    # (sentencepiece parses it as an int32: a larger one failed with a traceback after every source was read)
    _check(d.tokenizer.vocab_size < 2**31, "data.tokenizer.vocab_size",
           f"must be <= {2**31 - 1} (sentencepiece's limit), got {d.tokenizer.vocab_size}")  # fmt: skip
    _check(0 <= d.long_fraction <= 1, "data.long_fraction", f"must be in [0, 1], got {d.long_fraction}")
    _check(0 < d.val_fraction < 1, "data.val_fraction", f"must be in (0, 1), got {d.val_fraction}")
    _validate_data(d, where="data")
    _validate_train(cfg)
    from minilm.eval import validate_eval
    from minilm.positions import validate_position

    validate_position(cfg.model.position, where="model.position", head_dim=head_dim(cfg.model),
                      n_layers=cfg.model.n_layers, d_model=cfg.model.d_model)  # fmt: skip
    validate_eval(cfg.eval, position=cfg.model.position, head_dim=head_dim(cfg.model), train_len=cfg.train.seq_len)
    _validate_phases(cfg)


def _validate_paths(cfg: DictConfig) -> None:
    r = cfg.run
    for key in ("name", "dir"):  # an empty run.dir trained into the working directory, run.name into runs/ itself
        _check(r[key].strip() != "", f"run.{key}", "must not be empty")
    _check(cfg.data.cache_dir.strip() != "", "data.cache_dir", "must not be empty (a directory for prepared corpora)")
    for key in ("run.dir", "data.cache_dir", "data.tokenizer.model_file"):  # a shell does not expand '~' after '='
        value = OmegaConf.select(cfg, key)
        _check(value is None or not value.startswith("~"), key,
               f"{value!r}: '~' is not expanded (nor by a shell after '='): it names a directory called '~'; write "
               f"the full path, e.g. {key}=$HOME/...")  # fmt: skip


def _validate_model(m: DictConfig) -> None:
    _check(m.n_layers >= 1, "model.n_layers", f"must be >= 1, got {m.n_layers}")
    _check(m.d_model >= 1, "model.d_model", f"must be >= 1, got {m.d_model}")
    _check(m.n_heads >= 1, "model.n_heads", f"must be >= 1, got {m.n_heads}")
    # n_kv_heads / d_ff: 0 read as "unset" (``or``) and trained another model than the one asked for
    _check(m.n_kv_heads is None or m.n_kv_heads >= 1, "model.n_kv_heads",
           f"must be >= 1 or null (= n_heads), got {m.n_kv_heads}")  # fmt: skip
    _check(m.d_ff is None or m.d_ff >= 1, "model.d_ff", f"must be >= 1 or null (from d_model and mlp), got {m.d_ff}")
    _check(0 <= m.norm_eps < math.inf, "model.norm_eps", f"must be >= 0 and finite, got {m.norm_eps}")
    # 0 made every matrix zero: each gradient is then zero too, and the run trained nothing at a loss of log(vocab)
    _check(0 < m.init_std < math.inf, "model.init_std", f"must be > 0 and finite, got {m.init_std}")
    _check(m.d_model % m.n_heads == 0, "model.d_model",
           f"must be divisible by model.n_heads ({m.n_heads}), got {m.d_model}")  # fmt: skip
    # (an odd head width is the rotary family's concern alone, checked with its block: RopeParams.check_dims)
    kv = m.n_kv_heads or m.n_heads
    _check(kv >= 1 and m.n_heads % kv == 0, "model.n_kv_heads",
           f"must divide model.n_heads ({m.n_heads}), got {m.n_kv_heads}")  # fmt: skip
    _check(m.mlp in MLPS, "model.mlp", f"must be one of {MLPS}, got {m.mlp!r}")
    _check(0 <= m.dropout < 1, "model.dropout", f"must be in [0, 1), got {m.dropout}")
    _check(m.loss_chunk_size is None or m.loss_chunk_size >= 1, "model.loss_chunk_size",
           f"must be >= 1 (rows per chunk) or null for the plain loss, got {m.loss_chunk_size}")  # fmt: skip
    _check(m.sdpa_kernel in SDPA_KERNELS, "model.sdpa_kernel", f"must be one of {SDPA_KERNELS}, got {m.sdpa_kernel!r}")


def _validate_phases(cfg: DictConfig) -> None:
    for name in cfg.phases:  # raises with the phase's name on a bad name or any bad override
        _check(PHASE_NAME.fullmatch(name) is not None and name.lower() not in RESERVED_PHASE_NAMES, "phases",
               f"bad phase name {name!r}: a phase trains in the directory run.dir/<name>, so a name has letters, "
               f"digits, '_' and '-' (not first) only, and is not {' or '.join(RESERVED_PHASE_NAMES)} in any case "
               "(a case-insensitive file system, macOS's or Windows', holds one directory for both)")  # fmt: skip
        # (two phases in one directory would write, and resume from, each other's checkpoints and outputs)
        same = next((n for n in cfg.phases if n != name and n.lower() == name.lower()), None)
        _check(same is None, "phases", f"phases {same!r} and {name!r} differ in case alone: each trains in the "
               "directory run.dir/<name>, and a case-insensitive file system (macOS's or Windows') holds one directory "
               "for both; rename one")  # fmt: skip
        data = phase_config(cfg, name).data
        try:
            _validate_data(data, where=f"phases.{name}.data")
        except ConfigError as e:  # a value the phase inherits (restart_positions, against its document_mask) is data's
            raise _inherited(e, name, f"phases.{name}.data", "data", cfg.phases[name].data, data) from None
    first = next(iter(cfg.phases), None)
    _check(
        first is None or not cfg.phases[first].carry_optimizer,
        f"phases.{first}.carry_optimizer",
        "the first phase has no earlier phase whose optimizer moments it could carry; set it false",
    )


def as_dict(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


__all__ = [
    "Config",
    "load_config",
    "save_config",
    "to_yaml",
    "phase_config",
    "phase_names",
    "on_schema",
    "phase_steps",
    "warmup_warning",
    "shorter_phase_note",
    "scaling_warning",
    "ffn_dim",
    "head_dim",
    "micro_batch_size",
]
