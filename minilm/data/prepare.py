"""Preparation: sources -> tokenizer -> token memmaps + document index, cached by content hash.

Layout of one prepared corpus (``<data.cache_dir>/corpus-<key>/``)::

    tokenizer.model           the sentencepiece model (trained here, or a copy of data.tokenizer.model_file)
    {train,val}.tokens.npy    1-D uint16/uint32 token stream, EOS after each document (np.load(mmap_mode="r"))
    {train,val}.index.npz     doc_offsets, doc_lengths (EOS included), doc_source (int64 each)
    meta.json                 source names, the hashed key material, vocab size
    stats.json                documents, tokens, length histogram, long-document shares, skipped files

The key hashes the source settings (weights excluded: they only change sampling), the identity of the files
read (path, size, mtime), the tokenizer settings and ``val_fraction``. The directory is built under a temporary
name and renamed into place, so an interrupted or concurrent preparation never leaves a half-written cache.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from minilm.data.sources import SourceDocs, _plain, name_bytes, parse_sources, read_source, source_fingerprint
from minilm.data.tokenizer import Tokenizer, check_trainable, file_digest, sample_chunks, train_tokenizer
from minilm.errors import DataError
from minilm.files import disk_full, fsync_path, is_locked, lock_file, pid_alive

log = logging.getLogger(__name__)

FORMAT_VERSION = 6  # bump when the cache layout, the split, the documents read or the tokenizer training change
SPLITS = ("train", "val")
ENCODE_CHUNK_CHARS = 2_000_000
WRITE_CHUNK_TOKENS = 1 << 24  # tokens of the flat stream written per slice (64 MB of int32 ids)
TMP_MARK = ".tmp-"  # corpus-<key>.tmp-<host>-<pid>-<random>: a corpus being built (_temporary_dir)
SHARE_LENGTHS = tuple(2**k for k in range(6, 18))  # 64 .. 131072: seq_lens the long-document share is reported for


@dataclass
class TokenStore:
    """One split: every document's tokens back to back (EOS after each) plus the document index."""

    tokens: np.ndarray  # (N,) np.memmap, uint16 or uint32
    doc_offsets: np.ndarray  # (D,) int64 start of each document in tokens
    doc_lengths: np.ndarray  # (D,) int64 length including the trailing EOS
    doc_source: np.ndarray  # (D,) int64 index into source_names
    source_names: List[str]

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_docs(self) -> int:
        return int(self.doc_lengths.shape[0])

    def doc(self, i: int) -> np.ndarray:
        """Tokens of document ``i`` (EOS included), a view into the memmap."""
        o = int(self.doc_offsets[i])
        return self.tokens[o : o + int(self.doc_lengths[i])]

    def digest(self) -> str:
        """sha256 of the split's documents (tokens, lengths, sources): equal for the same documents tokenized alike,
        whatever the cache directory or the source files' timestamps."""
        h = hashlib.sha256()
        for part in (np.asarray(self.tokens, dtype=np.int64), self.doc_lengths.astype(np.int64),
                     self.doc_source.astype(np.int64)):  # fmt: skip
            h.update(np.ascontiguousarray(part).tobytes())
        h.update(json.dumps(self.source_names).encode())
        return h.hexdigest()

    def of_sources(self, sources: Sequence[str]) -> np.ndarray:
        """(D,) bool: the documents of the named sources."""
        return np.isin(self.doc_source, [i for i, n in enumerate(self.source_names) if n in set(sources)])

    def only(self, sources: Sequence[str]) -> "TokenStore":
        """The documents of the named sources, back to back in this store's order: this store itself when it holds
        no other source's, else a copy in memory (meant for the held-out split)."""
        keep = self.of_sources(sources)
        if keep.all():
            return self
        docs = np.flatnonzero(keep)
        lengths = self.doc_lengths[docs]
        tokens = np.concatenate([self.doc(int(i)) for i in docs]) if len(docs) else self.tokens[:0].copy()
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)[: len(docs)]
        return TokenStore(tokens, offsets, lengths, self.doc_source[docs], self.source_names)


