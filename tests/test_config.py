"""The config layer: every shipped YAML loads; bad input names the key and the file."""

import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from minilm.config import load_config, phase_config, phase_names, phase_steps
from minilm.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml")
                 if "studies" not in p.parts)  # study files: tests/test_study.py


@pytest.mark.parametrize("path", SHIPPED)
def test_every_shipped_yaml_loads(path):
    cfg = load_config(REPO / path)
    for name in phase_names(cfg):
        assert phase_steps(phase_config(cfg, name)) >= 1


def test_layers_merge_in_order(tmp_path):
    (tmp_path / "a.yaml").write_text("model: {n_layers: 3, d_model: 64, n_heads: 2}\ntrain: {seq_len: 32}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nmodel: {n_layers: 5}\n")
    cfg = load_config(tmp_path / "b.yaml", ["model.n_layers=7", "run.name=x"])
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.train.seq_len) == (7, 64, 32)
    assert cfg.run.dir == "runs/x"  # derived from run.name


def test_misspelled_key_is_named_with_its_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*model\.n_layer"):
        load_config(bad)


def test_wrong_type_and_bad_value():
    with pytest.raises(ConfigError, match="model.n_layers"):
        load_config(overrides=["model.n_layers=abc"])
    with pytest.raises(ConfigError, match="model.d_model.*divisible"):
        load_config(overrides=["model.d_model=100", "model.n_heads=3"])
    with pytest.raises(ConfigError, match="optim.decay"):
        load_config(overrides=["optim.decay=sometimes"])
    with pytest.raises(ConfigError, match="model.loss_chunk_size"):
        load_config(overrides=["model.loss_chunk_size=-3"])


def test_missing_file_and_base_cycle(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_position_block_resets_when_the_encoding_changes(tmp_path):
    (tmp_path / "r.yaml").write_text("model: {position: {name: rope, base: 500.0}}\n")
    cfg = load_config(tmp_path / "r.yaml", ["model.position.name=none"])
    assert dict(cfg.model.position) == {"name": "none"}  # RoPE's base is not inherited by NoPE
    with pytest.raises(ConfigError, match="model.position.base"):  # in one layer, both apply
        load_config(overrides=["model.position.base=500", "model.position.name=none"])
    with pytest.raises(ConfigError, match="model.position.bogus"):
        load_config(overrides=["model.position.bogus=1"])


def test_a_read_only_configs_phase_configs_are_built_once_and_a_writable_ones_each_time():
    """load_config's checks build every phase's config; the run, a study and the evaluation asked for them again
    (~30 ms each). A read-only config cannot change, so its phase configs are kept; a writable one can."""
    import copy

    from omegaconf import OmegaConf

    cfg = load_config(REPO / "configs/rope_yarn_tiny.yaml")
    assert phase_config(cfg, "extend_2k") is phase_config(cfg, "extend_2k")
    assert OmegaConf.is_readonly(phase_config(cfg, "extend_2k"))
    mine = copy.deepcopy(cfg)  # a copy is a config of its own
    OmegaConf.set_readonly(mine, False)
    mine.phases.extend_2k.seq_len = 1024
    assert phase_config(mine, "extend_2k").train.seq_len == 1024 != phase_config(cfg, "extend_2k").train.seq_len
    mine.phases.extend_2k.seq_len = 768
    assert phase_config(mine, "extend_2k").train.seq_len == 768


def test_the_kept_phase_configs_go_with_their_config():
    """A config without phases is its own phase config: kept in the module's table, it held its config alive, so the
    entry's finalizer never ran and every such config loaded stayed in memory."""
    import gc
    import weakref

    from minilm.config import _PHASE_CONFIGS

    for path in ("configs/tiny.yaml", "configs/rope_yarn_tiny.yaml"):
        cfg = load_config(REPO / path)
        for name in phase_names(cfg):
            phase_config(cfg, name)
        gone, key = weakref.ref(cfg), id(cfg)
        del cfg
        gc.collect()
        assert gone() is None and key not in _PHASE_CONFIGS, path


def test_phase_position_blocks_reset_when_the_encoding_changes():
    """configs/rope_yarn_tiny.yaml with model.position.name=alibi: the phases' YaRN blocks were RoPE's parameters,
    so ALiBi starts them fresh (the same schedule, no position change), as it does the run's block; a phase
    block given in the same layer as the new name still applies."""
    cfg = load_config(REPO / "configs/rope_yarn_tiny.yaml", ["model.position.name=alibi"])
    assert all(dict(cfg.phases[n].position) == {} for n in cfg.phases)
    assert phase_config(cfg, "extend_2k").model.position.name == "alibi"
    # (xpos: a phase may change only a rotary encoding's parameters — ALiBi's are refused at load)
    cfg = load_config(REPO / "configs/rope_yarn_tiny.yaml",
                      ["model.position.name=xpos", "phases.extend_2k.position.gamma=0.5"])  # fmt: skip
    assert phase_config(cfg, "extend_2k").model.position.gamma == 0.5
    assert dict(cfg.phases["extend_512"].position) == {}


def test_a_position_error_after_an_encoding_change_names_the_change_not_the_phase_block():
    """model.position.name=xpos on the command line empties every phase's position block, the YAML's YaRN scaling
    too: a scaling key given with it then lacked the YaRN parameters, and the error blamed the command line's phase
    block ("the phases.extend_512.position.scaling given on the command line replaced the block that held it") or
    said nothing of the dropped block ("not a parameter of rope_type 'default'"). It names the name change."""
    tiny = REPO / "configs/rope_yarn_tiny.yaml"
    change = r"model\.position\.name=xpos set on the command line started a fresh position block"
    with pytest.raises(ConfigError, match=r"scaling\.factor: required .*the 4\.0 set in .*rope_yarn_tiny\.yaml was "
                                          r"dropped: " + change):  # fmt: skip
        load_config(tiny, ["model.position.name=xpos", "phases.extend_512.position.scaling.rope_type=yarn"])
    with pytest.raises(ConfigError, match=r"scaling\.factor: not a parameter of rope_type 'default'.*the "
                                          r"phases\.extend_512\.position\.scaling block set in .*rope_yarn_tiny\.yaml, "
                                          r"line \d+ was dropped: " + change):  # fmt: skip
        load_config(tiny, ["model.position.name=xpos", "phases.extend_512.position.scaling.factor=8"])


def test_checks_that_need_the_head_size_run_at_load_for_every_phase():
    """longrope's lists need one entry per rotary frequency (head_dim 32 here: 16): a later phase's wrong list used
    to fail only when that phase began, after the earlier ones had trained. So did a fraction rotating < 2 dims."""
    long = "{rope_type: longrope, factor: 4.0, original_max_position_embeddings: 128, short_factor: [1.0, 1.0], "
    long += "long_factor: [1.0, 1.0]}"
    with pytest.raises(ConfigError, match=r"phases.extend_2k.position.scaling.short_factor: .*\(16\), got 2"):
        load_config(REPO / "configs/rope_yarn_tiny.yaml", [f"phases.extend_2k.position.scaling={long}"])
    with pytest.raises(ConfigError, match=r"model.position.fraction: 0.03 of head_dim 32 rotates 0"):
        load_config(REPO / "configs/tiny.yaml", ["model.position.fraction=0.03"])


@pytest.mark.parametrize("overrides, message", [
    # each loaded, and failed later: refused as too short a limit when training began (xpos), a traceback
    # building the model or at its first step, or NaN gradients
    (["model.position.name=xpos", "phases.extend_2k.position.scale_base=0.001"],
     r"phases\.extend_2k\.position\.scale_base: 0\.001 with gamma 0\.4 fits no two positions"),
    (["model.position.name=kerple", "model.position.eps=1e37"], r"model\.position\.eps: must be <= 26\.38"),
    (["model.position.name=fire", "model.position.init_L=1e39"], r"model\.position\.init_L: must be at most 3\.4e\+38"),
    (["model.position.name=floater", "model.position.delta=1e37"], r"model\.position\.delta: 1e\+37 puts position"),
    # positive and a normal fp32 number, but position · θ_0 / 1e-35 is inf from position 3403 on: NaN cos and sin
    (["phases.extend_2k.position.scaling={rope_type: longrope, factor: 4.0, original_max_position_embeddings: 128, "
      "short_factor: [1.0, 1e-35, " + "1.0, " * 13 + "1.0], long_factor: [" + "1.0, " * 15 + "1.0]}"],
     r"^phases\.extend_2k\.position\.scaling\.short_factor\[1\]: must be at least 4\.94e-32 .*got 1e-35"),
])  # fmt: skip
def test_a_position_parameter_past_fp32_s_range_is_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs/rope_yarn_tiny.yaml", overrides)


def test_a_run_s_position_key_that_a_phase_breaks_is_named_as_set(tmp_path):
    """The run's longrope lists (16 entries, head_dim 32) inherited by a phase whose fraction 0.5 rotates 8
    frequencies: the error named phases.b.position.scaling.short_factor, which the config does not set, and so could
    not say which file set the value. A list the phase gives itself keeps the phase's key."""
    ones = ", ".join(["1.0"] * 16)
    y = tmp_path / "p.yaml"
    y.write_text("base: " + str(REPO / "configs/tiny.yaml") + "\nmodel:\n  position:\n    name: rope\n    scaling: "
                 f"{{rope_type: longrope, factor: 2.0, original_max_position_embeddings: 128, short_factor: [{ones}], "
                 f"long_factor: [{ones}]}}\n"
                 "phases:\n  a: {steps: 1}\n  b: {steps: 1, position: {fraction: 0.5}}\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^model\.position\.scaling\.short_factor: in phase 'b' \(which inherits "
                                          rf"it\): .*\(8\), got 16 \(set in {re.escape(str(y))}, line 5\)$"):
        load_config(y)
    with pytest.raises(ConfigError, match=r"^phases\.b\.position\.scaling\.short_factor: .*\(8\), got 2 \(set on"):
        load_config(y, ["phases.b.position.scaling.short_factor=[1.0, 1.0]"])


def test_a_scaling_block_of_another_rope_type_replaces_the_inherited_one(tmp_path):
    """configs/rope_pi.yaml extends rope_yarn.yaml: its phases' linear scaling must not inherit YaRN's
    original_max_position_embeddings (linear takes none, so the merged block failed when the phase began). The
    same for a command-line override and for a phase's block over the run's; one of the same type still merges."""
    base = tmp_path / "base.yaml"
    yarn = "{rope_type: yarn, factor: %s, original_max_position_embeddings: 64}"
    base.write_text(f"model:\n  position:\n    scaling: {yarn % 2.0}\nphases:\n  pre: {{steps: 1}}\n  ext:\n"
                    f"    steps: 1\n    position:\n      scaling: {yarn % 4.0}\n")  # fmt: skip
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\nphases:\n  ext:\n    position:\n"
                     "      scaling: {rope_type: linear, factor: 4.0}\n")
    cfg = load_config(child)
    assert dict(phase_config(cfg, "ext").model.position.scaling) == {"rope_type": "linear", "factor": 4.0}
    cfg = load_config(base, ["model.position.scaling={rope_type: ntk, factor: 3.0}"])
    assert dict(cfg.model.position.scaling) == {"rope_type": "ntk", "factor": 3.0}
    assert dict(phase_config(cfg, "ext").model.position.scaling)["rope_type"] == "yarn"  # the phase's own block
    cfg = load_config(base, ["phases.ext.position.scaling={rope_type: linear, factor: 8.0}"])
    assert dict(phase_config(cfg, "ext").model.position.scaling) == {"rope_type": "linear", "factor": 8.0}
    cfg = load_config(base, ["phases.ext.position.scaling.factor=8.0"])  # same type: merged onto the inherited one
    assert dict(phase_config(cfg, "ext").model.position.scaling)["original_max_position_embeddings"] == 64


