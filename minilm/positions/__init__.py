"""THE registry of positional encodings: one visible dict literal, name -> PositionEntry.

Adding an encoding = one class (with its typed parameter dataclass) in the family's file + one line here.
``model.position.name`` picks the entry; the other keys under ``model.position`` are its parameters, validated
by the entry's parameter dataclass (bad keys and values raise ConfigError naming the key).

An entry builds up to two hook objects (base.py): ``embedding`` — one module at the model input, for encodings
that act on token embeddings — and ``attention`` — one module per attention layer, for encodings that rotate
q/k or add a score term. Where an entry has none, the model uses ``Identity``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional

from minilm.errors import ConfigError
from minilm.positions.base import Identity, PositionDims, PositionEncoding, make_params
from minilm.positions.absolute import (
    CausalConv,
    ComplexOrder,
    ComplexOrderParams,
    ConvParams,
    Floater,
    FloaterParams,
    LearnedAbsolute,
    LearnedParams,
    Multiplicative,
    MultiplicativeParams,
    Sinusoidal,
    SinusoidalParams,
)
from minilm.positions.bias import Alibi, AlibiParams, Fire, FireParams, Kerple, KerpleParams, T5Bias, T5Params
from minilm.positions.contextual import Cope, CopeParams
from minilm.positions.relative import (
    Deberta,
    DebertaParams,
    Shaw,
    ShawParams,
    TransformerXL,
    TransformerXLParams,
)
from minilm.positions.rope_scaling import compute_rope, parse_scaling
from minilm.positions.rotary import NoParams, NoPE, Rope, RopeParams, Xpos, XposParams


@dataclass(frozen=True)
class PositionEntry:
    params: type  # the typed parameter dataclass
    attention: Optional[Callable[[Any, PositionDims], PositionEncoding]] = None  # per-layer: rotate / score
    embedding: Optional[Callable[[Any, PositionDims], PositionEncoding]] = None  # once: embed
    family: str = ""
    summary: str = ""


REGISTRY: dict[str, PositionEntry] = {
    # absolute: act once on the token embeddings (absolute.py)
    "learned": PositionEntry(LearnedParams, embedding=LearnedAbsolute, family="absolute", summary="GPT-2 table"),
    "sinusoidal": PositionEntry(SinusoidalParams, embedding=Sinusoidal, family="absolute", summary="Vaswani 2017"),
    "floater": PositionEntry(FloaterParams, embedding=Floater, family="absolute", summary="Liu et al. 2020"),
    "multiplicative": PositionEntry(MultiplicativeParams, embedding=Multiplicative, family="absolute", summary="x⊙p"),
    "complex_order": PositionEntry(ComplexOrderParams, embedding=ComplexOrder, family="absolute", summary="Wang 2020"),
    "conv": PositionEntry(ConvParams, embedding=CausalConv, family="absolute", summary="causal depthwise conv"),
    # rotary: act on queries and keys (rotary.py)
    "rope": PositionEntry(RopeParams, attention=Rope, family="rotary", summary="RoPE, Su et al. 2021"),
    "xpos": PositionEntry(XposParams, attention=Xpos, family="rotary", summary="xPos, Sun et al. 2022"),
    # relative bias: a score term of (h, i, j) (bias.py)
    "alibi": PositionEntry(AlibiParams, attention=Alibi, family="bias", summary="ALiBi, Press et al. 2022"),
    "t5": PositionEntry(T5Params, attention=T5Bias, family="bias", summary="T5 buckets, Raffel et al. 2020"),
    "kerple": PositionEntry(KerpleParams, attention=Kerple, family="bias", summary="KERPLE, Chi et al. 2022"),
    "fire": PositionEntry(FireParams, attention=Fire, family="bias", summary="FIRE, Li et al. 2023"),
    # relative with q / k: a score term from per-step q·R tables (relative.py)
    "shaw": PositionEntry(ShawParams, attention=Shaw, family="relative", summary="Shaw et al. 2018"),
    "transformer_xl": PositionEntry(TransformerXLParams, attention=TransformerXL, family="relative", summary="Dai 19"),
    "deberta": PositionEntry(DebertaParams, attention=Deberta, family="relative", summary="He et al. 2021"),
    # contextual: positions from the attention itself (contextual.py)
    "cope": PositionEntry(CopeParams, attention=Cope, family="contextual", summary="CoPE, Golovneva et al. 2024"),
    "none": PositionEntry(NoParams, attention=NoPE, family="none", summary="NoPE, Kazemnejad et al. 2023"),
}  # fmt: skip


def _entry(cfg: Mapping[str, Any], where: str) -> tuple[PositionEntry, Any]:
    if "name" not in cfg:
        raise ConfigError(f"{where}.name: missing; registered encodings: {', '.join(REGISTRY)}")
    name = cfg["name"]
    if not isinstance(name, str) or name not in REGISTRY:  # (a list or mapping: not hashable, a TypeError)
        raise ConfigError(f"{where}.name: unknown encoding {name!r}; registered encodings: {', '.join(REGISTRY)}")
    entry = REGISTRY[name]
    values = {k: v for k, v in dict(cfg).items() if k != "name"}
    return entry, make_params(entry.params, values, where)


def _plain(cfg: Mapping[str, Any]) -> dict:
    try:  # OmegaConf nodes -> plain containers, so parameter objects never hold config nodes
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return dict(cfg)


def validate_position(
    cfg: Mapping[str, Any],
    where: str = "model.position",
    head_dim: Optional[int] = None,
    base: Optional[Mapping[str, Any]] = None,
    n_layers: Optional[int] = None,
    d_model: Optional[int] = None,
) -> Any:
    """Check a position block; returns its parameter object. With ``head_dim`` (and ``n_layers``) also what depends
    on the model's size (the parameters' ``check_dims``, where they have one: RoPE's rotary dimensions, scaling lists
    and NoPE pattern), and with ``d_model`` their ``check_width`` (the sinusoidal table's scale, complex order's
    pairs: checked when the config loads, so the message says where the value was set, not only when the model is
    built). With
    ``base`` (the run's ``model.position``, when ``cfg`` is a phase's) also that the phase changes only what its
    encoding can change between phases: only modules with ``configure`` (the rotary family) take new parameters
    (minilm.training.phases.apply_phase), so a phase that changes another encoding's is refused when the config
    loads, not after the earlier phases have trained."""
    plain = _plain(cfg)
    entry, params = _entry(plain, where)
    if head_dim is not None and hasattr(params, "check_dims"):
        params.check_dims(head_dim, where, n_layers)
    if d_model is not None and hasattr(params, "check_width"):
        params.check_width(d_model, where)
    if base is not None and not hasattr(entry.attention, "configure"):
        built = asdict(_entry(_plain(base), "model.position")[1])  # (the same encoding: config.py checks the name)
        changed = [key for key, value in asdict(params).items() if key in built and built[key] != value]
        if changed:
            raise ConfigError(
                f"{where}.{changed[0]}: encoding '{plain['name']}' cannot change its parameters between phases "
                "(its modules are built once, with model.position's); set it in model.position instead"
            )
    return params


def filled_position(block: dict) -> dict:
    """A position block with every parameter its encoding takes, the defaults it leaves out included, and so its
    RoPE scaling block's (none, null and ``rope_type: default`` alike): what the model computes from. A default
    spelled out (``phases.extend_512.position.scaling.beta_fast=32``, ``model.position.fraction=1.0``) trains the
    same model: --resume (minilm.training.run_checks) and a study's shared phases (minilm.study.phase_keys) compare
    blocks so. A block that does not validate is returned as it is."""
    try:
        params = validate_position(block)
        filled = {"name": block["name"], **asdict(params)}
        if hasattr(params, "scaling"):
            rope_type, scaling = parse_scaling(params.scaling)
            filled["scaling"] = {"rope_type": rope_type, **asdict(scaling)}
    except ConfigError:
        return block
    return json.loads(json.dumps(filled))  # (tuples, as longrope's factors parse, as the lists a config holds)


def typed_values(name: Any, block: Mapping[str, Any]) -> dict:
    """The parameters of ``block`` (a position block of encoding ``name``, or a phase's, without its name) that are
    text where their parameter is a float and that ``make_params`` reads as one ('1e-2', quoted): ``{key: float}``.
    The config holds these as numbers (minilm.config.load_config sets them), as OmegaConf converts the schema's
    typed keys (``model.norm_eps: "1e-5"``): else ``--print-config`` and the saved config kept the text. Any other
    text is left for ``validate_position`` to refuse, naming the key."""
    from dataclasses import fields

    from minilm.positions.base import _yaml_float

    entry = REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        return {}
    floats = {f.name for f in fields(entry.params) if str(f.type).replace("Optional[", "").rstrip("]") == "float"}
    out = {}
    for key, value in block.items():
        if key in floats and isinstance(value, str) and isinstance(_yaml_float(value), float):
            out[key] = _yaml_float(value)
    return out


def build_position(cfg: Mapping[str, Any], dims: PositionDims, role: str) -> PositionEncoding:
    """The hook object for ``role`` ("attention" — one per layer — or "embedding" — one at the input)."""
    entry, params = _entry(_plain(cfg), "model.position")
    factory = {"attention": entry.attention, "embedding": entry.embedding}[role]
    return factory(params, dims) if factory is not None else Identity()


def params_dict(params: Any) -> dict:
    return asdict(params)


__all__ = [
    "REGISTRY",
    "PositionEntry",
    "PositionDims",
    "PositionEncoding",
    "build_position",
    "validate_position",
    "filled_position",
    "compute_rope",
]
