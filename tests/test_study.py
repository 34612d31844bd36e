"""scripts/study.py: several variants of one schedule trained and compared in one command; shared phases are
exact (a variant that starts from a copy of another's pretraining ends bitwise where it would alone)."""

import json
import shlex
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from minilm.cli import run_cli
from minilm.config import phase_config, phase_names, phase_steps
from minilm.errors import ConfigError, MinilmError
from minilm.study import load_study, phase_keys, plan_sharing, run_config, study_runs, write_summary
from tests.conftest import local_data_yaml, load_script

REPO = Path(__file__).resolve().parents[1]

BASE = """
model: {{n_layers: 1, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, batch_size: 4, steps: 8, val_every: 4, val_batches: 2, log_every: 4, ckpt_every: 4}}
optim: {{lr: 0.003, warmup_steps: 2}}
eval: {{tasks: [ppl], sliding: false, batches: 1, batch_tokens: 256}}
phases:
  short: {{seq_len: 32, steps: 6, eval_lengths: [32, 64]}}
  long:
    seq_len: 64
    steps: 6
    batch_size: 2
    position: {{scaling: {{rope_type: yarn, factor: 2.0, original_max_position_embeddings: 32}}}}
    eval_lengths: [32, 64]
"""

STUDY = """
config: base.yaml
variants:
  yarn: []
  pi: ["phases.long.position.scaling={rope_type: linear, factor: 2.0}"]
  alibi: [model.position.name=alibi]
"""


def _script(name: str):
    return load_script(f"scripts/{name}.py")