def test_a_nope_every_past_the_last_layer_is_refused():
    """nope_every: 5 with 4 layers unrotated layer 4, which does not exist: a NoPE pattern that did nothing."""
    with pytest.raises(ConfigError, match=r"^model\.position\.nope_every: 5 leaves no layer of the 4 "):
        load_config(REPO / "configs/tiny.yaml", ["model.position.nope_every=5"])
    with pytest.raises(ConfigError, match=r"^phases\.extend_2k\.position\.nope_every: 9 leaves no layer"):
        load_config(REPO / "configs/rope_yarn_tiny.yaml", ["phases.extend_2k.position.nope_every=9"])
    assert load_config(REPO / "configs/tiny.yaml", ["model.position.nope_every=4"]).model.position.nope_every == 4


def test_a_source_of_another_kind_replaces_the_inherited_one(tmp_path):
    """data.sources.mine={kind: files, paths: [...]} over a YAML's {kind: embedded, max_docs: 100} kept max_docs
    (a files source reading 100 files, said nowhere), and over an hf source failed on its path; a source of the same
    kind still merges, and a YAML file extending another replaces alike."""
    base = tmp_path / "base.yaml"
    base.write_text("data:\n  sources:\n    embedded: null\n    mine: {kind: embedded, max_docs: 100, weight: 2.0}\n"
                    "    hub: {kind: hf, path: org/name}\n")  # fmt: skip
    files = "{kind: files, paths: [a.txt]}"
    cfg = load_config(base, [f"data.sources.mine={files}", f"data.sources.hub={files}"])
    assert dict(cfg.data.sources.mine) == dict(cfg.data.sources.hub) == {"kind": "files", "paths": ["a.txt"]}
    assert dict(load_config(base, ["data.sources.mine={kind: embedded, max_docs: 7}"]).data.sources.mine) == {
        "kind": "embedded", "max_docs": 7, "weight": 2.0}  # fmt: skip
    child = tmp_path / "child.yaml"
    child.write_text(f"base: base.yaml\ndata:\n  sources:\n    mine: {files}\n")
    assert dict(load_config(child).data.sources.mine) == {"kind": "files", "paths": ["a.txt"]}


def test_an_override_of_another_kind_replaces_an_earlier_override_of_the_same_block():
    """Two overrides of one source (or one scaling block) on a command line merged whatever their kind: the second
    source, of another kind, kept the first's max_docs and weight, and linear scaling after a YaRN block kept its
    original_max_position_embeddings, as no YAML layer beneath them would have. Of the same kind, they still merge."""
    cfg = load_config(overrides=["data.sources.embedded={kind: embedded, weight: 2.0, max_docs: 5}",
                                 "data.sources.embedded={kind: files, paths: [a.txt]}"])  # fmt: skip
    assert dict(cfg.data.sources.embedded) == {"kind": "files", "paths": ["a.txt"]}
    yarn = "model.position.scaling={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 64}"
    cfg = load_config(overrides=[yarn, "model.position.scaling={rope_type: linear, factor: 2.0}"])
    assert dict(cfg.model.position.scaling) == {"rope_type": "linear", "factor": 2.0}
    cfg = load_config(overrides=[yarn, "model.position.scaling={rope_type: yarn, factor: 8.0}"])
    assert dict(cfg.model.position.scaling) == {"rope_type": "yarn", "factor": 8.0,
                                                "original_max_position_embeddings": 64}  # fmt: skip
    cfg = load_config(REPO / "configs/rope_yarn_tiny.yaml",
                      ["phases.extend_512.position.scaling={rope_type: yarn, factor: 2.0, original_max_position_"
                       "embeddings: 128}", "phases.extend_512.position.scaling={rope_type: linear, factor: 4.0}"])
    assert dict(phase_config(cfg, "extend_512").model.position.scaling) == {"rope_type": "linear", "factor": 4.0}


def test_an_override_may_index_a_list_an_earlier_override_set():
    """Overrides land one by one as OmegaConf.from_dotlist lands them (config._dotlist): an index into a list set by
    an earlier override of the same command line sets that entry. Merging each override parsed alone instead (a
    "parse once" simplification of _dotlist) refused it: "Cannot merge incompatible container types"."""
    cfg = load_config(REPO / "configs/tiny.yaml", ["eval.lengths=[128, 256]", "eval.lengths.1=512",
                                                   "eval.lengths[0]=64"])  # fmt: skip
    assert list(cfg.eval.lengths) == [64, 512]


def test_phase_overrides_and_errors(tmp_path):
    y = tmp_path / "p.yaml"
    y.write_text(
        "phases:\n  short: {seq_len: 64, steps: 5}\n"
        "  long: {seq_len: 256, tokens: 1000, lr: 0.0001, position: {base: 50000.0}, data: {long_fraction: 0.5}}\n"
    )
    cfg = load_config(y, ["phases.long.batch_size=2"])
    assert phase_names(cfg) == ["short", "long"]
    long = phase_config(cfg, "long")
    assert (long.train.seq_len, long.train.batch_size, long.optim.lr) == (256, 2, 0.0001)
    assert long.model.position.base == 50000.0 and long.data.long_fraction == 0.5
    assert phase_steps(long) == 2  # ceil(1000 tokens / (2 · 256))
    with pytest.raises(ConfigError, match="phases.long.data"):
        load_config(y, ["phases.long.data.long_fractoin=0.3"])
    with pytest.raises(ConfigError, match="phases.long.position.name"):
        load_config(y, ["phases.long.position.name=none"])


def test_config_is_read_only():
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.model.n_layers = 9


def test_a_phase_may_reweight_but_not_add_sources(tmp_path):
    y = tmp_path / "s.yaml"
    y.write_text(
        "data:\n  sources:\n    extra: {kind: files, paths: ['x/*.txt'], weight: 0.0}\n"
        "phases:\n  a: {steps: 1}\n  b: {steps: 1, data: {sources: {extra: {weight: 2.0}}}}\n"
    )
    cfg = load_config(y)
    assert phase_config(cfg, "b").data.sources.extra.weight == 2.0
    with pytest.raises(ConfigError, match="phases.b.data.sources.new: a phase cannot add a source"):
        load_config(y, ["phases.b.data.sources.new={kind: embedded}"])
    with pytest.raises(ConfigError, match="phases.b.data.sources.extra.paths: a phase may change only"):
        load_config(y, ["phases.b.data.sources.extra={paths: ['y/*.txt']}"])


@pytest.mark.parametrize("override, key", [
    ("phases.b.data.tokenizer.vocab_size=999", "tokenizer.vocab_size"),
    ("phases.b.data.val_fraction=0.5", "val_fraction"),
    ("phases.b.data.cache_dir=elsewhere", "cache_dir"),
    ("phases.b.data.num_proc=1", "num_proc"),
])  # fmt: skip
def test_a_phase_cannot_change_what_the_corpus_is_prepared_from(tmp_path, override, key):
    """The corpus and its tokenizer are prepared once, from the run's data section: a phase that set one of these
    was accepted, trained on the run's value, and wrote its own into its config.yaml."""
    y = tmp_path / "p.yaml"
    y.write_text("phases:\n  a: {steps: 1}\n  b: {steps: 1, data: {long_fraction: 0.5}}\n")
    assert phase_config(load_config(y), "b").data.long_fraction == 0.5  # how rows are drawn: a phase's to change
    with pytest.raises(ConfigError, match=rf"phases\.b\.data\.{key}: .* a phase cannot change {key}"):
        load_config(y, [override])


@pytest.mark.parametrize("key", ["model.n_layers=8", "d_model=64"])
def test_a_phase_that_changes_the_model_is_refused_saying_what_a_phase_may_set(tmp_path, key):
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "configs/rope_yarn_tiny.yaml", [f"phases.extend_512.{key}", f"run.dir={tmp_path}"])
    assert "phases.extend_512." + key.split("=")[0].split(".")[0] in str(e.value)
    assert "a phase cannot change the model" in str(e.value)
    assert "phases.extend_512.position" in str(e.value) and "seq_len, steps" in str(e.value)
    with pytest.raises(ConfigError, match=r"phases\.extend_512\.foo.*a phase takes: seq_len, steps"):
        load_config(REPO / "configs/rope_yarn_tiny.yaml", ["phases.extend_512.foo=1"])


def test_a_removed_source_stays_removed_in_every_phase(tmp_path):
    y = tmp_path / "r.yaml"
    y.write_text("data:\n  sources:\n    embedded: null\n    local: {kind: files, paths: ['x/*.txt']}\n"
                 "phases:\n  a: {steps: 1}\n  b: {steps: 1, data: {long_fraction: 0.5}}\n")
    cfg = load_config(y)
    for name in ("a", "b"):
        assert list(phase_config(cfg, name).data.sources) == ["local"]


