"""Preparation that does not finish: a killed or interrupted one, a full disk, two at once on one cache."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from minilm.data import load_corpus
from minilm.data import prepare as prepare_mod
from minilm.errors import DataError
from tests.conftest import REPO, load_script

# a preparation that makes its temporary directory, then hangs there until it is killed
HANGING = textwrap.dedent("""\
    import sys, time
    from omegaconf import OmegaConf
    from minilm.data import prepare
    prepare._prepare = lambda *a, **k: time.sleep(300)
    prepare.load_corpus(OmegaConf.load(sys.argv[1]), progress=False)
    """)


def _entries(cache: Path) -> list:
    return sorted(p.name for p in cache.iterdir())


def _hanging_preparation(cfg, tmp_path: Path) -> subprocess.Popen:
    """A preparation of ``cfg`` in another process, once it has made its temporary directory under the cache."""
    (tmp_path / "data.yaml").write_text(OmegaConf.to_yaml(cfg))
    cache = Path(cfg.cache_dir)
    before = set(cache.glob("*.tmp-*"))
    proc = subprocess.Popen([sys.executable, "-c", HANGING, str(tmp_path / "data.yaml")], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    deadline = time.time() + 60
    while not set(cache.glob("*.tmp-*")) - before:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise AssertionError(f"the preparation made no temporary directory (exit code {proc.poll()})")
        time.sleep(0.05)
    return proc


def test_the_leftover_of_a_killed_preparation_goes_at_the_next_one_but_not_a_live_ones(files_cfg, tmp_path):
    """A preparation killed with SIGKILL (the OOM killer, a lost session) left its corpus-*.tmp-* directory in the
    cache for good, each possibly hundreds of MB. The next preparation now removes it, and never the directory of
    a preparation that is still running."""
    cfg = files_cfg()
    cache = Path(cfg.cache_dir)
    cache.mkdir(parents=True)
    proc = _hanging_preparation(cfg, tmp_path)
    try:
        (live,) = cache.glob("*.tmp-*")
        (live / "train.tokens.npy").write_bytes(b"\0" * 1000)  # as if it were writing
        # another corpus, at the same time (the same one would wait for it: _preparation_lock): its directory stays
        corpus = load_corpus(files_cfg(**{"tokenizer.vocab_size": 300}), progress=False)
        assert live.is_dir() and (live / "train.tokens.npy").is_file()
        assert _entries(cache) == sorted([corpus.cache_dir.name, live.name, live.name.split(".tmp-")[0] + ".lock"])
    finally:
        proc.kill()
        proc.wait()
    other = load_corpus(cfg, progress=False)  # the next preparation (the killed one's lock went with it)
    assert _entries(cache) == sorted([corpus.cache_dir.name, other.cache_dir.name])
    assert load_corpus(files_cfg(**{"tokenizer.vocab_size": 300}), progress=False).from_cache  # untouched


def test_only_this_machines_leftovers_of_dead_processes_are_removed(tmp_path, caplog):
    """A cache shared over the network holds other machines' directories, whose pids mean nothing here; an older
    minilm named its directories without the host, so those cannot be told apart: reported, not deleted."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = prepare_mod._host()
    names = {
        "mine_dead": f"corpus-0123456789abcdef.tmp-{host}-{dead.pid}-00c0ffee",
        "mine_live": f"corpus-0123456789abcdef.tmp-{host}-{os.getpid()}-00c0ffee",
        "other_host": f"corpus-0123456789abcdef.tmp-{host}x-{dead.pid}-00c0ffee",
        "old_name": f"corpus-0123456789abcdef.tmp-{dead.pid}-00c0ffee",
        "not_ours": f"notes.tmp-{host}-{dead.pid}-00c0ffee",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("x")
    with caplog.at_level("INFO", logger="minilm.data.prepare"):
        prepare_mod._remove_leftovers(tmp_path)
    assert _entries(tmp_path) == sorted(v for k, v in names.items() if k != "mine_dead")
    assert f"removed {tmp_path / names['mine_dead']}" in caplog.text
    assert f"{tmp_path / names['old_name']} looks left by a preparation that was killed" in caplog.text
    assert prepare_mod._owner(names["old_name"]) == (None, dead.pid)
    assert prepare_mod._owner(names["mine_live"]) == (host, os.getpid())
    assert "-" not in prepare_mod._host() and "/" not in prepare_mod._host()


def test_a_leftover_whose_corpus_lock_is_held_stays_though_its_pid_looks_dead(tmp_path):
    """Containers that share a host name but not a pid namespace see each other's live preparations as dead pids:
    the corpus's preparation lock, held by the live one, keeps its directory. Released, the directory goes; the
    corpus this process is preparing itself (its lock held here) does not protect its own leftovers."""
    import fcntl

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = prepare_mod._host()
    leftover = tmp_path / f"corpus-0123456789abcdef.tmp-{host}-{dead.pid}-00c0ffee"
    mine = tmp_path / f"corpus-fedcba9876543210.tmp-{host}-{dead.pid}-00c0ffee"
    for d in (leftover, mine):
        d.mkdir()
    holders = []
    for name in ("corpus-0123456789abcdef.lock", "corpus-fedcba9876543210.lock"):  # another namespace's; this one's
        fd = os.open(tmp_path / name, os.O_CREAT | os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        holders.append(fd)
    try:
        prepare_mod._remove_leftovers(tmp_path, holding="corpus-fedcba9876543210")
        assert leftover.is_dir() and not mine.exists()
    finally:
        for fd in holders:
            os.close(fd)
    prepare_mod._remove_leftovers(tmp_path)
    assert not leftover.exists()


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


def test_a_preparation_of_a_corpus_being_prepared_waits_for_it_and_loads_it(files_cfg, tmp_path, monkeypatch,
                                                                            capsys):  # fmt: skip
    """The ranks of a DDP job launched before the corpus was prepared (each runs train.py from the start) each
    prepared it whole at the same time: N times the memory, CPU and disk. Now the second waits for the first's
    preparation and loads its corpus; a killed holder's lock goes with its process."""
    cfg = files_cfg()
    proc = _hanging_preparation(cfg, tmp_path)  # holds the lock, until killed
    prepared = []
    real = prepare_mod._prepare
    monkeypatch.setattr(prepare_mod, "_prepare", lambda *a, **k: prepared.append(1) or real(*a, **k))
    killer = threading.Timer(1.0, proc.kill)
    killer.start()
    try:
        t0 = time.time()
        corpus = load_corpus(cfg)
        assert time.time() - t0 >= 0.9  # it waited for the holder, and said so (a waiting rank looks hung)
        assert "waiting for another process preparing" in capsys.readouterr().out
    finally:
        killer.cancel()
        proc.kill()
        proc.wait()
    assert prepared == [1] and not corpus.from_cache
    # a live preparation's lock: a second one waits, then loads what the first renamed into place
    other = files_cfg(**{"tokenizer.vocab_size": 300})
    entered, done = threading.Event(), threading.Event()

    def slow(*a, **k):
        entered.set()
        real(*a, **k)
        done.wait(5)

    monkeypatch.setattr(prepare_mod, "_prepare", slow)
    first = threading.Thread(target=load_corpus, args=(other,), kwargs={"progress": False})
    first.start()
    assert entered.wait(30)
    threading.Timer(0.5, done.set).start()
    monkeypatch.setattr(prepare_mod, "_prepare", lambda *a, **k: pytest.fail("prepared twice"))
    second = load_corpus(other, progress=False)
    first.join()
    assert second.from_cache and "waiting" not in capsys.readouterr().out  # (progress=False: prepare_data --quiet)
    assert _entries(Path(cfg.cache_dir)) == sorted([corpus.cache_dir.name, second.cache_dir.name])


def test_two_preparations_of_one_corpus_at_once_both_end_with_it(files_cfg, monkeypatch):
    """Two runs preparing one corpus at the same time where the preparation lock cannot hold them apart (a network
    file system without flock; two machines): the one that finishes second finds the first's corpus in place,
    keeps it and removes its own copy."""
    cfg = files_cfg()
    monkeypatch.setattr(prepare_mod, "_preparation_lock", lambda *a: contextlib.nullcontext())
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


def test_a_cache_dir_without_flock_prepares_and_keeps_no_lock_file(files_cfg, monkeypatch):
    """A file system refusing flock (ENOLCK: some network file systems): the preparation runs unlocked, as
    docs/data.md says, and its corpus-<key>.lock no longer stays beside the corpora for good."""
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    cfg = files_cfg()
    corpus = load_corpus(cfg, progress=False)
    assert not corpus.from_cache and _entries(Path(cfg.cache_dir)) == [corpus.cache_dir.name]
    assert load_corpus(cfg, progress=False).from_cache
