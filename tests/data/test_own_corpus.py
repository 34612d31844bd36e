"""A user's own corpus: symlinks, local record files that change, errors that say what went wrong."""

from __future__ import annotations

import json
import os
import re

import pytest

from minilm.data import held_out, load_corpus, validation_batches
from minilm.data.sources import parse_sources, read_source
from minilm.errors import DataError
from tests.data.conftest import make_data_cfg


def _read(name: str, entry: dict):
    return read_source(name, parse_sources({name: entry})[name], progress=False)


def test_a_file_reached_through_symlinks_is_read_once(tmp_path):
    """A symlink to a file of the corpus and a symlink loop (``ln -s . loop``, which ``**`` follows down to the
    OS's link limit) must not put the same text into the corpus again and again."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha document\n")
    (root / "sub" / "b.md").write_text("beta document\n")
    os.symlink("a.txt", root / "latest.txt")
    os.symlink(".", root / "sub" / "loop")
    docs = _read("mine", {"kind": "files", "paths": [f"{root}/**/*", f"{root}/a.txt"]})
    assert sorted(docs.texts) == ["alpha document\n", "beta document\n"]
    assert docs.names == [str(root / "a.txt"), str(root / "sub" / "b.md")]  # the first name in sorted order


def test_a_symlink_loop_under_a_glob_names_files_by_their_path_and_ends(tmp_path):
    """``**`` followed a symlink back to a parent directory down to the OS's 40-link limit: with one, every file
    below it was named through the loop (``a/up/a/up/.../x.txt``, sorting before ``a/x.txt``: the name the held-out
    split hashes); with two, the paths were 2^40 and the preparation never ended."""
    import signal

    root = tmp_path / "corpus"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.txt").write_text("a document below\n")
    (root / "y.txt").write_text("a document on top\n")
    os.symlink("..", root / "a" / "up")
    docs = _read("mine", {"kind": "files", "paths": [f"{root}/**/*"]})
    assert docs.names == [str(root / "a" / "x.txt"), str(root / "y.txt")]
    os.symlink("..", root / "a" / "up2")

    def hung(*_):
        raise TimeoutError("the glob did not end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        docs = _read("mine", {"kind": "files", "paths": [f"{root}/**/*"]})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert docs.names == [str(root / "a" / "x.txt"), str(root / "y.txt")]


def test_a_glob_over_the_cache_dir_reads_none_of_its_files(tmp_path, tiny_text_dir):
    """A corpus in data/ read with paths: [data/**/*] covers the default data.cache_dir, data/cache: the first
    preparation read its own lock file (skipped as 'unsupported suffix'), the next one keyed the cache's files into
    its key (a corpus prepared again on every run) and read the first corpus's meta.json as records, an error."""
    cache = tiny_text_dir / "cache"
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "files", "paths": [f"{tiny_text_dir}/**/*"]}},
                        cache_dir=str(cache))  # fmt: skip
    first = load_corpus(cfg, progress=False)
    assert first.stats["skipped"]["mine"] == {}
    again = load_corpus(cfg, progress=False)
    assert again.from_cache and again.cache_dir == first.cache_dir


def test_globs_matching_only_files_of_the_cache_dir_say_so(tmp_path, tiny_text_dir):
    """A data/ directory holding the default data/cache alone (the corpus not copied in yet), read with paths:
    [data/**/*]: every file matched is the cache's, none is read, and the error was "the source yields no documents
    (skipped: nothing)", naming neither the glob nor the cache."""
    cache = tmp_path / "data" / "cache"
    load_corpus(make_data_cfg(tmp_path, {"mine": {"kind": "files", "paths": [f"{tiny_text_dir}/*.py"]}},
                              cache_dir=str(cache)), progress=False)  # fmt: skip
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "files", "paths": [f"{tmp_path}/data/**/*"]}}, cache_dir=str(cache))
    with pytest.raises(DataError, match=r"^data\.sources\.mine\.paths: every file \[.*data/\*\*/\*'\] match is "
                                        rf"under data\.cache_dir \({re.escape(str(cache))}\)"):  # fmt: skip
        load_corpus(cfg, progress=False)


