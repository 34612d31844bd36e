"""Export to transformers: a Llama directory whose logits equal minilm's (fp32, 1e-4) at the training length and 4x
it, for every RoPE scaling transformers can express; a tokenizer that encodes as sentencepiece does; clear errors
for everything a Llama cannot express."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# (older ones are refused where their export would differ: test_an_older_transformers_is_refused_for_yarn_and_longrope)
transformers = pytest.importorskip("transformers", minversion="4.51.1")

from minilm.config import load_config, save_config  # noqa: E402
from minilm.errors import MinilmError  # noqa: E402
from minilm.export import _yarn_reads_truncate, check_exportable, export_model, max_logit_difference  # noqa: E402
from minilm.model import GPT  # noqa: E402
from minilm.positions.rope_scaling import ROPE_SCALING  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits
REPO = Path(__file__).resolve().parents[1]
V = 97
L = 32  # the "training length" of the tiny models; parity is checked at L and 4L
DH = 16  # head_dim = 64 / 4: 8 rotary frequencies


def tiny(*overrides, seed=0):
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2",
                                 f"train.seq_len={L}", *overrides])  # fmt: skip
    torch.manual_seed(seed)
    model = GPT(cfg.model, V)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # norms and all: every tensor off its initialization, so a swapped name shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval(), cfg


def scaling(block: str) -> str:
    return f"model.position.scaling={block}"


SHORT = [round(1.0 + 0.1 * i, 2) for i in range(DH // 2)]
LONG = [round(1.0 + 1.5 * i, 2) for i in range(DH // 2)]
CASES = {
    "default": [],
    "abf": ["model.position.base=500000.0"],
    "linear": [scaling("{rope_type: linear, factor: 4.0}")],
    "dynamic": [scaling(f"{{rope_type: dynamic, factor: 4.0, original_max_position_embeddings: {L}}}")],
    "yarn": [scaling(f"{{rope_type: yarn, factor: 4.0, original_max_position_embeddings: {L}}}")],
    "yarn_mscale": [scaling(f"{{rope_type: yarn, factor: 4.0, original_max_position_embeddings: {L}, mscale: 0.8,"
                            " mscale_all_dim: 0.5, beta_fast: 16.0, beta_slow: 2.0}")],  # fmt: skip
    "llama3": [scaling(f"{{rope_type: llama3, factor: 4.0, original_max_position_embeddings: {L},"
                       " low_freq_factor: 1.0, high_freq_factor: 4.0}")],  # fmt: skip
    # low_freq_factor / high_freq_factor left to minilm's defaults (Meta's 1 and 4): the export must write the same
    "llama3_defaults": [scaling(f"{{rope_type: llama3, factor: 4.0, original_max_position_embeddings: {L}}}")],
    "longrope": [scaling(f"{{rope_type: longrope, factor: 4.0, original_max_position_embeddings: {L},"
                         f" short_factor: {SHORT}, long_factor: {LONG}}}")],  # fmt: skip
    "ntk": [scaling("{rope_type: ntk, factor: 4.0}")],
    "ntk_by_parts": [scaling(f"{{rope_type: ntk_by_parts, factor: 4.0, original_max_position_embeddings: {L}}}")],
    "interleaved": ["model.position.layout=interleaved"],
    "interleaved_yarn": ["model.position.layout=interleaved",
                         scaling(f"{{rope_type: yarn, factor: 4.0, original_max_position_embeddings: {L}}}")],
    "mha_untied": ["model.n_kv_heads=4", "model.tie_embeddings=false", "model.norm_eps=1e-6"],
    # the optional keys of the scaling blocks, each copied to transformers' rope_parameters as it is
    "yarn_attention_factor": [scaling(f"{{rope_type: yarn, factor: 4.0, original_max_position_embeddings: {L},"
                                      " attention_factor: 1.3}")],  # fmt: skip
    "yarn_no_truncate": [scaling(f"{{rope_type: yarn, factor: 4.0, original_max_position_embeddings: {L},"
                                 " truncate: false}")],  # fmt: skip
    "ntk_by_parts_no_truncate": [scaling(f"{{rope_type: ntk_by_parts, factor: 4.0,"
                                         f" original_max_position_embeddings: {L}, truncate: false}}")],  # fmt: skip
    # no factor: the temperature is given, the context length is the training length
    "longrope_attention_factor": [scaling(f"{{rope_type: longrope, attention_factor: 1.2,"
                                          f" original_max_position_embeddings: {L}, short_factor: {SHORT},"
                                          f" long_factor: {LONG}}}")],  # fmt: skip
    # a factor whose target length original · factor is no integer (32 · 3.3 = 105.6): max_position_embeddings is
    # rounded to 106, and transformers must still take the factor itself from rope_parameters, not 106 / 32
    "yarn_fractional": [scaling(f"{{rope_type: yarn, factor: 3.3, original_max_position_embeddings: {L}}}")],
    "longrope_fractional": [scaling(f"{{rope_type: longrope, factor: 3.3, original_max_position_embeddings: {L},"
                                    f" short_factor: {SHORT}, long_factor: {LONG}}}")],  # fmt: skip
    "llama3_fractional": [scaling(f"{{rope_type: llama3, factor: 3.3, original_max_position_embeddings: {L}}}")],
    "linear_fractional": [scaling("{rope_type: linear, factor: 3.3}")],
    "dynamic_fractional": [scaling(f"{{rope_type: dynamic, factor: 3.3, original_max_position_embeddings: {L}}}")],
    "mqa_d_ff": ["model.n_kv_heads=1", "model.d_ff=100"],  # one kv head for all; a d_ff not from the default rule
}
ROPE_TYPE = {"linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "yarn_mscale": "yarn", "llama3": "llama3",
             "llama3_defaults": "llama3",
             "longrope": "longrope", "ntk": "ntk", "ntk_by_parts": "ntk_by_parts", "interleaved_yarn": "yarn",
             "yarn_attention_factor": "yarn", "yarn_no_truncate": "yarn", "ntk_by_parts_no_truncate": "ntk_by_parts",
             "longrope_attention_factor": "longrope", "yarn_fractional": "yarn", "longrope_fractional": "longrope",
             "llama3_fractional": "llama3", "linear_fractional": "linear", "dynamic_fractional": "dynamic"}


@pytest.mark.parametrize("case", list(CASES))
def test_logit_parity(case, tmp_path):
    rope_type = ROPE_TYPE.get(case)
    if rope_type is not None and rope_type not in ROPE_SCALING:
        pytest.skip(f"rope_type {rope_type!r} is not in minilm.positions.rope_scaling yet")
    if case.endswith("no_truncate") and not _yarn_reads_truncate():  # refused there (a test below)
        pytest.skip(f"transformers {transformers.__version__}'s yarn does not read truncate")
    model, cfg = tiny(*CASES[case])
    export_model(model, cfg, None, tmp_path)
    diffs = max_logit_difference(model, tmp_path, [L, 4 * L])  # ascending (transformers' dynamic RoPE keeps state)
    assert max(diffs.values()) < 1e-4, diffs


def test_config_form_matches_installed_transformers(tmp_path):
    model, cfg = tiny(*CASES["yarn"])
    export_model(model, cfg, None, tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == "llama" and config.hidden_act == "silu"
    assert (config.head_dim, config.num_key_value_heads, config.intermediate_size) == (DH, 2, 192)
    assert config.rms_norm_eps == 1e-5 and config.tie_word_embeddings
    rope = getattr(config, "rope_parameters", None) or {**config.rope_scaling, "rope_theta": config.rope_theta}
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0 and rope["rope_theta"] == 10000.0
    assert rope["original_max_position_embeddings"] == L
    assert config.max_position_embeddings == 4 * L  # the target length: original · factor


@pytest.mark.parametrize("tied", [True, False])
def test_config_and_tensors_of_a_plain_export(tied, tmp_path):
    """Without a scaling the context length is the training length; a tied LM head is not written twice (the config
    ties it), an untied one is; the tokenizer's BOS, EOS and pad ids are the config's."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from safetensors import safe_open

    from minilm.export import hf_config

    model, cfg = tiny(f"model.tie_embeddings={str(tied).lower()}")
    export_model(model, cfg, None, tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert config.max_position_embeddings == L and config.tie_word_embeddings == tied
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert ("lm_head.weight" in f.keys()) == (not tied)
    origin = json.loads((tmp_path / "minilm_export.json").read_text())  # the position block it came from
    assert origin == {"position": OmegaConf.to_container(cfg.model.position, resolve=True), "train_seq_len": L}
    ids = hf_config(cfg, V, SimpleNamespace(bos_id=1, eos_id=2, pad_id=3))
    assert (ids.bos_token_id, ids.eos_token_id, ids.pad_token_id) == (1, 2, 3)


def test_integer_and_null_scaling_values_are_written_as_transformers_reads_them(tmp_path):
    """A scaling block written by hand may hold integers (factor: 4) and nulls (a key left to its default): the
    config gets floats, as transformers' checks expect, and no null keys; the logits still match."""
    block = f"{{rope_type: yarn, factor: 4, original_max_position_embeddings: {L}, beta_fast: 32, mscale: null}}"
    model, cfg = tiny(scaling(block))
    export_model(model, cfg, None, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    rope = config.get("rope_parameters") or config["rope_scaling"]
    assert type(rope["factor"]) is float and type(rope["beta_fast"]) is float and "mscale" not in rope
    assert max(max_logit_difference(model, tmp_path, [L, 4 * L]).values()) < 1e-4


def test_dynamic_sets_the_original_length_once(tmp_path):
    """transformers' dynamic NTK reads the original length from max_position_embeddings; the key minilm names it by
    is not one of its dynamic keys ("Unrecognized keys in rope_parameters" at every load), so it is not written."""
    model, cfg = tiny(*CASES["dynamic"])
    export_model(model, cfg, None, tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    rope = getattr(config, "rope_parameters", None) or config.rope_scaling
    assert config.max_position_embeddings == L and rope["factor"] == 4.0
    assert "original_max_position_embeddings" not in rope


def test_greedy_generation_matches_transformers(tmp_path):
    from minilm.model.generate import generate

    model, cfg = tiny()
    export_model(model, cfg, None, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()  # (4.x: torch_dtype)
    prompt = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(3))
    ours = generate(model, prompt, 20, greedy=True)  # with minilm's KV cache
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                         pad_token_id=0, eos_token_id=None)  # fmt: skip
    assert torch.equal(ours, theirs)



@pytest.mark.parametrize("case", ["yarn", "llama3", "ntk_by_parts", "interleaved_yarn", "dynamic", "longrope"])
def test_greedy_generation_beyond_the_original_length_matches_transformers(case, tmp_path):
    """scripts/generate.py's greedy text is the exported model's generate() past original_max_position_embeddings
    (8 + 60 tokens, original 32). With the KV cache for the static types; for the length-dependent ones (dynamic,
    longrope) the two caches differ by design (transformers keeps keys rotated at their own step's length, minilm
    re-rotates them at the current one: docs/export.md), so there the cache-free decodings are compared."""
    from minilm.model.generate import generate

    model, cfg = tiny(*CASES[case])
    export_model(model, cfg, None, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()  # (4.x: torch_dtype)
    prompt = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(3))
    cached = case not in ("dynamic", "longrope")
    ours = generate(model, prompt, 60, greedy=True, use_cache=cached)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=60, min_new_tokens=60,
                         do_sample=False, pad_token_id=0, eos_token_id=None, use_cache=cached)  # fmt: skip
    assert torch.equal(ours, theirs)

REFUSED = {
    "alibi": (["model.position.name=alibi"], "alibi"),
    "t5": (["model.position.name=t5"], "'t5'"),
    "cope": (["model.position.name=cope"], "cope"),
    "xpos": (["model.position.name=xpos"], "xpos"),
    "gelu": (["model.mlp=gelu"], "model.mlp"),
    "partial": (["model.position.fraction=0.5"], "partial rotary"),
    "nope_layers": (["model.position.nope_every=2"], "nope_every"),
    "partial_scaling": ([scaling("{rope_type: linear, factor: 2.0, partial_rotary_factor: 0.5}")],
                        "model.position.scaling.partial_rotary_factor: 0.5 — partial rotary"),
    "dynamic_yarn": ([scaling(f"{{rope_type: dynamic_yarn, original_max_position_embeddings: {L}}}")], "dynamic_yarn"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refuses_what_llama_cannot_express(case, tmp_path):
    overrides, needle = REFUSED[case]
    if case == "dynamic_yarn" and "dynamic_yarn" not in ROPE_SCALING:
        pytest.skip("dynamic_yarn not in minilm.positions.rope_scaling")
    model, cfg = tiny(*overrides)
    with pytest.raises(MinilmError, match="cannot export") as err:
        export_model(model, cfg, None, tmp_path)
    assert needle in str(err.value)
    # and what can be exported instead: the refusal named only what cannot
    assert "exportable: model.position.name: rope (layout half or interleaved" in str(err.value)
    assert "rope_type default, linear, dynamic, yarn, llama3, longrope, ntk, ntk_by_parts" in str(err.value)
    assert "or none (partial_rotary_factor 1), and model.mlp: swiglu" in str(err.value)
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("target", ["file", "under_file"])
def test_output_path_that_is_a_file_is_a_clear_error(target, tmp_path):
    """An output path naming an existing file (or a path through one) is bad input: MinilmError naming the path."""
    model, cfg = tiny()
    blocker = tmp_path / "taken"
    blocker.write_text("not a directory")
    out = blocker if target == "file" else blocker / "hf"
    with pytest.raises(MinilmError, match="cannot create the export directory") as err:
        export_model(model, cfg, None, out)
    assert str(out) in str(err.value)


@pytest.mark.parametrize("kind", ["run_dir", "phase_dir", "foreign_model"])
def test_refuses_to_overwrite_a_run_or_another_model(kind, tmp_path):
    """Exporting into a run or phase directory replaced its model.safetensors with Llama-named tensors, so the run
    no longer loaded; a directory holding some other model.safetensors is not an earlier export to replace either."""
    model, cfg = tiny()
    out = tmp_path / kind
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the run's weights")
    if kind != "foreign_model":
        (out / ("config.yaml" if kind == "run_dir" else "complete.json")).write_text("{}")
    says = "holds a model.safetensors that is not a minilm export" if kind == "foreign_model" else "is a minilm run or"
    with pytest.raises(MinilmError, match="give another directory") as err:
        export_model(model, cfg, None, out)
    assert str(out) in str(err.value) and says in str(err.value)
    assert (out / "model.safetensors").read_bytes() == b"the run's weights"
    assert not (out / "config.json").exists()


def test_the_export_script_refuses_its_output_folder_before_it_loads_the_run(tmp_path, capsys, monkeypatch):
    """scripts/export_hf.py loaded the run (its weights, its model) and only then was the output folder refused: the
    user waited for the load to be told to give another folder. The folder is checked first."""
    import minilm.runs
    from minilm.cli import run_cli
    from tests.conftest import load_script

    monkeypatch.setattr(minilm.runs, "load_run", lambda *a, **k: pytest.fail("the run was loaded first"))
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("{}")
    script = load_script("scripts/export_hf.py")
    assert run_cli(script.main, script.parser(), [str(tmp_path / "some_run"), str(out)]) == 2
    assert "is a minilm run or phase directory" in capsys.readouterr().err


def test_the_export_script_refuses_an_out_dir_with_an_unexpanded_tilde(tmp_path, capsys, monkeypatch):
    """export_hf.py RUN '~/hf' (quoted: no shell expands it) exported into a folder called '~' in the working
    directory and said 'exported ... -> ~/hf', as if in the home directory."""
    import minilm.runs
    from minilm.cli import run_cli
    from tests.conftest import load_script

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(minilm.runs, "load_run", lambda *a, **k: pytest.fail("the run was loaded first"))
    script = load_script("scripts/export_hf.py")
    assert run_cli(script.main, script.parser(), [str(tmp_path / "some_run"), "~/hf"]) == 2
    err = capsys.readouterr().err
    assert "error: OUT_DIR '~/hf': '~' is not expanded" in err and err.strip().endswith("e.g. $HOME/hf")
    assert not (tmp_path / "~").exists()


def test_refuses_a_folder_with_other_files_but_takes_an_empty_one(tmp_path):
    """An existing folder that is no run and holds no model.safetensors (a phase's eval/, a folder of the user's)
    was written into, the export's files mixed with what it held. An empty folder, or one holding only the staging
    directory of an export killed there (deleted by the next one), is a new output."""
    model, cfg = tiny()
    out = tmp_path / "eval"
    out.mkdir()
    (out / "results.json").write_text("{}")
    with pytest.raises(MinilmError, match=r"eval: is not empty \(results.json\) and holds no earlier export "
                                          r"\(no minilm_export.json\).*give a new or empty directory"):  # fmt: skip
        export_model(model, cfg, None, out)
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    (out / "results.json").unlink()
    (out / ".export-999999999-x.tmp").mkdir()  # (no such pid: a killed export's)
    export_model(model, cfg, None, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "minilm_export.json", "model.safetensors"]


def test_reexport_replaces_an_earlier_export(tmp_path):
    model, cfg = tiny()
    export_model(model, cfg, None, tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")  # an earlier export's tokenizer: this one has none
    other, other_cfg = tiny("model.position.base=500000.0", seed=1)
    export_model(other, other_cfg, None, tmp_path)
    assert max(max_logit_difference(other, tmp_path, [L]).values()) < 1e-4  # the new model, base and all
    assert not (tmp_path / "tokenizer.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "minilm_export.json", "model.safetensors"]


@pytest.mark.parametrize("failure", ["verify", "interrupt"])
def test_failed_export_leaves_the_earlier_one(failure, tmp_path, monkeypatch):
    """A re-export that fails its check or is interrupted (Ctrl-C while writing) leaves the earlier export whole:
    before, config.json was already replaced (and the weights half-written) when it stopped."""
    import minilm.export

    model, cfg = tiny()
    export_model(model, cfg, None, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    other, other_cfg = tiny("model.position.base=500000.0", seed=1)

    def fail(*args):
        raise KeyboardInterrupt if failure == "interrupt" else MinilmError("logits differ")

    if failure == "interrupt":  # after config.json is written, before the weights are
        monkeypatch.setattr(minilm.export, "hf_state_dict", fail)
        with pytest.raises(KeyboardInterrupt):
            export_model(other, other_cfg, None, tmp_path)
    else:
        with pytest.raises(MinilmError):
            export_model(other, other_cfg, None, tmp_path, verify=fail)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no staging directory left either


def test_the_marker_is_moved_into_place_last(tmp_path, monkeypatch):
    """minilm_export.json marks a whole export: every other file is in place before it is, so an export interrupted
    while moving its files never leaves a marker beside a mix of old and new files."""
    import minilm.export

    moved, real_replace = [], os.replace

    def replace(src, dst):
        moved.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(minilm.export.os, "replace", replace)
    model, cfg = tiny()
    export_model(model, cfg, None, tmp_path)
    assert moved[-1] == "minilm_export.json" and sorted(moved) == ["config.json", "minilm_export.json",
                                                                  "model.safetensors"]


def test_a_killed_exports_staging_directory_is_removed_by_the_next(tmp_path):
    """kill -9 during an export leaves its staging directory (a whole model.safetensors) in the output; nothing read
    or deleted it, so each killed export cost a model's size of disk for good. The next export removes it, and keeps
    one of a live process (another export into the same directory)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".export-{dead.pid}-abc123.tmp"
    live = tmp_path / f".export-{os.getpid()}-def456.tmp"
    for d in (stale, live):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 1000)
    model, cfg = tiny()
    export_model(model, cfg, None, tmp_path)
    assert not stale.exists() and (live / "model.safetensors").is_file()
    assert (tmp_path / "model.safetensors").is_file()


def test_a_staging_directory_of_another_user_s_live_process_is_kept(tmp_path, monkeypatch):
    """A process that signal 0 may not reach (PermissionError) is alive: its export is not deleted under it, and
    this export goes on."""
    import minilm.export

    theirs = tmp_path / ".export-1-abc123.tmp"
    theirs.mkdir()

    def kill(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(minilm.export.os, "kill", kill)
    model, cfg = tiny()
    export_model(model, cfg, None, tmp_path)
    assert theirs.is_dir() and (tmp_path / "minilm_export.json").is_file()


def test_failed_first_export_leaves_no_directory(tmp_path):
    model, cfg = tiny()

    def fail(staged):
        assert (staged / "config.json").is_file() and (staged / "model.safetensors").is_file()
        raise MinilmError("logits differ")

    with pytest.raises(MinilmError):
        export_model(model, cfg, None, tmp_path / "new" / "hf", verify=fail)
    # the parents it created for the output go too (they were left behind, empty), never one that existed
    assert not (tmp_path / "new").exists() and tmp_path.is_dir()
    (tmp_path / "old").mkdir()
    with pytest.raises(MinilmError):
        export_model(model, cfg, None, tmp_path / "old" / "a" / "b" / "hf", verify=fail)
    assert (tmp_path / "old").is_dir() and not list((tmp_path / "old").iterdir())


def test_an_export_that_cannot_create_its_directory_leaves_the_parents_it_made(tmp_path, monkeypatch):
    """The staging directory could not be made (here: mkdtemp fails as on a full disk): the error names the output,
    and the parents created for it are removed as after any failed export."""
    import minilm.export

    def no_space(**kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(minilm.export.tempfile, "mkdtemp", no_space)
    model, cfg = tiny()
    with pytest.raises(MinilmError, match="cannot create the export directory"):
        export_model(model, cfg, None, tmp_path / "new" / "hf")
    assert not (tmp_path / "new").exists()


def test_refuses_installed_training_free_method(tmp_path):
    pytest.importorskip("minilm.positions.training_free")
    from minilm.positions.training_free import install_extension

    model, cfg = tiny()
    install_extension(model, "rerope", window=8)
    with pytest.raises(MinilmError, match="ReRope"):
        check_exportable(cfg.model, model)


# ------------------------------------------------------------------------------------------------ tokenizer

TEXTS = [
    "def f(x):\n    return x  + 12345\n\n\n",
    "   leading and trailing spaces   ",
    "tabs\tand\r\nwindows lines, ünïcödé ∑ and 😀 emoji",
    "literal </s> and <s> stay text",
    "runs  of   spaces    before words, and text  ,  that 's not cleaned up . ",  # both as sentencepiece does
    "a   x     function   plus  y",  # a run of spaces stays whole with the next word: '▁▁▁x', not '▁▁' + '▁x'
    "",
]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_tokenizer_encodes_like_sentencepiece(kind, tiny_text_dir, tmp_path):
    from minilm.data.tokenizer import train_tokenizer
    from minilm.export import hf_tokenizer

    docs = [p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))]
    tok_cfg = load_config(overrides=[f"data.tokenizer.type={kind}", "data.tokenizer.vocab_size=400"]).data.tokenizer
    ours = train_tokenizer(docs, tmp_path / "tok.model", tok_cfg)
    hf_tokenizer(ours.model_file).save_pretrained(tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS + docs[:5]:
        if kind == "unigram" and "</s>" in text:
            continue  # tokenizers' Unigram lattice matches control pieces' text (docstring of minilm/export.py)
        ids = ours.encode(text)
        assert theirs.encode(text, add_special_tokens=False) == ids, text
        assert theirs.decode(ids) == text
    assert (theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id) == (ours.eos_id, ours.bos_id, ours.pad_id)


def test_a_sentencepiece_setting_without_a_tokenizers_form_is_refused(tiny_text_dir, tmp_path):
    """A foreign .model with a dummy prefix (sentencepiece's default, which minilm turns off) would encode every text
    with a leading ▁ there and not here: refused by name rather than exported unequal."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    from minilm.data.tokenizer import train_tokenizer
    from minilm.export import hf_tokenizer

    docs = [p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))]
    tok_cfg = load_config(overrides=["data.tokenizer.vocab_size=400"]).data.tokenizer
    ours = train_tokenizer(docs, tmp_path / "tok.model", tok_cfg)
    proto = pb.ModelProto()
    proto.ParseFromString(Path(ours.model_file).read_bytes())
    proto.normalizer_spec.add_dummy_prefix = True
    (tmp_path / "foreign.model").write_bytes(proto.SerializeToString())
    with pytest.raises(MinilmError, match="foreign.model: sentencepiece settings without an exact tokenizers form: "
                                          "add_dummy_prefix"):  # fmt: skip
        hf_tokenizer(tmp_path / "foreign.model")


class _Extractor4x:
    """transformers 4.x's SentencePieceExtractor (convert_slow_tokenizer): extract() returns (vocab, merges)."""

    def __init__(self, model: str):
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=model)

    def extract(self, vocab_scores=None):
        try:
            from transformers.tokenization_utils_base import generate_merges
        except ImportError:  # run under a real 4.x
            from transformers.convert_slow_tokenizer import generate_merges

        vocab = {self.sp.id_to_piece(i): i for i in range(self.sp.GetPieceSize())}
        return vocab, generate_merges(vocab, vocab_scores)


def test_transformers_4_tokenizer_export(tiny_text_dir, tmp_path, monkeypatch):
    """The hf extra allows transformers >= 4.51, whose extractor lives in convert_slow_tokenizer and returns two
    values: export stopped with ModuleNotFoundError (a traceback) there. It now exports what sentencepiece encodes."""
    import importlib

    from minilm.data.tokenizer import train_tokenizer
    from minilm.export import hf_tokenizer

    docs = [p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))]
    ours = train_tokenizer(docs, tmp_path / "tok.model", load_config(overrides=["data.tokenizer.vocab_size=400"])
                           .data.tokenizer)  # fmt: skip
    monkeypatch.setitem(sys.modules, "transformers.tokenization_utils_sentencepiece", None)  # 4.x: no such module
    monkeypatch.setattr(importlib.import_module("transformers.convert_slow_tokenizer"), "SentencePieceExtractor",
                        _Extractor4x)  # fmt: skip
    theirs = hf_tokenizer(ours.model_file)
    for text in TEXTS + docs[:3]:
        assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text


def test_a_transformers_whose_yarn_ignores_truncate_is_refused_naming_the_version(tmp_path, monkeypatch):
    """transformers before gpt-oss (4.54 and older, which the hf extra allows) ignores yarn's ``truncate``: a
    ``truncate: false`` model exported with rounded ramp ends, logits off by ~0.1, which the export's check reported
    as a bare logit difference (and --no-verify not at all). Refused, naming the key and the version it needs."""
    import importlib

    rope_utils = importlib.import_module("transformers.modeling_rope_utils")
    yarn = rope_utils.ROPE_INIT_FUNCTIONS["yarn"]

    def yarn_without_truncate(config, *args, **kwargs):  # an older transformers: the key is not read
        saved = {a: getattr(config, a, None) for a in ("rope_parameters", "rope_scaling")}
        for a, block in saved.items():
            if isinstance(block, dict):
                setattr(config, a, {k: v for k, v in block.items() if k != "truncate"})
        try:
            return yarn(config, *args, **kwargs)
        finally:
            for a, block in saved.items():
                if isinstance(block, dict):
                    setattr(config, a, block)

    monkeypatch.setitem(rope_utils.ROPE_INIT_FUNCTIONS, "yarn", yarn_without_truncate)
    for case in ("yarn_no_truncate", "ntk_by_parts_no_truncate"):
        model, cfg = tiny(*CASES[case])
        with pytest.raises(MinilmError, match=r"^model\.position\.scaling\.truncate: false is not read by the "
                                              r"installed transformers .*transformers>=4\.57\.6"):  # fmt: skip
            export_model(model, cfg, None, tmp_path / case)
    model, cfg = tiny(*CASES["yarn"])  # truncate: true (the default) is what such a transformers does
    export_model(model, cfg, None, tmp_path / "yarn")
    assert max(max_logit_difference(model, tmp_path / "yarn", [L, 4 * L]).values()) < 1e-4


@pytest.mark.parametrize("case", ["yarn", "ntk_by_parts", "longrope"])
def test_an_older_transformers_is_refused_for_yarn_and_longrope(case, tmp_path, monkeypatch):
    """transformers 4.45.2 to 4.50.3 (the hf extra allowed >= 4.45) take yarn's and longrope's original length from
    max_position_embeddings: their exports of these scalings loaded, and their logits differed by 0.06 to 0.33."""
    model, cfg = tiny(*CASES[case])
    import importlib  # (the module now in sys.modules: transformers replaces its lazy one once models are loaded)

    monkeypatch.setattr(importlib.import_module("transformers"), "__version__", "4.50.3")
    with pytest.raises(MinilmError, match=rf"^model\.position\.scaling: rope_type {case} needs transformers "
                                          r"4\.51 or later to export; the installed 4\.50\.3 "):  # fmt: skip
        export_model(model, cfg, None, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    export_model(*tiny(*CASES["llama3"]), None, tmp_path / "llama3")  # which those versions export as minilm has it


def test_transformers_4_config_names_the_longrope_original_length(monkeypatch):
    """transformers 4.x's longrope reads original_max_position_embeddings from the config itself, not rope_scaling;
    without it, it took max_position_embeddings (original · factor) as the original length: the short factors up to
    4x the real original length and another temperature (logits off by 0.2 on the parity case)."""
    import importlib

    from minilm.export import llama_rope_kwargs

    class LlamaConfig4x:  # no rope_parameters: 4.x's form, rope_theta + rope_scaling
        pass

    # the module now in sys.modules: transformers replaces its lazy module there once models are loaded
    monkeypatch.setattr(importlib.import_module("transformers"), "LlamaConfig", LlamaConfig4x)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": L,
            "short_factor": SHORT, "long_factor": LONG}  # fmt: skip
    kwargs = llama_rope_kwargs(rope)
    assert kwargs["rope_theta"] == 10000.0 and kwargs["rope_scaling"]["type"] == "longrope"
    assert kwargs["original_max_position_embeddings"] == L
    assert "original_max_position_embeddings" not in llama_rope_kwargs({"rope_type": "default", "rope_theta": 1.0})


def test_a_longrope_export_writes_the_temperature_the_model_uses():
    """The export writes longrope's attention_factor as minilm computes it: transformers 4.x takes its factor from
    max_position_embeddings / original_max_position_embeddings, and at a factor whose target length is no integer
    (32 · 3.3 = 105.6, written as 106) that is another factor (3.3125) and another temperature."""
    from minilm.export import hf_rope_parameters
    from minilm.positions.rope_scaling import compute_rope

    block = {"rope_type": "longrope", "factor": 3.3, "original_max_position_embeddings": L, "short_factor": SHORT,
             "long_factor": LONG}  # fmt: skip
    rope, max_pos = hf_rope_parameters({"name": "rope", "base": 10000.0, "scaling": block}, DH)
    _, ours = compute_rope(DH, 10000.0, block)
    assert max_pos == 106 and rope["attention_factor"] == ours
    assert abs(math.sqrt(1 + math.log(max_pos / L) / math.log(L)) - ours) > 1e-4  # what 4.x computed instead
    given = {**block, "attention_factor": 1.2}  # one given is kept
    assert hf_rope_parameters({"name": "rope", "base": 10000.0, "scaling": given}, DH)[0]["attention_factor"] == 1.2


@pytest.mark.slow  # two subprocesses that each import transformers (~15 s of CPU apiece)
def test_export_script_on_a_run_dir(tiny_text_dir, tmp_path):
    """scripts/export_hf.py on a run directory (config.yaml + tokenizer.model + model.safetensors)."""
    from minilm.data.tokenizer import train_tokenizer
    from minilm.training.checkpoint import save_weights

    run = tmp_path / "run"
    tok = train_tokenizer([p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))], run / "tokenizer.model",
                          load_config(overrides=["data.tokenizer.vocab_size=300"]).data.tokenizer)  # fmt: skip
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", f"train.seq_len={L}",
                                 f"run.dir={run}"])  # fmt: skip
    save_config(cfg, run / "config.yaml")
    torch.manual_seed(0)
    save_weights(GPT(cfg.model, tok.vocab_size), run / "model.safetensors")
    out = tmp_path / "hf"
    proc = export_script(run, out)
    assert proc.returncode == 0, proc.stderr
    assert "max |logit difference|" in proc.stdout
    written = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= written
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    assert loaded.encode("def f(x):\n", add_special_tokens=False) == tok.encode("def f(x):\n")

    # refused: a non-RoPE run gives one line on stderr and exit code 2
    cfg2 = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2",
                                  "model.position.name=alibi"])  # fmt: skip
    save_config(cfg2, run / "config.yaml")
    save_weights(GPT(cfg2.model, tok.vocab_size), run / "model.safetensors")
    proc = export_script(run, tmp_path / "hf2")
    assert proc.returncode == 2 and "alibi" in proc.stderr and "Traceback" not in proc.stderr