@dataclass
class Corpus:
    tokenizer: Tokenizer
    train: TokenStore  # held-in documents
    val: TokenStore  # held-out documents (by a hash of each document's name)
    cache_dir: Path  # this corpus's directory
    stats: Dict[str, Any]
    from_cache: bool  # True when nothing was prepared by this call

    @property
    def source_names(self) -> List[str]:
        return self.train.source_names


# ------------------------------------------------------------------------------------------------ public API


def load_corpus(data_cfg: Any, *, progress: bool = True) -> Corpus:
    """Load the prepared corpus for ``data_cfg`` from the cache, preparing it first when missing."""
    # every source is prepared, weight 0 included: a phase may raise that weight later (phases re-weight the run's
    # sources but cannot add one), and the tokenizer must not change between phases
    specs = parse_sources(data_cfg.sources)
    for name in [n for n, s in specs.items() if s.weight == 0]:  # (here, once a run: parse_sources reads every phase's
        # sources, and said it a dozen times over, of a phase's weight 0 too)
        log.info("data.sources.%s.weight is 0: prepared but not sampled (a phase may raise it)", name)
    tok_cfg = data_cfg.tokenizer
    material = {
        "format": FORMAT_VERSION,
        "sources": {n: source_fingerprint(n, s, Path(data_cfg.cache_dir)) for n, s in specs.items()},
        # a model_file is its content: its path and the training settings it makes unused are not in the key (they
        # gave one corpus per path or vocab_size, all alike)
        "tokenizer": None if tok_cfg.model_file else _plain(tok_cfg),
        "tokenizer_file": file_digest(tok_cfg.model_file) if tok_cfg.model_file else None,
        "val_fraction": float(data_cfg.val_fraction),
    }
    if len(specs) > 1:  # the corpus is written, and its tokenizer sampled, in the sources' order, which the mapping
        # above loses (sorted keys): two orders shared one key and the cache held whichever was prepared first
        # (set only here, so a one-source corpus keeps the key it had)
        material["source_order"] = list(specs)
    key = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:16]
    root = Path(data_cfg.cache_dir)
    out = root / f"corpus-{key}"
    from_cache = (out / "meta.json").is_file()
    # a corpus is renamed into place whole, meta.json included: a directory without it was damaged afterwards (a
    # file deleted, an interrupted rm -r). Say so now, not with an OSError from the rename onto it after the whole
    # preparation; replacing it here could race with another process doing the same. (meta.json is looked for
    # again: another process may have renamed its corpus into place between the two looks.)
    if not from_cache and (out.exists() or out.is_symlink()) and not (out / "meta.json").is_file():
        raise DataError(f"data.cache_dir: the prepared corpus {out} is damaged (no meta.json); delete that "
                        f"directory and it is prepared again")  # fmt: skip
    from_cache = (out / "meta.json").is_file()
    if not from_cache:
        if tok_cfg.model_file:  # not a sentencepiece model, or one without EOS: say so before reading every source
            Tokenizer(tok_cfg.model_file)
        check_trainable(tok_cfg)  # (a vocab too small to train, likewise)
        with _preparation_lock(out, progress):
            from_cache = (out / "meta.json").is_file()  # prepared by the process this one waited for
            if not from_cache:
                _prepare_into(data_cfg, specs, material, out, progress)
    return _open(out, from_cache)