@pytest.mark.parametrize("kind", ["files", "hf"])
def test_a_record_file_rewritten_with_its_old_mtime_is_read_afresh(tmp_path, kind):
    """datasets caches a local file's records keyed by its mtime alone: a .jsonl replaced by another one with the
    same mtime (unpacked from an archive, ``cp -p``) changes the corpus key (its size changed) but was read back
    from that cache, so the corpus prepared again held the old records: training on stale text, silently."""
    path = tmp_path / "recs.jsonl"
    entry = {"kind": "files", "paths": [str(path)]} if kind == "files" else {"kind": "hf", "path": str(path)}
    texts = {}
    for version, records in (("old", ["the old record one", "the old record two"]),
                             ("new", ["a new record, longer than the old ones", "new two", "new three"])):  # fmt: skip
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in records))
        os.utime(path, ns=(1_600_000_000_000_000_000,) * 2)
        corpus = load_corpus(make_data_cfg(tmp_path, {"recs": entry}), progress=False)
        texts[version] = sorted(corpus.tokenizer.decode(s.doc(i)[:-1].tolist()) for s in (corpus.train, corpus.val)
                                for i in range(s.n_docs))  # fmt: skip
    assert texts["new"] == sorted(["a new record, longer than the old ones", "new two", "new three"])


@pytest.mark.parametrize("name, content, entry, says", [
    ("bad.jsonl", '{"text": "fine"}\n{"text": not json\n', {"kind": "files"}, "JSON parse error"),
    ("bad.csv", 'text,n\n"a",1\n"b",2,3\n', {"kind": "hf"}, "Expected 2 fields in line 3"),
    ("empty.jsonl", "", {"kind": "hf", "path": "json"}, "empty file"),
])  # fmt: skip
def test_a_data_file_datasets_cannot_parse_is_named_with_the_reason(tmp_path, name, content, entry, says):
    """datasets wraps a parse error in 'DatasetGenerationError: An error occurred while generating the dataset';
    the message gave only that, and for a files source of many record files not even which file."""
    path = tmp_path / name
    path.write_text(content)
    entry = dict(entry, **({"paths": [str(path)]} if entry["kind"] == "files" else
                           {"data_files": str(path)} if "path" in entry else {"path": str(path)}))  # fmt: skip
    with pytest.raises(DataError, match=says) as err:
        _read("mine", entry)
    assert str(path) in str(err.value) and "data.sources.mine" in str(err.value)


@pytest.mark.parametrize("bad_line, says", [
    ('{"text": "a record cut off\n', r"line 4 is not valid JSON"),
    ('"a string alone, not a record"\n', r"line 4 is a string, not an object"),
])  # fmt: skip
@pytest.mark.parametrize("kind", ["files", "hf"])
def test_a_jsonl_line_datasets_cannot_parse_is_named_by_its_line(tmp_path, kind, bad_line, says):
    """datasets' JSON parse error gives a row counted within the block of the file it was parsing ("in row 106800"
    for line 250002 of a 22 MB file) and names no file: the error names the file and the line."""
    path = tmp_path / "recs.jsonl"
    good = "".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(3))
    path.write_text(good + bad_line + good)
    entry = {"kind": "files", "paths": [str(path)]} if kind == "files" else {"kind": "hf", "path": str(path)}
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: {says}"):
        _read("mine", entry)


def test_a_json_parse_error_of_a_hub_dataset_names_no_file_of_the_working_directory(tmp_path, monkeypatch):
    """The hint reads the source's own local files: for a dataset of the Hub (no folder, no data_files) it read every
    file under the working directory, and could name one of the user's as the bad line of the dataset."""
    from minilm.data.sources import _json_line_hint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.jsonl").write_text('{"text": "a"}\nnot json\n')
    error = ValueError("JSON parse error: Invalid value. in row 1")
    assert _json_line_hint("someone/a-dataset", None, error) == ""
    said = f"; {tmp_path / 'notes.jsonl'}: line 2 is not valid JSON: Expecting value (column 1)"
    assert _json_line_hint(str(tmp_path), None, error) == said  # (a local folder: its files are read)


