"""Data sources: typed per-kind configs and the documents they yield.

``data.sources`` is an open mapping in the config schema (source name -> ``{kind, weight, ...}``) because each
kind has its own keys; this module owns their validation. Each kind has a dataclass below, and a bad key or value
raises ``DataError`` naming ``data.sources.<name>.<key>`` and what is allowed.

Kinds:
- ``embedded``: the Python standard library ``*.py`` files of the running interpreter (one file = one document).
  Present wherever Python is, needs no network, and has a natural mix of short and very long documents.
- ``files``: glob patterns of local ``.txt/.md/.py`` files (one file = one document) and
  ``.jsonl/.json/.parquet/.csv/.tsv`` files, all but parquet also compressed (one record = one document, text taken
  from ``text_field``; read through ``datasets``, a .tsv by its csv builder with a tab as the delimiter). A file
  reached through several paths (symlinks) is read once. A path naming an existing file is that file, even where its
  name holds glob characters (``notes[1].txt``); so is one in an hf source's data_files.
- ``hf``: anything ``datasets.load_dataset`` opens (hub name or local path / data files), and a directory written
  by ``save_to_disk`` (opened with ``datasets.load_from_disk``; ``split`` picks a split of a ``DatasetDict``).

Unreadable, binary (NUL byte) and non-UTF-8 files are skipped and *counted*; the counts end up in the stats.
"""

from __future__ import annotations

import bisect
import contextlib
import csv
import glob
import hashlib
import itertools
import json
import logging
import math
import os
import re
import sys
import sysconfig
import tempfile
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from minilm.errors import DataError
from minilm.files import disk_full

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".md", ".py")
# A local record file's datasets builder and that builder's settings, by suffix: the table datasets itself infers a
# directory's builder with (datasets.packaged_modules._EXTENSION_TO_MODULE: ".tsv" -> ("csv", {"sep": "\t"})), whose
# csv builder hands sep to pandas.read_csv (CsvConfig.sep; its delimiter, when given, overrides sep)
RECORD_FORMATS: Dict[str, Tuple[str, Dict[str, str]]] = {
    ".jsonl": ("json", {}), ".json": ("json", {}), ".parquet": ("parquet", {}),
    ".csv": ("csv", {}), ".tsv": ("csv", {"sep": "\t"}),
}  # fmt: skip
RECORD_SUFFIXES = tuple(RECORD_FORMATS)
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # a UTF-16 text (Windows editors, PowerShell's >): NUL bytes, yet text
COMPRESSIONS = (".gz", ".bz2", ".xz")  # a record file but .parquet compressed so: datasets (fsspec) decompresses it
KINDS = ("embedded", "files", "hf")


# ---------------------------------------------------------------------------------------------- typed configs


@dataclass
class EmbeddedSource:
    """The stdlib ``*.py`` files of this interpreter (site-packages excluded)."""

    kind: str = "embedded"
    weight: float = 1.0
    max_docs: Optional[int] = None  # cap for small runs: the first max_docs files in sorted order


@dataclass
class FilesSource:
    """Local files matched by glob patterns (relative to the working directory; ``**`` recurses)."""

    kind: str = "files"
    weight: float = 1.0
    paths: List[str] = field(default_factory=list)  # globs of .txt/.md/.py/.jsonl/.json/.parquet/.csv/.tsv files
    text_field: str = "text"  # the text column of .jsonl / .json / .parquet / .csv / .tsv records
    max_docs: Optional[int] = None


@dataclass
class HfSource:
    """``datasets.load_dataset(path, name, split=split, data_files=data_files, streaming=streaming)``."""

    kind: str = "hf"
    weight: float = 1.0
    path: str = ""  # hub name, builder ("json", "parquet") or a local file / directory
    name: Optional[str] = None  # dataset config name
    split: str = "train"
    text_field: str = "text"
    data_files: Optional[Any] = None  # str | list[str], for local builders
    streaming: bool = False
    max_docs: Optional[int] = None


SourceSpec = EmbeddedSource | FilesSource | HfSource
_KIND_TO_CLASS = {"embedded": EmbeddedSource, "files": FilesSource, "hf": HfSource}


def parse_sources(sources: Any) -> Dict[str, SourceSpec]:
    """Validate ``data.sources`` into typed specs, in config order; errors name ``data.sources.<name>.<key>``."""
    raw = _plain(sources)
    if not isinstance(raw, dict) or not raw:
        raise DataError("data.sources: must be a non-empty mapping of source name -> {kind, weight, ...}")
    specs: Dict[str, SourceSpec] = {}
    for name, entry in raw.items():
        specs[str(name)] = _parse_one(str(name), entry)
    weights = {n: s.weight for n, s in specs.items()}
    if all(w == 0 for w in weights.values()):
        raise DataError(f"data.sources: all weights are zero ({weights}); give at least one source a weight > 0")
    return specs


def _parse_one(name: str, entry: Any) -> SourceSpec:
    where = f"data.sources.{name}"
    if not isinstance(entry, dict):
        raise DataError(f"{where}: must be a mapping {{kind, weight, ...}}, got {entry!r}")
    kind = entry.get("kind")
    if kind not in _KIND_TO_CLASS:
        raise DataError(f"{where}.kind: must be one of {KINDS}, got {kind!r}")
    cls = _KIND_TO_CLASS[kind]
    allowed = [f.name for f in fields(cls)]
    for key in entry:
        if key not in allowed:
            raise DataError(f"{where}.{key}: unknown key for kind '{kind}'; allowed keys: {', '.join(allowed)}")
    spec = cls(**entry)
    _check_common(spec, where)
    if isinstance(spec, FilesSource):
        if isinstance(spec.paths, str):
            spec.paths = [spec.paths]
        if not _strings(spec.paths):
            raise DataError(f"{where}.paths: give a non-empty list of glob patterns, got {spec.paths!r}")
    if isinstance(spec, HfSource):
        _check_hf_types(spec, where)
        spec.path = os.path.expanduser(spec.path)  # as the files kind's globs: ~/corpus.jsonl is a local file
        # and so are its data files: datasets takes ~ literally ("Unable to find '<cwd>/~/a.jsonl'"), though the cache
        # key expanded it and keyed the file that was then not read
        df = spec.data_files
        spec.data_files = ({k: _expand_user(v) for k, v in df.items()} if isinstance(df, dict)
                           else _expand_user(df))  # fmt: skip
    if isinstance(spec, (FilesSource, HfSource)) and (not isinstance(spec.text_field, str) or not spec.text_field):
        # checked here: otherwise a files source of text files never notices, and a record source fails on lookup
        raise DataError(f"{where}.text_field: must be a non-empty string, the name of the records' text column "
                        f"(default 'text'), got {spec.text_field!r}")  # fmt: skip
    return spec


def _strings(x: Any) -> bool:
    """A non-empty list of non-empty strings."""
    return isinstance(x, list) and bool(x) and all(isinstance(p, str) and p for p in x)


def _check_hf_types(spec: HfSource, where: str) -> None:
    """The types of an hf source's keys, which go to ``datasets.load_dataset`` as they are: a list as ``split``
    returned a list of datasets (read as records: a TypeError), a number as ``data_files`` a TypeError, and a string
    as ``streaming`` (``yes_please``) turned it on."""
    if not isinstance(spec.path, str) or not spec.path:
        raise DataError(f"{where}.path: give a dataset name, builder or local path, got {spec.path!r}")
    if spec.name is not None and (not isinstance(spec.name, str) or not spec.name):
        raise DataError(f"{where}.name: give the dataset's config name (a string) or null, got {spec.name!r}")
    if not isinstance(spec.split, str) or not spec.split:
        raise DataError(f"{where}.split: give one split (a string: train, validation, train[:1000], ...), got "
                        f"{spec.split!r}")  # fmt: skip
    joined = re.sub(r"\s+", "", spec.split)
    if joined != spec.split:  # (datasets' "Split name should match ... but got ' train'", under the source)
        raise DataError(f"{where}.split: {spec.split!r} holds spaces, which datasets' split specs do not take; write "
                        f"{joined!r}")  # fmt: skip
    if not isinstance(spec.streaming, bool):
        raise DataError(f"{where}.streaming: must be true or false, got {spec.streaming!r}")
    files = spec.data_files
    if not (files is None or _files(files) or (isinstance(files, dict) and files
                                               and all(isinstance(k, str) and _files(v) for k, v in files.items()))):
        raise DataError(f"{where}.data_files: give a file or glob, a list of them, or a mapping of split to file(s) "
                        f"({{train: a.jsonl, validation: [b.jsonl]}}), or null; got {files!r}")


