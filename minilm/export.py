"""Export a minilm run to a Hugging Face transformers Llama directory (safetensors + config.json + tokenizer).

A minilm GPT with RoPE, RMSNorm, a SwiGLU MLP and no biases *is* a Llama model; only names and two fused
matrices differ. What this module writes, and why:

- weights: ``wq`` -> ``q_proj``; the fused ``wkv`` (rows: k of every kv head, then v; attention.py's
  ``view(B, T, 2, Hkv, Dh)``) -> ``k_proj`` / ``v_proj``; the fused SwiGLU ``w_in`` ([gate | up], ``chunk(2)``) ->
  ``gate_proj`` / ``up_proj``; ``w_out`` -> ``down_proj``; norm1 / norm2 -> input_layernorm /
  post_attention_layernorm. Grouped-query heads agree (both repeat each kv head for consecutive query heads).
- rotation layout: minilm's ``half`` layout is transformers' ``rotate_half`` (no change). ``interleaved`` pairs
  dimensions (2i, 2i+1); permuting the rows of every q and k head to [0, 2, 4, …, 1, 3, 5, …] turns it into the
  half layout. q·k is unchanged by permuting both alike, so the logits are too.
- RoPE scaling: minilm's scaling block already uses transformers' ``rope_parameters`` names, so it is copied with
  ``rope_theta`` = ``model.position.base``. Two minilm types have an exact Llama form: ``ntk`` (static NTK-aware)
  is the default type with rope_theta = base · factor^(d/(d−2)); ``ntk_by_parts`` is ``yarn`` with
  attention_factor 1. transformers' ``dynamic`` reads ``max_position_embeddings`` as the original length (minilm
  reads ``original_max_position_embeddings``), so for it max_position_embeddings = that length.
- the installed transformers decides the config form: ``rope_parameters`` (with rope_theta inside; 5.x) or
  ``rope_theta`` + ``rope_scaling`` (4.x). The config object is built by transformers and saved by it.
- tokenizer: the sentencepiece model becomes a ``tokenizers`` BPE/Unigram tokenizer.json reproducing minilm's
  settings (identity normalization, no dummy prefix, whitespace runs attached to the next word, byte fallback,
  ``\\n`` as its own piece, no BOS/EOS added), wrapped as a PreTrainedTokenizerFast; ``split_special_tokens``
  is on so text like "</s>" is tokenized as text, as sentencepiece does (BPE models, minilm's default; a Unigram
  model's lattice still matches the control pieces' text — sentencepiece never does). The .model file ships too.

What a Llama cannot express raises MinilmError naming it: non-RoPE encodings (ALiBi, T5, CoPE, …), xPos,
partial rotary, NoPE layers, GELU MLPs, training-free methods installed on the model, rope_types transformers
lacks (dynamic_yarn).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from minilm.config import ffn_dim, head_dim
from minilm.errors import MinilmError
from minilm.files import fsync_path
from minilm.positions.rope_scaling import longrope_attention

# minilm rope_type -> transformers rope_type (None: rewritten below into an equivalent transformers form)
HF_ROPE_TYPES = {
    "default": "default",
    "linear": "linear",
    "dynamic": "dynamic",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
    "ntk": None,  # -> default with an adjusted rope_theta
    "ntk_by_parts": None,  # -> yarn with attention_factor 1
}


def _plain(x: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(x, (DictConfig, ListConfig)):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return x


# ------------------------------------------------------------------------------------------------ checks


# what a refusal says can be exported (the error named what cannot, not what to train instead)
EXPORTABLE = ("exportable: model.position.name: rope (layout half or interleaved, fraction 1, nope_every 0) with "
              f"scaling rope_type {', '.join(HF_ROPE_TYPES)} or none (partial_rotary_factor 1), and model.mlp: swiglu")


def check_exportable(model_cfg, model=None) -> None:
    """Raise MinilmError naming everything of ``model_cfg`` (and an instantiated ``model``) a Llama cannot express."""
    problems = []
    position = _plain(model_cfg.position)
    name = position.get("name")
    if name != "rope":
        problems.append(
            f"model.position.name: {name!r} — a Llama model has only RoPE; ALiBi, T5, CoPE, learned / sinusoidal "
            "and the other non-rotary encodings (and xPos's decay) have no transformers Llama form"
        )
    else:
        if position.get("fraction", 1.0) != 1.0:
            problems.append(f"model.position.fraction: {position['fraction']} — partial rotary; transformers' Llama "
                            "rotates every head dimension (it ignores partial_rotary_factor)")  # fmt: skip
        if position.get("nope_every", 0):
            problems.append(f"model.position.nope_every: {position['nope_every']} — Llama rotates every layer")
        scaling = position.get("scaling") or {}
        rope_type = scaling.get("rope_type", "default")
        if rope_type not in HF_ROPE_TYPES:
            problems.append(f"model.position.scaling.rope_type: {rope_type!r} — transformers has no such rope_type")
        if scaling.get("partial_rotary_factor", 1.0) != 1.0:
            problems.append(f"model.position.scaling.partial_rotary_factor: {scaling['partial_rotary_factor']} — "
                            "partial rotary; transformers' Llama rotates every head dimension (it ignores "
                            "partial_rotary_factor)")  # fmt: skip
    if model_cfg.mlp != "swiglu":
        problems.append(f"model.mlp: {model_cfg.mlp!r} — a Llama MLP is SwiGLU (gate/up/down with SiLU)")
    if model is not None:
        from minilm.positions.rotary import Rope

        installed = {type(b.attn.extension).__name__ for b in model.blocks if b.attn.extension is not None}
        if installed:
            problems.append(f"training-free method {', '.join(sorted(installed))} installed — it is evaluation-time "
                            "code of minilm, not a Llama config; export the model without it")  # fmt: skip
        for i, b in enumerate(model.blocks):
            if type(b.attn.pos) is not Rope and name == "rope":
                problems.append(f"layer {i}: position module {type(b.attn.pos).__name__} is not plain RoPE")
                break
    if problems:
        raise MinilmError("cannot export to a transformers Llama model:\n  - " + "\n  - ".join(problems)
                          + "\n" + EXPORTABLE)


# ------------------------------------------------------------------------------------------------ config


def hf_rope_parameters(position: dict, dh: int) -> tuple[dict, Optional[int]]:
    """(transformers rope_parameters incl. rope_theta, the max_position_embeddings it needs or None)."""
    base = float(position.get("base", 10000.0))
    scaling = dict(position.get("scaling") or {})
    rope_type = scaling.pop("rope_type", "default")
    scaling.pop("partial_rotary_factor", None)  # 1.0 here (checked)
    if rope_type == "ntk":  # static NTK-aware: θ_i from base · factor^(d/(d−2)) (rope_scaling.py's _ntk)
        return {"rope_type": "default", "rope_theta": base * scaling["factor"] ** (dh / (dh - 2))}, None
    if rope_type == "ntk_by_parts":
        rope_type = "yarn"
        scaling["attention_factor"] = 1.0
    params = {"rope_type": rope_type, "rope_theta": base}
    for key, value in scaling.items():
        if value is None:
            continue
        params[key] = [float(v) for v in value] if isinstance(value, (list, tuple)) else value
    for key in ("factor", "attention_factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow",
                "low_freq_factor", "high_freq_factor"):  # fmt: skip
        if key in params:
            params[key] = float(params[key])
    if rope_type == "llama3":  # transformers requires both; minilm defaults them to Meta's 1 and 4
        params.setdefault("low_freq_factor", 1.0)
        params.setdefault("high_freq_factor", 4.0)
    original = params.get("original_max_position_embeddings")
    if rope_type == "longrope" and params.get("factor") and "attention_factor" not in params:
        # written out as minilm computes it (longrope_attention): transformers 4.x takes the factor of the temperature
        # from max_position_embeddings / original_max_position_embeddings, the target length rounded below (32 · 3.3
        # = 105.6 -> 106: 3.3125), so a factor whose target length is no integer gave another temperature there
        params["attention_factor"] = longrope_attention(params["factor"], original)
    if rope_type == "dynamic":  # transformers' dynamic NTK reads max_position_embeddings as the original length,
        del params["original_max_position_embeddings"]  # and warns at every load about this key in rope_parameters
        return params, int(original)
    if original is not None and params.get("factor"):
        return params, int(round(original * params["factor"]))  # the target length (transformers checks the ratio)
    return params, None


def _yarn_reads_truncate() -> bool:
    """Whether the installed transformers' yarn reads ``truncate`` (added with gpt-oss, after 4.54): an older one
    ignores the key, rounding the ramp's ends whatever it says. Asked of its yarn function itself (the frequencies
    of a small config with truncate true and false differ), not of a version number."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    freqs = []
    for truncate in (True, False):
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                "truncate": truncate}  # fmt: skip (a ramp from dimension 0.41 to 3.3 of 8: rounded, 0 to 4)
        config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=128,
                             **llama_rope_kwargs(rope))  # fmt: skip
        freqs.append(ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")[0])
    return not torch.equal(*freqs)


def llama_shape(m) -> dict:
    """The ``LlamaConfig`` keywords for the shape of a ``model`` section: widths, depth, heads, norm, tying and
    the fixed architecture (SiLU-gated MLP, no biases). The exporter and the benchmark's peer both build on it."""
    return dict(
        hidden_size=m.d_model,
        intermediate_size=ffn_dim(m),
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads or m.n_heads,
        head_dim=head_dim(m),
        hidden_act="silu",
        rms_norm_eps=float(m.norm_eps),
        tie_word_embeddings=bool(m.tie_embeddings),
        attention_bias=False,
        mlp_bias=False,
    )


def llama_rope_kwargs(rope: dict) -> dict:
    """``rope`` (transformers' ``rope_parameters``: rope_type, rope_theta, ...) as the installed transformers
    takes it: ``rope_parameters`` from 5.x on; ``rope_theta`` + ``rope_scaling`` (none for the default type) in 4.x."""
    from transformers import LlamaConfig

    if hasattr(LlamaConfig(), "rope_parameters"):
        return {"rope_parameters": dict(rope)}
    rope = dict(rope)
    kwargs = {"rope_theta": rope.pop("rope_theta")}
    if rope["rope_type"] != "default":
        kwargs["rope_scaling"] = {**rope, "type": rope["rope_type"]}
    if rope["rope_type"] == "longrope" and "original_max_position_embeddings" in rope:
        # 4.x's longrope reads the original length from the config itself, not from rope_scaling; without it, it
        # takes max_position_embeddings (original · factor): the long factors and the temperature from that
        kwargs["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    return kwargs


# the first transformers whose yarn and longrope read the original length as minilm writes it: 4.45.2 to 4.50.3 took
# it from max_position_embeddings (the target length), and their logits differed from the model's by 0.06 to 0.33 on
# tests/test_export.py's tiny models
READS_ORIGINAL_LENGTH = "4.51"


def _check_transformers_reads_original_length(rope_type: str, named: str) -> None:
    """``rope_type``: the exported one; ``named``: the model's (ntk_by_parts is exported as yarn)."""
    import transformers
    from packaging.version import Version

    if rope_type in ("yarn", "longrope") and Version(transformers.__version__) < Version(READS_ORIGINAL_LENGTH):
        raise MinilmError(f"model.position.scaling: rope_type {named} needs transformers {READS_ORIGINAL_LENGTH} "
                          f"or later to export; the installed {transformers.__version__} reads its original length "
                          f"from max_position_embeddings, so the export's frequencies would not be the model's (its "
                          f"logits differ by 0.06 to 0.33 on a tiny model): "
                          f"pip install -U 'transformers>={READS_ORIGINAL_LENGTH},<6'")  # fmt: skip


def hf_config(cfg, vocab_size: int, tokenizer=None):
    """The transformers ``LlamaConfig`` for a run config ``cfg`` (the phase's resolved config)."""
    from transformers import LlamaConfig

    m = cfg.model
    position = _plain(m.position)
    rope, max_pos = hf_rope_parameters(position, head_dim(m))
    _check_transformers_reads_original_length(rope["rope_type"], (position.get("scaling") or {}).get("rope_type"))
    if rope["rope_type"] == "yarn" and rope.get("truncate") is False and not _yarn_reads_truncate():
        import transformers

        # (ntk_by_parts is exported as yarn: it names its own key)
        raise MinilmError(f"model.position.scaling.truncate: false is not read by the installed transformers "
                          f"{transformers.__version__}, whose yarn always rounds the ramp's ends (truncate: true): the "
                          f"export's frequencies would not be the model's, and its logits differ (about 0.1 on a tiny "
                          f"model). It needs a transformers whose yarn reads truncate (4.57.6 and 5.x do; 4.54 does "
                          f"not): pip install -U 'transformers>=4.57.6,<6'")  # fmt: skip
    kwargs = dict(
        vocab_size=vocab_size,
        **llama_shape(m),
        max_position_embeddings=max_pos or int(cfg.train.seq_len),
        attention_dropout=0.0,
        architectures=["LlamaForCausalLM"],
        **llama_rope_kwargs(rope),
    )
    if tokenizer is not None:
        # a model_file may have no BOS (-1, which transformers reads as an id out of the vocabulary): null
        bos = tokenizer.bos_id if tokenizer.bos_id >= 0 else None
        kwargs.update(bos_token_id=bos, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
    return LlamaConfig(**kwargs)


def hf_generation_config(tokenizer):
    """``generation_config.json``: ``generate()``'s defaults, start token included. minilm's data puts EOS after every
    document and BOS nowhere (minilm/data/prepare.py), so a document's first token follows EOS and BOS's embedding
    never trained: transformers' ``generate()`` without ``input_ids`` starts from ``bos_token_id``, here EOS, as
    scripts/generate.py's empty prompt does. (config.json keeps the tokenizer's own BOS id.)"""
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=tokenizer.eos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)


# ------------------------------------------------------------------------------------------------ weights


def _half_layout_rows(w: Tensor, n_heads: int, dh: int) -> Tensor:
    """Rows of a q or k projection (n_heads·dh, D) permuted per head from the interleaved to the half layout."""
    perm = torch.cat([torch.arange(0, dh, 2), torch.arange(1, dh, 2)])  # new row j <- old row perm[j]
    return w.view(n_heads, dh, -1)[:, perm].reshape(n_heads * dh, -1)


def hf_state_dict(model) -> dict[str, Tensor]:
    """The Llama tensors of a minilm GPT (tied lm_head left out when embeddings are tied)."""
    m = model.cfg
    H, Hkv, dh = m.n_heads, m.n_kv_heads or m.n_heads, head_dim(m)
    interleaved = _plain(m.position).get("layout", "half") == "interleaved"
    out = {"model.embed_tokens.weight": model.tok_emb.weight, "model.norm.weight": model.norm.weight}
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        wq = b.attn.wq.weight
        wk, wv = b.attn.wkv.weight.split(Hkv * dh, dim=0)  # fused rows: [k heads | v heads]
        if interleaved:
            wq, wk = _half_layout_rows(wq, H, dh), _half_layout_rows(wk, Hkv, dh)
        gate, up = b.mlp.w_in.weight.chunk(2, dim=0)  # SwiGLU: h.chunk(2) -> gate, up
        out.update({
            p + "input_layernorm.weight": b.norm1.weight,
            p + "self_attn.q_proj.weight": wq,
            p + "self_attn.k_proj.weight": wk,
            p + "self_attn.v_proj.weight": wv,
            p + "self_attn.o_proj.weight": b.attn.wo.weight,
            p + "post_attention_layernorm.weight": b.norm2.weight,
            p + "mlp.gate_proj.weight": gate,
            p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": b.mlp.w_out.weight,
        })  # fmt: skip
    if not m.tie_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    return {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ tokenizer


def hf_tokenizer(model_file: str | Path):
    """A transformers fast tokenizer that encodes and decodes exactly as minilm's sentencepiece model."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer
    from transformers import PreTrainedTokenizerFast

    proto = pb.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    t, n = proto.trainer_spec, proto.normalizer_spec
    _check_exact_form(proto, model_file)
    CONTROL, USER = 3, 4  # sentencepiece piece types
    unk = proto.pieces[t.unk_id].piece
    tok = HfTokenizer(_hf_tokenizer_model(proto, model_file))
    if n.escape_whitespaces:
        tok.normalizer = normalizers.Replace(" ", "▁")
    # sentencepiece's SplitIntoWords (allow_whitespace_only_pieces): a word starts at the first ▁ of a run, so a
    # run of spaces stays with the word after it; a trailing run is a word of its own.
    if t.split_by_whitespace:
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("▁*[^▁]+|▁+"), behavior="isolated")
    # the unknown piece decodes to sentencepiece's unk_surface (" ⁇ "), not to its own text "<unk>" (only a model
    # without byte_fallback emits it: one with it spells unknown characters in bytes)
    steps = [decoders.Replace(unk, t.unk_surface)] if t.unk_surface else []
    steps += [decoders.Replace("▁", " ")] + ([decoders.ByteFallback()] if t.byte_fallback else []) + [decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps)
    tok.add_tokens([AddedToken(p.piece, normalized=False, special=False) for p in proto.pieces if p.type == USER])
    tok.add_special_tokens([AddedToken(p.piece, normalized=False, special=True) for p in proto.pieces
                            if p.type == CONTROL or p.piece == unk])  # fmt: skip

    def piece(i):
        return proto.pieces[i].piece if 0 <= i < len(proto.pieces) else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        # no pad piece: EOS pads, as minilm.data.Tokenizer.pad_id and config.json's pad_token_id say
        bos_token=piece(t.bos_id), eos_token=piece(t.eos_id), unk_token=unk,
        pad_token=piece(t.pad_id if t.pad_id >= 0 else t.eos_id),
        split_special_tokens=True,  # "</s>" in text is text, as in sentencepiece
        clean_up_tokenization_spaces=False,
        model_max_length=int(1e30),
    )  # fmt: skip


def _check_exact_form(proto, model_file) -> None:
    """Refuse sentencepiece settings that tokenizers cannot reproduce exactly."""
    t, n = proto.trainer_spec, proto.normalizer_spec
    unsupported = []
    if n.add_dummy_prefix:
        unsupported.append("add_dummy_prefix")
    if n.precompiled_charsmap or n.name not in ("identity", ""):
        unsupported.append(f"normalization {n.name!r}")
    if t.treat_whitespace_as_suffix:
        unsupported.append("treat_whitespace_as_suffix")
    if unsupported:  # minilm trains none of these (minilm/data/tokenizer.py); a foreign .model may
        raise MinilmError(
            f"{model_file}: sentencepiece settings without an exact tokenizers form: {', '.join(unsupported)}"
        )


def _hf_tokenizer_model(proto, model_file):
    """The tokenizers model (BPE or Unigram) of a sentencepiece model's pieces."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers.models import BPE, Unigram

    t = proto.trainer_spec
    unk = proto.pieces[t.unk_id].piece
    if t.model_type == pb.TrainerSpec.BPE:
        try:  # transformers 5
            from transformers.tokenization_utils_sentencepiece import SentencePieceExtractor
        except ImportError:  # 4.x (the hf extra allows >= 4.51): the same extractor, in another module
            from transformers.convert_slow_tokenizer import SentencePieceExtractor

        # merges ranked by piece score, as sentencepiece applies them (5.x ranks so by itself; 4.x when given them).
        # 5.x returns (vocab, scores, merges), 4.x (vocab, merges).
        extracted = SentencePieceExtractor(str(model_file)).extract({p.piece: p.score for p in proto.pieces})
        vocab, merges = extracted[0], extracted[-1]
        return BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=t.byte_fallback, dropout=None)
    if t.model_type == pb.TrainerSpec.UNIGRAM:
        return Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=t.unk_id, byte_fallback=t.byte_fallback)
    types = {number: name.lower() for name, number in pb.TrainerSpec.ModelType.items()}  # (3 alone said nothing: word)
    raise MinilmError(f"{model_file}: sentencepiece model type {types.get(t.model_type, t.model_type)!r} is not "
                      "exportable (bpe, unigram)")


# ------------------------------------------------------------------------------------------------ export


EXPORT_MARKER = "minilm_export.json"  # written last: a directory with it is a whole minilm export
EXPORT_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "tokenizer.model", EXPORT_MARKER}  # fmt: skip