def test_an_hf_path_naming_a_missing_or_text_file_is_refused_before_the_hub(tmp_path, monkeypatch):
    """A typo in a local file's name (or a run from another directory) was taken for a Hub dataset name: about
    20 s of network retries, then "Couldn't reach 'trian.jsonl' on the Hub". A local .txt went the same way."""
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("datasets.load_dataset called: the path was sent to the Hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    (tmp_path / "notes.txt").write_text("some notes\n")
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "hf", "path": str(tmp_path / "trian.jsonl")}})
    with pytest.raises(DataError, match=r"data\.sources\.mine\.path: no such file: .*trian\.jsonl"):
        load_corpus(cfg, progress=False)
    with pytest.raises(DataError, match=r"data\.sources\.mine\.path: .*notes\.txt.*kind: files"):
        _read("mine", {"kind": "hf", "path": str(tmp_path / "notes.txt")})


@pytest.mark.parametrize("name, says", [("shard.arrow", r"not a \.arrow file; for an \.arrow file use path: arrow"),
                                         ("corpus.xml", r"not a \.xml file; convert it"),
                                         ("corpus.xml.gz", r"not a \.xml\.gz file")])
def test_an_hf_path_naming_an_existing_file_of_another_format_is_refused_before_the_hub(tmp_path, monkeypatch,
                                                                                        name, says):  # fmt: skip
    """An existing .arrow or .xml file as an hf path went to the Hub as a dataset name, as a missing file did: 30 s
    of network retries, then "Couldn't reach 'shard.arrow' on the Hub", naming neither the local file nor why."""
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("datasets.load_dataset called: the path was sent to the Hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    (tmp_path / name).write_bytes(b"text\thello\n")
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "hf", "path": str(tmp_path / name)}})
    where = rf"^data\.sources\.mine\.path: .*{re.escape(name)}: an hf source opens "
    with pytest.raises(DataError, match=where + rf".*{says}"):
        load_corpus(cfg, progress=False)


def test_an_hf_path_to_a_compressed_text_or_parquet_file_says_what_reads_it(tmp_path):
    """A .txt.gz was told to use kind: files, which skips compressed text files (the source then yielded no
    documents); a .parquet.gz failed in datasets with "Couldn't find any data file at" a file that exists."""
    import gzip

    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress(b"one line\nanother line\n"))
    with pytest.raises(DataError, match=r"for a \.txt\.gz file use path: text with data_files: .*notes\.txt\.gz") as e:
        _read("mine", {"kind": "hf", "path": str(tmp_path / "notes.txt.gz")})
    assert "kind: files" not in str(e.value)
    docs = _read("mine", {"kind": "hf", "path": "text", "data_files": str(tmp_path / "notes.txt.gz")})
    assert docs.texts == ["one line", "another line"]  # what the message advises reads it
    (tmp_path / "t.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(DataError, match=r"path: .*t\.parquet\.gz: a compressed \.parquet file is not read"):
        _read("mine", {"kind": "hf", "path": str(tmp_path / "t.parquet.gz")})


@pytest.mark.parametrize("suffix", [".parquet.gz", ".parquet.xz"])
def test_a_files_glob_matching_a_compressed_parquet_file_is_refused_as_by_the_hf_kind(tmp_path, suffix):
    """The hf kind refuses a compressed .parquet; the files kind skipped one as "unsupported suffix", and a source
    of only such files "yields no documents (skipped: not_text: 1)", naming neither the file nor why. Refused
    before any source is read (a corpus is keyed by its files first)."""
    import gzip

    (tmp_path / "a.txt").write_text("a text document\n")
    (tmp_path / f"t{suffix}").write_bytes(gzip.compress(b"PAR1"))
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "files", "paths": [str(tmp_path / "*")]}})
    with pytest.raises(DataError, match=rf"^data\.sources\.mine\.paths: .*t{re.escape(suffix)}: a compressed "
                                        r"\.parquet file is not read .*decompress it"):  # fmt: skip
        load_corpus(cfg, progress=False)
    # the parquet builder given one in data_files: "Parquet magic bytes not found in footer" under the source alone
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "hf", "path": "parquet", "data_files": str(tmp_path / "t*")}})
    with pytest.raises(DataError, match=r"^data\.sources\.mine\.data_files: .*: a compressed \.parquet file is not"):
        load_corpus(cfg, progress=False)


