"""Preparation that does not finish: a killed or interrupted one, a full disk, two at once on one cache."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minilm.data import load_corpus
from minilm.data import prepare as prepare_mod
from minilm.errors import DataError
from tests.conftest import REPO, load_script


def _entries(cache: Path) -> list:
    return sorted(p.name for p in cache.iterdir())


def _disk_full_at(monkeypatch, target, name: str, code: int = errno.ENOSPC) -> None:
    """``target.name`` writes part of its file, then fails as a full disk does."""

    def full(path, *a, **k):
        with open(path, "wb") as f:  # half-written: must not stay behind
            f.write(b"\0" * 100)
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(target, name, full)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_while_writing_the_corpus_is_an_error_saying_so(files_cfg, monkeypatch, code):
    """A full disk was an OSError traceback from numpy, its temporary directory left behind (taking up the space
    the user had to free)."""
    cfg = files_cfg()
    _disk_full_at(monkeypatch, np, "savez", code)  # the document index, written after the tokens
    with pytest.raises(DataError) as e:
        load_corpus(cfg, progress=False)
    what = re.escape("the disk is full (No space left" if code == errno.ENOSPC
                     else "the quota is exhausted (Disk quota")  # fmt: skip
    says = (rf"^data\.cache_dir: no space left to write the prepared corpus under '{cfg.cache_dir}': {what}.*\); "
            rf"the corpus needs about \d+\.\d MB and [\d,]+\.\d MB are free there\. Nothing half-written was kept\. "
            rf"Free some space, or set data\.cache_dir to a directory on a disk with room$")  # fmt: skip
    assert e.match(says)
    assert _entries(Path(cfg.cache_dir)) == []
    monkeypatch.undo()
    corpus = load_corpus(cfg, progress=False)  # space freed: prepared as if nothing had happened
    need = float(str(e.value).split("needs about ")[1].split(" MB")[0])
    size = sum(f.stat().st_size for f in corpus.cache_dir.iterdir()) / 1e6
    assert size * 0.9 - 0.1 <= need <= size * 1.1 + 0.1  # the estimate is the size of the corpus written


def test_a_full_disk_while_writing_the_tokenizer_is_an_error_saying_so(files_cfg, monkeypatch):
    cfg = files_cfg()
    _disk_full_at(monkeypatch, Path, "write_bytes")  # sentencepiece's model, written before any token
    with pytest.raises(DataError, match=r"data\.cache_dir: no space left .* the disk is full .*; [\d,]+\.\d MB are "
                                        r"free there\. Nothing half-written was kept"):  # fmt: skip
        load_corpus(cfg, progress=False)
    assert _entries(Path(cfg.cache_dir)) == []


def test_a_full_disk_in_a_local_files_conversion_names_the_cache_dir(tmp_path, monkeypatch):
    """datasets converts a .jsonl file inside the corpus being built: a full disk there came wrapped in datasets'
    error and was reported as a broken data file."""
    import datasets

    from tests.data.conftest import make_data_cfg

    (tmp_path / "r.jsonl").write_text("".join(f'{{"text": "record {i}"}}\n' for i in range(50)))
    cfg = make_data_cfg(tmp_path, {"r": {"kind": "files", "paths": [str(tmp_path / "r.jsonl")]}})

    def full(*a, **k):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise datasets.exceptions.DatasetGenerationError("An error occurred while generating the dataset") from e

    monkeypatch.setattr(datasets, "load_dataset", full)
    with pytest.raises(DataError, match=r"^data\.cache_dir: no space left .* the disk is full"):
        load_corpus(cfg, progress=False)
    assert _entries(Path(cfg.cache_dir)) == []


def test_a_full_disk_in_datasets_own_cache_names_that_cache(tmp_path, monkeypatch):
    """A Hub dataset is downloaded into datasets' cache, not data.cache_dir: a full disk there names that cache."""
    import datasets

    from tests.data.conftest import make_data_cfg

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets, "load_dataset", full)
    cfg = make_data_cfg(tmp_path, {"hub": {"kind": "hf", "path": "someone/stories"}})
    says = (rf"^data\.sources\.hub: no space left on the disk of datasets' cache "
            rf"\({re.escape(str(datasets.config.HF_DATASETS_CACHE))}\).*HF_DATASETS_CACHE to a directory on a disk "
            rf"with room$")  # fmt: skip
    with pytest.raises(DataError, match=says):
        load_corpus(cfg, progress=False)
    assert _entries(Path(cfg.cache_dir)) == []