def test_a_section_of_the_wrong_shape_is_named(tmp_path):
    (tmp_path / "list.yaml").write_text("phases:\n  - {steps: 2}\n")
    with pytest.raises(ConfigError, match=r"list\.yaml: 'phases' must be a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "scalar.yaml").write_text("train: 5\n")
    with pytest.raises(ConfigError, match=r"scalar\.yaml: 'train' must be a mapping"):
        load_config(tmp_path / "scalar.yaml")
    with pytest.raises(ConfigError, match="command line: 'phases' must be a mapping"):
        load_config(overrides=["phases=[1]"])


def test_a_duplicated_yaml_key_is_an_error_not_a_silent_override(tmp_path):
    (tmp_path / "dup.yaml").write_text("train:\n  steps: 3\n  steps: 4\n")
    with pytest.raises(ConfigError, match=r"(?s)dup\.yaml.*duplicate key 'steps'"):
        load_config(tmp_path / "dup.yaml")


def test_a_yaml_file_reads_a_value_as_the_command_line_does(tmp_path):
    """``factor: 4e0`` in a scaling block was refused (YAML 1.1 reads an exponent without a dot as a string) while
    ``factor=4e0`` on the command line, parsed by OmegaConf's YAML 1.2 floats, was 4.0; a date was a traceback in a
    file and text on the command line. A file now reads every scalar as the command line does."""
    import yaml
    from omegaconf import OmegaConf

    from minilm.config import UniqueKeyLoader

    for text in ["4e0", "1e-3", "-2E+3", "1.0e5", "1.0e-5", ".5", "3", "1_000", "007", "yes", ".inf", "2024-01-01",
                 "1e", "e5", "1.2.3", "run7"]:
        in_file = yaml.load(f"v: {text}", Loader=UniqueKeyLoader)["v"]
        assert repr(in_file) == repr(OmegaConf.from_dotlist([f"v={text}"]).v), text
    scaling = "{rope_type: linear, factor: 4e0}"
    (tmp_path / "exp.yaml").write_text(f"model: {{position: {{name: rope, scaling: {scaling}}}}}\n"
                                       "optim: {lr: 3e-4}\nrun: {name: 2024-01-01}\n")  # fmt: skip
    in_file = load_config(tmp_path / "exp.yaml")
    on_line = load_config(overrides=[f"model.position.scaling={scaling}", "optim.lr=3e-4", "run.name=2024-01-01"])
    assert OmegaConf.to_container(in_file) == OmegaConf.to_container(on_line)
    assert in_file.model.position.scaling.factor == 4.0 and in_file.run.name == "2024-01-01"


@pytest.mark.parametrize("where", ["file", "command line"])
@pytest.mark.parametrize("key, text, value, number", [("eval.lengths", "[1:2]", "1:2", 62),
                                                      ("train.steps", "1:30", "1:30", 90),
                                                      ("optim.lr", "1:30.5", "1:30.5", 90.5)])
def test_a_base_60_number_is_text_refused_by_a_number_key(tmp_path, where, key, text, value, number):
    """YAML 1.1 reads 1:30 as the base-60 number 90, in a file (PyYAML) as on the command line (OmegaConf's loader):
    eval.lengths=[1:2] evaluated at length 62 and train.steps: 1:30 trained 90 steps, silently. Such a value is the
    text it looks like, which a number key refuses, naming the key, where it was set and why."""
    section, _, last = key.partition(".")
    if where == "file":
        (tmp_path / "b60.yaml").write_text(f"{section}:\n  {last}: {text}\n")
        args, label = (tmp_path / "b60.yaml", []), r".*b60\.yaml"
    else:
        args, label = (None, [f"{key}={text}"]), "command line"
    with pytest.raises(ConfigError, match=rf"^{label}(, line 2)?: bad config key '{re.escape(key)}.*'{re.escape(value)}' .*"
                                          rf"read as text, not as YAML 1\.1's base-60 number {number}"):  # fmt: skip
        load_config(*args)


def test_a_base_60_looking_value_is_text_for_a_string_key_and_in_an_open_block(tmp_path):
    """A string key keeps the text (it was '90' from a file); a position parameter and a source key refuse it as
    not a number, naming the key (they took 90)."""
    (tmp_path / "n.yaml").write_text("run: {name: 12:30}\n")
    assert load_config(tmp_path / "n.yaml").run.name == "12:30"
    assert load_config(overrides=["run.name=1:30"]).run.name == "1:30"
    with pytest.raises(ConfigError, match=r"^model\.position\.scaling\.factor: .*'1:30'.*command line"):
        load_config(overrides=["model.position.scaling={rope_type: linear, factor: 1:30}"])
    with pytest.raises(ConfigError, match=r"^data\.sources\.embedded\.max_docs: .*'1:30'"):
        load_config(overrides=["data.sources.embedded={kind: embedded, max_docs: 1:30}"])


def test_an_override_that_is_not_yaml_is_named():
    # an unclosed list, not '{kind:files,paths:[]}': omegaconf 2.3 reads that one (as the key 'kind:files', which
    # test_a_mapping_without_a_space_after_a_colon_says_so refuses), 2.4 does not
    with pytest.raises(ConfigError, match=r"command line: cannot parse override 'data.sources.x=\{kind: files"):
        load_config(overrides=["train.steps=3", "data.sources.x={kind: files, paths: [}"])
    # the parser's problem in one line, not its scanner report ('in "<unicode string>", line 1, column 1' ...)
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["model.d_model=[1"])
    # omegaconf 2.4 gets the scanner's "did not find expected ',' or ']'", 2.3 the parser's "expected ',' or ']', but
    # got '<stream end>'"
    assert str(e.value).startswith("command line: cannot parse override 'model.d_model=[1': ")
    assert "expected ',' or ']'" in str(e.value)
    assert "unicode string" not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key, value", [("log_every", 0), ("val_every", -1), ("ckpt_every", -1),
                                        ("val_batches", -1), ("keep_checkpoints", -1), ("max_bad_steps", -1)])
def test_train_counters_are_checked(key, value):
    with pytest.raises(ConfigError, match=f"train.{key}: must be >="):
        load_config(overrides=[f"train.{key}={value}"])


@pytest.mark.parametrize("value", ["007", "yes", "1e3", "2024_01"])
def test_a_string_key_from_the_command_line_keeps_its_text(value):
    """YAML reads run.name=007 as the int 7 (yes as True, 1e3 as 1000.0, 2024_01 as 202401), and the schema stored
    that as '7': the run went to runs/7. A string key takes the text as typed; quoting still works."""
    cfg = load_config(overrides=[f"run.name={value}"])
    assert (cfg.run.name, cfg.run.dir) == (value, f"runs/{value}")
    assert load_config(overrides=["run.name='a b'"]).run.name == "a b"
    assert load_config(overrides=["data.tokenizer.vocab_size=1_024"]).data.tokenizer.vocab_size == 1024  # not a str


def test_a_string_key_keeps_a_hash_or_a_colon_as_typed():
    """'run.dir=/tmp/a #b' was '/tmp/a' (YAML took ' #b' for a comment, cut without a word) and 'run.dir=/tmp/a: b'
    a mapping, refused as "Cannot convert 'DictConfig' to string": a path holds either."""
    for text in ("/tmp/a #b", "/tmp/a: b", "a#b"):
        assert load_config(overrides=[f"run.dir={text}"]).run.dir == text
    assert load_config(overrides=["run.name='a' "]).run.name == "a"  # quoted: the text inside the quotes


def test_a_misspelled_phase_on_the_command_line_is_an_error():
    """phases.NAME.key=value for a NAME the YAML lacks used to append a phase of that name, trained after the
    others with the run's settings (here: a 4th phase at seq_len 128). A config without phases may still declare
    them on the command line."""
    with pytest.raises(ConfigError, match=r"phases\.extend_521: no such phase .*pretrain, extend_512, extend_2k"):
        load_config(REPO / "configs/rope_yarn_tiny.yaml", ["phases.extend_521.steps=5"])
    assert phase_names(load_config(REPO / "configs/tiny.yaml", ["phases.a.steps=5", "phases.b.steps=2"])) == ["a", "b"]


def test_a_misspelled_phase_in_a_child_yaml_is_an_error(tmp_path):
    """A YAML extending a config with phases that misspelled one of them (extend_1K for extend_1k, in the style of
    rope_abf.yaml) appended a phase of the run's defaults, trained after the others, and left the phase it meant to
    change as it was. A child may still add a phase that says how long it is."""
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {REPO / 'configs/rope_yarn.yaml'}\nphases:\n  extend_1K:\n    position: {{base: 4.0e4}}\n")
    with pytest.raises(ConfigError, match=r"child\.yaml: phases\.extend_1K: not a phase of its base .*did you mean "
                                          r"'extend_1k'\?"):
        load_config(child)
    child.write_text(f"base: {REPO / 'configs/rope_yarn.yaml'}\nphases:\n  cooldown: {{seq_len: 4096, steps: 10}}\n")
    assert phase_names(load_config(child))[-1] == "cooldown"
    # a name that differs in case alone is the base's phase, even when it sets its length (it appended a phase)
    child.write_text(f"base: {REPO / 'configs/rope_yarn.yaml'}\nphases:\n  extend_1K: {{steps: 5}}\n")
    with pytest.raises(ConfigError, match=r"phases\.extend_1K: not a phase of its base .*did you mean 'extend_1k'\? "
                                          r"Phase names are case-sensitive"):  # fmt: skip
        load_config(child)


def test_a_phase_set_to_null_is_removed_as_a_source_is(tmp_path):
    """phases.NAME: null (a child YAML, or phases.NAME=null on the command line) removes an inherited phase, as
    data.sources.NAME: null removes a source; it was refused as "'phases.extend_2k' must be a mapping of keys, got
    None", so no layer could drop a phase. A name that is not a phase yet is an error, not a removal of nothing."""
    tiny = REPO / "configs/rope_yarn_tiny.yaml"
    assert phase_names(load_config(tiny, ["phases.extend_512=null"])) == ["pretrain", "extend_2k"]
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {tiny}\nphases:\n  extend_2k: null\n  extend_1k: {{seq_len: 1024, steps: 5}}\n")
    cfg = load_config(child, ["phases.extend_1k.steps=7"])
    assert phase_names(cfg) == ["pretrain", "extend_512", "extend_1k"]
    assert phase_steps(phase_config(cfg, "extend_1k")) == 7
    child.write_text(f"base: {tiny}\nphases:\n  extend_2K: null\n")
    with pytest.raises(ConfigError, match=r"child\.yaml: phases\.extend_2K: null removes an inherited phase, and there "
                                          r"is no phase 'extend_2K' .*did you mean 'extend_2k'\?"):  # fmt: skip
        load_config(child)
    with pytest.raises(ConfigError, match=r"phases\.x: null removes an inherited phase.*it has no phases"):
        load_config(REPO / "configs/tiny.yaml", ["phases.x=null"])


@pytest.mark.parametrize("override, phase_key", [("train.steps=5", "steps"), ("train.tokens=20000", "tokens"),
                                                 ("train.seq_len=64", "seq_len"),
                                                 ("eval.lengths=[64]", "eval_lengths")])  # fmt: skip
def test_a_run_key_every_phase_sets_for_itself_is_refused_on_the_command_line(override, phase_key):
    """train.steps=5 on configs/rope_yarn_tiny.yaml (a smoke test) trained 300, 60 and 30 steps without a word: every
    phase sets its own. A key some phase reads is kept (optim.lr here); so is any key on a config without phases."""
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"command line: {re.escape(key)} changes nothing here: every phase sets "
                                          rf"its own .*phases\.pretrain\.{phase_key}=\.\.\."):  # fmt: skip
        load_config(REPO / "configs/rope_yarn_tiny.yaml", [override])
    assert load_config(REPO / "configs/rope_yarn_tiny.yaml", ["optim.lr=0.01"]).optim.lr == 0.01
    assert load_config(REPO / "configs/tiny.yaml", [override])


def test_a_config_file_that_cannot_be_read_is_named(tmp_path):
    """A non-UTF-8 file (or a directory) gave a UnicodeDecodeError (IsADirectoryError) traceback, exit 1."""
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8 text"):
        load_config(latin)
    with pytest.raises(ConfigError, match="is not a file"):
        load_config(tmp_path)