def test_a_byte_order_mark_is_not_part_of_a_text_document(tmp_path):
    """A UTF-8 file saved with a BOM (Windows editors) began its document with U+FEFF, trained as 3 byte tokens
    after every EOS before such a file; the .jsonl and .csv readers already drop it. CRLF line ends are text."""
    (tmp_path / "bom.txt").write_bytes("\ufeffhello\r\nworld\r\n".encode())
    (tmp_path / "only_bom.txt").write_bytes("\ufeff".encode())
    docs = _read("mine", {"kind": "files", "paths": [f"{tmp_path}/*.txt"]})
    assert docs.texts == ["hello\r\nworld\r\n"]
    assert dict(docs.skipped) == {"empty": 1}


def test_a_record_file_of_only_a_byte_order_mark_is_skipped_as_empty(tmp_path):
    """As a text file of only a BOM is (above); the record file stopped the preparation with datasets' "Empty JSON
    file". One with records after its BOM is read."""
    (tmp_path / "a.jsonl").write_bytes('\ufeff{"text": "hello"}\n'.encode())
    (tmp_path / "b.jsonl").write_bytes("\ufeff\n".encode())
    docs = _read("mine", {"kind": "files", "paths": [f"{tmp_path}/*.jsonl"]})
    assert docs.texts == ["hello"] and dict(docs.skipped) == {"empty": 1}


def test_a_small_source_beside_a_large_one_has_held_out_documents_to_validate_on(tmp_path, monkeypatch):
    """Three files of one's own beside a large source at weight 0 (as docs/data.md once advised for the embedded
    one): by hash alone none of the three was held out, and the phase stopped with "no val documents in any source
    with weight > 0" (after a false warning that no document was shorter than seq_len)."""
    monkeypatch.chdir(tmp_path)  # relative globs: the documents' names, and so the split, do not depend on tmp_path
    for d, files in (("big", [f"f{i:02d}" for i in range(40)]), ("mine", ["a", "b", "c"])):
        (tmp_path / d).mkdir()
        for f in files:
            (tmp_path / d / f"{f}.txt").write_text(f"{d} {f}: some words of text here\n" * 5)
    assert not held_out([f"big/big/f{i:02d}.txt" for i in range(40)] + ["mine/mine/a.txt", "mine/mine/b.txt",
                                                                        "mine/mine/c.txt"], 0.02)[-3:].any()
    cfg = make_data_cfg(tmp_path, {"big": {"kind": "files", "paths": ["big/*.txt"], "weight": 0},
                                   "mine": {"kind": "files", "paths": ["mine/*.txt"]}}, val_fraction=0.02)  # fmt: skip
    corpus = load_corpus(cfg, progress=False)
    assert (corpus.val.doc_source == corpus.source_names.index("mine")).sum() == 1
    (batch,) = validation_batches(corpus, cfg, seq_len=16, batch_size=2, n_batches=1, seed=0)
    assert batch["input_ids"].shape == (2, 16)