def test_prepare_data_script_on_a_full_disk_exits_2_without_a_traceback(tmp_path, tiny_text_dir, monkeypatch,
                                                                         capsys):  # fmt: skip
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(f"""
data:
  cache_dir: {tmp_path / 'cache'}
  tokenizer: {{vocab_size: 320, sample_chars: 100000}}
  sources: {{embedded: null, tiny: {{kind: files, paths: ["{tiny_text_dir}/*.py"]}}}}
""")
    _disk_full_at(monkeypatch, np, "savez")
    assert load_script("scripts/prepare_data.py").main(["--config", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "error: data.cache_dir: no space left to write the prepared corpus" in err and "Traceback" not in err
    assert _entries(tmp_path / "cache") == []


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0  # fmt: skip


def test_a_really_full_disk_is_a_message_not_a_bus_error(tmp_path):
    """The tokens were written through a memmap of a sparse file: on a full disk the process died of SIGBUS
    ("Bus error", exit code 135) without a message, its temporary directory left on the full disk. Needs root
    (a small tmpfs is the full disk); skipped elsewhere."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "256k"):
        pytest.skip("needs root and mount (a small tmpfs plays the full disk)")
    try:
        corpus = tmp_path / "corpus"
        corpus.mkdir()
        rng = np.random.default_rng(0)
        for i in range(40):  # about 1 MB of text: its tokens cannot fit in 256 kB; the tokenizer (a few kB) can
            (corpus / f"{i}.txt").write_text(" ".join(rng.choice(["alpha", "beta", "gamma", "x", "7"], 5000)))
        cfg = tmp_path / "exp.yaml"
        cfg.write_text(f"""
data:
  cache_dir: {disk / 'cache'}
  tokenizer: {{vocab_size: 300, sample_chars: 100000}}
  sources: {{embedded: null, mine: {{kind: files, paths: ["{corpus}/*.txt"]}}}}
""")
        proc = subprocess.run([sys.executable, str(REPO / "scripts/prepare_data.py"), "--config", str(cfg), "--quiet"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "error: data.cache_dir: no space left to write the prepared corpus" in proc.stderr
        assert "the disk is full" in proc.stderr and "Traceback" not in proc.stderr
        assert _entries(disk / "cache") == []
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_two_preparations_of_one_corpus_at_once_both_end_with_it(files_cfg, monkeypatch):
    """Two runs (two train.py, the ranks of a DDP job) preparing one corpus at the same time: the one that finishes
    second finds the first's corpus in place, keeps it and removes its own copy."""
    cfg = files_cfg()
    sync_tree = prepare_mod._sync_tree
    inner = []

    def finished_elsewhere_first(directory):  # just before this preparation's rename, another one completes
        if not inner:
            inner.append(None)
            inner[0] = load_corpus(cfg, progress=False)
        sync_tree(directory)

    monkeypatch.setattr(prepare_mod, "_sync_tree", finished_elsewhere_first)
    corpus = load_corpus(cfg, progress=False)
    assert corpus.cache_dir == inner[0].cache_dir
    assert np.array_equal(corpus.train.tokens, inner[0].train.tokens)
    assert _entries(Path(cfg.cache_dir)) == [corpus.cache_dir.name]


@pytest.mark.parametrize("stage", ["read_source", "_tokenize", "_write_split"])
def test_an_interrupted_preparation_leaves_nothing_and_the_next_one_succeeds(files_cfg, monkeypatch, stage, capsys):
    cfg = files_cfg()

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_mod, stage, interrupt)
    with pytest.raises(KeyboardInterrupt):
        load_corpus(cfg, progress=False)
    assert _entries(Path(cfg.cache_dir)) == []
    monkeypatch.undo()
    corpus = load_corpus(cfg, progress=False)
    assert not corpus.from_cache and _entries(Path(cfg.cache_dir)) == [corpus.cache_dir.name]