def test_generate_without_a_prompt_starts_from_the_token_documents_follow(tiny_text_dir, tmp_path):
    """minilm's data has EOS after every document and no BOS: transformers' generate() without input_ids started
    from config.json's bos_token_id, an embedding no step trained, where scripts/generate.py's empty prompt starts
    from EOS. generation_config.json now starts there; config.json keeps the tokenizer's BOS."""
    from minilm.data.tokenizer import train_tokenizer

    tok = train_tokenizer([p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))], tmp_path / "tok.model",
                          load_config(overrides=["data.tokenizer.vocab_size=300"]).data.tokenizer)  # fmt: skip
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", f"train.seq_len={L}"])
    torch.manual_seed(0)
    export_model(GPT(cfg.model, tok.vocab_size), cfg, tok, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    assert hf.config.bos_token_id == tok.bos_id != tok.eos_id
    out = hf.generate(max_new_tokens=3, do_sample=False)
    assert out[0, 0].item() == tok.eos_id


def export_script(run: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, str(REPO / "scripts" / "export_hf.py"), str(run), str(out)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


def test_a_model_file_without_bos_or_pad_exports_ids_transformers_accepts(tiny_text_dir, tmp_path):
    """A data.tokenizer.model_file may have no BOS and no pad piece (sentencepiece's pad_id -1 is its default). The
    export wrote bos_token_id -1 into config.json (transformers warns it is out of the vocabulary), and its pad token
    id was EOS (minilm pads with EOS then) while the tokenizer had no pad token: padding a batch with the exported
    tokenizer failed. Absent BOS is null in both; pad is EOS in both."""
    import sentencepiece as spm

    from minilm.data import Tokenizer
    from minilm.export import hf_config, hf_tokenizer

    text = "".join(p.read_text() for p in sorted(tiny_text_dir.glob("*.py")))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_prefix=str(tmp_path / "own"), vocab_size=300, bos_id=-1,
        pad_id=-1, unk_id=0, eos_id=1, byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=False,
        minloglevel=2,
    )
    tok = Tokenizer(tmp_path / "own.model")
    config = hf_config(load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2"]), 300, tok)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (None, 1, 1)
    theirs = hf_tokenizer(tok.model_file)
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (None, 1, 1)
    assert theirs(["def f", "x = 1 + 2"], padding=True)["input_ids"][0][-1] == 1


def test_a_model_file_of_another_sentencepiece_type_is_refused_by_its_name(tiny_text_dir, tmp_path):
    """A word or char model (a data.tokenizer.model_file trains with one) was refused as 'model type 3'."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    from minilm.data.tokenizer import train_tokenizer
    from minilm.export import hf_tokenizer

    docs = [p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))]
    ours = train_tokenizer(docs, tmp_path / "tok.model", load_config(overrides=["data.tokenizer.vocab_size=300"])
                           .data.tokenizer)  # fmt: skip
    proto = pb.ModelProto()
    proto.ParseFromString(Path(ours.model_file).read_bytes())
    proto.trainer_spec.model_type = pb.TrainerSpec.WORD
    (tmp_path / "word.model").write_bytes(proto.SerializeToString())
    with pytest.raises(MinilmError, match=r"word\.model: sentencepiece model type 'word' is not exportable "
                                          r"\(bpe, unigram\)"):  # fmt: skip
        hf_tokenizer(tmp_path / "word.model")


def test_an_unfinished_run_is_refused_naming_its_newest_finished_phase(tiny_text_dir, tmp_path, capsys):
    """A run directory whose last phase has not finished has no final weights: the export took its newest finished
    phase's (the pretraining, without the extension's RoPE scaling) and wrote it under the run's name without a word.
    It is refused, naming that phase for --phase; a phase asked for by name or by its directory is exported."""
    from minilm.cli import run_cli
    from minilm.data.tokenizer import train_tokenizer
    from minilm.export import export_run
    from minilm.training.checkpoint import save_weights
    from tests.conftest import load_script

    run = tmp_path / "run"
    tok = train_tokenizer([p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))], run / "tokenizer.model",
                          load_config(overrides=["data.tokenizer.vocab_size=300"]).data.tokenizer)  # fmt: skip
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", f"run.dir={run}",
                                 f"phases={{pretrain: {{steps: 3}}, extend: {{steps: 3, seq_len: {2 * L}}}}}"])
    save_config(cfg, run / "config.yaml")
    save_weights(GPT(cfg.model, tok.vocab_size), run / "pretrain" / "model.safetensors")
    (run / "pretrain" / "complete.json").write_text("{}")  # 'pretrain' has finished, 'extend' has not
    out = tmp_path / "hf"
    script = load_script("scripts/export_hf.py")
    assert run_cli(script.main, script.parser(), [str(run), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run} has not finished (extend to come), so it has no final weights to export; "
                          "give --phase pretrain to export its newest finished phase, or finish the run with: ")
    assert err.count("\n") == 1 and not out.exists()
    with pytest.raises(MinilmError, match="has not finished"):
        export_run(run, out)
    assert not out.exists()
    for path, phase in ((run, "pretrain"), (run / "pretrain", None)):  # a phase asked for: exported
        assert export_run(path, out, phase=phase) == out
        assert json.loads((out / "minilm_export.json").read_text())["train_seq_len"] == cfg.train.seq_len


def test_the_unknown_piece_decodes_as_sentencepiece_does(tiny_text_dir, tmp_path):
    """A tokenizer without byte_fallback (data.tokenizer.byte_fallback: false) encodes an unknown character as <unk>,
    which sentencepiece (minilm's decode, generate.py) shows as ' ⁇ '; the export decoded it to '<unk>'."""
    from minilm.data.tokenizer import UNK_ID, train_tokenizer
    from minilm.export import hf_tokenizer

    docs = [p.read_text() for p in sorted(tiny_text_dir.glob("*.py"))]
    tok_cfg = load_config(overrides=["data.tokenizer.vocab_size=300", "data.tokenizer.byte_fallback=false"])
    ours = train_tokenizer(docs, tmp_path / "tok.model", tok_cfg.data.tokenizer)
    hf_tokenizer(ours.model_file).save_pretrained(tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "def f(é):\n    return 'ü' + x\n"
    ids = ours.encode(text)
    assert UNK_ID in ids and theirs(text)["input_ids"] == ids
    assert theirs.decode(ids) == ours.decode(ids) == "def f( ⁇ ):\n    return ' ⁇ ' + x\n"


def test_logit_check_never_holds_a_whole_sequence_s_logits(tmp_path):
    """export_hf.py checks at 4x the training length, and the check held the batch's (2, T, V) fp32 logits in both
    frameworks plus their difference: 4.7 GB at configs/rope_yarn.yaml's 16384 tokens for a tiny model. No tensor it
    makes may now be as large as one sequence's logits, and the difference it reports is the whole-logits one."""
    from torch.utils._python_dispatch import TorchDispatchMode

    big_v = 2**16  # one sequence's logits at 4L: 8.4M values (32 MiB), the batch's whole 4x that with the difference
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", f"train.seq_len={L}"])
    torch.manual_seed(0)
    model = GPT(cfg.model, big_v).eval()
    export_model(model, cfg, None, tmp_path)

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    with Largest():
        diffs = max_logit_difference(model, tmp_path, [4 * L])
    assert Largest.numel < 4 * L * big_v, Largest.numel
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).float().eval()
    x = torch.randint(0, big_v, (2, 4 * L), generator=torch.Generator().manual_seed(0))  # the check's tokens
    with torch.no_grad():
        whole = float((model(x) - hf(input_ids=x).logits).abs().max())
    assert diffs[4 * L] == pytest.approx(whole, rel=1e-6, abs=1e-9)