def test_a_phase_sampling_only_sources_without_held_out_documents_says_what_to_change(tmp_path):
    (tmp_path / "one.txt").write_text("the only document of this source\n" * 20)
    (tmp_path / "many").mkdir()
    for i in range(5):
        (tmp_path / "many" / f"{i}.txt").write_text(f"document {i} of the other source\n" * 20)
    sources = {"one": {"kind": "files", "paths": [str(tmp_path / "one.txt")]},
               "many": {"kind": "files", "paths": [f"{tmp_path}/many/*.txt"], "weight": 0}}  # fmt: skip
    cfg = make_data_cfg(tmp_path, sources)
    corpus = load_corpus(cfg, progress=False)
    says = r"no val documents .*weights: \{'one': 1\.0, 'many': 0\.0\}.*add documents to a source sampled"
    with pytest.raises(DataError, match=says) as e:
        validation_batches(corpus, cfg, seq_len=16, batch_size=2, n_batches=1, seed=0)
    assert "raise data.val_fraction" not in str(e.value)  # it holds out no document of a one-document source
    raised = make_data_cfg(tmp_path, sources, val_fraction=0.9)
    with pytest.raises(DataError, match="no val documents"):
        validation_batches(load_corpus(raised, progress=False), raised, seq_len=16, batch_size=2, n_batches=1, seed=0)


def test_sources_of_one_document_each_are_all_trained_on_and_validation_says_why_it_has_none(tmp_path):
    """Two sources of one big file each: the first source's document was held out as the corpus's one validation
    document, and training silently never drew from that source."""
    for d in ("wiki", "code"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "all.txt").write_text(f"{d}: some words of text here and there\n" * 50)
    cfg = make_data_cfg(tmp_path, {d: {"kind": "files", "paths": [f"{tmp_path}/{d}/*.txt"]} for d in ("wiki", "code")})
    corpus = load_corpus(cfg, progress=False)
    assert sorted(corpus.train.doc_source.tolist()) == [0, 1]
    with pytest.raises(DataError, match="the val split has no documents: .*each source here has one"):
        validation_batches(corpus, cfg, seq_len=16, batch_size=2, n_batches=1, seed=0)


def test_files_max_docs_stops_reading_at_the_cap(tmp_path):
    """max_docs (for a quick run on a large corpus) truncated after reading and converting every file: a files
    source of 2 documents still parsed all the .jsonl files, and a bad one after the cap stopped the run."""
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text(f"text document {i}\n")
    (tmp_path / "y.jsonl").write_text('{"text": "record one"}\n{"text": "record two"}\n')
    (tmp_path / "z.jsonl").write_text('{"text": "a record"}\n{"text": not json\n')
    docs = _read("mine", {"kind": "files", "paths": [f"{tmp_path}/*"], "max_docs": 2})
    assert docs.texts == ["text document 0\n", "text document 1\n"]
    four = _read("mine", {"kind": "files", "paths": [f"{tmp_path}/*"], "max_docs": 4})
    assert four.texts[2:] == ["text document 2\n", "record one"]  # records count towards the cap, in order
    with pytest.raises(DataError, match="JSON parse error"):
        _read("mine", {"kind": "files", "paths": [f"{tmp_path}/*"], "max_docs": 6})


@pytest.mark.parametrize("suffix, opener", [(".gz", "gzip"), (".bz2", "bz2"), (".xz", "lzma")])
def test_compressed_jsonl_files_are_read_by_both_kinds(tmp_path, monkeypatch, suffix, opener):
    """A corpus shipped as .jsonl.gz: the files kind skipped it as an unsupported suffix, and an hf source with
    that path sent it to the Hub as a dataset name. A missing one is a missing local file, not a Hub name."""
    import importlib

    path = tmp_path / f"recs.jsonl{suffix}"
    with importlib.import_module(opener).open(path, "wt") as f:
        f.write("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(3)))
    expected = ["record 0", "record 1", "record 2"]
    assert _read("mine", {"kind": "files", "paths": [str(path)]}).texts == expected
    assert _read("mine", {"kind": "hf", "path": str(path)}).texts == expected
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=rf"data\.sources\.mine\.path: no such file: gone\.jsonl{suffix} "):
        _read("mine", {"kind": "hf", "path": f"gone.jsonl{suffix}"})


