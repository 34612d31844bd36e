"""scripts/prepare_data.py: prints stats and the per-phase long share; bad input -> message and exit code 2."""

from __future__ import annotations

import re

import pytest

from tests.conftest import load_script


@pytest.fixture
def script():
    return load_script("scripts/prepare_data.py")


def _yaml(tmp_path, tiny_text_dir, extra: str = "") -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
data:
  cache_dir: {tmp_path / 'cache'}
  num_proc: 1
  tokenizer: {{vocab_size: 320, sample_chars: 100000}}
  sources:
    embedded: {{kind: embedded, weight: 0, max_docs: 3}}  # the default source, kept tiny
    tiny: {{kind: files, paths: ["{tiny_text_dir}/*.py"]}}
train: {{seq_len: 64, batch_size: 2}}
phases:
  short: {{seq_len: 64, steps: 1}}
  long: {{seq_len: 256, steps: 1, data: {{long_fraction: 0.5}}}}
{extra}""")
    return str(path)


def test_prints_stats_and_long_share_per_phase(script, tmp_path, tiny_text_dir, capsys):
    assert script.main(["--config", _yaml(tmp_path, tiny_text_dir), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "train:" in out and "skipped files" in out
    assert "phase short: seq_len 64" in out and "phase long: seq_len 256" in out
    # documents and tokens per source too, as docs/data.md says (they were in stats.json alone)
    assert re.search(r"\n  train: .*\n    by source: embedded \d+ docs, [\d,]+ tokens; tiny \d+ docs, ", out)
    assert script.main(["--config", _yaml(tmp_path, tiny_text_dir), "--quiet"]) == 0
    assert "(cached)" in capsys.readouterr().out


def test_bad_input_exits_2_with_a_message(script, tmp_path, tiny_text_dir, capsys):
    cfg = _yaml(tmp_path, tiny_text_dir)
    assert script.main(["--config", cfg, "--quiet", "data.sources.tiny.paths=[/nonexistent/*.txt]"]) == 2
    err = capsys.readouterr().err
    assert "data.sources.tiny.paths" in err and "Traceback" not in err
    assert script.main(["--config", cfg, "--quiet", "phases.long.data.long_min_tokens=100000"]) == 2
    # each key named as the config sets it: the phase's own long_fraction and seq_len, the run's batch_size
    err = capsys.readouterr().err
    assert "phase 'long': phases.long.data.long_fraction=0.5 but no train document" in err
    assert "lower phases.long.data.long_fraction or phases.long.data.long_min_tokens," in err
    assert script.main(["--config", cfg, "--quiet", "phases.long.seq_len=100000"]) == 2  # as training refuses it
    err = capsys.readouterr().err
    assert "phase 'long': the sources sampled (tiny) have" in err
    assert "lower train.batch_size / phases.long.seq_len" in err


def test_long_share_and_check_count_only_the_sources_a_phase_samples(script, tmp_path, tiny_text_dir, capsys):
    """The long documents of a weight-0 source are never drawn: the phase line counted them (so it read fine) and
    the check passed, while train.py refused the phase; the sampler's error quoted their length as the longest."""
    cfg = _yaml(tmp_path, tiny_text_dir).replace("max_docs: 3", "max_docs: 40")  # the stdlib: long documents
    longest = max(len(p.read_text()) for p in tiny_text_dir.glob("*.py"))  # >= tokens of the longest tiny doc
    assert script.main(["--config", cfg, "--quiet", f"phases.long.seq_len={longest}"]) == 2
    out, err = capsys.readouterr()
    said = f"phase long: seq_len {longest}, long_fraction 0.5: 0.0% of the train tokens of tiny are in the 0 docs"
    assert said in out
    assert "phase 'long': phases.long.data.long_fraction=0.5 but no train document" in err
    shown = int(err.split("(longest: ")[1].split(")")[0])
    assert shown < longest  # the longest *tiny* document, not a stdlib file


def test_stats_are_printed_once(script, tmp_path, tiny_text_dir, capsys):
    """Without --quiet, load_corpus prints the stats of the corpus it prepared, and the script printed them again."""
    for _ in range(2):  # prepared, then cached
        assert script.main(["--config", _yaml(tmp_path, tiny_text_dir)]) == 0
        assert capsys.readouterr().out.count("skipped files:") == 1


def test_a_bad_weight_in_a_phase_is_named_with_the_phase_as_train_py_names_it(script, tmp_path, tiny_text_dir, capsys):
    """The per-phase long-share line read the phase's sources before check_phase_data: a phase's weight .nan (or
    every weight 0) was reported as "data.sources...", not naming the phase train.py names."""
    cfg = _yaml(tmp_path, tiny_text_dir)
    for override, says in (("phases.long.data.sources.tiny.weight=.nan", "data.sources.tiny.weight: must be a finite"),
                           ("phases.long.data.sources.tiny.weight=0", "data.sources: all weights are zero")):
        assert script.main(["--config", cfg, "--quiet", override]) == 2  # refused by the config's check, as train.py
        assert f"error: phases.long.{says}" in capsys.readouterr().err


def test_weights_are_said_once_not_for_each_phase_and_check(script, tmp_path, tiny_text_dir, caplog):
    """parse_sources said "data.sources.embedded.weight is 0: prepared but not sampled" each time it read the sources
    (the config's checks, the corpus, each phase's samplers and its style: 7 times for two phases), and a phase's
    normalized weights were said twice, once under phases.long.data.sources and once under data.sources."""
    cfg = _yaml(tmp_path, tiny_text_dir)
    with caplog.at_level("INFO"):
        assert script.main(["--config", cfg, "--quiet", "phases.long.data.sources.tiny.weight=2"]) == 0
    said = [r.getMessage() for r in caplog.records]
    assert sum("embedded.weight is 0: prepared but not sampled" in m for m in said) == 1, said
    assert [m for m in said if "sum to" in m] == ["phases.long.data.sources weights embedded 0, tiny 2 sum to 2: each "
                                                  "source's share of the rows is embedded 0, tiny 1"], said