def _prepare_into(data_cfg: Any, specs: Dict[str, Any], material: dict, out: Path, progress: bool) -> None:
    """Prepare the corpus in a temporary directory beside ``out`` and rename it into place; nothing half-written
    stays (an error, Ctrl-C; a SIGKILL's leftover goes at the next preparation)."""
    root = out.parent
    tmp = _temporary_dir(out)  # first: an unusable cache_dir should not cost a read and a tokenizer training
    _remove_leftovers(root, holding=out.name)
    need: Dict[str, int] = {}  # bytes the corpus needs, once known: for the message of a full disk
    try:
        _prepare(data_cfg, specs, material, tmp, out, progress, need)
    except Exception as e:  # a full disk may come wrapped (datasets' DatasetGenerationError of pyarrow's OSError)
        if isinstance(e, DataError) or (full := disk_full(e)) is None:  # (a DataError has said what it is)
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # first: the free space the message quotes is then true
        raise _disk_full_error(root, full, need.get("bytes")) from e  # (--debug shows where the write failed)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _preparation_lock(out: Path, say: bool = True):
    """One preparation of the corpus ``out`` at a time on this machine; the others wait for it and then load it.
    The ranks of a DDP job launched before the corpus was prepared (torchrun, SLURM: each rank runs train.py from
    the start, before any process group exists) each prepared it whole at once: N times the memory, the CPU and the
    temporary disk of one preparation. An advisory ``flock`` on ``<out>.lock``, released by the kernel when its
    process dies however it dies; removed after the preparation (a waiter that then wakes holding the removed
    file's lock takes a fresh one). Where flock cannot work (no fcntl; a network file system refusing it),
    preparations run side by side as before: the one that renames second keeps the first's corpus."""
    path = out.with_name(out.name + ".lock")

    def say_waiting():  # (a rank waiting minutes in silence looks hung)
        print(f"waiting for another process preparing {out} (it holds {path})", flush=True)

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, locked = lock_file(path, wait=True, on_wait=say_waiting if say else None)
    except OSError as e:
        raise _cache_dir_error(out.parent, e) from None
    if not locked:
        os.close(fd)
        fd = None
        log.info("data.cache_dir: cannot lock %s (no flock there); preparing without waiting for other processes",
                 path)  # fmt: skip
    try:
        yield
    finally:
        # while locked: a process that opened it meanwhile sees it gone and takes a fresh one. Unlocked (no flock
        # there) too: nothing waits on it, and it stayed in data.cache_dir beside the corpora for good
        path.unlink(missing_ok=True)
        if fd is not None:
            os.close(fd)


# ------------------------------------------------------------------------------------------------ preparation