def test_an_hf_path_under_home_is_the_local_file_and_is_in_the_cache_key(tmp_path, monkeypatch):
    """path: ~/recs.jsonl went to the Hub as a dataset name, and the cache key did not follow the file."""
    from minilm.data.sources import source_fingerprint

    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "recs.jsonl"
    path.write_text('{"text": "one record"}\n')
    entry = {"kind": "hf", "path": "~/recs.jsonl"}
    assert _read("mine", entry).texts == ["one record"]
    before = source_fingerprint("mine", parse_sources({"mine": entry})["mine"])
    path.write_text('{"text": "another record"}\n')
    assert source_fingerprint("mine", parse_sources({"mine": entry})["mine"]) != before



@pytest.mark.parametrize("form", ["string", "list", "mapping"])
def test_hf_data_files_under_home_are_read(tmp_path, monkeypatch, form):
    """data_files: ~/recs.jsonl went to datasets as it was, which took the ~ literally ("Unable to find
    '<cwd>/~/recs.jsonl'"), though the cache key expanded it, as path and the files kind's globs are."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "recs.jsonl").write_text('{"text": "one record"}\n')
    files = {"string": "~/recs.jsonl", "list": ["~/recs.jsonl"], "mapping": {"train": "~/recs.jsonl"}}[form]
    assert _read("mine", {"kind": "hf", "path": "json", "data_files": files}).texts == ["one record"]

@pytest.fixture
def bracketed(tmp_path, monkeypatch):
    """Files whose names hold glob characters (notes[1].txt, recs[1].jsonl) beside the files those names match as
    globs (notes1.txt, recs1.jsonl)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes[1].txt").write_text("the notes of [1]\n")
    (tmp_path / "notes1.txt").write_text("the notes of 1\n")
    for d in (tmp_path, tmp_path / "shards"):  # (shards: a local directory as an hf path, its data files in it)
        d.mkdir(exist_ok=True)
        (d / "recs[1].jsonl").write_text('{"text": "a record of [1]"}\n{"text": "another record of [1]"}\n')
        (d / "recs1.jsonl").write_text('{"text": "a record of 1"}\n')
    return tmp_path


def test_a_files_path_naming_an_existing_file_is_taken_literally_not_as_a_glob(bracketed):
    """paths: [notes[1].txt] read notes1.txt (the glob class [1]), or matched nothing without it; and a record file so
    named, matched by a glob, went to datasets as a pattern too, which read recs1.jsonl's records under its name."""
    assert _read("mine", {"kind": "files", "paths": ["notes[1].txt"]}).texts == ["the notes of [1]\n"]
    assert sorted(_read("mine", {"kind": "files", "paths": ["notes*.txt"]}).texts) == ["the notes of 1\n",
                                                                                       "the notes of [1]\n"]
    docs = _read("mine", {"kind": "files", "paths": ["recs[1].jsonl", "recs*.jsonl"]})
    assert sorted(docs.texts) == ["a record of 1", "a record of [1]", "another record of [1]"]
    (bracketed / "notes1.txt").unlink()  # as a glob, notes[1].txt now matches nothing: "matches no file"
    assert _read("mine", {"kind": "files", "paths": [str(bracketed / "notes[1].txt")]}).texts == ["the notes of [1]\n"]


@pytest.mark.parametrize("entry", [{"path": "recs[1].jsonl"}, {"path": "json", "data_files": "recs[1].jsonl"},
                                   {"path": "json", "data_files": {"train": ["recs[1].jsonl"]}},
                                   {"path": "shards", "data_files": "recs[1].jsonl"}])  # fmt: skip
def test_an_hf_data_file_naming_an_existing_file_is_taken_literally_and_keys_the_cache(bracketed, entry):
    """datasets takes every data file for a glob: recs[1].jsonl read recs1.jsonl's one record; and the cache key,
    which globbed it too, did not follow the file, so a rewritten recs[1].jsonl kept the stale corpus."""
    from minilm.data.sources import source_fingerprint

    entry = {"kind": "hf", **entry}
    assert _read("mine", entry).texts == ["a record of [1]", "another record of [1]"]
    before = source_fingerprint("mine", parse_sources({"mine": entry})["mine"])
    for d in (bracketed, bracketed / "shards"):
        (d / "recs[1].jsonl").write_text('{"text": "a longer record of [1] now"}\n')
    assert source_fingerprint("mine", parse_sources({"mine": entry})["mine"]) != before