def check_out_dir(out: Path) -> None:
    """Refuse an output path that is a file, or a directory whose model.safetensors is not an earlier export: a minilm
    run or phase directory (its weights would be replaced by Llama-named ones and the run would no longer load) or
    another model's directory."""
    if out.exists() and not out.is_dir():
        raise MinilmError(f"{out}: cannot create the export directory (a file of that name exists); give a directory "
                          "path to write (created if missing, an earlier export in it replaced)")  # fmt: skip
    if (out / "config.yaml").is_file() or (out / "complete.json").is_file():
        raise MinilmError(f"{out}: is a minilm run or phase directory (it holds config.yaml); exporting there would "
                          "replace its weights; give another directory")  # fmt: skip
    if (out / "model.safetensors").is_file() and not (out / EXPORT_MARKER).is_file():
        raise MinilmError(f"{out}: holds a model.safetensors that is not a minilm export (no {EXPORT_MARKER}); "
                          "give another directory, or remove it first")  # fmt: skip
    # any other folder with files in it (a phase's eval/, the user's own): the export's files were mixed with them.
    # A killed export's staging directory is no content: the next export there deletes it (_remove_stale_staging)
    if out.is_dir() and not (out / EXPORT_MARKER).is_file():
        held = sorted(p.name for p in out.iterdir() if not p.match(STAGING_GLOB))
        if held:
            listed = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "")
            raise MinilmError(f"{out}: is not empty ({listed}) and holds no earlier export (no {EXPORT_MARKER}); the "
                              "export's files would be mixed with these: give a new or empty directory, or an earlier "
                              "export to replace")  # fmt: skip