def _temporary_dir(out: Path) -> Path:
    """A fresh directory beside ``out`` to build the corpus in, ``<out>.tmp-<host>-<pid>-<random>``: the host and
    pid say whose it is, so a later preparation can tell the leftover of a killed one (``_remove_leftovers``) from
    the directory a live one is writing. ``os.mkdir`` honours the umask (``mkdtemp`` would make it 0700,
    unreadable to the other users of a shared cache once renamed into place)."""
    tmp = out.with_name(f"{out.name}{TMP_MARK}{_host()}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise _cache_dir_error(out.parent, e) from None
    return tmp


def _cache_dir_error(root: Path, e: OSError) -> DataError:
    if disk_full(e):
        return _disk_full_error(root, e, None)
    return DataError(f"data.cache_dir: cannot write the prepared corpus under {str(root)!r} ({e.strerror or e}); "
                     f"give a writable directory")  # fmt: skip


def _host() -> str:
    """This machine's name as it goes into a temporary directory's name (no ``/``; no ``-``, where ``_owner`` splits
    the name)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "_"


def _owner(name: str) -> Tuple[str | None, int] | None:
    """(host, pid) of the preparation that builds the directory ``name`` (host None: a name of an older minilm,
    ``corpus-<key>.tmp-<pid>-<random>``), or None for a name that is not one of its temporary directories."""
    if not name.startswith("corpus-") or TMP_MARK not in name:
        return None
    parts = name.split(TMP_MARK, 1)[1].split("-")
    if len(parts) not in (2, 3) or not parts[-2].isdigit():
        return None
    return (parts[0] if len(parts) == 3 else None), int(parts[-2])


def _remove_leftovers(root: Path, holding: str = "") -> None:
    """Delete the temporary directories that preparations killed on this machine (SIGKILL, a lost session, the
    out-of-memory killer: no ``finally`` ran) left in ``root``, each possibly hundreds of MB. One whose process is
    alive is being written and stays; so does one whose corpus's preparation lock someone holds (a process of
    another pid namespace — containers sharing a host name — looks dead by its pid; ``holding``: the corpus whose
    lock this process holds itself), and one made on another machine (a cache shared over the network: its pid means
    nothing here). A directory named by an older minilm has no host in its name: it is reported, not deleted."""
    host = _host()
    for d in sorted(root.glob(f"corpus-*{TMP_MARK}*")):
        owner = _owner(d.name)
        if owner is None or not d.is_dir() or pid_alive(owner[1]):
            continue
        corpus = d.name.split(TMP_MARK, 1)[0]
        if corpus != holding and is_locked(root / f"{corpus}.lock"):
            continue
        if owner[0] is None:
            log.warning("data.cache_dir: %s looks left by a preparation that was killed (an older minilm's, whose "
                        "names say no host); delete it unless a machine sharing this cache is preparing into it", d)
            continue
        if owner[0] != host:
            continue
        size = _tree_size(d)
        shutil.rmtree(d, ignore_errors=True)  # (another preparation may be deleting it too)
        if not d.exists():
            log.info("data.cache_dir: removed %s (%.1f MB), left by a preparation (pid %d) that was killed", d,
                     size / 1e6, owner[1])  # fmt: skip


def _tree_size(directory: Path) -> int:
    """Bytes of the files under ``directory``, as far as they can be read (another process may be deleting it)."""
    total = 0
    for f in directory.rglob("*"):
        try:
            total += f.lstat().st_size if f.is_file() and not f.is_symlink() else 0
        except OSError:
            pass
    return total


def _disk_full_error(root: Path, e: OSError, need: int | None) -> DataError:
    """The error for a disk (or quota) that filled up while a corpus was written under ``root``."""
    try:
        free = f"{shutil.disk_usage(root).free / 1e6:,.1f} MB are free there"
    except OSError:
        free = "the free space there cannot be read"
    size = f"the corpus needs about {need / 1e6:,.1f} MB and " if need else ""
    what = "quota is exhausted" if e.errno == errno.EDQUOT else "disk is full"
    return DataError(f"data.cache_dir: no space left to write the prepared corpus under {str(root)!r}: the {what} "
                     f"({e.strerror or e}); {size}{free}. Nothing half-written was kept. Free some space, or set "
                     f"data.cache_dir to a directory on a disk with room")  # fmt: skip


def _prepare(data_cfg: Any, specs: Dict[str, Any], material: dict, tmp: Path, out: Path, progress: bool,
             need: Dict[str, int] | None = None) -> None:  # fmt: skip
    """Read, train the tokenizer, tokenize and write into ``tmp``, then rename it to ``out``. ``need["bytes"]``:
    set to the size of the corpus on disk once that is known (after tokenizing)."""
    t0 = time.time()
    names: List[str] = []
    texts: List[str] = []
    source_of: List[int] = []
    skipped: Dict[str, Dict[str, int]] = {}
    for si, (name, spec) in enumerate(specs.items()):
        docs: SourceDocs = read_source(name, spec, progress=progress, scratch=tmp, cache_dir=out.parent)
        names += [f"{name}/{n}" for n in docs.names]
        texts += docs.texts
        source_of += [si] * len(docs.texts)
        skipped[name] = dict(docs.skipped)
        if docs.skipped:
            log.warning("data.sources.%s: skipped %s", name, docs.skipped_text())
    t_read = time.time() - t0
    t1 = time.time()
    tok = _make_tokenizer(data_cfg, names, texts, tmp / "tokenizer.model")
    t_train = time.time() - t1
    t1, c1 = time.time(), time.process_time()
    # cutting long documents at newlines gives the same ids only with the BPE tokenizer trained here (_tokenize)
    split_lines = not data_cfg.tokenizer.model_file and data_cfg.tokenizer.type == "bpe"
    flat, lengths = _tokenize(tok, texts, data_cfg.num_proc, progress, split_lines)
    t_tok, c_tok = time.time() - t1, time.process_time() - c1  # CPU time: comparable on a busy machine
    if need is not None:  # tokens, the index (3 int64 per document), the tokenizer already written
        itemsize = np.dtype(_token_dtype(tok.vocab_size)).itemsize
        need["bytes"] = int(lengths.sum()) * itemsize + 24 * len(lengths) + (tmp / "tokenizer.model").stat().st_size
    is_val = held_out(names, data_cfg.val_fraction, texts, source_of)
    stores = {}
    for split, mask in (("train", ~is_val), ("val", is_val)):
        stores[split] = _write_split(tmp, split, flat, lengths, np.asarray(source_of), mask, tok.vocab_size,
                                     list(specs))  # fmt: skip
    stats = corpus_stats(stores, skipped)
    stats["prepare_seconds"] = round(time.time() - t0, 2)
    stats.update(read_seconds=round(t_read, 2), tokenizer_seconds=round(t_train, 2),
                 tokenize_seconds=round(t_tok, 2), tokenize_cpu_seconds=round(c_tok, 2),
                 chars=sum(len(t) for t in texts))  # fmt: skip
    meta = {"source_names": list(specs), "vocab_size": tok.vocab_size, "material": material}
    (tmp / "stats.json").write_text(json.dumps(stats, indent=1))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    _sync_tree(tmp)  # on disk before the rename publishes it: after a crash, a whole cache or none
    try:
        os.rename(tmp, out)
    except OSError:  # another process finished the same corpus first: keep theirs
        if not (out / "meta.json").is_file():
            raise
    fsync_path(out.parent)
    if progress:
        print(format_stats(stats, header=f"prepared {out}"))


def _sync_tree(directory: Path) -> None:
    """fsync every file of ``directory`` and the directory itself."""
    for f in [*directory.iterdir(), directory]:
        fsync_path(f)


def held_out(names: Sequence[str], val_fraction: float, texts: Sequence[str] | None = None,
             sources: Sequence[int] | None = None) -> np.ndarray:
    """(D,) bool: a document is held out when a hash of its name falls below ``val_fraction``. Deterministic and
    independent of the other documents, so adding a file never moves another one between splits. With ``texts``,
    documents of identical text share one split, the one of the first of their names in sorted order (one hash per
    group, so the held-out share stays ``val_fraction``): a copy in training would leak the held-out one (the stdlib
    alone has 19 such copies, boilerplate ``__main__.py`` files among them). At least one document is held out (the
    lowest hash) so validation always has data; at least one stays in training.

    With ``sources`` (D,) (the source of each document), both guarantees hold per source, for each source of at
    least two documents: a phase validates on the held-out documents of the sources it samples, so a small source
    beside a large one (or beside the embedded corpus at weight 0) had none and the phase could not start; and a
    one-document source whose document had the corpus's lowest hash was held out whole, never trained on.

    Sources may share texts (two sources reading one file: a directory and, upweighted, one file of it). Every
    source's trained document (its highest hash) is fixed first, and a source then holds out its lowest hash among
    the others: one source at a time, a one-document source sharing the lowest hash of a larger one took it back
    into training after the larger one had held it out, and the larger one kept no held-out document at all."""
    if texts is not None:
        first: Dict[bytes, str] = {}
        digests = [hashlib.sha1(t.encode()).digest() for t in texts]
        for d, n in zip(digests, names):
            first[d] = min(first.get(d, n), n)
        names = [first[d] for d in digests]
    h = np.array([int.from_bytes(hashlib.sha1(name_bytes(n)).digest()[:8], "big") / 2**64 for n in names])
    is_val = h < val_fraction
    groups = np.zeros(len(names), np.int64) if sources is None else np.asarray(sources, dtype=np.int64)
    # (identical texts have one hash: flipping by hash moves their copies together, in every source holding one)
    trained = {h[groups == g].max() for g in np.unique(groups)}  # each source's trained document (if any is
    is_val[np.isin(h, list(trained))] = False  # trained by hash, its highest is: then nothing changes)
    for g in np.unique(groups):
        sel = groups == g
        if sel.sum() < 2 or is_val[sel].any():
            continue
        free = [x for x in h[sel] if x not in trained]
        if free:
            is_val[h == min(free)] = True
        elif len(set(h[sel])) == 1:  # its documents have one text: hold one out all the same
            # (per source: over the whole corpus, two one-document sources held the first one out, never trained)
            is_val[np.flatnonzero(sel)[0]] = True
    return is_val


def _make_tokenizer(data_cfg: Any, names: List[str], texts: List[str], dest: Path) -> Tokenizer:
    tok_cfg = data_cfg.tokenizer
    if tok_cfg.model_file:
        Tokenizer(tok_cfg.model_file)  # validates the file before copying it
        shutil.copyfile(tok_cfg.model_file, dest)
        return Tokenizer(dest)
    # documents in hash order: a spread over all sources and files rather than the first ones in sorted order
    order = sorted(range(len(texts)), key=lambda i: hashlib.sha1(name_bytes(names[i])).digest())
    chunks = sample_chunks(texts, order, tok_cfg.sample_chars)
    # one thread, whatever data.num_proc (not part of the cache key): unigram's EM sums scores over per-thread shards,
    # so 2 threads gave other scores and piece order (other ids) than 1; BPE gained nothing from a second thread
    # (measured 1.2 vs 1.3 s on 3 M characters)
    return train_tokenizer(chunks, dest, tok_cfg, num_threads=1)


def _tokenize(tok: Tokenizer, texts: List[str], num_proc: int, progress: bool,
              split_lines: bool = False) -> Tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Token ids of every document with EOS appended: flat (N,) int32 ids and (D,) int64 lengths.

    sentencepiece's batch encode runs ``num_proc`` C++ threads over the documents. It is fed longest document
    first, in chunks of about ``ENCODE_CHUNK_CHARS`` characters, so the progress bar moves and a huge file does
    not leave the other threads idle. (``datasets.map(num_proc=2)`` was measured 3x slower on the embedded
    corpus: process start-up and the Python-list -> Arrow round trip of 10 M ids cost more than the encoding.)

    ``split_lines`` (a BPE tokenizer trained here): a document longer than ``ENCODE_CHUNK_CHARS`` is encoded in
    pieces cut after a newline. sentencepiece needs about 50 bytes per character of one encoded string (2.7 GB
    for a 51 MB file, so a corpus that is one big file could not be prepared), and the pieces give the same ids:
    ``\n`` is a user-defined piece that no other piece contains, so no BPE merge crosses it. (Not for unigram,
    whose Viterbi breaks ties between equal segmentations by position, nor for a model_file of unknown settings.)
    """
    from tqdm.auto import tqdm

    eos = np.array([tok.eos_id], dtype=np.int32)
    # (document, piece) items: a document is one piece unless it is long and may be cut at newlines
    items = [(d, p) for d, text in enumerate(texts)
             for p in (_line_pieces(text, ENCODE_CHUNK_CHARS) if split_lines else [text])]  # fmt: skip
    order = sorted(range(len(items)), key=lambda i: -len(items[i][1]))  # longest first keeps the threads balanced
    bounds = _chunk_bounds([len(items[i][1]) for i in order], ENCODE_CHUNK_CHARS)
    pieces: List[np.ndarray] = [eos[:0]] * len(items)
    with tqdm(total=sum(len(t) for t in texts), desc="tokenize", unit="char", unit_scale=True,
              disable=not progress, leave=False) as bar:  # fmt: skip
        for lo, hi in bounds:
            batch = [items[i][1] for i in order[lo:hi]]
            for i, ids in zip(order[lo:hi], tok.encode_batch(batch, num_threads=num_proc)):
                pieces[i] = np.asarray(ids, dtype=np.int32)
            bar.update(sum(len(t) for t in batch))
    encoded: List[List[np.ndarray]] = [[] for _ in texts]
    for (d, _), ids in zip(items, pieces):  # items are in document order, pieces in text order
        encoded[d].append(ids)
    docs = [np.concatenate(e + [eos]) for e in encoded]
    lengths = np.array([len(e) for e in docs], dtype=np.int64)
    return (np.concatenate(docs) if docs else np.zeros(0, np.int32)), lengths