def test_a_large_record_file_with_a_non_utf8_byte_late_is_skipped_like_a_small_one(tmp_path):
    """The UTF-8 pre-check stopped decoding after the first non-blank 1 MB block, so a .jsonl over 1 MB with a
    latin-1 byte further on was not skipped and counted (as documented, and as a small one is) but stopped the
    run at that record."""
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "a fine record"}\n')
    big = tmp_path / "big.jsonl"
    line = json.dumps({"text": "x" * 1000}) + "\n"
    big.write_bytes(line.encode() * 1200 + b'{"text": "caf\xe9"}\n')  # 1.2 MB, then latin-1
    docs = _read("mine", {"kind": "files", "paths": [str(big), str(good)]})
    assert docs.texts == ["a fine record"] and dict(docs.skipped) == {"non_utf8": 1}


def test_a_one_document_corpus_says_why_validation_has_nothing(tmp_path):
    """The advice was "add documents or change data.val_fraction", but no val_fraction holds out the only document
    of a source."""
    (tmp_path / "only.txt").write_text("the one and only document of this corpus\n" * 50)
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "files", "paths": [str(tmp_path / "only.txt")]}},
                        val_fraction=0.9)  # fmt: skip
    corpus = load_corpus(cfg, progress=False)
    with pytest.raises(DataError, match=r"the val split has no documents: .*each source here has one; add documents$"):
        validation_batches(corpus, cfg, seq_len=16, batch_size=2, n_batches=1, seed=0)


def test_resuming_on_a_corpus_whose_files_changed_says_why_the_corpus_differs(tmp_path):
    """With the config unchanged, a source file edited (or only touched) since gives another corpus key: the
    refusal said only "resume with the same config", which the user had done."""
    from minilm.data import make_sampler

    for i in range(4):
        (tmp_path / f"{i}.txt").write_text(f"document {i} with a few words in it\n" * 30)
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "files", "paths": [f"{tmp_path}/*.txt"]}})
    args = dict(seq_len=16, batch_size=2, seed=0, phase="p")
    state = make_sampler(load_corpus(cfg, progress=False), "train", cfg, **args).state_dict()
    os.utime(tmp_path / "0.txt", ns=(1_600_000_000_000_000_000,) * 2)
    now = make_sampler(load_corpus(cfg, progress=False), "train", cfg, **args)
    with pytest.raises(DataError, match=r"corpus: checkpoint .*size and mtime of every file .* touched since"):
        now.load_state_dict(state)


def test_resuming_on_another_corpus_names_a_minilm_upgrade_as_a_cause_too(tmp_path, monkeypatch):
    """The corpus key holds FORMAT_VERSION (4 -> 6 in one day): a run resumed after an upgrade was told only that
    its source files had changed, and the user went looking for an edited file."""
    from minilm.data import make_sampler, prepare

    (tmp_path / "0.txt").write_text("document with a few words in it\n" * 30)
    (tmp_path / "1.txt").write_text("another document, other words\n" * 30)
    cfg = make_data_cfg(tmp_path, {"mine": {"kind": "files", "paths": [f"{tmp_path}/*.txt"]}})
    args = dict(seq_len=16, batch_size=2, seed=0, phase="p")
    state = make_sampler(load_corpus(cfg, progress=False), "train", cfg, **args).state_dict()
    monkeypatch.setattr(prepare, "FORMAT_VERSION", prepare.FORMAT_VERSION + 1)
    now = make_sampler(load_corpus(cfg, progress=False), "train", cfg, **args)
    with pytest.raises(DataError, match=r"corpus: checkpoint .*a version of minilm that prepares data differently"):
        now.load_state_dict(state)