STAGING = ".export-{pid}-"  # + mkdtemp's random part + ".tmp": a staging directory inside the output
STAGING_GLOB = ".export-*-*.tmp"


def _remove_stale_staging(out: Path) -> None:
    """Delete the staging directories that exports killed midway (kill -9, a lost machine) left in ``out``: each as
    large as a model, and nothing else reads or deletes them. One of a live process (another export into the same
    directory now) is kept."""
    for d in out.glob(STAGING_GLOB):
        try:
            pid = int(d.name.split("-")[1])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)  # signal 0: is it alive?
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def _write_export(model, cfg, tokenizer, out: Path) -> None:
    from safetensors.torch import save

    hf_config(cfg, model.vocab_size, tokenizer).save_pretrained(out)
    (out / "model.safetensors").write_bytes(save(hf_state_dict(model), metadata={"format": "pt"}))
    if tokenizer is not None:  # (the start token generate() takes is the tokenizer's EOS)
        hf_generation_config(tokenizer).save_pretrained(out)
        hf_tokenizer(tokenizer.model_file).save_pretrained(out)
        shutil.copyfile(tokenizer.model_file, out / "tokenizer.model")
    origin = {"position": _plain(cfg.model.position), "train_seq_len": int(cfg.train.seq_len)}
    (out / EXPORT_MARKER).write_text(json.dumps(origin, indent=2))