def _line_pieces(text: str, limit: int) -> List[str]:
    """``text`` cut after the first newline past every ``limit`` characters (a text without one stays whole)."""
    out, lo = [], 0
    while len(text) - lo > limit:
        cut = text.find("\n", lo + limit)
        if cut < 0:
            break
        out.append(text[lo : cut + 1])
        lo = cut + 1
    out.append(text[lo:])
    return out


def _chunk_bounds(sizes: Sequence[int], target: int) -> List[Tuple[int, int]]:
    """[lo, hi) ranges of consecutive items of about ``target`` total size each."""
    out, lo, acc = [], 0, 0
    for i, n in enumerate(sizes):
        acc += n
        if acc >= target:
            out.append((lo, i + 1))
            lo, acc = i + 1, 0
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


def _write_split(tmp: Path, split: str, flat: np.ndarray, lengths_all: np.ndarray, source_of: np.ndarray,
                 mask: np.ndarray, vocab_size: int, source_names: List[str]) -> TokenStore:  # fmt: skip
    """Write the documents selected by ``mask`` as a token array (a ``.npy`` file, opened as a memmap) plus index."""
    lengths = lengths_all[mask]
    token_mask = np.repeat(mask, lengths_all)
    dtype = _token_dtype(vocab_size)
    n = int(lengths.sum())
    path = tmp / f"{split}.tokens.npy"
    # written with write(), not into a memmap (np.lib.format.open_memmap): that file is sparse, and on a full disk a
    # store into one of its pages is a SIGBUS that killed the process without a word, its temporary directory left
    # behind; write() says ENOSPC, which load_corpus reports. In slices, so no whole-split copy is made either.
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                 "fortran_order": False, "shape": (n,)})  # fmt: skip
        for lo in range(0, len(flat), WRITE_CHUNK_TOKENS):
            f.write(flat[lo : lo + WRITE_CHUNK_TOKENS][token_mask[lo : lo + WRITE_CHUNK_TOKENS]].astype(dtype))
    doc_offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    np.savez(tmp / f"{split}.index.npz", doc_offsets=doc_offsets, doc_lengths=lengths,
             doc_source=source_of[mask].astype(np.int64))  # fmt: skip
    return TokenStore(np.load(path, mmap_mode="r"), doc_offsets, lengths, source_of[mask].astype(np.int64),
                      source_names)  # fmt: skip