def _big_beside_mine(tmp_path, n_big: int, line: str, mine: str, big_weight=None) -> dict:
    """A source of ``n_big`` documents of twenty ``line``s each, beside three one-line documents ``mine i``: the
    sources mapping of a config over them (``big`` at ``big_weight`` when given)."""
    (tmp_path / "big").mkdir()
    for i in range(n_big):
        (tmp_path / "big" / f"{i}.txt").write_text(line.format(i=i) * 20)
    (tmp_path / "mine").mkdir()
    for i in range(3):
        (tmp_path / "mine" / f"{i}.txt").write_text(f"{mine} {i}\n")
    big = {"kind": "files", "paths": [f"{tmp_path}/big/*.txt"]}
    return {"big": big if big_weight is None else {**big, "weight": big_weight},
            "mine": {"kind": "files", "paths": [f"{tmp_path}/mine/*.txt"]}}


def test_a_batch_must_fit_in_the_sources_sampled_not_the_whole_corpus(tmp_path):
    """Three sentences of one's own beside a large source at weight 0 passed the 'fewer tokens than one batch'
    check (it counted the whole corpus), and every training row repeated those few tokens."""
    from minilm.data import make_sampler

    cfg = make_data_cfg(tmp_path, _big_beside_mine(tmp_path, 20, "a long enough document number {i}, many words\n",
                                                   "tiny", big_weight=0))  # fmt: skip
    corpus = load_corpus(cfg, progress=False)
    assert corpus.train.n_tokens > 4 * (32 + 1)  # the whole corpus would hold a batch
    with pytest.raises(DataError, match=r"the sources sampled \(mine\) have \d+ training tokens, fewer than one batch"):
        make_sampler(corpus, "train", cfg, seq_len=32, batch_size=4, seed=0, phase="p")


def test_a_phase_whose_sampled_source_has_fewer_training_tokens_than_a_row_is_warned_about(tmp_path, caplog):
    """A training row wraps around its source's documents as a validation row does: three sentences of one's own
    at weight 1 beside a large source passed the one-batch check (the large one holds it), and half the rows
    repeated those sentences without a word."""
    from omegaconf import OmegaConf

    from minilm.data import check_phase_data

    cfg = make_data_cfg(tmp_path, _big_beside_mine(tmp_path, 20, "a long enough document number {i}, many words\n",
                                                   "tiny"))  # fmt: skip
    corpus = load_corpus(cfg, progress=False)
    pcfg = OmegaConf.create({"train": {"seq_len": 32, "batch_size": 2}, "run": {"seed": 0}, "data": cfg})
    with caplog.at_level("WARNING", logger="minilm.data.sampler"):
        check_phase_data(corpus, pcfg, "p")
    said = [r.getMessage() for r in caplog.records if "fewer than one row" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("phase 'p': source mine has ") and "train split" in said[0]


def test_validation_warns_when_a_sampled_source_holds_out_less_than_a_row(tmp_path, caplog):
    """Validation rows of a source wrap around its held-out documents; the warning looked at the whole held-out
    split, so a small source's few held-out tokens beside a large weight-0 source were repeated without a word."""
    sources = _big_beside_mine(tmp_path, 30, "document number {i} of the big source, with words\n", "short", 0)
    cfg = make_data_cfg(tmp_path, sources, val_fraction=0.2)
    corpus = load_corpus(cfg, progress=False)
    assert corpus.val.n_tokens > 64 + 1  # the held-out split as a whole holds a row
    with caplog.at_level("WARNING"):
        validation_batches(corpus, cfg, seq_len=64, batch_size=2, n_batches=1, seed=0)
    assert "source mine has" in caplog.text and "fewer than one row of 65" in caplog.text


def test_a_json_file_that_is_not_data_says_to_leave_it_out_of_the_glob(tmp_path):
    """dir/**/* over a project also matches package.json: the advice was only to set text_field to one of its
    keys (name, version), which is not what the user wants."""
    (tmp_path / "notes.md").write_text("# some notes\n")
    (tmp_path / "package.json").write_text('{"name": "x", "version": "1.0"}\n')
    with pytest.raises(DataError, match=r"not a column of .*package\.json .*or leave .*package\.json out of "
                                        r"data\.sources\.mine\.paths"):  # fmt: skip
        _read("mine", {"kind": "files", "paths": [f"{tmp_path}/**/*"]})