def _install(staged: Path, out: Path) -> None:
    """Move the staged files into ``out``, each fsynced and renamed over its old version (the marker last), so an
    interrupted export leaves the earlier export's files or the new ones, never a truncated file."""
    names = sorted((p.name for p in staged.iterdir()), key=lambda n: n == EXPORT_MARKER)
    for name in names:
        fsync_path(staged / name)
    for name in names:
        os.replace(staged / name, out / name)
    for name in EXPORT_FILES - set(names):  # an earlier export's tokenizer when this one has none
        (out / name).unlink(missing_ok=True)
    fsync_path(out)


def export_model(model, cfg, tokenizer, out_dir: str | Path, verify: Optional[Callable[[Path], None]] = None) -> Path:
    """Write ``model`` (a minilm GPT trained with config ``cfg``) and ``tokenizer`` (minilm.data.Tokenizer) to
    ``out_dir`` as a transformers Llama directory. Returns ``out_dir``.

    The files are written to a staging directory inside ``out_dir`` first; ``verify(staged_dir)``, when given, runs
    on it (raise to abort: scripts/export_hf.py compares logits there), and only then are they moved into place. A
    failed or interrupted export leaves an earlier export in ``out_dir`` as it was."""
    if importlib.util.find_spec("transformers") is None:
        raise MinilmError("export needs Hugging Face transformers: pip install transformers")
    check_exportable(cfg.model, model)
    out = Path(out_dir)
    check_out_dir(out)
    created = _missing_dirs(out)  # out and the parents it needs that do not exist yet, innermost first
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
            _remove_stale_staging(out)
            staged = Path(tempfile.mkdtemp(prefix=STAGING.format(pid=os.getpid()), suffix=".tmp", dir=out))
        except OSError as e:  # a file on the way, no permission: bad input, not a crash
            raise MinilmError(
                f"{out}: cannot create the export directory ({e.strerror}); give a directory path to write (created "
                "if missing, an earlier export in it replaced)"
            ) from None
        try:
            _write_export(model, cfg, tokenizer, staged)
            if verify is not None:
                verify(staged)
            _install(staged, out)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    except BaseException:
        _remove_created(created)
        raise
    return out