def test_save_config_is_written_through_minilm_files(tmp_path, monkeypatch):
    """Saved configs (the run's, each phase's) are files a resume trusts: fsynced before the rename like every other
    file that matters (minilm.files), not only renamed."""
    import os

    from minilm.config import save_config

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    save_config(load_config(overrides=["run.name=x"]), tmp_path / "sub" / "config.yaml")
    assert load_config(tmp_path / "sub" / "config.yaml").run.name == "x"
    assert synced and [p.name for p in (tmp_path / "sub").iterdir()] == ["config.yaml"]


def test_carry_optimizer_on_the_first_phase_is_an_error():
    """There is nothing before the first phase to carry moments from: the flag was ignored without a word (and a
    study still hashed it into the phase's identity)."""
    with pytest.raises(ConfigError, match=r"phases\.pretrain\.carry_optimizer: the first phase"):
        load_config(REPO / "configs/rope_yarn_tiny.yaml", ["phases.pretrain.carry_optimizer=true"])
    assert load_config(REPO / "configs/rope_yarn_tiny.yaml", ["phases.extend_512.carry_optimizer=true"])


def test_the_printed_config_loads_back_to_the_same_config(tmp_path):
    """`train.py --config <the --print-config output>` (or a run's saved config.yaml) must train the same run. A
    config that removed the default source (`embedded: null`) printed without it, and the reload merged the
    schema's default `embedded` source back in: another corpus, another tokenizer."""
    from minilm.config import to_yaml
    from minilm.runs import load_run_config

    y = tmp_path / "own.yaml"
    y.write_text(f"base: {REPO / 'configs/rope_yarn_tiny.yaml'}\n"
                 "data:\n  sources:\n    embedded: null\n    local: {kind: files, paths: ['x/*.py']}\n")  # fmt: skip
    cfg = load_config(y, ["model.position.name=alibi"])
    printed = tmp_path / "printed.yaml"
    printed.write_text(to_yaml(cfg))
    again = load_config(printed)
    assert list(again.data.sources) == ["local"]
    assert to_yaml(again) == to_yaml(cfg)
    assert list(load_run_config(printed).data.sources) == ["local"]  # how runs.py reads a saved config.yaml


def test_a_phase_with_both_steps_and_tokens_is_refused(tmp_path):
    """Which length was meant cannot be guessed: ``tokens`` used to win silently over the phase's ``steps``
    (typically a ``phases.X.tokens=`` override on a YAML phase that gives steps)."""
    y = tmp_path / "p.yaml"
    y.write_text("phases:\n  a: {seq_len: 32, steps: 5}\n  b: {seq_len: 64, tokens: 1000}\n")
    with pytest.raises(ConfigError, match=r"phases\.a: gives both steps \(5\) and tokens \(640\).*a\.steps=null"):
        load_config(y, ["phases.a.tokens=640"])
    (tmp_path / "both.yaml").write_text("phases:\n  a: {steps: 5, tokens: 640}\n")
    with pytest.raises(ConfigError, match=r"phases\.a: gives both steps"):
        load_config(tmp_path / "both.yaml")
    cfg = load_config(y, ["phases.a.steps=null", "phases.a.tokens=640", "train.batch_size=4"])  # the way to switch
    assert phase_steps(phase_config(cfg, "a")) == 5  # 640 / (4 · 32)


def test_a_warmup_longer_than_the_phase_is_warned_of():
    """lr_lambda's warmup is (step + 1) / warmup_steps: a phase shorter than its warmup never reaches its peak lr
    and never decays. A smoke run (train.steps=20 on tiny.yaml) is legitimate, so it is a warning naming the keys."""
    from minilm.config import warmup_warning

    tiny = REPO / "configs" / "tiny.yaml"  # optim.warmup_steps: 40
    msg = warmup_warning(load_config(tiny, ["train.steps=20"]), "train")
    assert msg.startswith("optim.warmup_steps = 40 is longer than the run (20 steps from train.steps)")
    assert "50% of the peak 0.002" in msg
    assert warmup_warning(load_config(tiny, ["train.steps=40"]), "train") is None  # the peak is reached at step 40
    yarn = load_config(REPO / "configs" / "rope_yarn_tiny.yaml", ["phases.extend_2k.steps=3"])
    assert [warmup_warning(yarn, n) is not None for n in phase_names(yarn)] == [False, False, True]
    assert warmup_warning(yarn, "extend_2k").startswith(
        "phases.extend_2k.warmup_steps = 5 is longer than phase 'extend_2k' (3 steps from phases.extend_2k.steps)")


def test_a_phase_shorter_than_the_one_before_it_gets_a_one_line_note():
    """A phase that forgot its seq_len trains at the run's train.seq_len, after an extension phase a shorter one,
    without a word (so does a 512 typed for 5120). A short stage after a long one is also a recipe of its own, so it
    is a note naming the key, never an error; phases at the same or a longer length get none."""
    from minilm.config import shorter_phase_note

    cfg = load_config(overrides=["train.seq_len=256", "phases.a={seq_len: 512, steps: 3}", "phases.b={steps: 3}",
                                 "phases.c={seq_len: 128, steps: 3}", "phases.d={seq_len: 128, steps: 3}"])  # fmt: skip
    notes = {n: shorter_phase_note(cfg, n) for n in phase_names(cfg)}
    assert notes["a"] is None and notes["d"] is None
    assert notes["b"] == ("phase 'b' trains at seq_len 256 (train.seq_len: it sets none), shorter than the 512 of "
                          "phase 'a' before it; fine for a short-sequence stage, else set its seq_len")
    assert "seq_len 128 (phases.c.seq_len), shorter than the 256 of phase 'b'" in notes["c"]
    assert all("\n" not in n for n in notes.values() if n)
    yarn = load_config(REPO / "configs" / "rope_yarn_tiny.yaml")  # the usual schedule: short, then longer
    assert [shorter_phase_note(yarn, n) for n in phase_names(yarn)] == [None, None, None]


@pytest.mark.parametrize("overrides, warned", [
    ([], None),  # the shipped schedule: YaRN 4 and 16 from the 128 tokens pretraining trained at
    (["phases.extend_2k.position.scaling.factor=4"],  # 4 × 128 = 512, not the 2048 it trains at
     "phase 'extend_2k' trains at seq_len 2048, beyond the 4 × 128 = 512 tokens that yarn with "
     "phases.extend_2k.position.scaling.factor = 4 stretches"),
    (["phases.extend_2k.position.scaling={rope_type: linear, factor: 4}"], "set factor: 16 if"),
    (["phases.extend_2k.position.scaling={rope_type: llama3, factor: 4, original_max_position_embeddings: 128}"],
     None),  # Llama 3.1 trains beyond factor × L
    (["phases.extend_2k.position.scaling.original_max_position_embeddings=512",
      "phases.extend_2k.position.scaling.factor=4"],  # 512: the length extend_512 trained at, with scaling
     "phases.extend_2k.position.scaling.original_max_position_embeddings = 512, but the model trained without "
     "scaling at seq_len 128 (phase 'pretrain')"),
    (["phases.extend_512.position={base: 40000.0, scaling: null}"],  # ABF at 512, then YaRN relative to 128
     "set original_max_position_embeddings: 512 if"),
])
def test_a_scaling_that_contradicts_the_phases_is_warned_of_before_they_train(overrides, warned):
    from minilm.training.phases import phase_notes

    cfg = load_config(REPO / "configs" / "rope_yarn_tiny.yaml", overrides)
    lines = [line for line in phase_notes(cfg, phase_names(cfg)) if "scaling" in line or "factor" in line]
    if warned is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith("warning: ") and warned in lines[0]


@pytest.mark.parametrize("override, message", [
    ("model.d_model=0", "model.d_model: must be >= 1"),  # was a ZeroDivisionError traceback
    ("model.n_kv_heads=0", "model.n_kv_heads: must be >= 1 or null"),  # was silently n_heads
    ("model.d_ff=0", "model.d_ff: must be >= 1 or null"),  # was a model without an MLP
    ("model.norm_eps=-1", "model.norm_eps: must be >= 0 and finite"),  # was a NaN loss at step 0
    ("model.init_std=-0.02", "model.init_std: must be > 0 and finite"),  # torch traceback, run.dir written
    ("model.init_std=0", "model.init_std: must be > 0 and finite"),  # all-zero weights and gradients: trained nothing
    ("train.micro_batch_size=0", "train.micro_batch_size: must be >= 1 or null"),  # was silently batch_size
    ("phases.a.micro_batch_size=0", "phases.a.micro_batch_size: must be >= 1 or null"),
    ("optim.beta1=1", r"optim.beta1: must be in \[0, 1\)"),  # AdamW's traceback when the phase started
    ("optim.beta2=1.5", r"optim.beta2: must be in \[0, 1\)"),
    ("optim.eps=-1e-8", "optim.eps: must be >= 0 and finite"),
    ("optim.weight_decay=-0.1", "optim.weight_decay: must be >= 0 and finite"),  # trained silently
    ("optim.grad_clip=-1", "optim.grad_clip: must be >= 0"),  # was silently no clipping
    ("optim.lr=inf", "optim.lr: must be > 0 and finite"),  # was a NaN loss at step 0
    ("model.init_std=.inf", "model.init_std: must be > 0 and finite"),
    ("run.dir=''", "run.dir: must not be empty"),  # trained into the working directory
    ("run.name=''", "run.name: must not be empty"),  # trained into runs/ itself
    ("data.cache_dir=''", "data.cache_dir: must not be empty"),
    ("train.compile_mode=reduce-overhead", r"train.compile_mode: must be one of \('default', 'max-autotune-no"),
    ("model.sdpa_kernel=fa3",
     r"model.sdpa_kernel: must be one of \(.auto., .flash., .cudnn., .efficient.\), got .fa3."),
])  # fmt: skip
def test_model_and_optimizer_values_are_checked_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=["phases.a.steps=3", override])


@pytest.mark.parametrize("name", ["..", ".", "a/b", "tb", "TB", "Tb", ".lock", "config.yaml", "-x", " "])
def test_a_phase_name_that_is_not_a_plain_directory_name_is_refused(tmp_path, name):
    """A phase trains in run.dir/<name> and --phase NAME deletes that directory first: a phase named '..' made
    `--phase ..` delete every run next to this one; 'tb' would delete the TensorBoard events."""
    y = tmp_path / "p.yaml"
    y.write_text(f"phases:\n  {name!r}: {{steps: 3}}\n  pretrain: {{steps: 3}}\n")
    with pytest.raises(ConfigError, match=f"phases: bad phase name '{re.escape(name)}'"):
        load_config(y)
    y.write_text("phases:\n  pretrain_1k: {steps: 3}\n  Extend-4K: {steps: 3}\n")
    assert phase_names(load_config(y)) == ["pretrain_1k", "Extend-4K"]


def test_two_phase_names_that_differ_in_case_alone_are_refused(tmp_path):
    """Each phase trains in run.dir/<name>: on a case-insensitive file system (macOS's, Windows') 'extend_2k' and
    'Extend_2K' are one directory, where the two phases would write each other's checkpoints and outputs."""
    y = tmp_path / "p.yaml"
    y.write_text("phases:\n  extend_2k: {steps: 3}\n  Extend_2K: {steps: 3}\n")
    with pytest.raises(ConfigError, match="phases 'Extend_2K' and 'extend_2k' differ in case alone.*rename one"):
        load_config(y)
    with pytest.raises(ConfigError, match="differ in case alone"):
        load_config(overrides=["phases.a={steps: 1}", "phases.A={steps: 1}"])