@pytest.fixture
def study_file(tmp_path, tiny_text_dir) -> Path:
    (tmp_path / "base.yaml").write_text(BASE.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    return path


def _study(argv) -> int:
    mod = _script("study")
    return run_cli(mod.main, mod.parser(), [str(a) for a in argv])


def test_a_study_trains_every_variant_shares_pretraining_exactly_and_compares(tmp_path, study_file, capsys):
    out = tmp_path / "out"
    assert _study([study_file, "--out", out, "--only", "yarn,pi"]) == 0  # alibi later, by --resume
    assert "'pi' starts from 'yarn' after short" in capsys.readouterr().out
    pi, yarn = out / "pi", out / "yarn"
    # pi's first phase is yarn's, copied (no checkpoints: it was not trained there); its second phase trained
    assert (pi / "short" / "complete.json").is_file() and not (pi / "short" / "checkpoints").exists()
    shared = [load_file(run / "short" / "model.safetensors") for run in (pi, yarn)]
    assert shared[0].keys() == shared[1].keys()
    assert (pi / "long" / "checkpoints").is_dir() and (pi / "model.safetensors").is_file()
    assert not (out / "alibi").exists()
    # sharing is exact: pi trained alone, from scratch, ends with the same weights
    train_py = load_script("train.py")
    alone = tmp_path / "pi_alone"
    argv = ["--config", str(tmp_path / "base.yaml"), f"run.dir={alone}",
            "phases.long.position.scaling={rope_type: linear, factor: 2.0}"]  # fmt: skip
    assert run_cli(train_py.main, train_py.parser(), argv) == 0
    a, b = load_file(pi / "model.safetensors"), load_file(alone / "model.safetensors")
    assert all((a[k] == b[k]).all() for k in a), "a shared pretraining changed the variant's result"

    # without --resume an existing study is refused; with it, finished variants are skipped and alibi trains
    capsys.readouterr()
    assert _study([study_file, "--out", out]) == 2
    assert "--resume" in capsys.readouterr().err
    assert _study([study_file, "--out", out, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "starts from 'yarn'" not in printed  # pi had its copy of yarn's short: nothing copied, nothing said
    # said before the seconds of checking every run's config and data: how many runs, and where
    assert printed.startswith(f"study {study_file.stem}: 3 runs (3 variants) into {out}; first every run's"), printed
    assert (out / "alibi" / "short" / "checkpoints").is_dir()  # a different model: nothing shared
    report = json.loads((out / "study.json").read_text())
    rows = {r["variant"]: r for r in report["variants"]}
    assert rows["pi"]["runs"]["pi"]["shared"] == {"from": "yarn", "phases": ["short"]}
    assert rows["alibi"]["runs"]["alibi"]["shared"] is None
    assert all(rows[v]["val_loss"][p]["n"] == 1 for v in rows for p in ("short", "long"))
    md = (out / "study.md").read_text()
    assert "| pi | `phases.long.position.scaling={rope_type: linear, factor: 2.0}` | short from yarn |" in md
    assert "| variant | 32 | 64 |" in md and "| alibi | " in md.split("## ppl")[1]  # the last evaluations
    assert (out / "compare.png").stat().st_size > 1000


def test_plan_sharing_takes_the_longest_equal_prefix_never_the_last_phase():
    keys = {"a": ["p", "p+x", "p+x+y"], "b": ["p", "p+x", "p+x+z"], "c": ["p", "p+w"], "d": ["q"],
            "e": ["p", "p+x", "p+x+y"]}  # fmt: skip
    plan = plan_sharing(keys)
    assert plan["b"] == ("a", 2) and plan["c"] == ("a", 1)
    assert "d" not in plan  # a different first phase shares nothing
    assert plan["e"] == ("a", 2)  # identical to a: its last phase still trains
    assert plan_sharing({"a": ["p"], "b": ["p"]}) == {}  # one phase: nothing to share


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "studies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_study_resolves_and_its_rope_variants_share_the_pretraining(path, tmp_path):
    study = load_study(path)
    cfgs = {r.label: run_config(study, r, tmp_path, []) for r in study_runs(study)}
    for cfg in cfgs.values():
        assert [phase_steps(phase_config(cfg, n)) for n in phase_names(cfg)]  # every phase resolves
    plan = plan_sharing({n: phase_keys(c) for n, c in cfgs.items()})
    for seed in study.seeds or [None]:  # each seed's RoPE variants share that seed's pretraining, no other seed's
        rope = [r.label for r in study_runs(study) if r.seed == seed and cfgs[r.label].model.position.name == "rope"]
        assert {n: plan[n] for n in rope[1:]} == {n: (rope[0], 1) for n in rope[1:]}


@pytest.mark.parametrize(
    "text, message",
    [
        ("variants: {a: []}\n", "config: the path of a config YAML"),
        ("config: nope.yaml\nvariants: {a: []}\n", "config file not found"),
        ("config: base.yaml\n", "variants: a mapping"),
        ("config: base.yaml\nvariants: {a: [model.n_layers]}\n", "must look like key.sub=value"),
        ("config: base.yaml\nvariants: {a: 3}\n", "variants.a: a list of overrides"),
        ("config: base.yaml\nvariants: {a/b: []}\n", "variants.a/b: a variant name is a directory name"),
        ("config: base.yaml\nvariants: {a: {overides: []}}\n", "unknown key 'overides'"),
        ("config: base.yaml\nvariant: {a: []}\n", "unknown key 'variant'"),
        ("config: base.yaml\nvariants:\n  a: []\n  a: [train.steps=3]\n", "duplicate key 'a'"),
        # one line naming the line of the problem (PyYAML's report named the file '<unicode string>'), a tab's fix
        ("config: base.yaml\nvariants:\n\ta: []\n", "study.yaml, line 3, column 1: not valid YAML: .*; replace the tab "
                                                    "with spaces"),
        ("config: base.yaml\nseeds: [1, 1]\nvariants: {a: []}\n", "seeds must differ"),
        ("config: base.yaml\nseeds: [one]\nvariants: {a: []}\n", "seeds: a non-empty list of integer seeds"),
        ("config: base.yaml\nseeds: [true]\nvariants: {a: []}\n", "seeds: a non-empty list of integer seeds"),  # a bool
        ("config: base.yaml\nvariants: {study.json: []}\n", "variants.study.json: the name of a file the study writes"),
        # a run's config given for a study: 'unknown key base' did not say what the file is, nor what takes it
        ("base: tiny.yaml\nmodel: {n_layers: 1}\n", "study.yaml: a run config .it has 'base:'., not a study file"),
        ("model: {n_layers: 1}\nphases: {}\n", "it has 'model:'., not a study file .config:, variants:.; train it with "
                                                "python train.py --config"),
    ],
)
def test_bad_study_files_are_refused_with_the_key(study_file, text, message):
    study_file.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_study(study_file)


def test_a_study_file_whose_name_is_no_study_name_says_so_not_that_its_name_key_is_wrong(study_file):
    """Without a name: key the study is named by its file: 'my study.yaml' was refused with "name: ... got 'my
    study'", naming a key the file does not have."""
    named = study_file.with_name("my study.yaml")
    named.write_text(study_file.read_text())
    with pytest.raises(ConfigError, match=r"my study.yaml: name: letters, digits, '_', '-', '.' expected \(none given, "
                                          r"and the file's name 'my study' is not one\)"):
        load_study(named)
    named.write_text(study_file.read_text() + "name: my_study\n")
    assert load_study(named).name == "my_study"
    named.write_text(study_file.read_text() + "name: a b\n")
    with pytest.raises(ConfigError, match=r"name: letters, digits, '_', '-', '.' expected \(got 'a b'\)"):
        load_study(named)


def test_a_bad_variant_override_exits_2_naming_the_variant_before_anything_trains(tmp_path, study_file, capsys):
    study_file.write_text(STUDY + "  broken: [model.n_layer=3]\n")
    assert _study([study_file, "--out", tmp_path / "out"]) == 2
    err = capsys.readouterr().err
    assert "variant 'broken'" in err and "model.n_layer" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize("same", ["[]", "[phases.long.steps=6]", "{config: base.yaml}",
                                  "[phases.long.position.scaling.factor=2]", "[model.position.fraction=1.0]",
                                  "[phases.long.position.scaling.beta_fast=32]"])  # fmt: skip
def test_two_variants_that_train_alike_exit_2_before_anything_trains(tmp_path, study_file, capsys, monkeypatch, same):
    """A variant whose overrides change nothing (left out, or setting what the config says) trained the other variant
    again and reported a difference of nothing, without a word. A position parameter given as the integer 2 where the
    config says 2.0 (position blocks are untyped) trains alike too, as --resume sees it; so does one spelled out at
    its default (RoPE's fraction 1.0, YaRN's beta_fast 32), which --resume takes as the same model too."""
    import minilm.study

    monkeypatch.setattr(minilm.study, "_check_data", lambda *a: pytest.fail("the data was prepared"))
    study_file.write_text(STUDY + f"  yarn_again: {same}\n")
    for seeds in ([], ["--seeds", "1,2"]):
        assert _study([study_file, "--out", tmp_path / "out", *seeds]) == 2
        err = capsys.readouterr().err
        assert "variants 'yarn' and 'yarn_again' train alike: every phase of theirs resolves to the same config" in err
        assert "Nothing was trained" in err and not (tmp_path / "out").exists()


def test_a_bad_value_in_a_variant_is_said_to_be_set_in_the_study_file_not_on_the_command_line(tmp_path, study_file,
                                                                                             capsys):  # fmt: skip
    study_file.write_text(STUDY + "  broken: [model.n_layers=-2]\n")
    assert _study([study_file, "--out", tmp_path / "out"]) == 2
    err = capsys.readouterr().err
    assert f"model.n_layers: must be >= 1, got -2 (set in study file {study_file}, variant 'broken')" in err
    assert "command line" not in err
    # the remedy ends it: this study again, once corrected
    assert err.strip().endswith(f"Nothing was trained; correct it, then: python scripts/study.py {study_file} --out "
                                f"{tmp_path / 'out'} --resume")
    study_file.write_text(STUDY)  # on the study's own command line, it is the command line's
    assert _study([study_file, "--out", tmp_path / "out", "model.n_layers=-2"]) == 2
    assert "(set on the command line)" in capsys.readouterr().err


@pytest.mark.parametrize("bad, said", [
    ("train.log_evry=3", "overrides (every variant): bad config key 'train.log_evry'"),
    ("model.n_layers=-2", "-2 (set in study file {}, overrides (every variant))"),
])
def test_a_bad_override_for_every_variant_is_said_to_be_the_study_files_not_the_first_variants(tmp_path, study_file,
                                                                                              capsys, bad, said):
    """A bad entry of the study file's `overrides:` was said to be set in "variant 'yarn'", whose own list is empty."""
    study_file.write_text(f"overrides: [{bad}]\n" + STUDY)
    assert _study([study_file, "--out", tmp_path / "out"]) == 2
    err = capsys.readouterr().err
    assert said.format(study_file) in err and "variant 'yarn'" not in err, err
    # a variant on a config of its own, the only one that refuses it: which variant
    (tmp_path / "other.yaml").write_text("base: base.yaml\nmodel: {position: {name: alibi}}\n")
    study_file.write_text("overrides: ['phases.long.position.scaling.factor=3.0']\nconfig: base.yaml\n"
                          "variants: {yarn: [], mine: {config: other.yaml}}\n")  # fmt: skip
    assert _study([study_file, "--out", tmp_path / "out"]) == 2
    err = capsys.readouterr().err
    said = f"(set in study file {study_file}, overrides (every variant)) (for variant mine, which starts from "
    assert said + f"{tmp_path / 'other.yaml'})" in err, err


def test_the_command_to_run_once_corrected_keeps_negative_seeds_to_their_flag(tmp_path, study_file, capsys):
    """It said "--seeds -1,2", which argparse reads as a flag: "argument --seeds: expected one argument"."""
    assert _study([study_file, "--out", tmp_path / "out", "--seeds=-1,2", "model.n_layers=-2"]) == 2
    again = capsys.readouterr().err.strip().split("correct it, then: ")[1]
    assert again.endswith(f"--out {tmp_path / 'out'} --seeds=-1,2 --resume model.n_layers=-2")
    mod = _script("study")
    assert mod.parser().parse_intermixed_args(shlex.split(again)[2:]).seeds == "-1,2"


def test_a_variant_whose_data_fails_is_refused_before_the_first_variant_trains(tmp_path, study_file, capsys):
    # config-valid, but no document reaches long_min_tokens: only building the phase's sampler can tell
    mixed = "[phases.long.data.long_fraction=0.5, phases.long.data.long_min_tokens=1000000]"
    study_file.write_text(STUDY + f"  mixed: {mixed}\n")
    assert _study([study_file, "--out", tmp_path / "out"]) == 2
    err = capsys.readouterr().err
    assert "'mixed'" in err and "phase 'long'" in err and "long_fraction" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "yarn").exists()


def test_seeds_give_one_run_per_variant_and_seed_and_mean_sd_tables(tmp_path, study_file):
    """Every variant trains once per seed (seed by seed, so a stopped study still compares all variants); the
    summary reports mean ± sample sd over the seeds, and says n where a run is missing."""
    from minilm.config import save_config
    from minilm.files import atomic_write_text

    study_file.write_text("config: base.yaml\nseeds: [1, 2]\nvariants: {a: [], b: [phases.long.lr=0.001]}\n")
    study = load_study(study_file)
    assert [r.label for r in study_runs(study)] == ["a/seed1", "b/seed1", "a/seed2", "b/seed2"]
    out = tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    cfg = cfgs["b/seed2"]
    assert (cfg.run.seed, cfg.run.dir, cfg.run.name) == (2, str(out / "b/seed2"), "b-seed2")
    assert phase_config(cfg, "long").optim.lr == 0.001
    assert plan_sharing({label: phase_keys(c) for label, c in cfgs.items()}) == {"b/seed1": ("a/seed1", 1),
                                                                                  "b/seed2": ("a/seed2", 1)}
    finished = {"a/seed1": (4.0, 10.0), "a/seed2": (4.2, 12.0), "b/seed1": (3.9, 9.0)}  # b/seed2 not run
    for label, (loss, ppl) in finished.items():
        save_config(cfgs[label], out / label / "config.yaml")
        for phase in ("short", "long"):
            atomic_write_text(out / label / phase / "complete.json", json.dumps({"val_loss": loss}))
        results = {"lengths": [32], "ppl": {"32": ppl}, "train_seq_len": 64, "phase": "long", "run": label}
        atomic_write_text(out / label / "long" / "eval" / "results.json", json.dumps(results))
    write_summary(study, out, cfgs, log=lambda msg: None)
    md = (out / "study.md").read_text()
    assert "| a | – | – | 4.1000 ± 0.1414 | 4.1000 ± 0.1414 |" in md
    assert "| b | `phases.long.lr=0.001` | – | 3.9000 (n=1) |" in md
    assert "| a | 11.00 ± 1.41 |" in md and "| b | 9.00 (n=1) |" in md
    report = json.loads((out / "study.json").read_text())
    assert report["variants"][0]["evaluation"]["ppl"]["32"] == {"mean": 11.0, "sd": pytest.approx(2**0.5), "n": 2}
    assert "| a | 11.00 |" in (out / "compare.md").read_text()  # the figure and compare.md show the means
    # b against a, seed by seed: only seed 1 has both (b 3.9 / 9 vs a 4.0 / 10)
    assert report["variants"][1]["vs_first"]["val_loss"] == {"mean": pytest.approx(-0.1), "sd": 0.0, "n": 1}
    paired = md.split("## Difference from a, paired by seed")[1]
    assert "| b | -0.1000 (n=1) | -1.00 (n=1) |" in paired


def test_a_variants_mean_names_its_folder_by_its_absolute_path(study_file, tmp_path, monkeypatch):
    """A variant's mean over seeds named its folder as --out was typed (``runs/studies/x/a (mean of 2 seeds)`` in
    compare.md), where each run's results.json names its run by its absolute path."""
    from minilm.config import save_config
    from minilm.files import atomic_write_text

    study_file.write_text("config: base.yaml\nseeds: [1, 2]\nvariants: {a: []}\n")
    study = load_study(study_file)
    monkeypatch.chdir(tmp_path)
    out = Path("out")
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    for label, ppl in (("a/seed1", 10.0), ("a/seed2", 12.0)):
        save_config(cfgs[label], out / label / "config.yaml")
        for phase in ("short", "long"):
            atomic_write_text(out / label / phase / "complete.json", json.dumps({"val_loss": 4.0}))
        results = {"lengths": [32], "ppl": {"32": ppl}, "train_seq_len": 64, "phase": "long",
                   "run": str((out / label).resolve())}  # fmt: skip
        atomic_write_text(out / label / "long" / "eval" / "results.json", json.dumps(results))
    write_summary(study, out, cfgs, log=lambda msg: None)
    assert f"`{tmp_path.resolve() / 'out' / 'a'} (mean of 2 seeds)`" in (out / "compare.md").read_text()


def test_the_paired_table_without_an_evaluation_has_as_many_cells_as_its_header():
    """With no phase evaluated (no ppl column) the header had a trailing empty cell over a two-cell separator, which
    markdown does not render as a table."""
    from minilm.study import _paired_table

    entries = [{"variant": "a", "val_loss": {"long": 4.0}},
               {"variant": "b", "val_loss": {"long": 3.9}, "vs_first": {"val_loss": {"mean": -0.1, "sd": 0.0, "n": 1}}}]
    table = [line for line in _paired_table(entries, 2) if line.startswith("|")]
    assert table == ["| variant | val loss long |", "|---|---:|", "| b | -0.1000 (n=1) |"]


def test_the_paired_table_names_no_phase_a_variant_from_another_config_lacks():
    """A variant whose config ends in another phase ('train', a config without phases) was compared on its own last
    phase's loss under the header 'val loss long', the first variant's phase."""
    from minilm.study import _paired_table

    entries = [{"variant": "a", "val_loss": {"short": 4.1, "long": 4.0}},
               {"variant": "b", "val_loss": {"train": 3.9},
                "vs_first": {"val_loss": {"mean": -0.1, "sd": 0.0, "n": 1}}}]  # fmt: skip
    assert "| variant | val loss (each variant's last phase) |" in _paired_table(entries, 2)


def test_the_tables_per_length_name_the_phase_they_are_of_where_it_is_not_the_last():
    """A variant whose last phase does not evaluate (eval_lengths: []) is compared on the last phase that does; the
    tables' heading said '(last phase's evaluation)' all the same."""
    from minilm.study import Study, Variant, _markdown

    def entry(name, phases, evaluated):
        return {"variant": name, "config": "c.yaml", "overrides": [], "not_validated": [], "evaluated_phase": evaluated,
                "runs": {name: {"seed": None, "shared": None}}, "val_loss": {p: None for p in phases},
                "evaluation": {"ppl": {"64": {"mean": 5.0, "sd": 0.0, "n": 1}}}}  # fmt: skip

    study = Study(Path("s.yaml"), "s", [Variant("a", Path("c.yaml")), Variant("b", Path("c.yaml"))])
    report = {"date": "d", "config": "c.yaml", "study": "s.yaml", "out": "o",
              "variants": [entry("a", ["pre", "ext"], "ext"), entry("b", ["pre", "ext", "tune"], "ext")]}  # fmt: skip
    assert "## ppl at each length (phase ext's evaluation)" in _markdown(study, report, False)
    report["variants"][1] = entry("b", ["pre", "tune"], "pre")
    assert "## ppl at each length (evaluation of a: ext, b: pre)" in _markdown(study, report, False)
    report["variants"][1] = entry("b", ["pre", "ext"], "ext")
    assert "## ppl at each length (last phase's evaluation)" in _markdown(study, report, False)


def test_the_first_line_counts_one_run_in_the_singular(tmp_path, study_file, capsys):
    """'--only yarn --seeds 1' said 'study study: 1 runs (1 variants × 1 seeds)'."""
    assert _study([study_file, "--out", tmp_path / "out", "--only", "yarn", "--seeds", "1", "nokey.x=1"]) == 2
    assert f"study study: 1 run (1 variant × 1 seed) into {tmp_path / 'out'};" in capsys.readouterr().out
    assert _study([study_file, "--out", tmp_path / "out", "--seeds", "1,2", "nokey.x=1"]) == 2
    assert "study study: 6 runs (3 variants × 2 seeds) into" in capsys.readouterr().out


def test_bad_seeds_on_the_command_line_exit_2_naming_the_flag(tmp_path, study_file, capsys):
    assert _study([study_file, "--out", tmp_path / "out", "--seeds=--1"]) == 2
    assert "--seeds: a non-empty list of integer seeds" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, values", [("--seeds", ["1,2", "3"]), ("--out", ["a", "b"]), ("--only", ["yarn", "pi"])])
def test_a_value_flag_given_twice_exits_2_not_the_last_one_silently(tmp_path, study_file, capsys, monkeypatch, flag,
                                                                    values):  # fmt: skip
    """`--seeds 1,2 ... --seeds 3` (a command edited from the shell history) trained seed 3 alone, without a word, as
    --out and --only kept their last value: the other scripts refuse a flag given twice."""
    import minilm.study

    monkeypatch.setattr(minilm.study, "run_study", lambda *a, **k: pytest.fail("the study ran"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        _study([study_file, flag, values[0], flag, values[1]])
    assert e.value.code == 2
    assert f"{flag} given twice ({values[0]!r} and {values[1]!r})" in capsys.readouterr().err



def test_an_out_that_is_a_file_exits_2_naming_out_before_anything_runs(tmp_path, study_file, capsys, monkeypatch):
    """It failed in the first run's directory check, which advised setting run.dir: a study refuses run.dir."""
    import minilm.study

    monkeypatch.setattr(minilm.study, "_check_data", lambda *a: pytest.fail("the data was prepared"))
    (tmp_path / "out").write_text("a file")
    assert _study([study_file, "--out", tmp_path / "out"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "run.dir" not in err and str(tmp_path / "out") in err
    assert _study([study_file, "--out", tmp_path / "out" / "sub"]) == 2  # cannot be created: under a file
    err = capsys.readouterr().err
    assert f"--out {tmp_path / 'out' / 'sub'} is not writable" in err and "run.dir" not in err


def test_an_out_in_a_run_directory_exits_2_before_anything_runs(tmp_path, study_file, capsys, monkeypatch):
    """--out runs/tiny (a run, not a folder for one) put the study's runs and summary inside that run: evaluate.py and
    compare_runs.py then read the folder as the run it is, and never saw the study."""
    import minilm.study

    monkeypatch.setattr(minilm.study, "_check_data", lambda *a: pytest.fail("the data was prepared"))
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "tokenizer.model"):
        (run / name).write_text("")
    assert _study([study_file, "--out", run]) == 2
    assert f"--out {run} is a run directory" in capsys.readouterr().err
    assert _study([study_file, "--out", run / "studies" / "s"]) == 2
    assert f"--out {run / 'studies' / 's'} lies in {run}, which is a run directory" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "tokenizer.model"]


@pytest.mark.parametrize("out, remedy", [("~/x", "--out $HOME/x"), ("~", "--out $HOME")])
def test_an_out_with_a_tilde_names_out_in_its_remedy(tmp_path, study_file, capsys, monkeypatch, out, remedy):
    """--out '~/x' (quoted, or --out=~/x) was refused by each run's run.dir check, whose advice was run.dir=$HOME/...
    '(set in study's --out and seeds)': a study refuses run.dir. The remedy names --out."""
    monkeypatch.chdir(tmp_path)
    assert _study([study_file, "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"--out '{out}': '~' is not expanded" in err and err.strip().endswith(f"e.g. {remedy}")
    assert "run.dir" not in err and not (tmp_path / "~").exists()


@pytest.mark.parametrize("flag, message", [("--only=", "--only: comma-separated variant names expected"),
                                           ("--only=,", "--only: comma-separated variant names expected"),
                                           ("--only=yarn,", "got 'yarn,' (an empty name); variants are: yarn, pi"),
                                           ("--only=yarn,,pi", "--only: comma-separated variant names expected"),
                                           ("--only=yarn, ,pi", "--only: comma-separated variant names expected"),
                                           ("--seeds=", "--seeds: a non-empty list of integer seeds")])
def test_an_empty_only_or_seeds_exits_2_not_the_whole_study(tmp_path, study_file, capsys, flag, message, monkeypatch):
    """--only '' (an unset shell variable) trained every variant, --seeds '' ran the file's seeds: silently. An empty
    item of --only ('yarn,', 'yarn,,pi': a name lost to a typo or an unset variable) was dropped silently too."""
    import minilm.study

    monkeypatch.setattr(minilm.study, "run_study", lambda *a, **k: pytest.fail("the study ran"))
    assert _study([study_file, "--out", tmp_path / "out", flag]) == 2
    assert message in capsys.readouterr().err

@pytest.mark.parametrize("out", ["", " "])
def test_an_empty_out_exits_2_not_the_default_out(tmp_path, study_file, capsys, monkeypatch, out):
    """--out '' (an unset shell variable) trained into runs/studies/<name>, the default, without a word."""
    import minilm.study

    monkeypatch.setattr(minilm.study, "run_study", lambda *a, **k: pytest.fail("the study ran"))
    assert _study([study_file, f"--out={out}"]) == 2
    assert f"--out: a directory expected, got {out!r}" in capsys.readouterr().err


def _finished(cfg, run_dir: Path, phases, val_loss=4.0) -> None:
    """What a finished phase leaves (weights faked): config.yaml of the run and of each phase, complete.json."""
    from minilm.config import save_config
    from minilm.files import atomic_write_text

    save_config(cfg, run_dir / "config.yaml")
    for phase in phases:
        save_config(phase_config(cfg, phase), run_dir / phase / "config.yaml")
        (run_dir / phase / "model.safetensors").write_bytes(b"weights")
        atomic_write_text(run_dir / phase / "complete.json", json.dumps({"val_loss": val_loss}))


def test_a_variant_only_left_untrained_shares_nothing_in_the_summary(tmp_path, study_file):
    """pi, planned to share yarn's pretraining but not trained (--only yarn), was summarized as 'short from yarn'
    beside empty cells, as if it had been copied."""
    out = tmp_path / "out"
    assert _study([study_file, "--out", out, "--only", "yarn"]) == 0
    rows = {r["variant"]: r for r in json.loads((out / "study.json").read_text())["variants"]}
    assert rows["pi"]["runs"]["pi"]["shared"] is None
    row = next(line for line in (out / "study.md").read_text().splitlines() if line.startswith("| pi |"))
    assert row.split(" | ")[2] == "–", row


def test_the_summary_says_what_each_run_copied_not_what_this_invocation_plans(tmp_path, study_file):
    """Trained with --no-share, then continued without it, pi was summarized as 'short from yarn' (the plan's word)
    though it had trained short itself; and a copy made before a --no-share --resume was summarized as nothing."""
    out = tmp_path / "out"
    assert _study([study_file, "--out", out, "--only", "yarn,pi", "--no-share"]) == 0
    assert _study([study_file, "--out", out, "--only", "yarn,pi", "--resume"]) == 0
    rows = {r["variant"]: r for r in json.loads((out / "study.json").read_text())["variants"]}
    assert rows["pi"]["runs"]["pi"]["shared"] is None
    shutil.rmtree(out / "pi")
    assert _study([study_file, "--out", out, "--only", "yarn,pi", "--resume"]) == 0  # pi copies yarn's short
    assert _study([study_file, "--out", out, "--only", "yarn,pi", "--resume", "--no-share"]) == 0
    rows = {r["variant"]: r for r in json.loads((out / "study.json").read_text())["variants"]}
    assert rows["pi"]["runs"]["pi"]["shared"] == {"from": "yarn", "phases": ["short"]}


def test_seeds_summary_compares_only_each_runs_last_phase_evaluation(tmp_path, study_file):
    """A run stopped after its shared pretraining holds that phase's evaluation (copied): it is not the variant's
    result, and must not be averaged with the finished seeds' last-phase numbers."""
    from minilm.files import atomic_write_text

    study_file.write_text("config: base.yaml\nseeds: [1, 2]\nvariants: {a: [], b: [phases.long.lr=0.001]}\n")
    study = load_study(study_file)
    out = tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    for label, phases, ppl in [("a/seed1", ["short", "long"], 10.0), ("a/seed2", ["short", "long"], 12.0),
                               ("b/seed1", ["short", "long"], 9.0), ("b/seed2", ["short"], 500.0)]:  # fmt: skip
        _finished(cfgs[label], out / label, phases)
        results = {"lengths": [32], "ppl": {"32": ppl}, "train_seq_len": 32, "phase": phases[-1], "run": label}
        atomic_write_text(out / label / phases[-1] / "eval" / "results.json", json.dumps(results))
    write_summary(study, out, cfgs, log=lambda msg: None)
    md = (out / "study.md").read_text()
    assert "| b | 9.00 (n=1) |" in md and "| a | 11.00 ± 1.41 |" in md
    assert "| b | 9.00 |" in (out / "compare.md").read_text()


def test_the_summary_records_the_overrides_given_on_the_studys_command_line(tmp_path, study_file):
    """study.md / study.json said what the study file sets, not the key=value arguments every variant was trained
    with (phases.short.steps=50 for a quick trial read as the file's schedule)."""
    study_file.write_text("config: base.yaml\nvariants: {a: []}\n")
    study, out, extra = load_study(study_file), tmp_path / "out", ["phases.short.steps=5", "train.log_every=2"]
    cfgs = {r.label: run_config(study, r, out, extra) for r in study_runs(study)}
    _finished(cfgs["a"], out / "a", ["short", "long"])
    write_summary(study, out, cfgs, log=lambda msg: None, extra=extra)
    assert json.loads((out / "study.json").read_text())["command_line_overrides"] == extra
    assert "Command-line overrides (every variant): `phases.short.steps=5` `train.log_every=2`." in (
        out / "study.md").read_text()


def test_the_studys_common_overrides_are_listed_once_above_the_table_not_in_every_variants_cell(tmp_path,
                                                                                               study_file):
    """The study file's `overrides:` were repeated in each variant's cell of study.md's table (nine quick-trial
    overrides made every row a wall of text): listed once above the table, each cell keeps the variant's own."""
    study_file.write_text("config: base.yaml\noverrides: [phases.short.steps=5, train.log_every=2]\n"
                          "variants: {a: [], b: [phases.long.lr=0.001]}\n")  # fmt: skip
    study, out = load_study(study_file), tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    assert phase_steps(phase_config(cfgs["b"], "short")) == 5 and cfgs["b"].phases.long.lr == 0.001
    for label in ("a", "b"):
        _finished(cfgs[label], out / label, ["short", "long"])
    write_summary(study, out, cfgs, log=lambda msg: None)
    md = (out / "study.md").read_text()
    assert "The study file's overrides (every variant): `phases.short.steps=5` `train.log_every=2`." in md
    assert md.count("phases.short.steps=5") == 1
    assert "| a | – |" in md and "| b | `phases.long.lr=0.001` |" in md
    # the column says it holds each variant's own (headed 'overrides', '–' read as no overrides at all)
    assert "| variant | own overrides | shared | val loss short | val loss long |" in md
    report = json.loads((out / "study.json").read_text())
    assert report["overrides"] == ["phases.short.steps=5", "train.log_every=2"]
    assert [e["overrides"] for e in report["variants"]] == [[], ["phases.long.lr=0.001"]]


def test_a_variant_that_starts_from_another_config_says_which_in_the_table(tmp_path, study_file):
    """`other: {config: ../alibi.yaml}` showed '–' in study.md's overrides column: read as the study's config as
    is."""
    (tmp_path / "other.yaml").write_text("base: base.yaml\nmodel: {n_layers: 2}\n")
    study_file.write_text("config: base.yaml\nvariants:\n  a: []\n"
                          "  c: {config: other.yaml, overrides: [optim.lr=0.01]}\n")  # fmt: skip
    study, out = load_study(study_file), tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    for label in ("a", "c"):
        _finished(cfgs[label], out / label, ["short", "long"])
    write_summary(study, out, cfgs, log=lambda msg: None)
    md = (out / "study.md").read_text()
    assert "| a | – |" in md and "| c | config `other.yaml`<br>`optim.lr=0.01` |" in md
    assert json.loads((out / "study.json").read_text())["config"] == str(tmp_path / "base.yaml")


def test_each_runs_line_names_its_variants_own_overrides_and_the_common_ones_once(tmp_path, study_file,
                                                                                  monkeypatch):  # fmt: skip
    """Each run's line repeated the overrides common to every variant (nine for a quick trial), and a variant
    with none of its own was 'the config as is' although the common ones changed it."""
    import minilm.training.phases as phases_mod
    from minilm.study import run_study

    monkeypatch.setattr(phases_mod, "run_phases", lambda cfg, resume, log, notes: None)
    (tmp_path / "other.yaml").write_text("base: base.yaml\nmodel: {n_layers: 2}\n")
    study_file.write_text("config: base.yaml\noverrides: [phases.short.steps=5]\n"
                          "variants: {a: [], b: [phases.long.lr=0.001], c: {config: other.yaml}}\n")  # fmt: skip
    logged = []
    run_study(load_study(study_file), tmp_path / "out", extra=("train.log_every=2",), share=False, log=logged.append)
    name = load_study(study_file).name
    assert f"study {name}: every variant with the study file's overrides: phases.short.steps=5" in logged
    assert f"study {name}: every variant with the command line's overrides: train.log_every=2" in logged
    assert f"study {name}: 'a' (no overrides of its own)" in logged
    assert f"study {name}: 'b' (phases.long.lr=0.001)" in logged
    assert f"study {name}: 'c' (config {tmp_path / 'other.yaml'}; no overrides of its own)" in logged
    assert sum("phases.short.steps=5" in line for line in logged) == 1


def test_each_seed_is_checked_against_its_own_seed_not_the_first_runs(tmp_path, study_file):
    """A seed's run evaluates with its own run.seed (the text it reads): the check of 'other settings than the study
    asks' compared every run with the first seed's config, so each later seed was listed, with a remedy command that
    would have measured it on the first seed's text."""
    def results(label, cfg):
        return {"lengths": [32, 64], "tasks": ["ppl"], "extension": None, "seed": cfg.run.seed, "ppl": {"32": 9.0},
                "batches": cfg.eval.batches, "train_seq_len": 64, "phase": "long", "run": label}  # fmt: skip

    out = _summarized_two_seed_study(tmp_path, study_file, results)
    assert "other settings" not in (out / "study.md").read_text()


def _summarized_two_seed_study(tmp_path, study_file, results) -> Path:
    """A study of one variant 'a' at seeds 1 and 2, whose runs' last phase evaluated to ``results(label, cfg)``,
    summarized; returns its folder."""
    from minilm.files import atomic_write_text

    study_file.write_text("config: base.yaml\nseeds: [1, 2]\nvariants: {a: []}\n")
    study = load_study(study_file)
    out = tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    for label, cfg in cfgs.items():
        _finished(cfg, out / label, ["short", "long"])
        atomic_write_text(out / label / "long" / "eval" / "results.json", json.dumps(results(label, cfg)))
    write_summary(study, out, cfgs, log=lambda msg: None)
    return out


def test_the_studys_compare_counts_the_prompts_of_every_seed_behind_a_mean_accuracy(tmp_path, study_file):
    """compare.md gives each accuracy the prompts it counts; a study's row is the mean over its seeds, which counts
    the prompts of every seed measured there, not the first run's alone."""
    accuracy = {"a/seed1": 0.5, "a/seed2": 0.25}

    def results(label, cfg):
        return {"lengths": [32], "passkey": {"32": accuracy[label]}, "details": {"passkey": {"32": {"samples": 4}}},
                "train_seq_len": 32, "phase": "long", "run": label}  # fmt: skip

    out = _summarized_two_seed_study(tmp_path, study_file, results)
    table = (out / "compare.md").read_text()
    assert "prompts per length: a 8." in table and "| a | 0.38 [0.14, 0.69] |" in table  # 3 of 8


@pytest.mark.parametrize("name", ["out", "my out"])
def test_an_evaluation_made_with_other_settings_than_the_study_asks_is_named_with_its_remedy(tmp_path, study_file,
                                                                                             name):
    """--resume skips finished phases, so raising eval.samples in the study file (or on its command line) left the
    old evaluations in the tables, silently: numbers of 1 prompt per cell under a study that asks for 3. The summary
    now names each such run and the evaluate.py command that measures it as the study asks (its paths quoted: an
    --out with a space broke the command there)."""
    import shlex

    from minilm.cli import one_run
    from minilm.files import atomic_write_text

    study_file.write_text("config: base.yaml\nvariants: {a: []}\n")
    study = load_study(study_file)
    out = tmp_path / name
    extra = ["eval.tasks=[ppl,passkey]", "eval.samples=3"]
    cfgs = {r.label: run_config(study, r, out, extra) for r in study_runs(study)}
    _finished(cfgs["a"], out / "a", ["short", "long"])
    results = {"lengths": [32, 64], "tasks": ["ppl", "passkey"], "samples": 1, "depths": [0.0, 0.25, 0.5, 0.75, 1.0],
               "extension": None, "train_seq_len": 64, "phase": "long", "run": str(out / "a"),
               "ppl": {"32": 10.0, "64": 11.0}, "passkey": {"32": 0.0, "64": 0.0}}  # fmt: skip
    atomic_write_text(out / "a" / "long" / "eval" / "results.json", json.dumps(results))
    write_summary(study, out, cfgs, log=lambda msg: None)
    md = (out / "study.md").read_text()
    assert "## Evaluated with other settings than the study asks" in md
    line = next(x for x in md.splitlines() if x.startswith("- a: samples 1 (study: 3)"))
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["python", "scripts/evaluate.py"]
    args = _script("evaluate").parser().parse_args(command[2:])
    one_run(args, "run", "evaluate.py RUN")  # (as evaluate.py's main reads the run: first or --run)
    assert (args.run, args.phase, args.samples) == (str(out / "a"), "long", 3)
    report = json.loads((out / "study.json").read_text())
    assert report["variants"][0]["runs"]["a"]["evaluated_with_other_settings"] == {
        "samples": {"evaluated": 1, "study": 3}}  # fmt: skip
    # perplexity of other windows (results.json records them since they are checked), of other text
    batches, seed = cfgs["a"].eval.batches, cfgs["a"].run.seed
    atomic_write_text(out / "a" / "long" / "eval" / "results.json",
                      json.dumps({**results, "samples": 3, "batches": batches + 1, "seed": seed + 1}))
    write_summary(study, out, cfgs, log=lambda msg: None)
    report = json.loads((out / "study.json").read_text())
    assert report["variants"][0]["runs"]["a"]["evaluated_with_other_settings"] == {
        "batches": {"evaluated": batches + 1, "study": batches}, "seed": {"evaluated": seed + 1, "study": seed}}
    # evaluated as the study asks (as the end of the phase does): nothing to say
    atomic_write_text(out / "a" / "long" / "eval" / "results.json", json.dumps({**results, "samples": 3}))
    write_summary(study, out, cfgs, log=lambda msg: None)
    assert "other settings" not in (out / "study.md").read_text()


def test_the_remedy_command_sets_each_differing_setting_as_evaluate_py_reads_it():
    import shlex

    from minilm.eval import parse_extension
    from minilm.study import _evaluate_flags

    want = {"lengths": [32, 128], "tasks": ["ppl", "kv"], "depths": [0.0, 0.5], "batches": 2, "batch_tokens": 512,
            "needles": 3, "seed": 7,
            "extension": {"name": "longrope", "short_factor": [1.0, 1.5], "original_max_position_embeddings": 32}}
    flags = _evaluate_flags({k: {"evaluated": None, "study": v} for k, v in want.items()}, "/r/a/long")
    args = _script("evaluate").parser().parse_args(["--run", "/r/a"] + shlex.split(flags))
    assert (args.lengths, args.tasks, args.depths) == ([32, 128], ["ppl", "kv"], [0.0, 0.5])
    assert (args.batches, args.batch_tokens, args.needles, args.seed) == (2, 512, 3, 7)
    assert parse_extension(args.extension) == want["extension"]
    assert args.out == "/r/a/long/eval"  # an --extension would be written beside eval/, not into it
    none = _evaluate_flags({"extension": {"evaluated": {"name": "logn"}, "study": None}}, "/r/a/long")
    assert shlex.split(none) == ["--extension", "none", "--out", "/r/a/long/eval"]
    spaced = _evaluate_flags({"extension": {"evaluated": {"name": "logn"}, "study": None}}, "/my runs/a/long")
    assert shlex.split(spaced) == ["--extension", "none", "--out", "/my runs/a/long/eval"]


def test_seeds_one_seed_is_named_and_val_batches_0_is_not_a_missing_run(tmp_path, study_file):
    study_file.write_text("config: base.yaml\nseeds: [7]\nvariants: {a: [], c: [train.val_batches=0]}\n")
    study = load_study(study_file)
    out = tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    _finished(cfgs["a/seed7"], out / "a/seed7", ["short", "long"])
    _finished(cfgs["c/seed7"], out / "c/seed7", ["short", "long"], val_loss=None)
    write_summary(study, out, cfgs, log=lambda msg: None)
    md = (out / "study.md").read_text()
    assert "seed 7." in md and "the config's" not in md
    assert "| c | `train.val_batches=0` | – | no validation | no validation |" in md


@pytest.mark.parametrize("seeds", ["", "seeds: [7]\n", "seeds: [7, 8]\n"])
def test_a_one_seed_study_says_no_difference_is_significant_and_shows_the_variants_side_by_side(tmp_path, study_file,
                                                                                                seeds):  # fmt: skip
    """With one seed the paired table (variants paired across seeds) is left out: study.md showed its tables with
    nothing saying that one draw per variant cannot tell a difference from noise."""
    study_file.write_text(f"config: base.yaml\n{seeds}variants: {{a: [], b: [optim.lr=0.01]}}\n")
    study = load_study(study_file)
    out = tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    for r, loss in zip(study_runs(study), (4.0, 3.5, 4.1, 3.4)):
        _finished(cfgs[r.label], out / r.label, ["short", "long"], val_loss=loss)
    write_summary(study, out, cfgs, log=lambda msg: None)
    md = (out / "study.md").read_text()
    one = seeds != "seeds: [7, 8]\n"
    assert ("no difference between the variants below can be called significant" in md) == one
    assert ("paired by seed\n" in md) == (not one)  # the paired table's heading
    rows = [line for line in md.splitlines() if line.startswith(("| a |", "| b |"))][:2]  # the first table's
    assert rows == (["| a | – | – | 4.0000 | 4.0000 |", "| b | `optim.lr=0.01` | – | 3.5000 | 3.5000 |"] if one
                    else ["| a | – | – | 4.0500 ± 0.0707 | 4.0500 ± 0.0707 |",
                          "| b | `optim.lr=0.01` | – | 3.4500 ± 0.0707 | 3.4500 ± 0.0707 |"])  # fmt: skip


def test_plan_a_run_copies_only_the_shared_phases_it_lacks_and_checks_the_donors_first(tmp_path, study_file,
                                                                                      monkeypatch):  # fmt: skip
    import minilm.training.phases as phases_mod
    from minilm.config import load_config
    from minilm.errors import MinilmError
    from minilm.study import _train_run

    trained = []
    monkeypatch.setattr(phases_mod, "run_phases", lambda cfg, resume, log, notes: trained.append(cfg.run.name))
    study = load_study(study_file)
    out = tmp_path / "out"
    cfgs = {r.label: run_config(study, r, out, []) for r in study_runs(study)}
    pi = next(r for r in study_runs(study) if r.variant == "pi")
    # pi has its own finished pretraining (say from --no-share) and yarn none: nothing to copy, pi continues
    _finished(cfgs["pi"], out / "pi", ["short"])
    logged = []
    _train_run(study, pi, out, cfgs["pi"], ("yarn", 1), log=logged.append)
    assert trained == ["pi"]
    # nothing copied, nothing said: "'pi' starts from 'yarn' after short" was logged on every --resume
    assert not any("starts from 'yarn'" in line for line in logged), logged
    # yarn's finished pretraining was trained otherwise than pi's config says (an edited study, --only pi):
    # refused before a stale copy lands in pi's run directory
    shutil.rmtree(out / "pi")
    older = load_config(study_file.parent / "base.yaml", ["phases.short.lr=0.01", f"run.dir={out / 'yarn'}"])
    _finished(older, out / "yarn", ["short"])
    with pytest.raises(MinilmError, match=r"'pi' starts from 'yarn': phase 'short' finished with optim.lr = 0.01"):
        _train_run(study, pi, out, cfgs["pi"], ("yarn", 1), log=lambda msg: None)
    assert not (out / "pi" / "short").exists() and trained == ["pi"]
    # a donor that finished them as pi's config says: copied, and said
    shutil.rmtree(out / "yarn")
    _finished(cfgs["yarn"], out / "yarn", ["short"])
    _train_run(study, pi, out, cfgs["pi"], ("yarn", 1), log=logged.append)
    assert (out / "pi" / "short" / "complete.json").is_file() and trained == ["pi", "pi"]
    assert logged[-2] == f"study {study.name}: 'pi' starts from 'yarn' after short"


def test_plan_a_donor_left_out_by_only_is_checked_before_anything_trains(tmp_path, study_file, monkeypatch):
    import minilm.training.phases as phases_mod
    from minilm.errors import MinilmError
    from minilm.study import run_study

    study_file.write_text("config: base.yaml\nvariants: {yarn: [], alibi: [model.position.name=alibi], "
                          "pi: [phases.long.lr=0.001]}\n")  # fmt: skip
    trained = []
    monkeypatch.setattr(phases_mod, "run_phases", lambda cfg, resume, log, notes: trained.append(cfg.run.name))
    with pytest.raises(MinilmError, match="'pi' shares short with 'yarn', which has not finished it in"):
        run_study(load_study(study_file), tmp_path / "out", only=["pi", "alibi"], log=lambda msg: None)
    assert trained == []  # not alibi first, then the refusal


def test_copy_finished_phase_leaves_out_checkpoints_and_stale_temporary_files(tmp_path):
    """Files are hard-linked: a temporary file an interrupted write left in the donor would be one inode in both
    runs, and a later atomic write through that name in one run (write the .tmp, rename it) would change the
    other's file."""
    from minilm.eval.report import write_json
    from minilm.study import copy_finished_phase

    donor, copy = tmp_path / "yarn" / "short", tmp_path / "pi" / "short"
    (donor / "checkpoints").mkdir(parents=True)
    (donor / "checkpoints" / "step-00000004.ckpt").write_bytes(b"ckpt")
    (donor / "complete.json").write_text("{}")
    write_json({"ppl": {"32": 1.0}}, donor / "eval" / "results.json")
    (donor / "eval" / "results.json.tmp").write_text("left by an interrupted write")
    (copy / "half").mkdir(parents=True)  # an interrupted earlier copy or run
    (tmp_path / "pi" / "short.copying" / "eval").mkdir(parents=True)  # a copy interrupted before its rename
    copy_finished_phase(donor, copy)
    assert not (tmp_path / "pi" / "short.copying").exists()
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*")) == ["complete.json", "eval",
                                                                               "eval/results.json"]
    write_json({"ppl": {"32": 2.0}}, copy / "eval" / "results.json")  # scripts/evaluate.py on the copy
    write_json({"ppl": {"32": 3.0}}, donor / "eval" / "results.json")  # then on the donor
    assert json.loads((copy / "eval" / "results.json").read_text()) == {"ppl": {"32": 2.0}}


def test_run_placement_overrides_and_mixed_layouts_are_refused(tmp_path, study_file):
    """run.dir / run.name (and run.seed when the study has seeds) are the study's to set: given, they would be
    silently replaced. A study run once without seeds and once with them would nest runs inside runs."""
    from minilm.study import run_study

    study_file.write_text("config: base.yaml\nvariants: {a: [run.dir=/tmp/elsewhere]}\n")
    with pytest.raises(ConfigError, match="variant 'a': override 'run.dir=/tmp/elsewhere'.*--out"):
        run_study(load_study(study_file), tmp_path / "out")
    study_file.write_text("config: base.yaml\nseeds: [1]\nvariants: {a: []}\n")
    with pytest.raises(ConfigError, match="the command line: override 'run.seed=3'.*seeds"):
        run_study(load_study(study_file), tmp_path / "out", extra=("run.seed=3",))
    (tmp_path / "out" / "a").mkdir(parents=True)
    (tmp_path / "out" / "a" / "config.yaml").write_text("{}\n")  # a run of the study without seeds
    with pytest.raises(MinilmError, match="holds runs without seeds"):
        run_study(load_study(study_file), tmp_path / "out", resume=True)


@pytest.mark.parametrize("name", ["out #1", "a: b", "[x], {y}", "été"])
def test_each_run_is_placed_under_out_whatever_characters_its_path_holds(tmp_path, study_file, name):
    """The run directory reached load_config as a YAML override: '--out "runs/s #1"' put every run in 'runs/s' (' #1'
    a comment), the second refused as 'already holds a run', and 'a: b' was refused as a mapping."""
    study = load_study(study_file)
    out = tmp_path / name
    for run in study_runs(study):
        assert run_config(study, run, out, []).run.dir == str(out / run.label)


def test_a_study_into_an_out_holding_another_studys_summary_is_refused(tmp_path, study_file):
    """A second study given the --out of a first (its variants named otherwise) trained beside its runs and replaced
    its study.md / study.json / compare.* without a word."""
    from minilm.study import run_study

    out = tmp_path / "out"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"name": "first", "variants": []}))
    with pytest.raises(MinilmError, match=f"holds study 'first'.*study '{study_file.stem}' would replace its summary"):
        run_study(load_study(study_file), out, resume=True)
    assert sorted(p.name for p in out.iterdir()) == ["study.json"]  # nothing trained, nothing written


def test_a_failing_run_still_leaves_the_summary_of_the_finished_ones(tmp_path, study_file, monkeypatch):
    import minilm.study as study_mod

    def fail(study, run, out_dir, *args):
        if run.variant == "pi":
            raise MinilmError("phase 'long': loss is nan")
        (out_dir / run.label).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(study_mod, "_train_run", fail)
    # which run failed: the phase the error names, every run of the study has (a seed's runs, every seed's)
    with pytest.raises(MinilmError, match="^'pi': phase 'long': loss is nan$"):
        study_mod.run_study(load_study(study_file), tmp_path / "out", log=lambda msg: None)
    assert "| yarn |" in (tmp_path / "out" / "study.md").read_text()


def test_a_resumed_study_removes_the_temporary_files_a_kill_left_while_writing_its_summary(tmp_path, study_file,
                                                                                           monkeypatch):  # fmt: skip
    """A kill while the summary was written (compare.png's figure, study.json) left its atomic write's temporary file
    in <out>/, and the --resume that finished the study wrote the summary beside it, for good; a kill while a shared
    phase was copied left <run>/<phase>.<pid>.copying, for good where --only never took that run again. A live
    process's (a study writing there now) is kept."""
    import subprocess
    import sys

    import minilm.study as study_mod

    monkeypatch.setattr(study_mod, "_train_run", lambda study, run, out_dir, *a: (out_dir / run.label).mkdir(
        exist_ok=True))
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # the killed process: its pid exists no more
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = [out / f".compare.png.{dead.pid}.tmp", out / f".study.json.{dead.pid}.tmp"]
        writing = out / f".study.md.{live.pid}.tmp"
        for path in [*left, writing]:
            path.write_bytes(b"half")
        copies = [out / "pi" / f"short.{dead.pid}.copying", out / "alibi" / "short.copying"]  # (the second: as
        copying = out / "yarn" / f"short.{live.pid}.copying"  # minilm named it before the pid)
        for path in [*copies, copying]:
            (path / "eval").mkdir(parents=True)
        study_mod.run_study(load_study(study_file), out, resume=True, only=["yarn"], log=lambda msg: None)
    finally:
        live.kill()
        live.wait()
    assert [p.name for p in left if p.exists()] == [] and writing.exists()
    assert [p.name for p in copies if p.exists()] == [] and copying.exists()
    assert (out / "study.md").is_file()


def test_only_rank_zero_prints_the_studys_lines(tmp_path, study_file, monkeypatch):
    """Under DDP every rank runs the whole study; its lines ('study …: <run> (overrides)', the summary's path) were
    printed once per rank."""
    import minilm.study as study_mod
    import minilm.training.run_checks as run_checks

    def train(study, run, out_dir, cfg, shared, log):
        log(f"training {run.label}")

    monkeypatch.setattr(study_mod, "_train_run", train)
    printed = {}
    for rank in (0, 1):
        monkeypatch.setattr(run_checks, "is_primary_process", lambda: rank == 0)
        lines = printed[rank] = []
        study_mod.run_study(load_study(study_file), tmp_path / f"out{rank}", log=lines.append)
    assert any("training" in line for line in printed[0]) and printed[1] == []


def test_a_variant_edited_after_it_finished_is_refused_with_the_study_remedy(tmp_path, study_file, capsys):
    """A finished run whose variant now trains a phase differently must not be kept (nor silently retrained):
    the refusal names the key and says what to do in a study (train.py's --phase does not apply)."""
    from minilm.config import save_config
    from minilm.files import atomic_write_text

    study_file.write_text("config: base.yaml\nvariants: {a: []}\n")
    out = tmp_path / "out"
    old = run_config(load_study(study_file), study_runs(load_study(study_file))[0], out, [])
    for phase in ("short", "long"):  # a finished run, as the study trained it before the edit
        save_config(phase_config(old, phase), out / "a" / phase / "config.yaml")
        atomic_write_text(out / "a" / phase / "complete.json", "{}")
    study_file.write_text("config: base.yaml\nvariants: {a: [phases.long.lr=0.01]}\n")
    assert _study([study_file, "--out", out, "--resume", "train.log_every=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'a': --resume: phase 'long' finished with phases.long.lr" in err and "--phase" not in err
    # the remedy is a command to run: the changed phase removed, then this study continued
    assert err.endswith(f"continue the study: rm -r {out / 'a' / 'long'} && python scripts/study.py {study_file} "
                        f"--out {out} --resume train.log_every=2")


def test_a_phase_a_command_line_override_changed_is_not_blamed_on_the_study_file(tmp_path, study_file, capsys):
    """The refusal's advice said "to retrain it as the study file now says" when the change came from a key=value
    argument, the study file unchanged: it now names both sources."""
    from minilm.config import save_config
    from minilm.files import atomic_write_text

    study_file.write_text("config: base.yaml\nvariants: {a: []}\n")
    out = tmp_path / "out"
    old = run_config(load_study(study_file), study_runs(load_study(study_file))[0], out, [])
    for phase in ("short", "long"):  # a finished run, as the study trained it
        save_config(phase_config(old, phase), out / "a" / phase / "config.yaml")
        atomic_write_text(out / "a" / phase / "complete.json", "{}")
    assert _study([study_file, "--out", out, "--resume", "phases.long.lr=0.01"]) == 2  # the file as it was
    err = capsys.readouterr().err
    assert "'a': --resume: phase 'long' finished with phases.long.lr" in err and "study file now says" not in err
    assert "To retrain it as the study file and command line now say, delete the changed phases" in err


def test_every_run_a_changed_study_file_refuses_is_named_in_one_remedy(tmp_path, study_file):
    from minilm.config import save_config
    from minilm.files import atomic_write_text
    from minilm.study import run_study

    study_file.write_text("config: base.yaml\nseeds: [1, 2]\nvariants: {a: []}\n")
    out = tmp_path / "out"
    for run in study_runs(load_study(study_file)):
        old = run_config(load_study(study_file), run, out, [])
        for phase in ("short", "long"):
            save_config(phase_config(old, phase), out / run.label / phase / "config.yaml")
            atomic_write_text(out / run.label / phase / "complete.json", "{}")
    study_file.write_text("config: base.yaml\nseeds: [1, 2]\nvariants: {a: [phases.short.lr=0.01]}\n")
    with pytest.raises(MinilmError) as e:
        run_study(load_study(study_file), out, resume=True, log=lambda msg: None, again="AGAIN")
    assert "'a/seed1': --resume: phase 'short' finished with phases.short.lr" in str(e.value)
    assert "so do 'a/seed2' (short)" in str(e.value)
    dirs = " ".join(str(out / f"a/seed{s}/{p}") for s in (1, 2) for p in ("short", "long"))
    assert str(e.value).endswith(f"rm -r {dirs} && AGAIN")


def test_resume_checks_every_run_it_continues_before_the_first_one_trains(tmp_path, study_file, monkeypatch):
    """A run edited after it finished was refused only at its turn, after the hours of the variants before it: it is
    refused before anything trains (and before any corpus is prepared), naming the run."""
    import minilm.training.phases as phases_mod
    from minilm.config import load_config
    from minilm.study import run_study

    trained = []
    monkeypatch.setattr(phases_mod, "run_phases", lambda cfg, resume, log, notes: trained.append(cfg.run.name))
    study_file.write_text("config: base.yaml\nvariants: {yarn: [], pi: [phases.long.lr=0.001]}\n")
    out = tmp_path / "out"
    older = load_config(study_file.parent / "base.yaml", ["phases.long.lr=0.002", f"run.dir={out / 'pi'}"])
    _finished(older, out / "pi", ["short", "long"])  # pi as it trained before its variant was edited
    with pytest.raises(MinilmError, match=r"'pi': --resume: phase 'long' finished with phases.long.lr = 0.002.*study"):
        run_study(load_study(study_file), out, resume=True, log=lambda msg: None)
    assert trained == [] and not (tmp_path / "cache").exists()  # not yarn first, then the refusal


def test_mean_sd_is_the_sample_sd_over_the_measured_values():
    from minilm.study import mean_sd

    assert mean_sd([1.0, None, 3.0]) == {"mean": 2.0, "sd": pytest.approx(2 ** 0.5), "n": 2}  # n - 1 in the sd
    assert mean_sd([5.0]) == {"mean": 5.0, "sd": 0.0, "n": 1} and mean_sd([None]) is None


def test_a_table_cell_shows_sd_and_how_many_seeds_it_averages_when_some_are_missing():
    from minilm.study import _cell

    assert _cell({"mean": 1.5, "sd": 0.25, "n": 2}, 2, 3) == "1.50 ± 0.25 (n=2)"
    assert _cell({"mean": 1.5, "sd": 0.25, "n": 3}, 2, 3) == "1.50 ± 0.25"
    assert _cell({"mean": -0.5, "sd": 0.0, "n": 1}, 1, 1, sign="+") == "-0.5" and _cell(None, 2, 3) == "–"
    assert _cell({"mean": 1.5, "sd": 0.0, "n": 1}, 2, 3) == "1.50 (n=1)"  # one value: no spread to show


def test_a_difference_that_rounds_to_zero_has_no_sign():
    """The paired-difference table printed '-0.0000 ± 0.0001' for a tiny negative mean: a sign the digits do not
    support. Zero as shown is '0.0000'; real signs stay."""
    from minilm.study import _cell

    assert _cell({"mean": -0.00004, "sd": 0.0001, "n": 3}, 4, 3, sign="+") == "0.0000 ± 0.0001"
    assert _cell({"mean": 0.00004, "sd": 0.0001, "n": 3}, 4, 3, sign="+") == "0.0000 ± 0.0001"
    assert _cell({"mean": -0.004, "sd": 0.01, "n": 3}, 2, 3, sign="+") == "0.00 ± 0.01"
    assert _cell({"mean": -0.00006, "sd": 0.0001, "n": 3}, 4, 3, sign="+") == "-0.0001 ± 0.0001"
    assert _cell({"mean": 0.0002, "sd": 0.0, "n": 1}, 4, 1, sign="+") == "+0.0002"
    assert _cell({"mean": -0.001, "sd": 0.0, "n": 1}, 2, 1) == "0.00"


def test_paired_differences_are_other_minus_reference_per_seed_on_the_last_phase():
    from minilm.study import paired_differences

    def variant(losses_by_seed, ppl_by_seed):
        runs = {f"v/seed{s}": {"seed": s, "val_loss": {"pre": 9.0, "ext": loss}} for s, loss in losses_by_seed.items()}
        return {"runs": runs}, {s: {"ppl": {"64": p}} for s, p in ppl_by_seed.items()}

    ref = variant({1: 2.0, 2: 3.0}, {1: 10.0, 2: 20.0})
    other = variant({1: 2.5, 2: 3.0}, {1: 12.0})  # seed 2 has no evaluation: only seed 1 is paired for ppl
    diffs = paired_differences(ref, other)
    assert diffs["val_loss"]["mean"] == pytest.approx(0.25) and diffs["val_loss"]["n"] == 2
    assert diffs["ppl@64"] == {"mean": 2.0, "sd": 0.0, "n": 1}


def test_a_study_without_seeds_may_set_each_variant_s_seed(tmp_path, study_file):
    """run.seed is the study's only when it has ``seeds:``; without them a variant (or the command line) sets its
    own, as in any config."""
    study_file.write_text("config: base.yaml\nvariants: {a: [run.seed=7], b: []}\n")
    study = load_study(study_file)
    a, b = (run_config(study, r, tmp_path / "out", ["optim.lr=0.001"]) for r in study_runs(study))
    assert a.run.seed == 7 and a.run.name == "a" and a.run.dir == str(tmp_path / "out" / "a")
    assert run_config(study, study_runs(study)[1], tmp_path / "out", ["run.seed=5"]).run.seed == 5
    assert b.optim.lr == 0.001


def test_lengths_evaluate_py_chose_for_a_phase_that_names_none_are_not_other_settings(tmp_path, study_file):
    """A phase without eval_lengths is evaluated at the lengths scripts/evaluate.py chooses: those are not settings
    the study asks otherwise (no remedy to print), while a phase that names lengths is compared on them."""
    from minilm.study import other_settings

    study = load_study(study_file)
    results = {"lengths": [32, 64, 128], "tasks": ["ppl"], "extension": None}
    run = study_runs(study)[0]
    unnamed = run_config(study, run, tmp_path / "out", ["phases.long.eval_lengths=[]"])
    assert other_settings(results, phase_config(unnamed, "long")) == {}
    named = run_config(study, run, tmp_path / "out", [])
    assert other_settings(results, phase_config(named, "long")) == {"lengths": ([32, 64, 128], [32, 64])}


def test_a_long_override_is_cut_in_the_table_cell_only():
    from minilm.study import _short

    assert _short("a=1   b") == "a=1 b"  # whitespace runs (a YAML flow list over lines) as one space
    long = "phases.x.position.scaling={long_factor: [" + ", ".join(["1.5"] * 40) + "]}"
    cell = _short(long)
    assert len(cell) == 100 and cell.endswith("…") and long.startswith(cell[:-1])
    assert _short("x" * 100) == "x" * 100


def test_carrying_the_optimizer_into_a_phase_makes_it_another_phase():
    """A phase that starts from the previous phase's optimizer moments trains differently from one that starts
    afresh: the phase keys differ from that phase on (so a variant never copies it), not before."""
    from minilm.config import load_config

    base = load_config(str(REPO / "configs" / "rope_yarn_tiny.yaml"))
    last = phase_names(base)[-1]
    for carry in ("true", "false"):
        other = load_config(str(REPO / "configs" / "rope_yarn_tiny.yaml"), [f"phases.{last}.carry_optimizer={carry}"])
        same = bool(base.phases[last].carry_optimizer) == (carry == "true")
        assert phase_keys(other)[:-1] == phase_keys(base)[:-1]
        assert (phase_keys(other)[-1] == phase_keys(base)[-1]) == same


def test_a_variant_whose_phases_evaluate_nowhere_is_read_from_its_last_phase(tmp_path, study_file):
    """No phase names eval_lengths: scripts/evaluate.py writes into the last phase's eval/, so that is the
    evaluation the summary reads (and waits for), not the first phase's."""
    from minilm.study import _variant_summary

    study = load_study(study_file)
    cfgs = {r.label: run_config(study, r, tmp_path / "out", ["phases.short.eval_lengths=[]",
                                                                "phases.long.eval_lengths=[]"])
            for r in study_runs(study)}  # fmt: skip
    entry, results = _variant_summary(study, study.variants[0], tmp_path / "out", cfgs)
    assert entry["evaluated_phase"] == "long" and results == {}


def test_a_mean_over_seeds_records_every_seed_it_averages(tmp_path):
    """compare() of a study's variants read each mean's seed as its first run's: a mean over seeds 1 and 2 beside one
    over seed 1 alone (its seed 2 not finished) passed as evaluated alike, though one averages other text."""
    from minilm.eval.report import setting_differences
    from minilm.study import _averaged

    def averaged(variant: str, seeds: list) -> dict:
        results = [{"seed": s, "ppl": {"64": 5.0}, "batches": 1, "batch_tokens": 64, "stride": None} for s in seeds]
        return _averaged(results, {"variant": variant, "evaluation": {"ppl": {"64": {"mean": 5.0}}}}, tmp_path)

    both, alike, first = averaged("a", [1, 2]), averaged("b", [1, 2]), averaged("c", [1])
    assert both["seed"] == [1, 2] and first["seed"] == 1
    assert setting_differences([both, alike], ["a", "b"]) == []
    [warning] = setting_differences([both, first], ["a", "c"])
    assert warning.startswith("evaluated with different seed: [1, 2] (a); 1 (c).")


def test_a_mean_over_seeds_has_a_column_for_every_length_any_seed_was_evaluated_at(tmp_path):
    """A study's compare.md took its columns from each variant's first seed: a length only a later seed was
    evaluated at (the study resumed with longer eval_lengths) was drawn in compare.png but had no column."""
    from minilm.eval import compare
    from minilm.study import _averaged

    results = [{"seed": 1, "lengths": [64], "ppl": {"64": 5.0}},
               {"seed": 2, "lengths": [64, 128], "ppl": {"64": 7.0, "128": 9.0}}]  # fmt: skip
    evaluation = {"ppl": {"64": {"mean": 6.0}, "128": {"mean": 9.0}}}
    mean = _averaged(results, {"variant": "a", "evaluation": evaluation}, tmp_path)
    _, table = compare([mean], ["a"], tmp_path / "cmp")
    assert "| run | 64 | 128 |" in table.read_text() and "| a | 6.00 | 9.00 |" in table.read_text()


def test_a_warning_on_every_runs_phases_is_said_once_before_the_first_run_not_once_per_run(tmp_path, study_file):
    """A study trained with few steps printed the same warmup warning for every run (5 runs × 3 phases: 15 lines).
    It now says each distinct warning once, before training, naming the runs it concerns unless they are all; the
    runs' own run_phases do not repeat it (train.py still says it: run_phases' notes=True)."""
    from minilm.study import run_study

    study_file.write_text("config: base.yaml\nvariants: {a: [], b: [train.log_every=3]}\n")
    logged = []
    extra = ("optim.warmup_steps=7", "phases.long.warmup_steps=20", "train.val_every=0",
             "phases.short.eval_lengths=[]", "phases.long.eval_lengths=[]")  # fmt: skip
    out = run_study(load_study(study_file), tmp_path / "out", extra=extra, log=logged.append)
    short = [line for line in logged if "optim.warmup_steps = 7 is longer than phase 'short'" in line]
    long = [line for line in logged if "phases.long.warmup_steps = 20 is longer than phase 'long'" in line]
    assert len(short) == 1 and short[0].startswith("warning: ") and short[0].endswith(" (every run)"), short
    assert len(long) == 1 and long[0].endswith(" (every run)"), long
    assert logged.index(short[0]) < next(i for i, line in enumerate(logged) if "'a' (" in line)  # before training
    # b/long alone left to train: b's warning alone is said, without '(every run)' of one run
    shutil.rmtree(out / "b" / "long")
    logged.clear()
    run_study(load_study(study_file), out, extra=extra, resume=True, log=logged.append)
    assert [line for line in logged if "is longer than" in line] == [long[0][: -len(" (every run)")] + " (runs b)"]


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_whose_lock_a_live_process_holds_is_refused_first_as_in_use(tmp_path, study_file, resume):
    """--out/RUN holding only the .lock of a study training there now was refused as "already holds this study's
    runs; continue it (--resume)", and with --resume noted that the run "starts from step 0" before refusing it as
    in use. It is refused as in use, before any run is checked, naming --out."""
    import fcntl

    from minilm.errors import MinilmError
    from minilm.study import run_study, study_runs

    study = load_study(study_file)
    run_dir = tmp_path / "out" / study_runs(study)[0].label
    run_dir.mkdir(parents=True)
    said = []
    with open(run_dir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # (this process: as another one's, the flock is what is_locked reads)
        with pytest.raises(MinilmError, match=r"is in use by another process \(lock file .*\.lock\): another "
                                              r"study or train\.py .*give this study another --out"):  # fmt: skip
            run_study(study, tmp_path / "out", resume=resume, share=False, log=said.append)
    assert not any("starts from step 0" in line for line in said), said


def test_a_run_another_process_trains_names_out_not_run_dir(tmp_path, study_file, monkeypatch):
    """A study's run locked by another process (a second study.py on the same --out) was refused with train.py's
    remedy, 'choose another run.dir', where a study's runs are placed by its --out."""
    import socket

    import minilm.training.phases as phases_mod
    from minilm.errors import MinilmError
    from minilm.study import run_study

    def locked(cfg, resume, log, notes):
        run_dir = Path(cfg.run.dir)
        run_dir.mkdir(parents=True)
        (run_dir / ".lock").write_text(f"1 {socket.gethostname()}")  # pid 1 lives: the lock is respected
        with phases_mod.run_lock(run_dir, log=log):
            pass

    monkeypatch.setattr(phases_mod, "run_phases", locked)
    with pytest.raises(MinilmError) as err:
        run_study(load_study(study_file), tmp_path / "out", share=False, log=lambda m: None)
    said = str(err.value)
    assert said.startswith("'yarn-s0': ") or said.startswith("'yarn'"), said
    assert "is in use by process 1" in said and "give this study another --out" in said and "run.dir" not in said