def _missing_dirs(out: Path) -> list[Path]:
    """``out`` and each of its parents that does not exist, innermost first: what ``mkdir(parents=True)`` creates."""
    missing = []
    for d in (out, *out.parents):
        if os.path.lexists(d):
            break
        missing.append(d)
    return missing


def _remove_created(created: list[Path]) -> None:
    """A failed export leaves no directory it created behind (the output and the parents it made for it, innermost
    first), and never one that existed before: each only while empty (another process may have written into it)."""
    for d in created:
        try:
            d.rmdir()
        except OSError:  # not empty, or already gone: leave it, and the ones holding it
            break


def check_run_finished(path: str | Path, phase: Optional[str] = None) -> None:
    """Refuse a run directory given without a phase whose last phase has not finished. Its export is the run's final
    weights (docs/export.md), which it does not have yet: minilm.runs.load_run reads its newest finished phase instead,
    maybe the pretraining without the extension's RoPE scaling, and that was exported under the run's name without a
    word. A phase asked for (``phase``, a phase directory, a weights file) names its weights itself."""
    from minilm.runs import finish_command, resolve_run, run_phase_names

    if phase is not None:
        return
    run_dir, newest, _ = resolve_run(path, None)
    if newest is None or Path(path).resolve() != run_dir.resolve():
        return
    names = run_phase_names(run_dir)
    to_come = names[names.index(newest) + 1 :]
    if to_come:
        raise MinilmError(f"{run_dir} has not finished ({', '.join(to_come)} to come), so it has no final weights to "
                          f"export; give --phase {newest} to export its newest finished phase, or "
                          f"{finish_command(run_dir, 'finish the run')}")  # fmt: skip