def _token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size < 2**16 else np.uint32


def _open(out: Path, from_cache: bool) -> Corpus:
    """Open a prepared corpus; a damaged one (a file deleted, truncated or edited by hand) is a ``DataError`` that
    says to delete the directory, not a numpy or json traceback."""
    try:
        meta = json.loads((out / "meta.json").read_text())
        stats = json.loads((out / "stats.json").read_text())
        if not isinstance(stats, dict) or not all(isinstance(stats.get(k), dict) for k in (*SPLITS, "skipped")):
            raise ValueError("stats.json lacks the splits' stats")  # (format_stats read them: a KeyError traceback)
        stores = {}
        for split in SPLITS:
            with np.load(out / f"{split}.index.npz") as idx:
                offsets, lengths, source = idx["doc_offsets"], idx["doc_lengths"], idx["doc_source"]
            tokens = np.load(out / f"{split}.tokens.npy", mmap_mode="r")
            if not (tokens.ndim == 1 and len(offsets) == len(lengths) == len(source)
                    and int(lengths.sum()) == tokens.shape[0]):  # fmt: skip
                raise ValueError(f"{split}: the document index does not match the {tokens.shape[0]} tokens")
            stores[split] = TokenStore(tokens, offsets, lengths, source, list(meta["source_names"]))
        tok = Tokenizer(out / "tokenizer.model")
    except (OSError, ValueError, KeyError, DataError) as e:  # json and numpy format errors are ValueErrors
        first = (str(e).splitlines() or [""])[0]
        raise DataError(f"data.cache_dir: the prepared corpus {out} is damaged ({type(e).__name__}: {first}); "
                        f"delete that directory and it is prepared again") from None  # fmt: skip
    return Corpus(tok, stores["train"], stores["val"], out, stats, from_cache)