def _expand_user(files: Any) -> Any:
    """A file or glob (or a list of them) with a leading ``~`` expanded; None stays None."""
    if isinstance(files, str):
        return os.path.expanduser(files)
    return None if files is None else [os.path.expanduser(f) for f in files]


def _files(x: Any) -> bool:
    """A file or glob (a non-empty string), or a non-empty list of them."""
    return (isinstance(x, str) and bool(x)) or _strings(x)


def _check_common(spec: SourceSpec, where: str) -> None:
    w = spec.weight
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < math.inf:  # NaN fails too
        # (a YAML .nan or .inf weight passed and normalized every weight to nan or 0: "no train documents in any
        # source with weight > 0", a message about the corpus, not about the weight)
        raise DataError(f"{where}.weight: must be a finite number >= 0, got {w!r}")
    spec.weight = float(w)
    m = spec.max_docs
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
        raise DataError(f"{where}.max_docs: must be a positive integer or null, got {m!r}")


def _plain(obj: Any) -> Any:
    """An OmegaConf node (or anything) as plain Python containers."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(obj):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return obj


# ------------------------------------------------------------------------------------------------ documents


@dataclass
class SourceDocs:
    """The documents of one source: parallel lists of names (for the held-out hash) and texts."""

    names: List[str]
    texts: List[str]
    skipped: Counter  # reason -> count (unreadable, binary, non_utf8, empty, not_text)
    first_skipped: Dict[str, str] = field(default_factory=dict)  # reason -> the first file (or record) it skipped

    def skip(self, reason: str, what: Any) -> None:
        """Count a skipped file or record; the first of each reason is named in the warning (``skipped_text``)."""
        self.skipped[reason] += 1
        self.first_skipped.setdefault(reason, str(what))

    def skipped_text(self) -> str:
        """The counts, each with its first file: "non_utf8: 1 (first: a.jsonl)", not a count a user cannot act
        on (one bad byte skips a whole record file)."""
        return ", ".join(f"{r}: {n}" + (f" (first: {self.first_skipped[r]})" if r in self.first_skipped else "")
                         for r, n in self.skipped.items())  # fmt: skip


def stdlib_files() -> List[Path]:
    """Sorted stdlib ``*.py`` files of the running interpreter, site-packages / dist-packages excluded. Those
    directories are not entered (``Path.rglob`` walked every installed package, ~13x the stdlib's files here, and
    made every start of a run, an evaluation or a study's check of a run take ~1 s for a list of 1,800 files)."""
    out = []
    for top, dirs, files in os.walk(sysconfig.get_paths()["stdlib"]):  # (symlinked directories not followed)
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages")]
        out.extend(Path(top, f) for f in files if f.endswith(".py"))
    return sorted(out)


def _glob(pattern: str, loops: Optional[List[str]] = None) -> List[str]:
    """The files a path or glob names: a path naming an existing file is that file, taken literally whatever its
    name holds (``notes[1].txt``: as a glob, ``[1]`` is a class of one character, which matched ``notes1.txt``, or
    nothing); anything else is a glob (``**`` recursing, as ``_rglob`` does; its matches in glob's order)."""
    return [pattern] if os.path.isfile(pattern) else _rglob(pattern, loops)


def _rglob(pattern: str, loops: Optional[List[str]] = None) -> List[str]:
    """``glob.glob(pattern, recursive=True)``, but a ``**`` does not follow a symlink back into a directory it is
    already inside (its path is added to ``loops``). glob follows such a link until the OS refuses a path of 40 links:
    one link to a parent directory named every file below it through 40 of them (``a/up/a/up/.../x.txt``, the name
    its held-out hash was taken of), and two made the paths 2^40: the preparation never ended, without a word. Other
    symlinked directories are followed as glob follows them; hidden ones are not entered, as glob's ``**`` does not."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return glob.glob(pattern)
    i = parts.index("**")
    base, rest = os.sep.join(parts[:i]) or ("" if i == 0 else os.sep), parts[i + 1 :]
    bases = [base] if base == "" else [b for b in glob.glob(base) if os.path.isdir(b)]
    out: List[str] = []
    for top in bases:
        stack = [(top, (os.path.realpath(top or "."),))]  # (directory, the real paths of it and its parents)
        while stack:
            d, inside = stack.pop()
            if rest:  # the rest of the pattern below each directory (a second ** walks again, from there)
                out += _rglob(os.path.join(glob.escape(d), *rest), loops)
            else:  # a trailing ** matches every directory and file under it, as glob's does
                out += [os.path.join(d, "")] if d == top and d else []
                out += glob.glob(os.path.join(glob.escape(d), "*"))
            try:
                entries = sorted(os.scandir(d or "."), key=lambda e: e.name, reverse=True)  # (popped in name order)
            except OSError:
                continue
            for e in entries:
                try:
                    is_dir = e.is_dir()  # (a symlink to a directory is followed, as glob follows it)
                except OSError:
                    continue
                if not is_dir or e.name.startswith("."):
                    continue
                child = os.path.join(d, e.name)
                real = os.path.realpath(child)
                if real in inside:
                    if loops is not None:
                        loops.append(child)
                    continue
                stack.append((child, inside + (real,)))
    return list(dict.fromkeys(out))


def _for_datasets(files: Any, base: str) -> Any:
    """``data_files`` (a file or glob, a list, a ``{split: ...}`` mapping) as datasets is to read them: it takes each
    one for a glob, so a path naming an existing file (relative to ``base``, where datasets resolves them) is escaped
    and read as it is, as ``_glob`` takes it (``recs[1].jsonl`` read ``recs1.jsonl``'s records)."""
    if isinstance(files, dict):
        return {k: _for_datasets(v, base) for k, v in files.items()}
    if isinstance(files, str):
        return glob.escape(files) if os.path.isfile(os.path.join(base, files)) else files
    return None if files is None else [_for_datasets(f, base) for f in files]


def _expand_globs(spec: FilesSource, where: str, cache_dir: Optional[Path] = None,
                  loops: Optional[List[str]] = None) -> List[Path]:  # fmt: skip
    """The files of a files source, each once; ``loops``: gets the symlinks back into a directory that ``**`` did not
    follow (``_rglob``)."""
    files: List[Path] = []
    for pattern in spec.paths:
        found = sorted(Path(p) for p in _glob(os.path.expanduser(pattern), loops))
        matches = [p for p in found if p.is_file()]
        if not matches:
            dirs = [p for p in found if p.is_dir()]
            hint = f"; {dirs[0]} is a directory: '{dirs[0]}/**/*' reads the files under it" if dirs else ""
            raise DataError(f"{where}.paths: the glob {pattern!r} matches no file (cwd: {os.getcwd()}){hint}")
        files.extend(matches)
    # one file once, by its real path: a symlink to a file of the corpus (latest.txt -> v3.txt), two overlapping
    # patterns, or a symlink to a parent directory (which ** follows, down to the OS's 40-link limit) would
    # otherwise train on the same text again and again; the first name in pattern then sorted order is kept
    seen: set = set()
    files = [p for p in files if not (p.resolve() in seen or seen.add(p.resolve()))]
    if cache_dir is not None:  # never minilm's own prepared corpora, their locks and the one being built: a glob over
        # data/**/* covers the default data.cache_dir, data/cache, and each run keyed, and read, the previous one's
        # files (meta.json "is not a column" of its records)
        cache = Path(cache_dir).resolve()
        kept = [p for p in files if not p.resolve().is_relative_to(cache)]
        if files and not kept:  # (it "yielded no documents (skipped: nothing)", naming neither glob nor cache)
            raise DataError(f"{where}.paths: every file {spec.paths} match is under data.cache_dir ({cache}), whose "
                            f"prepared corpora are never read (cwd: {os.getcwd()})")  # fmt: skip
        files = kept
    for p in files:  # (refused before any source is read: the cache key expands the globs first)
        if _data_suffix(p) == (".parquet", True):  # as the hf kind: it was skipped as "unsupported suffix", and a
            # source of only such files "yields no documents (skipped: not_text: 1)", naming neither file nor cause
            raise _compressed_parquet(f"{where}.paths", p, ", or leave it out of the globs")
    return files


def _compressed_parquet(key: str, path, also: str = "") -> DataError:
    """The refusal of a compressed .parquet file, wherever a source names one (``also``: a further way out)."""
    return DataError(f"{key}: {path}: a compressed .parquet file is not read (parquet compresses its own columns); "
                     f"decompress it{also}")


def source_fingerprint(name: str, spec: SourceSpec, cache_dir: Optional[Path] = None) -> Dict[str, Any]:
    """What the cache key hashes for a source: its settings (weight excluded: it only affects sampling) plus
    the identity of the files it reads (path, size, mtime), so editing a file invalidates the cache. ``cache_dir``:
    ``data.cache_dir``, whose files a files source never reads."""
    settings = {k: v for k, v in spec.__dict__.items() if k != "weight"}
    if isinstance(spec, HfSource) and spec.data_files is None and _saved_to_disk(Path(spec.path)):
        # load_from_disk memory-maps a save_to_disk directory whatever streaming says: keyed as false (the value a
        # config that leaves it out has, so those keys stay), switching it prepared the same corpus again
        settings["streaming"] = False
    where = f"data.sources.{name}"
    if isinstance(spec, EmbeddedSource):
        files = stdlib_files()
        extra: Any = {"python": sys.version, "stdlib": _stat_digest(files)}
    elif isinstance(spec, FilesSource):
        loops: List[str] = []
        files = _expand_globs(spec, where, cache_dir, loops)
        extra = {"files": _stat_digest(files)}
        if loops:  # (since 2026-11-25) its files were named through the loop before (a/up/a/up/.../x.txt) and held
            # out by those names: the same files keyed such a corpus; a source without a loop keeps its key
            extra["symlink_loops"] = "not followed"
        for suffix in (".csv", ".tsv"):  # read as records since 2026-11-24 (.tsv some hours after .csv), skipped
            # before: a corpus prepared before lacks them, and the same files and settings keyed it (each suffix its
            # own mark: a glob matching .csv files alone keeps the key it has had since they began to be read)
            if any(_data_suffix(f)[0] == suffix for f in files):
                extra[suffix[1:]] = "records"
    else:
        _check_local_file(spec, where)  # before anything is read, not after the other sources
        local = _hf_local_files(spec)
        packed = [p for p in local if _data_suffix(p) == (".parquet", True)]
        if spec.path == "parquet" and spec.data_files is not None and packed:  # "Parquet magic bytes not found"
            raise _compressed_parquet(f"{where}.data_files", packed[0])
        _check_one_format(spec, where)  # a directory of several formats refused, before anything is read
        _hf_csv_settings(spec, where)  # and a mix of .csv and .tsv
        extra = {"files": _stat_digest(local)}
        if not _whole_split(spec.split):  # a slice or a sum: its records are named by split and
            # index since 2026-11-24 (_record_names), so a corpus prepared before held other ones out; a split's name
            # alone named them so already, and keeps its key
            extra["record_names"] = "split:index"
    return {"settings": settings, **extra}


LOCAL_FILE_SUFFIXES = RECORD_SUFFIXES + (".txt",)  # an hf path ending so is a local file, never a Hub name


def _data_suffix(path: Path) -> Tuple[str, bool]:
    """(format suffix, compressed): ('.jsonl', True) for ``x.jsonl.gz``, ('.jsonl', False) for ``x.jsonl``."""
    suffix = path.suffix.lower()
    if suffix in COMPRESSIONS:
        return Path(path.stem).suffix.lower(), True
    return suffix, False


BUILDERS = ("json", "parquet", "csv")  # datasets' builders of the record files the files kind reads, in reading order


def _record_builder(path: Path) -> Optional[str]:
    """The datasets builder of a local record file (``json``, ``parquet``, ``csv`` for .csv and .tsv; all but parquet
    compressed too), None for any other file."""
    suffix, compressed = _data_suffix(path)
    if suffix not in RECORD_FORMATS or (suffix == ".parquet" and compressed):
        return None
    return RECORD_FORMATS[suffix][0]


def _builder_settings(path: Path) -> Dict[str, str]:
    """The settings its builder reads a local record file with (``{"sep": "\\t"}`` for a .tsv, compressed too)."""
    return dict(RECORD_FORMATS[_data_suffix(path)[0]][1]) if _record_builder(path) else {}


# What datasets infers a local directory's builder from, and the files it leaves out of one (README.md, a folder
# builder's metadata files), where its own tables cannot be imported (private names): the formats minilm reads,
# plain text, and arrow
_FORMATS = {**{k: v[0] for k, v in RECORD_FORMATS.items()}, ".ndjson": "json", ".txt": "text", ".arrow": "arrow"}
_NOT_DATA = {"README.md", "metadata.csv", "metadata.jsonl", "metadata.parquet"}


def _datasets_formats() -> Tuple[Dict[str, str], set]:
    """(datasets' builder of a data file by suffix: ``.jsonl`` -> json, ``.txt`` -> text, ``.png`` -> imagefolder,
    ...; the file names it leaves out of a directory), the tables it infers a local directory's builder with."""
    try:
        from datasets.data_files import FILES_TO_IGNORE
        from datasets.packaged_modules import _ALL_METADATA_FILENAMES, _EXTENSION_TO_MODULE
    except ImportError:
        return _FORMATS, _NOT_DATA
    return {k: module for k, (module, _) in _EXTENSION_TO_MODULE.items()}, {*FILES_TO_IGNORE, *_ALL_METADATA_FILENAMES}


def _file_format(path: Path, formats: Dict[str, str], skipped: set) -> Optional[str]:
    """The builder datasets reads ``path`` (relative to its directory) with, by its suffixes (``a.jsonl.gz``: json);
    None for a file it leaves out: hidden or special (``.x``, ``__x``), a README or metadata file, no data suffix."""
    if path.name in skipped or any(part.startswith((".", "__")) for part in path.parts):
        return None
    return next((formats[s] for s in (s.lower() for s in path.suffixes) if s in formats), None)


def _check_one_format(spec: HfSource, where: str) -> None:
    """An hf source whose path is a local directory of data files reads the files of one format: datasets infers its
    builder from their most common suffix and leaves the files of every other format out, without a word (a
    directory of 3 .jsonl files and 2 .csv ones gave the .jsonl records alone). Refused, naming one file of each; so
    is a directory of text files, as a .txt ``path`` is (datasets reads them one line = one document)."""
    path = Path(spec.path)
    if not path.is_dir() or _saved_to_disk(path):
        return
    (formats, skipped), first = _datasets_formats(), {}
    for f in _hf_local_files(spec, data_files_only=spec.data_files is not None):
        name = _file_format(f.relative_to(path) if f.is_relative_to(path) else f, formats, skipped)
        if name is not None:
            first.setdefault(name, f)
    if len(first) > 1:
        key = "data_files" if spec.data_files is not None else "path"
        found = ", ".join(f"{f} ({name})" for name, f in first.items())
        raise DataError(f"{where}.{key}: {spec.path} holds data files of {len(first)} formats: {found}; datasets reads "
                        f"those of its most common format alone and leaves the others out without a word; give "
                        f"data_files of one format, make one source per format, or read them with kind: files")
    if list(first) == ["text"]:  # as a local .txt path (_check_local_file): datasets' text builder made each line of
        # each file a document, without a word (a folder of notes: every line, blank ones skipped as empty)
        key, f = ("data_files" if spec.data_files is not None else "path"), first["text"]
        raise DataError(f"{where}.{key}: {spec.path} holds text files ({f}), which datasets reads one line = one "
                        f"document; for one file = one document use kind: files with paths: "
                        f"['{spec.path}/**/*{f.suffix}'], or, for one line = one document, path: text with data_files: "
                        f"'{spec.path}/**/*{f.suffix}'")  # fmt: skip


def _hf_csv_settings(spec: HfSource, where: str) -> Dict[str, str]:
    """The settings of the csv builder for the local data files of an hf source read in one ``load_dataset`` call:
    ``path: csv`` with ``data_files`` (which datasets reads with a comma whatever their suffix), or a local directory
    of data files (whose builder datasets infers from their suffixes, a .tsv's tab too). One call reads every file
    with one delimiter, so a mix of .csv and .tsv is refused: one of them would be read as one column of joined
    names and values. (The files kind reads each file on its own, with its own delimiter.)"""
    directory = Path(spec.path).is_dir() and not _saved_to_disk(Path(spec.path))
    if spec.path != "csv" and not directory:
        return {}
    files = _hf_local_files(spec, data_files_only=spec.data_files is not None)
    comma = [p for p in files if _data_suffix(p)[0] == ".csv"]
    tab = [p for p in files if _data_suffix(p)[0] == ".tsv"]
    if directory and any(_record_builder(p) not in (None, "csv") for p in files):
        return {}  # datasets reads the directory's json or parquet files, or fails naming its own choice
    if comma and tab:
        key = "data_files" if spec.data_files is not None else "path"
        raise DataError(f"{where}.{key}: {comma[0]} is comma-separated and {tab[0]} tab-separated, but datasets reads "
                        f"the files of one hf source with one delimiter; make them two sources, one of the .csv files "
                        f"and one of the .tsv ones, or read them with kind: files (each file with its own delimiter)")
    return {"sep": "\t"} if tab and spec.path == "csv" else {}  # (a directory: datasets takes .tsv's tab itself)


def _check_local_file(spec: HfSource, where: str) -> None:
    """An hf ``path`` that names a data file is read as that local file; a missing one (a typo, another working
    directory) went to the Hub as a dataset name: 20 s of retries, then "Couldn't reach 'trian.jsonl' on the Hub".
    A local ``.txt`` file was sent there too (only ``.jsonl/.json/.parquet/.csv/.tsv`` open directly), and so was an
    existing file of any other format (``.arrow``, ``.xml``): the same retries, naming neither the file nor why. A
    ``name`` is refused where it selects nothing: a local file, or a builder of data files (``json``, ``csv``, ...)."""
    path = Path(spec.path)
    suffix, compressed = _data_suffix(path)
    local = spec.data_files is None and path.is_file()
    if spec.name is not None and (local or spec.path in RECORD_BUILDERS + ("text",)):
        # as for a save_to_disk directory: datasets took the name as that of a config of the file's builder, which
        # has none, and went on; it changed nothing read (a Hub config name kept on a local copy: wikitext-103-raw-v1)
        what = "a local file" if local else f"datasets' {spec.path} builder, which reads data_files"
        raise DataError(f"{where}.name: {spec.path} is {what}, and has no dataset configs: name {spec.name!r} "
                        f"selects nothing (the same records are read); remove name")  # fmt: skip
    if spec.data_files is not None:
        _check_data_files_match(spec, where)
        return
    if path.is_file() and suffix not in LOCAL_FILE_SUFFIXES + (".py",):  # (.py: datasets says scripts are gone)
        ending = suffix + (path.suffix.lower() if compressed else "") or path.suffix or "suffix-less"
        arrow = suffix == ".arrow" and not compressed
        how = (f"for an .arrow file use path: arrow with data_files: {spec.path}" if arrow
               else f"convert it to one of those, or give its datasets builder as path with data_files: {spec.path}")
        raise DataError(f"{where}.path: {spec.path}: an hf source opens a local .jsonl/.json/.parquet/.csv/.tsv file "
                        f"(all but parquet also compressed: {', '.join(COMPRESSIONS)}) or a save_to_disk directory, "
                        f"not a {ending} file; {how}")  # fmt: skip
    if suffix not in LOCAL_FILE_SUFFIXES:
        return
    if not path.exists():
        ending = suffix + (path.suffix.lower() if compressed else "")
        raise DataError(f"{where}.path: no such file: {spec.path} (cwd: {os.getcwd()}); a path ending in {ending} "
                        f"is read as a local file")  # fmt: skip
    if path.is_file() and suffix == ".txt":
        # (the files kind reads no compressed text file: for one, path: text alone)
        files = "" if compressed else "kind: files (one file = one document), or "
        raise DataError(f"{where}.path: {spec.path}: an hf source opens a local .jsonl/.json/.parquet/.csv/.tsv file; "
                        f"for a {suffix}{path.suffix.lower() if compressed else ''} file use {files}path: text with "
                        f"data_files: {spec.path} (one line = one document)")  # fmt: skip
    if path.is_file() and suffix == ".parquet" and compressed:  # datasets said "Couldn't find any data file at"
        raise _compressed_parquet(f"{where}.path", spec.path)


def _check_data_files_match(spec: HfSource, where: str) -> None:
    """Each of ``data_files``' files or globs must match a local file where they are local (``path`` a builder of
    data files, or a local directory; a Hub dataset's are paths in its repository, a URL is remote): datasets 5
    ends a glob that matches nothing with a bare StopIteration, reported as "no records (an empty file?)"."""
    if spec.path not in RECORD_BUILDERS + ("text",) and not Path(spec.path).is_dir():
        return
    for pattern in _data_file_patterns(spec.data_files):
        if "://" in pattern:  # a remote file (https://, hf://, s3://): datasets reaches it through fsspec
            continue
        if not any(os.path.isfile(m) for m in _local_matches(spec, pattern)):
            raise DataError(f"{where}.data_files: {pattern!r} matches no file (cwd: {os.getcwd()}"
                            + (f"; nor under {spec.path}" if Path(spec.path).is_dir() else "") + ")")


def _data_file_patterns(data_files: Any) -> List[str]:
    """``data_files`` (a file or glob, a list, a ``{split: ...}`` mapping of them) as one list of its patterns."""
    listed = data_files.values() if isinstance(data_files, dict) else [data_files]
    return [p for v in listed for p in _as_list(v)]


def _local_matches(spec: HfSource, pattern: str) -> List[str]:
    """The local files a ``data_files`` pattern names, as datasets takes it: relative to the working directory, and
    to ``path`` when that is a local directory (each one's matches sorted)."""
    bases = [Path(".")] + ([Path(spec.path)] if Path(spec.path).is_dir() else [])
    return [m for base in bases for m in sorted(_glob(os.path.join(base, os.path.expanduser(str(pattern)))))]


def _hf_local_files(spec: HfSource, data_files_only: bool = False) -> List[Path]:
    """The local files an hf source reads: ``path`` (a file, or every file of a directory) and every file that
    ``data_files`` names — a string, a list or a ``{split: ...}`` mapping of paths or glob patterns, as datasets
    takes them (relative to the working directory, or to ``path`` when that is a local directory). Patterns are
    expanded here: hashing the pattern alone would keep a stale cache when a file it matches is added or edited.
    ``data_files_only``: the files ``data_files`` names alone (those datasets reads, where ``path`` is a directory)."""
    found = [] if data_files_only else [Path(spec.path)]
    found += [Path(m) for pat in _data_file_patterns(spec.data_files) for m in _local_matches(spec, pat)]
    # a local directory (save_to_disk, or data files of a builder) by the files in it: rewriting a shard in place
    # does not change the directory's own mtime
    files = [f for p in found for f in (sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])]
    seen: set = set()
    return [p for p in files if p.is_file() and not (p.resolve() in seen or seen.add(p.resolve()))]


def _stat_digest(files: List[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(name_bytes(f"{p.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n"))
    return h.hexdigest()


def name_bytes(name: str) -> bytes:
    """A file's path (or a document name holding one) as the bytes to hash: UTF-8, the bytes of a file name that is
    not UTF-8 (``caf\\xe9.txt`` from a Latin-1 archive, which Python holds as lone surrogates) given back as they
    are. A plain ``encode()`` refused them, and such a file in a glob stopped the preparation with a traceback."""
    return name.encode("utf-8", "surrogateescape")


@contextlib.contextmanager
def _datasets_bars(progress: bool):
    """datasets' own progress bars ("Generating train split") off while a source is read without progress (the
    scripts' --quiet), and restored after."""
    if progress:
        yield
        return
    import datasets
    from datasets.utils.tqdm import are_progress_bars_disabled

    was_off = are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_off:
            datasets.enable_progress_bars()


def _as_list(x: Any) -> List[str]:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


def read_source(name: str, spec: SourceSpec, *, progress: bool = True, scratch: Optional[Path] = None,
                cache_dir: Optional[Path] = None) -> SourceDocs:  # fmt: skip
    """All documents of one source. Raises ``DataError`` if it yields none (never a silent empty dataset).

    Local data files read through ``datasets`` are converted to Arrow in a temporary directory (under ``scratch``,
    the corpus being built, when given), deleted once their records are read, not in datasets' own cache: that
    cache keys a local file by its mtime alone, so a file replaced by another one with the same mtime (unpacked
    from an archive, ``cp -p``) gave the old records to a corpus prepared again because the file's size changed.
    A private directory also keeps ranks that prepare at once from rewriting one shared conversion. A files source
    reads no file under ``cache_dir`` (``data.cache_dir``)."""
    where = f"data.sources.{name}"
    if isinstance(spec, EmbeddedSource):
        docs = _read_text_files(name, stdlib_files()[: spec.max_docs], root=sysconfig.get_paths()["stdlib"],
                                progress=progress)  # fmt: skip
    else:
        with tempfile.TemporaryDirectory(prefix="datasets-", dir=scratch) as local_cache, _datasets_bars(progress):
            if isinstance(spec, FilesSource):
                docs = _read_files_source(name, spec, where, progress, local_cache, cache_dir)
            else:
                docs = _read_hf(name, spec, where, local_cache)
    if not docs.texts:
        skipped = docs.skipped_text() or "nothing"
        raise DataError(f"{where}: the source yields no documents (skipped: {skipped}); check its paths/settings")
    return docs


def _read_files_source(name: str, spec: FilesSource, where: str, progress: bool, local_cache: str,
                       cache_dir: Optional[Path] = None) -> SourceDocs:  # fmt: skip
    files = _expand_globs(spec, where, cache_dir)
    text_files = [p for p in files if p.suffix.lower() in TEXT_SUFFIXES]
    record_files = [p for p in files if _record_builder(p) in BUILDERS]
    kept = set(text_files) | set(record_files)
    other = [p for p in files if p not in kept]
    cap = spec.max_docs  # reading stops there: a quick run on a few documents of a large corpus reads only those
    docs = _read_text_files(name, text_files, root=None, progress=progress, max_docs=cap)
    if other:  # named as the other skip reasons are: the first one (in the warning, and in the error of a source
        # that yields no documents, which said only "skipped: not_text: 2" of a glob matching .rst or .log files)
        docs.skipped["not_text"] += len(other)
        docs.first_skipped.setdefault("not_text", str(other[0]))
        log.warning("%s: %d file(s) with unsupported suffix skipped (first: %s; allowed: %s; all but .parquet also "
                    "compressed: %s)", where, len(other), other[0], ", ".join(TEXT_SUFFIXES + RECORD_SUFFIXES),
                    ", ".join(COMPRESSIONS))  # fmt: skip
    for builder in BUILDERS:  # (the record files by format, json, parquet then csv and tsv; each in paths' order)
        for path in [p for p in record_files if _record_builder(p) == builder]:
            if cap is not None and len(docs.texts) >= cap:
                break
            problem = _record_problem(path)
            if problem:  # as for text files: an empty or undecodable file is skipped and counted, not fatal
                docs.skip(problem, path)
                continue
            # one file a call, with its own settings: a .csv and a .tsv in one source each read with their delimiter
            ds = _load_dataset(where, builder, None, "train", [glob.escape(str(path))], False, cache_dir=local_cache,
                               settings=_builder_settings(path))  # fmt: skip
            _append_records(docs, ds, spec.text_field, f"{where}.text_field", name=lambda i, p=path: f"{p}:{i}",
                            file=str(path), max_docs=cap, paths_key=f"{where}.paths")  # fmt: skip
    return docs


def _record_problem(path: Path) -> Optional[str]:
    """Why a local record file gives no records, as ``_read_text_files`` counts it (None: it has some): each record
    file of the files kind, and the one file an hf source's ``path`` names."""
    problem = _text_problem(path) if _record_builder(path) in ("json", "csv") else None
    return problem or ("empty" if _no_records(path) else None)


def _no_records(path: Path) -> bool:
    """Whether a record file holds no record: a .csv/.tsv of a header alone (blank lines are no rows, as for pandas,
    which datasets reads it with), a .json of ``[]``, a parquet file of no rows. datasets fails on each ("Instruction
    "train" corresponds to no data!", for parquet "BatchSize must be greater than 0"): one such file in a glob stopped
    the whole preparation, where an empty .jsonl is skipped. False where unsure (a file this cannot read): datasets
    reads it then, and says what is wrong. Reads a .csv/.tsv up to its first row, a .json up to its third character."""
    import lzma

    builder = _record_builder(path)
    try:
        if builder == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows == 0
        with _open_record_file(path, "rt", encoding="utf-8-sig", newline="") as f:  # (a leading BOM dropped)
            if builder == "csv":  # (with the file's delimiter: a quoted cell's newline is no row end)
                rows = csv.reader(f, delimiter=_builder_settings(path).get("sep", ","))
                return sum(1 for _ in itertools.islice((row for row in rows if row), 2)) < 2
            head = ""  # the file's characters but whitespace, up to 3 of them: "[]" is all of it
            while len(head) < 3 and (block := f.read(1 << 16)):
                head += "".join(block.split())
            return head == "[]"
    except (OSError, EOFError, ValueError, csv.Error, lzma.LZMAError):  # (UnicodeDecodeError, ArrowInvalid: ValueError)
        return False


def _open_record_file(path: Path, mode: str = "rb", **kwargs):
    """A record file opened as ``open(path, mode, **kwargs)`` would, through its decompressor where its suffix is
    one of COMPRESSIONS."""
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix.lower(), open)
    return opener(path, mode, **kwargs)


def _text_problem(path: Path) -> Optional[str]:
    """Why a .jsonl/.json/.csv/.tsv file (compressed too) cannot give records, as ``_read_text_files`` counts it (None:
    readable). Read in blocks with an incremental decoder: such files can be large. (datasets reads a non-UTF-8
    record file without complaint and fails with a bare UnicodeDecodeError when the record is taken; an empty one
    fails with StopIteration, and so did an empty .jsonl.gz shard in a glob: the whole preparation stopped, where
    an empty .jsonl was skipped.)"""
    import codecs
    import lzma

    # utf-8-sig: a leading byte order mark is no content (a file of only one was "Empty JSON file" in datasets)
    decoder, blank = codecs.getincrementaldecoder("utf-8-sig")(), True
    try:
        with _open_record_file(path) as f:
            first = True
            while block := f.read(1 << 20):
                if b"\0" in block:
                    return "non_utf8" if first and block.startswith(UTF16_BOMS) else "binary"
                first = False
                text = decoder.decode(block)  # every block: after `blank and ...` short-circuited, a file whose
                blank = blank and not text.strip()  # first MB was text was never checked further
            blank = not decoder.decode(b"", final=True).strip() and blank
    except (OSError, EOFError, lzma.LZMAError):  # (a damaged or truncated compressed file)
        return "unreadable"
    except UnicodeDecodeError:
        return "non_utf8"
    return "empty" if blank else None


def _read_text_files(name: str, files: List[Path], root: Optional[str], progress: bool,
                     max_docs: Optional[int] = None) -> SourceDocs:  # fmt: skip
    """One file = one document (up to ``max_docs`` of them). Decoding is strict UTF-8: a lossy decode would put
    garbage into the vocab."""
    from tqdm.auto import tqdm

    docs = SourceDocs([], [], Counter())
    for path in tqdm(files, desc=f"read {name}", unit="file", disable=not progress, leave=False):
        if max_docs is not None and len(docs.texts) >= max_docs:
            break
        try:
            raw = path.read_bytes()
        except OSError:
            docs.skip("unreadable", path)
            continue
        if b"\0" in raw:  # (UTF-16 text is not UTF-8, not binary: the warning says what to do, re-encode it)
            docs.skip("non_utf8" if raw.startswith(UTF16_BOMS) else "binary", path)
            continue
        try:
            # utf-8-sig: a leading byte order mark (Windows editors write one) is an encoding marker, not text; kept,
            # every such document began with U+FEFF (3 byte tokens), which the .jsonl/.csv/.tsv readers drop
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            docs.skip("non_utf8", path)
            continue
        if not text.strip():
            docs.skip("empty", path)
            continue
        docs.names.append(os.path.relpath(path, root) if root else str(path))
        docs.texts.append(text)
    return docs


Parts = List[Tuple[str, int, float]]  # the records read, in order: (split, first index, end index) for each piece


def _read_hf(name: str, spec: HfSource, where: str, local_cache: str) -> SourceDocs:
    _check_local_file(spec, where)
    path, data_files = spec.path, spec.data_files
    builder, settings = _record_builder(Path(path)), _hf_csv_settings(spec, where)
    if data_files is None and Path(path).is_file() and builder:
        # a local file: datasets opens it through its packaged builder of that format, with its settings (a .tsv's
        # tab: opened so, a .tsv was read with a comma)
        path, data_files, settings = builder, path, _builder_settings(Path(path))
        problem = _record_problem(Path(data_files))  # the files kind's check of its record files: this one
        # checked .json/.jsonl text alone and missed .csv (added to the files kind later), so a .csv with a NUL byte
        # was a document and a Latin-1 or truncated one datasets' error, where such a file yields no documents
        if problem:  # one file and nothing to read in it: the source yields no documents (read_source says so)
            return SourceDocs([], [], Counter({problem: 1}), {problem: str(data_files)})
    if data_files is None and _saved_to_disk(Path(path)):
        if spec.name is not None:  # load_from_disk has no configs: the name was ignored, whatever it said
            raise DataError(f"{where}.name: {path} was written by save_to_disk, which has no dataset configs; "
                            f"remove name (pick a split of a saved DatasetDict with split)")  # fmt: skip
        reads = [_load_from_disk(where, Path(path), spec.split)]
    else:
        if spec.streaming and "[" in spec.split:  # datasets streams whole splits: "Bad split: train[:10%]", under
            # the source's name alone (not its split key), and no way round it
            raise DataError(f"{where}.split: {spec.split!r} is a slice, which datasets cannot stream (it streams "
                            f"whole splits); give the split's name alone with max_docs: N to read its first N "
                            f"records, or streaming: false")  # fmt: skip
        # local files: converted afresh (read_source); a Hub dataset: datasets' cache, not downloaded each time
        cache_dir = local_cache if _hf_local_files(spec) else None
        data_files = _for_datasets(data_files, path if Path(path).is_dir() else ".")
        reads = (_stream_splits(where, path, spec.name, spec.split, data_files, cache_dir, settings) if spec.streaming
                 else [_load_split(where, path, spec.name, spec.split, data_files, cache_dir, settings)])  # fmt: skip
    docs = SourceDocs([], [], Counter())
    file = spec.path if spec.data_files is None else f"{spec.path} data_files={spec.data_files}"
    for ds, parts in reads:  # (a generator when streaming: a split of a sum is opened once the earlier ones are read)
        if spec.max_docs is not None and len(docs.texts) >= spec.max_docs:
            break
        _append_records(docs, ds, spec.text_field, f"{where}.text_field", _record_names(f"{spec.path}/{spec.name}",
                        parts), file, max_docs=spec.max_docs)  # fmt: skip
    return docs


def _record_names(prefix: str, parts: Parts) -> Callable[[int], str]:
    """Record i of the rows read (the parts one after another) -> ``<prefix>/<split>:<its index in that split>``.
    A record keeps its name, and so its side of the held-out split, however the split was sliced: the first 1000
    records of train[:2000] are those of train[:1000], and record 0 of train[500:] is named as record 500 of train.
    (Until 2026-11-24 the name held the split spec and the index among the rows read, so widening a slice renamed,
    and re-split, every record.) Skipped records count: the index is the record's place in its split."""
    ends = list(itertools.accumulate(end - start for _, start, end in parts))

    def name(i: int) -> str:
        k = bisect.bisect_right(ends, i)
        split, start, _ = parts[k]
        return f"{prefix}/{split}:{start + i - (ends[k - 1] if k else 0)}"

    return name


def _whole_split(split: str) -> bool:
    """Whether ``split`` names one whole split (datasets' rule for a split's name), not a slice or a sum."""
    return re.fullmatch(r"\w+(\.\w+)*", split) is not None


def _load_split(where: str, path: str, name: Optional[str], split: str, data_files: Any,
                cache_dir: Optional[str], settings: Optional[Dict[str, str]] = None) -> Tuple[Any, Parts]:  # fmt: skip
    """The records ``load_dataset`` reads for ``split`` (a split, a slice of one, a sum), and where each came from:
    the split spec resolved against the split sizes datasets recorded, as datasets itself resolves it to read them."""
    import datasets

    ds = _load_dataset(where, path, name, split, data_files, False, cache_dir=cache_dir, settings=settings)
    if _whole_split(split):  # its records in order: no sizes needed (a builder may record none)
        return ds, [(split, 0, len(ds))]
    sizes = {n: s.num_examples for n, s in (ds.info.splits or {}).items()}
    if len(ds) == 0:  # (train[5:2]: "cannot tell which records", below, of a slice that is simply empty)
        files = f", data_files={data_files!r}" if data_files is not None else ""
        raise _empty_slice(where, split, f"datasets.load_dataset({path!r}, name={name!r}{files})", sizes)
    try:
        parts = [(p.splitname, p.from_, p.to) for p in datasets.ReadInstruction.from_spec(split).to_absolute(sizes)]
    except ValueError:
        parts = []
    if sum(end - start for _, start, end in parts) != len(ds):  # (never seen: datasets reads by these sizes)
        raise DataError(f"{where}.split: cannot tell which records of which split datasets read for {split!r} "
                        f"(split sizes it recorded: {sizes}; {len(ds)} records read), so they cannot be named for "
                        f"the held-out split (data.val_fraction)")  # fmt: skip
    return ds, parts


def _stream_splits(where: str, path: str, name: Optional[str], split: str, data_files: Any,
                   cache_dir: Optional[str], settings: Optional[Dict[str, str]] = None):  # fmt: skip
    """A streamed split, or each split of a sum (train+test: datasets streamed them as one, whose records could not
    tell which split they came from and where), one stream at a time, with its parts."""
    for one in (s.strip() or split for s in split.split("+")):  # (datasets' own separator of a sum; no slice
        # here; an empty part, of "train+", stands for the whole spec: its error names that, not '')
        yield (_load_dataset(where, path, name, one, data_files, True, cache_dir=cache_dir, settings=settings),
               [(one, 0, math.inf)])


def _column_kind(feature: Any) -> Optional[str]:
    """What a non-text column holds (``int64``, ``a list``, ...), or None for a text column, or one of nulls alone
    (a null record is skipped as empty, as a missing text is)."""
    if _mixed(feature):
        return None
    dtype = getattr(feature, "dtype", None)
    if type(feature).__name__ == "Value":
        return None if dtype in ("string", "large_string", "null") else f"{dtype} values"
    return f"{type(feature).__name__} values"  # List, Sequence, a dict of features, Image, ...


def _mixed(feature: Any) -> bool:
    """A column of values of several types (datasets >= 4 reads a JSON field that is text in most records and a number
    or a list in some as a ``Json`` column): each record's value is checked, a non-string one skipped as not_text."""
    return type(feature).__name__ == "Json"


def _text_columns_hint(features: Any, file: str) -> str:
    """What an error about a text_field that holds no text suggests: the columns of text, or that there are none."""
    texts = [c for c in features if _column_kind(features[c]) is None and not _mixed(features[c])]
    return f"set text_field to a text column: {', '.join(texts)}" if texts else f"{file} has no text column"


def _saved_to_disk(path: Path) -> bool:
    """A directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (load_dataset refuses those)."""
    return path.is_dir() and any((path / f).is_file() for f in ("state.json", "dataset_dict.json"))


def _load_from_disk(where: str, path: Path, split: str) -> Tuple[Any, Parts]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # a damaged directory: FileNotFoundError, ValueError, pyarrow errors...
        raise DataError(f"{where}: datasets.load_from_disk({str(path)!r}) failed: {type(e).__name__}: "
                        f"{(str(e).splitlines() or [''])[0]}") from None  # fmt: skip
    splits = dict(ds) if isinstance(ds, datasets.DatasetDict) else {"train": ds}
    try:  # load_dataset's split syntax: a split, a slice of one (train[:1000], train[10%:]), a sum (train+test)
        parts = datasets.ReadInstruction.from_spec(split).to_absolute({n: len(d) for n, d in splits.items()})
    except ValueError as e:  # a split name not there, or a malformed spec (load_from_disk took only whole splits:
        # a slice, the syntax the hf kind documents for split, was "not a split")
        if not isinstance(ds, datasets.DatasetDict):  # another name would silently read the whole (only) dataset
            raise DataError(f"{where}.split: {path} holds one Dataset (save_to_disk of a Dataset, no splits), so "
                            f"split {split!r} cannot be chosen; leave split at its default 'train' (a slice of it, "
                            f"train[:1000] or train[:10%], is allowed)") from None  # fmt: skip
        raise DataError(f"{where}.split: {_not_a_split(split, path, ds)}; datasets says: {e}") from None
    if sum(max(0, p.to - p.from_) for p in parts) == 0:  # ("the source yields no documents (skipped: nothing)")
        raise _empty_slice(where, split, path, {n: len(d) for n, d in splits.items()})
    pieces = [splits[p.splitname].select(range(p.from_, p.to)) if (p.from_, p.to) != (0, len(splits[p.splitname]))
              else splits[p.splitname] for p in parts]  # fmt: skip
    ds = pieces[0] if len(pieces) == 1 else datasets.concatenate_datasets(pieces)
    return ds, [(p.splitname, p.from_, p.to) for p in parts]


def _load_dataset(where: str, path: str, name: Optional[str], split: str, data_files: Any, streaming: bool,
                  cache_dir: Optional[str] = None, settings: Optional[Dict[str, str]] = None):  # fmt: skip
    """``datasets.load_dataset``; ``settings``: its builder's config (``sep`` for a .tsv), given only when there are
    some, so a call without them is the one it was (a Hub dataset's builder may take no such keys)."""
    import datasets

    settings = settings or {}
    try:
        return datasets.load_dataset(path, name, split=split, data_files=data_files, streaming=streaming,
                                     cache_dir=cache_dir, **settings)  # fmt: skip
    except Exception as e:  # datasets raises many types (FileNotFoundError, ValueError, DatasetNotFoundError...)
        if disk_full(e) is not None:
            if cache_dir is not None:  # the conversion of a local file, inside the corpus being built: load_corpus
                raise  # says so, with data.cache_dir
            raise DataError(f"{where}: no space left on the disk of datasets' cache "
                            f"({datasets.config.HF_DATASETS_CACHE}) while datasets.load_dataset({path!r}) wrote there: "
                            f"{disk_full(e)}; free some space or set HF_DATASETS_CACHE to a directory on a disk with "
                            f"room") from None  # fmt: skip
        files = f", data_files={data_files!r}" if data_files is not None else ""
        files += "".join(f", {k}={v!r}" for k, v in settings.items())
        call = f"datasets.load_dataset({path!r}, name={name!r}{files})"
        if isinstance(e, ValueError):  # datasets' error for a split it lacks ("Unknown split", "Bad split")
            _check_split(where, path, name, split, data_files, cache_dir, call, settings)
            if "corresponds to no data" in str(e) and not _whole_split(split):  # a slice of no record (train[:0]);
                # a whole split of none is a data file of no records, which the other hints name
                raise _empty_slice(where, split, call, {}) from None
        raise DataError(f"{where}: datasets.load_dataset({path!r}, name={name!r}, split={split!r}{files}) failed: "
                        f"{_cause(e)}{_builder_hint(path, data_files)}{_bad_file_hint(path, data_files)}"
                        f"{_json_line_hint(path, data_files, e)}") from None  # fmt: skip


RECORD_BUILDERS = ("json", "csv", "parquet", "arrow")


def _local_record_files(path: str, data_files: Any) -> Iterator[str]:
    """The local data files of an hf source that a record builder reads, in the order datasets lists them: those
    ``data_files`` names (relative to ``path`` where it is a folder), or every file under the folder ``path``; none
    for a dataset of the Hub (no folder, no data_files), where the working directory is nothing of the source's."""
    base = path if Path(path).is_dir() else "."
    if data_files is None and base == ".":
        return
    patterns = _data_file_patterns(data_files) if data_files is not None else ["**/*"]
    for pattern in patterns:
        for m in sorted(_rglob(os.path.join(base, pattern))):  # (a file's pattern is escaped)
            if _record_builder(Path(m)) and os.path.isfile(m):
                yield m


def _bad_file_hint(path: str, data_files: Any) -> str:
    """Where the load of local data files failed, the first of them that holds no records: datasets' error names none
    ("CastError: Couldn't cast text: string to {}" for a shard of blank lines or a .json of ``[]`` read first among
    others), where the files kind skips such a file. Bounded reads alone (a large corpus failing for another reason
    is not read through to say so): the header or first characters, and a small file's text."""
    for m in _local_record_files(path, data_files):
        f = Path(m)
        small = f.stat().st_size <= 1 << 20 and _record_builder(f) != "parquet"
        if _no_records(f) or (small and _text_problem(f) == "empty"):
            return (f"; {m} holds no records, which datasets does not skip (the files kind does): leave it out of "
                    f"the source, or read the files with kind: files")
    return ""


def _json_line_hint(path: str, data_files: Any, e: BaseException) -> str:
    """Where datasets' json builder failed to parse a local JSON Lines file, the line that is not one JSON object:
    its error gives a row counted within the block of the file it was parsing ("JSON parse error: Invalid encoding in
    string. in row 106800" for line 250002 of a 22 MB file), and names no file. Read only after such a failure, each
    JSON file up to its first bad line: a .json file holding one JSON document over several lines is not JSON Lines,
    and a line that Python's json reads as it is (NaN, which datasets reads too) is not flagged."""
    if "JSON parse error" not in _cause(e):
        return ""
    for m in _local_record_files(path, data_files):
        if _record_builder(Path(m)) == "json" and (bad := _json_lines_problem(Path(m))):
            return f"; {os.path.normpath(m)}: {bad}"
    return ""


def _json_lines_problem(path: Path) -> Optional[str]:
    """The first line of a JSON Lines file that is not one JSON object (``line 3 is not valid JSON: Expecting value
    (column 10)``), None where every line is one, or where the file is one JSON document (a .json file: a list of
    records on one line, or a document over several lines)."""
    import lzma

    try:
        with _open_record_file(path, "rt", encoding="utf-8-sig") as f:
            objects = 0  # lines read as one object each: then the file is JSON Lines, whatever its suffix
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                    if "\\u" in line:  # an escaped lone surrogate (\ud800): Python reads it, Arrow refuses it
                        json.dumps(value, ensure_ascii=False).encode("utf-8")
                except json.JSONDecodeError as err:
                    if objects == 0 and _data_suffix(path)[0] == ".json":
                        return None
                    return f"line {n} is not valid JSON: {err.msg} (column {err.colno})"
                except UnicodeEncodeError:
                    return f"line {n} holds an escaped lone surrogate (\\ud800-\\udfff), which is no character"
                if not isinstance(value, dict):
                    if objects == 0 and _data_suffix(path)[0] == ".json":
                        return None
                    what = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
                        type(value), "a number")  # fmt: skip
                    return f'line {n} is {what}, not an object: JSON Lines hold one record, {{"text": ...}}, a line'
                objects += 1
    except (OSError, EOFError, ValueError, lzma.LZMAError):  # (unreadable, not UTF-8: datasets' error says it)
        return None
    return None


def _builder_hint(path: str, data_files: Any) -> str:
    """Where a record builder failed on a data file whose suffix names another record format (``path: json`` with
    ``a.csv``), the builder its suffix asks for: datasets' own error says only that the text did not parse ("JSON
    parse error: Invalid value", "Parquet magic bytes not found", for a .jsonl read as csv "Instruction "train"
    corresponds to no data!"). Said after the failure, not refused before: a file's suffix may lie."""
    if path not in RECORD_BUILDERS:
        return ""
    formats, _ = _datasets_formats()
    for f in _data_file_patterns(data_files):
        fmt = _file_format(Path(Path(str(f)).name), formats, set())
        if fmt in RECORD_BUILDERS and fmt != path:
            return (f"; {f} is a {fmt} file by its suffix, which path: {path} reads with datasets' {path} builder: "
                    f"set path: {fmt}")
    return ""


def _empty_slice(where: str, split: str, of: Any, sizes: Dict[str, int]) -> DataError:
    """The refusal of a ``split`` spec that selects no record (``train[:0]``, ``train[5:2]``, a slice of an empty
    split): reported as the source yielding no documents, with ``skipped: nothing``, or as a failure of the source."""
    counts = f" (records per split: {', '.join(f'{n} {k}' for n, k in sizes.items())})" if sizes else ""
    return DataError(f"{where}.split: {split!r} selects no records of {of}{counts}; give a slice that holds some, "
                     f"train[:1000] or train[10%:20%]")  # fmt: skip


def _not_a_split(split: str, of: Any, splits: Any) -> str:
    """The refusal of a ``split`` spec that names no split of ``of`` (its ``splits``) in load_dataset's syntax."""
    return (f"{split!r} is not a split of {of} (splits: {', '.join(splits)}), nor a slice or sum of them "
            "(train[:1000], train[10%:], train+test)")


def _check_split(where: str, path: str, name: Optional[str], split: str, data_files: Any,
                 cache_dir: Optional[str], call: str, settings: Dict[str, str]) -> None:  # fmt: skip
    """After load_dataset failed with a ValueError: raise ``DataError`` naming ``<where>.split`` and the dataset's
    splits when ``split`` names a split it lacks or is malformed (both were reported under ``<where>`` alone, as a
    failure of the whole source). The splits are asked of the dataset's builder, not read from datasets' message
    text; when they cannot be had (an unreachable Hub), nothing is raised here and the caller reports ``e``."""
    import datasets

    try:
        splits = datasets.get_dataset_split_names(path, name, data_files=data_files, cache_dir=cache_dir, **settings)
    except Exception:  # the builder itself cannot be had: the caller's error says why
        return
    try:  # load_dataset's own parser of split specs; the lengths only bound slices, which any length passes
        datasets.ReadInstruction.from_spec(split).to_absolute({s: 1 << 40 for s in splits})
    except ValueError:
        one = ("; a file, or a list of files, is the one split 'train' (a data_files mapping names others: "
               "{train: a.jsonl, validation: b.jsonl})" if data_files is not None
               and not isinstance(data_files, dict) else "")  # fmt: skip
        raise DataError(f"{where}.split: {_not_a_split(split, call, splits)}{one}") from None


def _cause(e: BaseException) -> str:
    """``Type: first line`` of ``e`` and of the errors it was raised from. datasets wraps a parse error of a data
    file in ``DatasetGenerationError: An error occurred while generating the dataset``: the wrapped error (``JSON
    parse error: Invalid value. in row 1``, ``Expected 2 fields in line 4, saw 3``) is the part that says what is
    wrong. An empty JSON file ends as a bare StopIteration (datasets 2.19: a SchemaInferenceError, "Please pass
    `features` or at least one example when writing data")."""
    from datasets.arrow_writer import SchemaInferenceError

    parts, seen = [], set()
    while e is not None and id(e) not in seen and len(parts) < 4:
        seen.add(id(e))
        first = (str(e).splitlines() or [""])[0] or ("no records (an empty file?)" if isinstance(e, StopIteration)
                                                     else "")  # fmt: skip
        if isinstance(e, SchemaInferenceError):
            first += " (no records: an empty file?)"
        parts.append(f"{type(e).__name__}: {first}" if first else type(e).__name__)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return " <- ".join(parts)


def _append_records(docs: SourceDocs, ds: Any, text_field: str, key: str, name: Callable[[int], str], file: str,
                    max_docs: Optional[int] = None, paths_key: Optional[str] = None) -> None:  # fmt: skip
    """Take the ``text_field`` of each record; non-string and empty values are skipped and counted. ``name``: the
    name of record i of ``ds`` (for the held-out hash). ``paths_key``: the glob key that matched ``file`` (files
    kind)."""
    columns = getattr(ds, "column_names", None)
    if columns is None and getattr(ds, "features", None) is not None:
        columns = list(ds.features)
    if columns is not None and text_field not in columns:
        # a glob over a code or docs tree (dir/**/*) also matches package.json, tsconfig.json...: not data at all
        suffix = _data_suffix(Path(file))[0]  # (a results table in the tree: some.csv, some.tsv)
        other = (f", or leave {file} out of {paths_key} (a {suffix} file is read as records)"
                 if paths_key and suffix in (".json", ".csv", ".tsv") else "")  # fmt: skip
        raise DataError(f"{key}: {text_field!r} is not a column of {file} (columns: {', '.join(columns)}); "
                        f"set text_field to one of them{other}")  # fmt: skip
    features = getattr(ds, "features", None)
    if features is None and columns is None and hasattr(ds, "take"):  # datasets before 3 streams a JSON file with
        # no features: the head's types, as a Dataset of it infers them (datasets 2.19)
        import datasets

        head = list(ds.take(1))
        features = datasets.Dataset.from_list(head).features if head else None
    kind = _column_kind(features[text_field]) if features is not None and text_field in features else None
    if kind is not None:  # a number or a list column: every record was skipped as not_text, and the error was "the
        # source yields no documents (skipped: not_text: 400)", naming neither text_field nor the text columns
        raise DataError(f"{key}: column {text_field!r} of {file} holds {kind}, not text; "
                        f"{_text_columns_hint(features, file)}")
    records = iter(ds.select_columns([text_field]) if columns is not None else ds)
    taken, not_text = len(docs.texts), docs.skipped["not_text"]
    for i in itertools.count():
        if max_docs is not None and len(docs.texts) >= max_docs:
            break
        try:
            rec = next(records)
        except StopIteration:
            break
        except UnicodeDecodeError as e:  # Arrow holds the bytes as they were; decoding them fails here
            where = key.rsplit(".", 1)[0]  # data.sources.<name>
            raise DataError(f"{where}: record {i} of {file} is not valid UTF-8 ({e.reason} at byte {e.start} of "
                            f"its text); re-encode the file as UTF-8") from None  # fmt: skip
        if text_field not in rec:
            raise DataError(f"{key}: record {i} of {file} has no field {text_field!r} (fields: {', '.join(rec)})")
        text = rec[text_field]
        if not isinstance(text, str) or not text.strip():
            docs.skip("empty" if isinstance(text, str) or text is None else "not_text", f"record {i} of {file}")
            continue
        docs.names.append(name(i))
        docs.texts.append(text)
    if features is not None and text_field in features and _mixed(features[text_field]) \
            and len(docs.texts) == taken and docs.skipped["not_text"] > not_text:  # fmt: skip
        # values of several types and not one of them text (numbers and lists, say): what a column of one type that
        # is not text says, not "the source yields no documents", nor a file silently skipped beside others
        raise DataError(f"{key}: column {text_field!r} of {file} holds no text (numbers, lists, objects); "
                        f"{_text_columns_hint(features, file)}")