def export_run(path: str | Path, out_dir: str | Path, phase: Optional[str] = None,
               verify: Optional[Callable[[Path], None]] = None) -> Path:
    """Export a run directory (its final weights: a run whose last phase has not finished is refused), phase directory
    or weights file (minilm.runs.load_run) to ``out_dir``."""
    from minilm.runs import load_run

    check_run_finished(path, phase)
    run = load_run(path, phase=phase)
    return export_model(run.model, run.cfg, run.tokenizer, out_dir, verify=verify)


LOGIT_CHUNK = 2**22  # logits compared per chunk of positions: about this many values (16 MiB in fp32) at a time


@torch.no_grad()
def max_logit_difference(model, hf_dir: str | Path, lengths, seed: int = 0, batch: int = 2) -> dict[int, float]:
    """Max |minilm − transformers| fp32 logit difference on ``batch`` random sequences, per sequence length (in the
    order given: transformers' dynamic RoPE keeps the frequencies of the longest call so far, so give lengths
    ascending).

    Every logit of every sequence is compared, but one sequence at a time and the logits ``LOGIT_CHUNK`` values at a
    time: each model's final hidden states (B=1, T, D) go through its own LM head chunk by chunk, as its forward
    would take them whole (GPT.forward and LlamaForCausalLM.forward are both ``lm_head(final normed hidden)``).
    Whole, at export_hf.py's 4x the training length, the batch's logits in both frameworks, their difference and its
    absolute value were four (2, T, V) fp32 tensors: for configs/rope_yarn.yaml's extend_4k phase (T 16384, V 8192)
    4.7 GB of peak memory for a 2-layer d_model-64 model, now 0.5 GB."""
    from transformers import AutoModelForCausalLM

    # (no dtype keyword: transformers before 4.56 named it torch_dtype and took dtype for the model's __init__;
    # a bf16 export read in its own dtype and cast is the same fp32 values)
    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir)).float().eval()
    model = model.float().eval()
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    out = {}
    for T in lengths:
        x = torch.randint(0, model.vocab_size, (batch, T), generator=g)  # (B, T): the tokens drawn as before
        worst = 0.0
        for row in x.split(1):  # (1, T)
            ours = model.hidden(row.to(device))  # (1, T, D)
            theirs = hf.model(input_ids=row).last_hidden_state  # (1, T, D)
            step = max(1, LOGIT_CHUNK // model.vocab_size)
            for i in range(0, T, step):
                a = model.lm_head(ours[:, i : i + step]).cpu()  # (1, step, V)
                b = hf.lm_head(theirs[:, i : i + step])
                worst = max(worst, float((a - b).abs().max()))
        out[int(T)] = worst
    return out