# -------------------------------------------------------------------------------------------------------- stats


def long_share(store: TokenStore, min_tokens: int, sources: Sequence[str] | None = None) -> float:
    """Share of the split's tokens that lie in documents of at least ``min_tokens`` tokens (EOS included), among
    the documents of ``sources`` (default: all; a phase samples only the sources it weights above 0)."""
    lengths = store.doc_lengths
    if sources is not None:
        lengths = lengths[np.isin(store.doc_source, [store.source_names.index(n) for n in sources])]
    total = lengths.sum()
    return float(lengths[lengths >= min_tokens].sum() / total) if total else 0.0


def corpus_stats(stores: Dict[str, TokenStore], skipped: Dict[str, Dict[str, int]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"skipped": skipped}
    for split, st in stores.items():
        lengths = st.doc_lengths
        edges = [0] + [2**k for k in range(4, 21)] + [2**62]
        hist, _ = np.histogram(lengths, bins=edges)
        per_source = {
            name: {"docs": int((st.doc_source == i).sum()), "tokens": int(lengths[st.doc_source == i].sum())}
            for i, name in enumerate(st.source_names)
        }
        out[split] = {
            "docs": st.n_docs,
            "tokens": st.n_tokens,
            "max_doc_tokens": int(lengths.max()) if len(lengths) else 0,
            "median_doc_tokens": float(np.median(lengths)) if len(lengths) else 0.0,
            "length_histogram": {f"[{lo},{hi})" if hi < 2**62 else f">={lo}": int(c)
                                 for lo, hi, c in zip(edges[:-1], edges[1:], hist)},  # fmt: skip
            "long_share": {str(n): round(long_share(st, n), 4) for n in SHARE_LENGTHS},
            "sources": per_source,
        }
    return out


def format_stats(stats: Dict[str, Any], header: str = "") -> str:
    lines = [header] if header else []
    for split in SPLITS:
        s = stats[split]
        lines.append(f"  {split}: {s['docs']} docs, {s['tokens']:,} tokens, median doc {s['median_doc_tokens']:.0f}, "
                     f"max doc {s['max_doc_tokens']:,}")  # fmt: skip
        per_source = s.get("sources", {})  # (a cache of an older minilm may lack them)
        if len(per_source) > 1:  # what each source gave: a glob that matched little shows here, not only in the sum
            lines.append("    by source: " + "; ".join(f"{name} {v['docs']} docs, {v['tokens']:,} tokens"
                                                       for name, v in per_source.items()))  # fmt: skip
    hist = {k: v for k, v in stats["train"]["length_histogram"].items() if v}
    lines.append(f"  train doc length histogram (tokens): {hist}")
    shares = ", ".join(f">={k}: {v:.1%}" for k, v in stats["train"]["long_share"].items())
    lines.append(f"  share of train tokens in docs at least N tokens long: {shares}")
    skipped = {k: v for k, v in stats["skipped"].items() if v}
    lines.append(f"  skipped files: {skipped or 'none'}")
    if "tokenize_seconds" in stats:
        lines.append(f"  prepared in {stats['prepare_seconds']} s (read {stats.get('read_seconds')} s, "
                     f"tokenizer training {stats.get('tokenizer_seconds')} s, "
                     f"tokenize {stats['tokenize_seconds']} s)")  # fmt: skip
    return "\n".join(lines)