def test_a_bad_value_names_the_file_or_the_command_line_that_gave_it(tmp_path):
    """README: bad values stop with a message naming the key and the file. In a base: chain the key alone does not
    say which of three files to edit; the line in it, where the key sits (a phase's steps four lines down)."""
    (tmp_path / "base.yaml").write_text("model: {n_layers: 2, d_model: 64, n_heads: 2}\noptim: {decay: cosine}\n")
    (tmp_path / "exp.yaml").write_text("base: base.yaml\noptim: {decay: sometimes}\nphases:\n  a: {steps: 0}\n")
    with pytest.raises(ConfigError, match=r"optim.decay: must be one of .* \(set in .*exp\.yaml, line 2\)$"):
        load_config(tmp_path / "exp.yaml")
    with pytest.raises(ConfigError, match=r"model.n_layers: must be >= 1, got 0 \(set on the command line\)$"):
        load_config(tmp_path / "exp.yaml", ["model.n_layers=0", "optim.decay=linear"])
    with pytest.raises(ConfigError, match=r"phases.a.steps: must be >= 1, got 0 \(set in .*exp\.yaml, line 4\)$"):
        load_config(tmp_path / "exp.yaml", ["optim.decay=linear"])
    with pytest.raises(ConfigError, match=r"model.position.base: must be > 1, got -1.0 \(set on the command line\)"):
        load_config(tmp_path / "base.yaml", ["model.position.base=-1"])  # minilm.positions' checks too


def test_overrides_from_elsewhere_than_the_command_line_are_named_as_where_they_came_from(tmp_path):
    """A study's variant overrides come from its study file: errors in them said '(set on the command line)' and
    'command line: ...', which sent the user to the wrong place. ``source`` names them; ``more`` adds groups."""
    (tmp_path / "exp.yaml").write_text("model: {n_layers: 2, d_model: 64, n_heads: 2}\n")
    where = "study file s.yaml, variant 'a'"
    with pytest.raises(ConfigError, match=rf"model.n_layers: must be >= 1, got 0 \(set in {where}\)$"):
        load_config(tmp_path / "exp.yaml", ["model.n_layers=0"], where)
    with pytest.raises(ConfigError, match=rf"^{where}: bad config key 'model.n_layr'"):
        load_config(tmp_path / "exp.yaml", ["model.n_layr=0"], where)
    with pytest.raises(ConfigError, match=rf"^{where}: override 'model' must look like key.sub=value"):
        load_config(tmp_path / "exp.yaml", ["model"], where)
    with pytest.raises(ConfigError, match=r"model.n_layers: must be >= 1, got 0 \(set on the command line\)$"):
        load_config(tmp_path / "exp.yaml", ["model.n_layers=3"], where, more=[("command line", ["model.n_layers=0"])])
    cfg = load_config(tmp_path / "exp.yaml", ["model.n_layers=3"], where, more=[("command line", ["model.d_model=32"])])
    assert (cfg.model.n_layers, cfg.model.d_model) == (3, 32)


def test_a_null_value_names_the_layer_that_gave_the_null(tmp_path):
    """A layer that gave a key null was passed over as if it did not give it: the message named an earlier file that
    gave a good value (or no layer at all)."""
    (tmp_path / "base.yaml").write_text("model: {position: {name: rope, base: 10000.0}}\n")
    (tmp_path / "exp.yaml").write_text("base: base.yaml\nmodel: {position: {base: null}}\n")
    with pytest.raises(ConfigError, match=r"model.position.base: must not be null \(set on the command line\)$"):
        load_config(tmp_path / "base.yaml", ["model.position.base=null"])
    with pytest.raises(ConfigError, match=r"model.position.base: must not be null \(set in .*exp\.yaml, line 2\)$"):
        load_config(tmp_path / "exp.yaml")


@pytest.mark.parametrize("item", ["=1", ".a=1", "model..n_layers=2", "model.=2"])
def test_an_override_with_an_empty_key_part_is_named(item):
    with pytest.raises(ConfigError, match=f"override '{re.escape(item)}' must look like key.sub=value"):
        load_config(overrides=[item])


@pytest.mark.parametrize("override, message", [
    ("model.position=[1]", r"'model.position' must be a mapping of keys, got \[1\]"),  # was a ConfigTypeError traceback
    ("phases.a.data=3", "'phases.a.data' must be a mapping of keys, got 3"),
    ("eval.lengths=128", r"'eval.lengths' must be a list such as \[a, b\], got 128"),  # "AnyNode is not a ListConfig"
    ("data.synthetic.tasks=kv", r"'data.synthetic.tasks' must be a list such as \[a, b\], got 'kv'"),
    ("eval.lengths={a: 1}", r"'eval.lengths' must be a list such as \[a, b\], got \{'a': 1\}"),  # "bad config key '?'"
])  # fmt: skip
def test_a_nested_key_of_the_wrong_shape_is_named(override, message):
    with pytest.raises(ConfigError, match=f"command line: {message}"):
        load_config(overrides=["phases.a.steps=3", override])
    assert load_config(overrides=["phases.a.steps=3", "phases.a.eval_lengths=null"]).phases.a.eval_lengths is None


@pytest.mark.parametrize("override, key, glued", [
    ("data.sources.mine={kind:files, paths: [a.txt]}", "data.sources.mine", "kind:files"),
    ("data.sources=[{kind:files}]", r"data.sources\[0\]", "kind:files"),
    ("model.position={name:alibi}", "model.position", "name:alibi"),
    ("phases.a.position={scaling: {rope_type:yarn}}", "phases.a.position.scaling", "rope_type:yarn"),
])  # fmt: skip
def test_a_mapping_without_a_space_after_a_colon_says_so(override, key, glued, tmp_path):
    """YAML reads '{kind:files}' as the key 'kind:files' with no value: the error came later and read as another
    mistake ("data.sources.mine.kind: must be one of (...), got None", "model.position.name:alibi: unknown
    parameter"). It names the key, where it was written, and the fix."""
    name, _, value = glued.partition(":")
    with pytest.raises(ConfigError, match=f"^{key}: '{glued}' is read as one key with no value \\(on the command "
                                          f"line\\): YAML needs a space after the colon of a mapping; write "
                                          f"'{name}: {value}'$"):
        load_config(overrides=["phases.a.steps=3", override])
    (tmp_path / "c.yaml").write_text("data:\n  sources:\n    mine: {kind:files, paths: [a.txt]}\n")
    with pytest.raises(ConfigError, match=r"^data.sources.mine: 'kind:files' .*\(in .*c\.yaml, line 3\)"):
        load_config(tmp_path / "c.yaml")
    # a colon inside a value is no key: kept as the text it is
    assert load_config(overrides=["run.name=a:b"]).run.name == "a:b"


def test_data_sources_given_as_a_list_says_the_mapping_it_takes():
    with pytest.raises(ConfigError, match=r"'data.sources' must be a mapping of keys \(a name for each source: "
                                          r"data.sources.NAME=\{kind: files, paths: \[...\]\}\), got \["):
        load_config(overrides=["data.sources=[{kind: files, paths: [a.txt]}]"])


def test_a_switch_is_true_or_false_not_a_number(tmp_path):
    """OmegaConf reads any nonzero number as true: ``train.compile=2`` compiled, ``compile: 0.5`` too."""
    for override in ("train.compile=2", "train.compile=0", "phases.a.carry_optimizer=1"):
        key = override.split("=")[0]
        with pytest.raises(ConfigError, match=f"command line: '{re.escape(key)}' must be true or false"):
            load_config(overrides=["phases.a.steps=3", override])
    (tmp_path / "q.yaml").write_text('train:\n  compile: "2"\n')  # quoted: a string OmegaConf reads as 2, so true
    with pytest.raises(ConfigError, match=r"q\.yaml: 'train.compile' must be true or false, got '2'"):
        load_config(tmp_path / "q.yaml")
    (tmp_path / "s.yaml").write_text("model:\n  tie_embeddings: 0.5\n")
    with pytest.raises(ConfigError, match=r"s\.yaml: 'model.tie_embeddings' must be true or false, got 0.5"):
        load_config(tmp_path / "s.yaml")
    assert load_config(overrides=["train.compile=yes", "model.tie_embeddings=false"]).train.compile is True


def test_a_switch_in_a_phase_data_section_is_true_or_false_not_a_number(tmp_path):
    """A phase's ``data`` is an open mapping merged onto the data section: ``phases.a.data.document_mask=2`` passed
    the switch check and the merge read it as true."""
    with pytest.raises(ConfigError, match=r"command line: 'phases\.a\.data\.document_mask' must be true or false"):
        load_config(overrides=["phases.a.steps=3", "phases.a.data.document_mask=2"])
    (tmp_path / "p.yaml").write_text("phases:\n  a:\n    steps: 3\n    data: {restart_positions: 1}\n")
    with pytest.raises(ConfigError, match=r"p\.yaml: 'phases\.a\.data\.restart_positions' must be true or false"):
        load_config(tmp_path / "p.yaml")
    cfg = load_config(overrides=["phases.a.steps=3", "phases.a.data.document_mask=true"])
    assert phase_config(cfg, "a").data.document_mask is True


def test_a_nested_key_of_the_wrong_shape_is_named_with_its_file(tmp_path):
    (tmp_path / "e.yaml").write_text("eval:\n  lengths: 128\n")
    with pytest.raises(ConfigError, match=r"e\.yaml: 'eval.lengths' must be a list"):
        load_config(tmp_path / "e.yaml")


def test_a_config_path_that_cannot_name_a_file_is_named(tmp_path):
    """A symlink loop was a RuntimeError traceback from Path.resolve; an empty --config read the working directory
    ("config /work is not a file"); an empty base: named the directory of the file."""
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    with pytest.raises(ConfigError, match=r"loop\.yaml cannot be resolved"):
        load_config(tmp_path / "loop.yaml")
    (tmp_path / "to_loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(ConfigError, match=r"loop\.yaml \(named by 'base:' in .*to_loop\.yaml\) cannot be resolved"):
        load_config(tmp_path / "to_loop.yaml")
    with pytest.raises(ConfigError, match="the path of a YAML file is expected, got an empty string"):
        load_config("")
    (tmp_path / "empty_base.yaml").write_text("base: ''\n")
    with pytest.raises(ConfigError, match=r"empty_base\.yaml: 'base' must be a path to a YAML file, got ''"):
        load_config(tmp_path / "empty_base.yaml")


@pytest.mark.parametrize("key", ["run.dir", "data.cache_dir", "data.tokenizer.model_file"])
def test_a_path_starting_with_a_tilde_is_refused(key):
    """A shell does not expand '~' after '=' (`run.dir=~/runs/x`), nor does Path: the run went to ./~/runs/x, a
    directory called '~' that a careless `rm -rf ~` then "cleans up"."""
    with pytest.raises(ConfigError, match=f"{re.escape(key)}: '~/x': '~' is not expanded.*{re.escape(key)}=\\$HOME"):
        load_config(overrides=[f"{key}=~/x"])
    assert load_config(overrides=["run.dir=/tmp/a~b"]).run.dir == "/tmp/a~b"


def test_ffn_width_follows_the_documented_rule():
    """d_ff null: SwiGLU keeps a 4·d GELU MLP's parameter count, 8/3·d_model rounded *up* to a multiple of 64;
    GELU is 4·d_model; a given d_ff wins."""
    from minilm.config import ffn_dim

    def width(*over):
        return ffn_dim(load_config(overrides=["model.n_heads=2", *over]).model)

    assert width("model.d_model=64") == 192  # 170.7 -> 192 (not 128)
    assert width("model.d_model=96") == 256  # 256 exactly stays
    assert width("model.d_model=64", "model.mlp=gelu") == 256
    assert width("model.d_model=64", "model.d_ff=100") == 100


def test_every_model_key_is_documented_in_the_schema():
    """README and configs/base.yaml send readers to minilm/config.py, "where every key is documented": each ModelConfig
    field carries a comment on its line or in the comment block right above it (dropout's reach, init_std's scaling
    and tie_embeddings' effect on the logged parameter count had none)."""
    import inspect

    from minilm.config import ModelConfig

    lines = inspect.getsource(ModelConfig).splitlines()
    undocumented = []
    for f in dataclasses.fields(ModelConfig):
        i = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{f.name}:"))
        if "#" not in lines[i] and not lines[i - 1].strip().startswith("#"):
            undocumented.append(f.name)
    assert undocumented == []


def test_a_phase_with_its_own_steps_is_not_overridden_by_a_run_token_budget(tmp_path):
    """train.tokens wins over train.steps for the run, but a phase that gives its own steps trains those steps."""
    y = tmp_path / "p.yaml"
    y.write_text("train: {tokens: 100000, batch_size: 2, seq_len: 32}\nphases:\n  a: {steps: 3}\n  b: {seq_len: 64}\n")
    cfg = load_config(y)
    assert phase_steps(phase_config(cfg, "a")) == 3
    assert phase_steps(phase_config(cfg, "b")) == -(-100000 // (2 * 64))  # the run's budget, at b's seq_len


def test_a_phase_s_eval_lengths_replace_the_run_s():
    cfg = load_config(overrides=["eval.lengths=[32]", "phases.a.steps=1", "phases.a.eval_lengths=[64, 128]",
                                 "phases.b.steps=1"])  # fmt: skip
    assert list(phase_config(cfg, "a").eval.lengths) == [64, 128]
    assert list(phase_config(cfg, "b").eval.lengths) == [32]


def test_a_bad_phase_eval_lengths_is_named_as_the_config_sets_it(tmp_path):
    """A phase sets its evaluation lengths as phases.NAME.eval_lengths: the error named phases.NAME.eval.lengths, a key
    the config does not have (phases.NAME.eval is refused), and so could not say which file set it."""
    with pytest.raises(ConfigError, match=r"^phases\.a\.eval_lengths: has repeats: \[16, 16\] \(set on the command"):
        load_config(overrides=["phases.a.steps=1", "phases.a.eval_lengths=[16, 16]"])
    y = tmp_path / "p.yaml"
    y.write_text("phases:\n  a: {steps: 1}\n  b: {steps: 1, eval_lengths: [64, 1]}\n")
    with pytest.raises(ConfigError, match=rf"^phases\.b\.eval_lengths: must be integers >= 2, got \[64, 1\] \(set in "
                                          rf"{re.escape(str(y))}, line 3\)"):
        load_config(y)


def test_a_run_s_data_key_that_a_phase_breaks_is_named_as_set(tmp_path):
    """The run's data.restart_positions with a phase that sets document_mask false, and the run's empty
    data.synthetic.tasks with a phase that sets a synthetic fraction: the errors named phases.a.data.restart_positions
    and phases.a.data.synthetic.tasks, keys the phase does not set, and so could not say which file set the value."""
    y = tmp_path / "p.yaml"
    y.write_text("data: {document_mask: true, restart_positions: true}\n"
                 "phases:\n  a: {steps: 1, data: {document_mask: false}}\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^data\.restart_positions: in phase 'a' \(which inherits it\): needs "
                                          rf"document_mask: true .* \(set in {re.escape(str(y))}, line 1\)$"):
        load_config(y)
    with pytest.raises(ConfigError, match=r"^data\.synthetic\.tasks: in phase 'a' \(which inherits it\): must not be "
                                          r"empty when fraction > 0 \(set on the command line\)$"):
        load_config(overrides=["data.synthetic.tasks=[]", "phases.a.steps=1",
                               "phases.a.data={synthetic: {fraction: 0.1}}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"^phases\.a\.data\.restart_positions: needs document_mask"):  # the phase's
        load_config(overrides=["phases.a.steps=1", "phases.a.data={restart_positions: true}"])


def test_a_run_s_eval_key_that_a_phase_breaks_is_named_as_set(tmp_path):
    """The run's eval.stride longer than a phase's shortest eval_lengths, and the run's eval.extension lists that do
    not fit the rotary dims of a phase whose fraction halves them: the errors named phases.NAME.eval.stride and
    phases.NAME.eval.extension.short_factor, keys the config cannot have (phases.NAME.eval is refused), and so could
    not say which file set the value. The stride's names the phase's eval_lengths too, the other key to change."""
    y = tmp_path / "p.yaml"
    y.write_text("eval: {stride: 128}\nphases:\n  a: {steps: 1, eval_lengths: [64, 256]}\n")
    with pytest.raises(ConfigError, match=rf"^eval\.stride: in phase 'a' \(which inherits it\): must be <= the "
                                          rf"shortest of phases\.a\.eval_lengths \(64\) for sliding windows, got "
                                          rf"128 \(set in {re.escape(str(y))}, line 1\)$"):
        load_config(y)
    ones = ", ".join(["1.0"] * 16)
    extension = f"eval.extension={{name: longrope, factor: 2.0, short_factor: [{ones}], long_factor: [{ones}]}}"
    with pytest.raises(ConfigError, match=r"^eval\.extension\.short_factor: in phase 'b' \(which inherits it\): .*"
                                          r"\(8\), got 16 \(set on the command line\)$"):
        load_config(REPO / "configs/tiny.yaml", [extension, "phases.a.steps=1", "phases.b.steps=1",
                                                 "phases.b.position.fraction=0.5"])  # fmt: skip


def test_micro_batch_size_must_divide_the_batch():
    """Gradient accumulation splits each batch into equal micro-batches: 16 rows cannot be split into 3s."""
    with pytest.raises(ConfigError, match=r"train\.micro_batch_size: must divide batch_size \(16\), got 3"):
        load_config(overrides=["train.batch_size=16", "train.micro_batch_size=3"])
    with pytest.raises(ConfigError, match=r"phases\.a\.micro_batch_size: must divide batch_size \(16\), got 6"):
        load_config(overrides=["train.batch_size=16", "phases.a.steps=1", "phases.a.micro_batch_size=6"])


def test_a_run_s_micro_batch_size_that_a_phase_s_batch_does_not_take_is_named_as_set(tmp_path):
    """A phase that sets batch_size 6 and inherits the run's train.micro_batch_size 4: the error named
    phases.b.micro_batch_size, which the config does not set, and so could not say which file set the value."""
    y = tmp_path / "p.yaml"
    y.write_text("train: {micro_batch_size: 4}\nphases:\n  a: {steps: 1}\n  b: {steps: 1, batch_size: 6}\n")
    with pytest.raises(ConfigError, match=rf"^train\.micro_batch_size: in phase 'b' \(which inherits it\): must divide "
                                          rf"batch_size \(6\), got 4 \(set in {re.escape(str(y))}, line 1\)$"):
        load_config(y)
    with pytest.raises(ConfigError, match=r"^phases\.b\.micro_batch_size: must divide batch_size \(6\), got 4 \(set "):
        load_config(y, ["train.micro_batch_size=null", "phases.b.micro_batch_size=4"])  # the phase's own: its key


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_min_lr_ratio_accepts_both_ends_of_its_range(ratio):
    """[0, 1]: 0 decays to zero, 1 keeps the peak lr after warmup (no decay)."""
    assert load_config(overrides=[f"optim.min_lr_ratio={ratio}"]).optim.min_lr_ratio == ratio


def test_micro_batch_size_null_means_the_whole_batch():
    from minilm.config import micro_batch_size

    assert micro_batch_size(load_config(overrides=["train.batch_size=8"]).train) == 8
    assert micro_batch_size(load_config(overrides=["train.batch_size=8", "train.micro_batch_size=2"]).train) == 2


def test_an_odd_head_size_is_refused_only_where_every_dimension_rotates_in_pairs():
    """d_model / n_heads odd was refused for every encoding ("must be even, got 3", without a reason): only RoPE and
    xPos rotating every dimension (fraction 1) need it even, in the run's block and in a phase's that sets fraction 1
    (a partial fraction rotates ⌊fraction · head_dim⌋ rounded down to even)."""
    odd = ["model.d_model=10", "model.n_heads=2"]
    assert load_config(overrides=[*odd, "model.position={name: alibi}"]).model.d_model == 10
    assert load_config(overrides=[*odd, "model.position={name: rope, fraction: 0.5}"]).model.position.fraction == 0.5
    for name in ("rope", "xpos"):
        with pytest.raises(ConfigError, match=rf"^model\.position\.fraction: 1 rotates every dimension of a head, "
                                              rf"and '{name}' rotates them in pairs .* model\.d_model / model\.n_heads "
                                              rf"must be even, got 5; give an even head width, or a fraction below 1"):
            load_config(overrides=[*odd, f"model.position={{name: {name}}}"])
    with pytest.raises(ConfigError, match=r"^phases\.long\.position\.fraction: 1 rotates every dimension .* got 5"):
        load_config(overrides=[*odd, "model.position={name: rope, fraction: 0.5}", "phases.short.steps=1",
                               "phases.long={steps: 1, position: {fraction: 1.0}}"])  # fmt: skip


@pytest.mark.parametrize("fraction", [0, 1])
def test_val_fraction_must_hold_out_some_documents_and_keep_some(fraction):
    with pytest.raises(ConfigError, match=r"data\.val_fraction: must be in \(0, 1\)"):
        load_config(overrides=[f"data.val_fraction={fraction}"])


def test_a_quoted_position_parameter_is_held_as_the_number_it_is_read_as(tmp_path):
    """``eps: "1e-2"`` passed validation as the float 0.01, but --print-config and the saved config.yaml kept the
    text '1e-2' (model.norm_eps: "1e-5", a schema key, was converted): the config now holds the number, in the run's
    block and a phase's; a quoted number the encoding does not read as one is refused, saying to drop the quotes."""
    (tmp_path / "q.yaml").write_text('model:\n  position: {name: fire, eps: "1e-2"}\n'
                                     'phases:\n  a: {steps: 1}\n'
                                     '  b: {steps: 1, position: {}}\n')
    cfg = load_config(tmp_path / "q.yaml")
    assert cfg.model.position.eps == 0.01 and isinstance(cfg.model.position.eps, float)
    assert "eps: 0.01" in OmegaConf.to_yaml(cfg)
    phased = load_config(overrides=["phases.a.steps=1", 'phases.b.position={base: "5e4"}'])
    assert phased.phases.b.position.base == 50000.0 and isinstance(phased.phases.b.position.base, float)
    (tmp_path / "b.yaml").write_text('model:\n  position: {name: alibi, max_bias: "8"}\n')
    with pytest.raises(ConfigError, match=r"model.position.max_bias: must be float, got the string '8'; write it "
                                          r"without quotes \(set in .*b\.yaml, line 2\)"):
        load_config(tmp_path / "b.yaml")
    # nan / inf (text to YAML 1.2, floats to a schema key: optim.lr=nan) are refused as not finite; they were told to
    # drop quotes they never had
    for text, got in (("nan", "nan"), ("-Infinity", "-inf"), ("inf", "inf")):
        with pytest.raises(ConfigError, match=rf"^model.position.base: must be a finite number, got {got} \(set on"):
            load_config(None, [f"model.position.base={text}"])


def test_a_value_a_later_block_replaced_is_not_named_as_where_the_bad_value_was_set(tmp_path):
    """A scaling block of another rope_type replaces the YAML's (its factor is not inherited): 'factor: required'
    said '(set in exp.yaml)', naming the file whose factor was dropped as if it had set the missing value. It says
    the value was dropped and which layer's block replaced it; the study's variants and train.py alike."""
    (tmp_path / "exp.yaml").write_text(
        "phases:\n  pretrain: {steps: 3}\n  extend:\n    steps: 3\n"
        "    position: {scaling: {rope_type: yarn, factor: 4.0, original_max_position_embeddings: 64}}\n")
    linear = "phases.extend.position.scaling={rope_type: linear}"
    dropped = r"\(the 4.0 set in .*exp\.yaml was dropped: the phases.extend.position.scaling given {} replaced"
    with pytest.raises(ConfigError, match=r"scaling.factor: required for rope_type 'linear' "
                                          + dropped.format("on the command line")) as e:
        load_config(tmp_path / "exp.yaml", [linear])
    assert "(set in" not in str(e.value)
    where = "study file s.yaml, variant 'pi'"
    with pytest.raises(ConfigError, match=dropped.format(re.escape(f"in {where}"))):
        load_config(tmp_path / "exp.yaml", [linear], where)
    # a value the final config holds is still named where it was set, a merged block's or a converted number's
    with pytest.raises(ConfigError, match=r"scaling.factor: must be >= 1, got 0.5 \(set on the command line\)$"):
        load_config(tmp_path / "exp.yaml", ["phases.extend.position.scaling.factor=0.5"])
    (tmp_path / "b.yaml").write_text("base: exp.yaml\nphases: {extend: {position: {scaling: {factor: 5e-1}}}}\n")
    with pytest.raises(ConfigError, match=r"scaling.factor: must be >= 1, got 0.5 \(set in .*b\.yaml, line 2\)$"):
        load_config(tmp_path / "b.yaml")


def test_a_study_file_given_as_a_config_says_what_runs_it():
    """train.py --config configs/studies/extension_tiny.yaml said "bad config key 'config'", not what the file is."""
    study = Path(__file__).resolve().parents[1] / "configs" / "studies" / "extension_tiny.yaml"
    with pytest.raises(ConfigError, match=r"extension_tiny\.yaml: a study file \(config:, variants:\), not a run "
                                          r"config: run it with python scripts/study.py .*extension_tiny\.yaml$"):
        load_config(study)


def test_an_empty_config_file_is_refused_and_an_empty_override_value_is_named(tmp_path):
    """An empty or comment-only YAML trained the schema's defaults (1000 steps into runs/run) without a word; a
    truncated or wrong file looks the same. '{}' still asks for the defaults. 'run.dir=' (an unset shell variable
    expanded to nothing) said only "Incompatible value 'None'", a None the user never typed."""
    for text in ("", "# only a comment\n\n"):
        (tmp_path / "e.yaml").write_text(text)
        with pytest.raises(ConfigError, match=r"e\.yaml: holds no config \(empty, or only comments\): a truncated"):
            load_config(tmp_path / "e.yaml")
    (tmp_path / "child.yaml").write_text("base: e.yaml\n")
    with pytest.raises(ConfigError, match=r"e\.yaml \(named by 'base:' in .*child\.yaml\): holds no config"):
        load_config(tmp_path / "child.yaml")
    (tmp_path / "e.yaml").write_text("{}\n")
    assert load_config(tmp_path / "e.yaml").train.steps == 1000
    with pytest.raises(ConfigError, match=r"bad config key 'run.dir': Incompatible value 'None' .* \('run.dir=' gives "
                                          r"no value after '=': an unset shell variable\? give the value\)$"):
        load_config(tmp_path / "e.yaml", ["run.dir="])


def test_a_required_key_no_layer_gives_names_the_block_that_lacks_it(tmp_path):
    """'original_max_position_embeddings: required' named no file: the key is in no layer, so there was no '(set in
    FILE)' to say, and a chain of base files left the user to search for the block. The block given without it is
    named, with its file and line, or the command line; a section above it (model, phases.P) never is."""
    (tmp_path / "a.yaml").write_text("model:\n  n_layers: 2\n  position:\n    name: rope\n"
                                     "    scaling: {rope_type: yarn, factor: 4.0}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ntrain: {steps: 3}\n")
    with pytest.raises(ConfigError, match=r"^model.position.scaling.original_max_position_embeddings: required for "
                                          r"rope_type 'yarn' \(the model.position.scaling block set in .*a\.yaml, "
                                          r"line 5 lacks it\)$"):
        load_config(tmp_path / "b.yaml")
    with pytest.raises(ConfigError, match=r"^eval.extension.window: required \(the eval.extension block set on the "
                                          r"command line lacks it\)$"):
        load_config(None, ["eval.extension={name: rerope}"])


@pytest.mark.parametrize("overrides", [["model.position.name=rope"], ["model.position={name: rope, base: 500.0}"], []])
def test_a_defaulted_key_no_layer_gives_is_not_said_to_be_lacking(tmp_path, overrides):
    """``model.d_model=6 model.n_heads=2 model.position.name=rope`` ended its error about RoPE's ``fraction`` (a
    default the user never set) with "(the model.position block set on the command line lacks it)", as if the block
    should have given it; the YAML's block was blamed the same way. A default is no block's omission."""
    (tmp_path / "a.yaml").write_text("model:\n  d_model: 6\n  n_heads: 2\n  position:\n    name: rope\n")
    with pytest.raises(ConfigError, match=r"^model\.position\.fraction: 1 rotates every dimension") as e:
        load_config(tmp_path / "a.yaml", overrides)
    assert "lacks it" not in str(e.value) and str(e.value).endswith("or an encoding without rotation")


def test_a_missing_original_length_names_the_length_the_unscaled_model_trained_at(tmp_path):
    """A staged extension's scaling block without original_max_position_embeddings said only that it is required;
    the value it means is the length the last phase before it trained at without scaling (both extensions of
    configs/rope_yarn.yaml give 256, the pretraining's), which the error now names. Without such a phase (the first
    phase scaled, or the run's own position scaled) it says no more."""
    (tmp_path / "exp.yaml").write_text(
        "train: {seq_len: 32}\nphases:\n  pre: {seq_len: 48, steps: 3}\n"
        "  mid: {seq_len: 96, steps: 3, position: {scaling: {rope_type: yarn, factor: 2.0,"
        " original_max_position_embeddings: 48}}}\n"
        "  long: {seq_len: 192, steps: 3, position: {scaling: {rope_type: ntk, factor: 4.0}}}\n")
    yarn = "phases.long.position.scaling={rope_type: yarn, factor: 4.0}"
    with pytest.raises(ConfigError, match=r"^phases\.long\.position\.scaling\.original_max_position_embeddings: "
                                          r"required for rope_type 'yarn'; to extend the model phase 'pre' trained "
                                          r"without scaling, give the length it trained at: "
                                          r"original_max_position_embeddings: 48 \(the phases.long.position.scaling "
                                          r"block set on the command line lacks it\)$"):  # fmt: skip
        load_config(tmp_path / "exp.yaml", [yarn])
    load_config(tmp_path / "exp.yaml", [yarn.replace("}", ", original_max_position_embeddings: 48}")])
    # rope_type default: no scaling
    with pytest.raises(ConfigError, match=r"phase 'pre' trained without scaling, .*: 48 \(the .*lacks it\)$"):
        load_config(tmp_path / "exp.yaml", ["phases.pre.position.scaling={rope_type: default}", yarn])
    first = "phases.pre.position.scaling={rope_type: yarn, factor: 2.0}"
    with pytest.raises(ConfigError, match=r"^phases\.pre\.position\.scaling\.original_max_position_embeddings: "
                                          r"required for rope_type 'yarn' \(the phases.pre.position.scaling block "
                                          r"set on the command line lacks it\)$"):  # fmt: skip
        load_config(tmp_path / "exp.yaml", [first])


def test_a_key_in_the_wrong_section_names_the_section_it_is_in(tmp_path):
    """OmegaConf suggests names within the key's own section only: train.seed=5 said "Key 'seed' not in
    'TrainConfig'" and nothing more, where the key is run.seed; in a YAML file as on the command line."""
    with pytest.raises(ConfigError, match=r"bad config key 'train.seed': .*; did you mean run.seed\?$"):
        load_config(None, ["train.seed=5"])
    (tmp_path / "exp.yaml").write_text("optim: {seq_len: 64}\n")
    with pytest.raises(ConfigError, match=r"exp.yaml, line 1: bad config key 'optim.seq_len': .*did you mean train.seq_len\?"):
        load_config(tmp_path / "exp.yaml")
    with pytest.raises(ConfigError, match=r"bad config key 'train.lrr': Key 'lrr' not in 'TrainConfig'$"):
        load_config(None, ["train.lrr=1"])  # a name no section has: no guess


def test_yaml_line_finds_a_dotted_key_in_block_and_flow_style(tmp_path):
    """The line an error about a file's value names (``yaml_line``): block and flow mappings, list items by index;
    None for a key the file does not hold, or a file that is not YAML."""
    from minilm.config import yaml_line

    y = tmp_path / "x.yaml"
    y.write_text("# a comment\nmodel:\n  n_layers: 2\n  position: {name: rope,\n    base: 5.0e5}\neval:\n"
                 "  lengths:\n    - 64\n    - 128\n")  # fmt: skip
    assert [yaml_line(y, k) for k in ("model", "model.n_layers", "model.position.base", "eval.lengths[1]")] == [
        2, 3, 5, 9]
    assert yaml_line(y, "model.d_model") is None and yaml_line(y, "eval.lengths[5]") is None
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    assert yaml_line(tmp_path / "bad.yaml", "a") is None


@pytest.mark.parametrize("seed, ok", [(2**63 - 1, True), (-(2**63), True), (2**63, False), (-(2**63) - 1, False),
                                      (99999999999999999999, False)])  # fmt: skip
def test_run_seed_must_fit_64_bits(seed, ok):
    """torch's generators take 64 bits (train.py trains at both ends); past them the model's init was a traceback."""
    if ok:
        load_config(None, [f"run.seed={seed}"])
        return
    with pytest.raises(ConfigError, match=r"run\.seed: must be a 64-bit integer, in \[-2\^63, 2\^63 - 1\], got"):
        load_config(None, [f"run.seed={seed}"])


def test_a_yaml_merge_key_merges_as_in_plain_yaml(tmp_path):
    """``<<: *anchor`` (phases sharing one block) is YAML that yaml.safe_load merges; the duplicate-key loader
    refused it: "not valid YAML: could not determine a constructor for the tag 'tag:yaml.org,2002:merge'". The
    mapping's own keys win over the merged ones; a key given twice among its own is still an error."""
    (tmp_path / "m.yaml").write_text(
        "train: &t {seq_len: 32, steps: 3}\n"
        "phases:\n  a: {<<: *t}\n  b:\n    <<: *t\n    steps: 5\n")
    cfg = load_config(tmp_path / "m.yaml")
    assert (cfg.train.steps, cfg.phases.a.seq_len, cfg.phases.a.steps, cfg.phases.b.steps) == (3, 32, 3, 5)
    (tmp_path / "dup.yaml").write_text("train: &t {steps: 3}\nphases:\n  a:\n    <<: *t\n    steps: 4\n    steps: 5\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'steps'"):
        load_config(tmp_path / "dup.yaml")


def test_run_steps_given_after_the_run_tokens_are_refused_not_ignored(tmp_path):
    """train.tokens wins over train.steps, so ``train.steps=5`` on a YAML that sets ``train.tokens`` trained the
    tokens' steps (10 here) without a word, where a phase giving both is refused. A steps given after the last layer
    giving the tokens is refused now, naming both layers; tokens given after steps (over a YAML's steps) win, and a
    layer that gives both, as a saved config.yaml does, loads as before."""
    y = tmp_path / "tok.yaml"
    y.write_text("train: {tokens: 20480, batch_size: 16, seq_len: 128}\n")
    with pytest.raises(ConfigError, match=r"^train\.steps: 5 \(set on the command line\) is not used: train\.tokens = "
                                          r"20480 \(set in .*tok\.yaml, line 1\).*train\.tokens=null"):
        load_config(y, ["train.steps=5"])
    (tmp_path / "child.yaml").write_text("base: tok.yaml\ntrain: {steps: 7}\n")
    with pytest.raises(ConfigError, match=r"^train\.steps: 7 \(set in .*child\.yaml, line 2\) is not used"):
        load_config(tmp_path / "child.yaml")
    assert phase_steps(load_config(overrides=["train.steps=5", "train.tokens=2048", "train.batch_size=16",
                                              "train.seq_len=128"])) == 1  # fmt: skip
    (tmp_path / "saved.yaml").write_text("train: {steps: 1000, tokens: 20480, batch_size: 16, seq_len: 128}\n")
    assert phase_steps(load_config(tmp_path / "saved.yaml")) == 10
    assert phase_steps(load_config(y)) == 10
    assert phase_steps(load_config(y, ["train.tokens=null", "train.steps=5"])) == 5
    assert phase_steps(load_config(REPO / "configs/tiny.yaml", ["train.tokens=20480"])) == 10  # over the YAML's 400


def test_a_nan_or_inf_value_s_error_names_the_layer_that_set_it(tmp_path):
    """``optim.lr=nan`` (or ``lr: .nan`` in a file) was refused without saying where it was set: the check that names
    the layer compared the value given with the loaded one, and nan != nan (the command line's 'nan' is text to YAML
    1.2, which the schema reads as the float)."""
    (tmp_path / "nan.yaml").write_text("optim:\n  lr: .nan\n")
    with pytest.raises(ConfigError, match=r"^optim\.lr: must be > 0 and finite, got nan \(set in .*nan\.yaml, line 2\)"):
        load_config(tmp_path / "nan.yaml")
    for value in ("nan", ".nan", "NaN"):
        with pytest.raises(ConfigError, match=r"^optim\.lr: .*got nan \(set on the command line\)$"):
            load_config(overrides=[f"optim.lr={value}"])
    with pytest.raises(ConfigError, match=r"^optim\.eps: .*got inf \(set on the command line\)$"):
        load_config(overrides=["optim.eps=Infinity"])


def test_a_vocab_size_sentencepiece_cannot_take_is_refused_at_load():
    """sentencepiece reads vocab_size as a 32-bit int: 3000000000 passed the config and stopped the preparation,
    after every source was read, with a ValueError traceback ('cannot parse "3000000000" as int')."""
    with pytest.raises(ConfigError, match=r"^data\.tokenizer\.vocab_size: must be <= 2147483647 .*got 3000000000"):
        load_config(overrides=["data.tokenizer.vocab_size=3000000000"])
    assert load_config(overrides=["data.tokenizer.vocab_size=70000"]).data.tokenizer.vocab_size == 70000



@pytest.mark.parametrize("value", ["''", "'  '"])
def test_an_empty_tokenizer_model_file_is_refused_not_read_as_null(value):
    """data.tokenizer.model_file '' (an unset environment variable in a script, say) trained a tokenizer on the
    corpus without a word, as null does, when a .model was asked for."""
    with pytest.raises(ConfigError, match=r"^data\.tokenizer\.model_file: must be the path of a sentencepiece \.model "
                                          r"or null \(train one on the corpus\), got "):  # fmt: skip
        load_config(overrides=[f"data.tokenizer.model_file={value}"])


def test_an_interpolation_that_points_nowhere_is_one_line_naming_the_key_and_where_it_was_set(tmp_path):
    """OmegaConf's message spanned four lines of its internals (reference_type=RunConfig, ...) and named no file; and
    a lookup that resolves skipped the layer holding the bad interpolation, so the file named was the base's."""
    (tmp_path / "a.yaml").write_text("run:\n  name: a\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nrun:\n  name: ${run.nam}\n")
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "b.yaml")
    assert str(e.value).startswith("run.name: '${run.nam}' cannot be resolved: Interpolation key 'run.nam' not found")
    assert f"(set in {tmp_path / 'b.yaml'}, line 3)" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^train\.steps: '\$\{oc\.env:MINILM_UNSET_X\}' cannot be resolved: .*"
                                          r"MINILM_UNSET_X.*\(set on the command line\)"):
        load_config(overrides=["train.steps=${oc.env:MINILM_UNSET_X}"])
    with pytest.raises(ConfigError, match=r"^config: cannot be resolved: .*eval\.lengths='\$\{train\.seq_len\}' on "
                                          r"the command line"):
        load_config(overrides=["eval.lengths=${train.seq_len}"])  # (a whole list: OmegaConf names no key)


def test_an_interpolation_inside_a_list_on_the_command_line_resolves_against_the_whole_config():
    """The check for 'kind:files' iterated the command line's list values, which resolved each item against the
    command line's layer alone: a traceback (InterpolationKeyError) for any item naming a key of the config."""
    cfg = load_config(overrides=["train.seq_len=96", 'eval.lengths=[64, "${train.seq_len}"]',
                                 'data.sources.x={kind: files, paths: ["${run.dir}/a.txt"]}'])  # fmt: skip
    assert list(cfg.eval.lengths) == [64, 96]
    assert list(cfg.data.sources.x.paths) == ["runs/run/a.txt"]
    with pytest.raises(ConfigError, match=r"^eval\.lengths\[1\]: '\$\{nope\}' cannot be resolved"):
        load_config(overrides=['eval.lengths=[64, "${nope}"]'])


@pytest.mark.parametrize("text, where, problem", [
    ("run:\n\tname: x\n", "line 2, column 1", "cannot start any token (while scanning for the next token); replace "
                                             "the tab with spaces"),
    ("train: {steps: 3, steps: 4}\n", "line 1, column 19", "found duplicate key 'steps' (first at line 1)"),
    ("optim:\n  lr: [1\n", "line 3, column 1", "expected ',' or ']'"),
])  # fmt: skip
def test_a_file_that_is_not_yaml_is_one_line_naming_its_line(tmp_path, text, where, problem):
    """PyYAML's report spans four or more lines and names the file '<unicode string>' (the text was read first):
    the error is one line, the file and the line and column of the problem first, a tab's fix with it."""
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "bad.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'bad.yaml'}, {where}: not valid YAML: ")
    assert problem in str(e.value)
    assert "\n" not in str(e.value) and "unicode string" not in str(e.value)


def test_a_float_with_a_leading_dot_and_an_unsigned_exponent_is_a_number_in_a_file_and_on_the_command_line(tmp_path):
    """.5e6 is a float to YAML 1.2 and Python; YAML 1.1 (PyYAML, OmegaConf's loader) wants a signed exponent after a
    leading dot and read the text '.5e6': a position parameter refused it ("got the string '.5e6'; write it without
    quotes", of a value never quoted), in a file and on the command line; a string key still keeps the text."""
    (tmp_path / "a.yaml").write_text("model:\n  position: {name: rope, base: .5e6}\n")
    assert load_config(tmp_path / "a.yaml").model.position.base == 5e5
    cfg = load_config(overrides=["model.position.base=.5e6", "run.name=.5e6"])
    assert (cfg.model.position.base, cfg.run.name) == (5e5, ".5e6")
    cfg = load_config(REPO / "configs/rope_yarn_tiny.yaml", ["phases.extend_512.position.scaling.factor=.4e1"])
    assert phase_config(cfg, "extend_512").model.position.scaling.factor == 4.0


def test_an_unquoted_interpolation_inside_a_list_override_is_told_to_be_quoted():
    """eval.lengths=[${train.seq_len}] said only "did not find expected ',' or ']'": YAML reads the { of ${...} inside
    brackets as a mapping. The message says to quote it, the form that works."""
    with pytest.raises(ConfigError) as err:
        load_config(str(REPO / "configs" / "tiny.yaml"), overrides=["eval.lengths=[${train.seq_len}]"])
    assert "quote an interpolation inside a list or mapping, eval.lengths=['${train.seq_len}', 512]" in str(err.value)
    cfg = load_config(str(REPO / "configs" / "tiny.yaml"), overrides=["eval.lengths=['${train.seq_len}', 512]"])
    assert list(cfg.eval.lengths) == [cfg.train.seq_len, 512]
    with pytest.raises(ConfigError) as err:  # a colon glued to its value keeps its own advice
        load_config(str(REPO / "configs" / "tiny.yaml"), overrides=["eval={lengths:[64}"])
    assert "quote an interpolation" not in str(err.value)
