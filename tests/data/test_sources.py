"""Sources: the hf kind on local jsonl/parquet through datasets, files with records, the embedded corpus, and
a clear error for each kind of bad input."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minilm.data import load_corpus, make_sampler, parse_sources, stdlib_files
from minilm.data.sources import read_source
from minilm.errors import DataError
from tests.data.conftest import make_data_cfg

STORIES = [f"Once upon a time there was a fox number {i}. It ran {i} miles and slept.\n" * (2 + i % 4)
           for i in range(30)]  # fmt: skip


@pytest.fixture
def jsonl_file(tmp_path):
    path = tmp_path / "stories.jsonl"
    path.write_text("".join(json.dumps({"id": i, "story": t}) + "\n" for i, t in enumerate(STORIES)))
    return path


@pytest.fixture
def parquet_file(tmp_path):
    path = tmp_path / "stories.parquet"
    pq.write_table(pa.table({"id": list(range(len(STORIES))), "story": STORIES}), path)
    return path


@pytest.fixture
def csv_file(tmp_path):
    path = tmp_path / "stories.csv"
    with path.open("w", newline="") as f:  # (the stories hold newlines: quoted, as csv writes them)
        csv.writer(f).writerows([["id", "story"]] + [[i, t] for i, t in enumerate(STORIES)])
    return path


def _texts(corpus):
    return {corpus.tokenizer.decode(s.doc(i)[:-1].tolist()) for s in (corpus.train, corpus.val)
            for i in range(s.n_docs)}  # fmt: skip


@pytest.mark.parametrize("fixture", ["jsonl_file", "parquet_file"])
def test_hf_kind_loads_local_files_through_datasets(tmp_path, request, fixture):
    path = request.getfixturevalue(fixture)
    cfg = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(path), "text_field": "story"}})
    corpus = load_corpus(cfg, progress=False)
    assert _texts(corpus) == set(STORIES)
    capped = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(path), "text_field": "story", "max_docs": 7}})
    assert len(_texts(load_corpus(capped, progress=False))) == 7


def test_without_progress_datasets_draws_no_bars_either(tmp_path, jsonl_file, capfd):
    """prepare_data.py --quiet still drew datasets' "Generating train split" bars; with progress they stay."""
    from datasets.utils.tqdm import are_progress_bars_disabled

    for progress, drawn in ((False, False), (True, True)):
        cfg = make_data_cfg(tmp_path / str(progress), {"st": {"kind": "hf", "path": str(jsonl_file),
                                                              "text_field": "story"}})  # fmt: skip
        load_corpus(cfg, progress=progress)
        assert ("Generating train split" in capfd.readouterr().err) is drawn
        assert not are_progress_bars_disabled()  # as it was before


def test_hf_kind_with_builder_and_data_files(tmp_path, jsonl_file):
    cfg = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": "json", "data_files": str(jsonl_file),
                                          "text_field": "story", "streaming": True}})  # fmt: skip
    assert _texts(load_corpus(cfg, progress=False)) == set(STORIES)


def test_hf_kind_opens_a_save_to_disk_directory(tmp_path):
    """``datasets.load_dataset`` refuses a ``save_to_disk`` directory; the hf kind opens it with load_from_disk,
    a DatasetDict by ``split``, and re-saving other records there invalidates the cache."""
    import shutil

    import datasets

    one, whole = tmp_path / "one", tmp_path / "dict"
    datasets.Dataset.from_dict({"story": STORIES}).save_to_disk(str(one))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"story": STORIES[:20]}),
                          "test": datasets.Dataset.from_dict({"story": STORIES[20:]})}).save_to_disk(str(whole))
    cfg = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(one), "text_field": "story"}})
    assert _texts(load_corpus(cfg, progress=False)) == set(STORIES)
    test = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(whole), "split": "test", "text_field": "story"}})
    assert _texts(load_corpus(test, progress=False)) == set(STORIES[20:])
    bad = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(whole), "split": "val", "text_field": "story"}})
    with pytest.raises(DataError, match=r"data.sources.st.split: 'val' is not a split .*\(splits: train, test\)"):
        load_corpus(bad, progress=False)
    # a single Dataset has no splits: asking for one read all of it, silently
    single = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(one), "split": "test", "text_field": "story"}})
    with pytest.raises(DataError, match=r"data.sources.st.split: .*one holds one Dataset .*split 'test' cannot be"):
        load_corpus(single, progress=False)
    # nor configs: a name was ignored, silently
    named = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(whole), "name": "en", "text_field": "story"}})
    with pytest.raises(DataError, match=r"data.sources.st.name: .*dict was written by save_to_disk.*remove name"):
        load_corpus(named, progress=False)
    datasets.Dataset.from_dict({"story": STORIES[:10]}).save_to_disk(str(one) + ".new")
    for f in (one.parent / "one.new").iterdir():  # rewrite the files in place: the directory's mtime stays
        shutil.copyfile(f, one / f.name)
    assert _texts(load_corpus(cfg, progress=False)) == set(STORIES[:10])


def test_streaming_is_no_part_of_a_save_to_disk_sources_key(tmp_path):
    """A save_to_disk directory is memory-mapped whatever ``streaming`` says, but the setting was part of the
    corpus key: switching it prepared the same corpus again. It is keyed as false, the value of a config that leaves
    it out, so the key of such a config is the one it had."""
    import datasets

    from minilm.data.sources import source_fingerprint

    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"story": STORIES}).save_to_disk(str(saved))
    spec = {"kind": "hf", "path": str(saved), "text_field": "story"}
    first = load_corpus(make_data_cfg(tmp_path, {"st": spec}), progress=False)
    streamed = load_corpus(make_data_cfg(tmp_path, {"st": {**spec, "streaming": True}}), progress=False)
    assert streamed.from_cache and streamed.cache_dir == first.cache_dir
    # the settings hashed: every field as it was, streaming false, so a config without streaming keeps its key
    settings = source_fingerprint("st", parse_sources({"st": spec})["st"])["settings"]
    assert settings == {"kind": "hf", "path": str(saved), "name": None, "split": "train", "text_field": "story",
                        "data_files": None, "streaming": False, "max_docs": None}


@pytest.mark.parametrize("split, kept", [("train[:5]", STORIES[:5]), ("test[-50%:]", STORIES[25:]),
                                         ("train[10:12]+test", STORIES[10:12] + STORIES[20:])])
def test_hf_kind_takes_a_slice_of_a_save_to_disk_split(tmp_path, split, kept):
    """``split`` takes load_dataset's syntax (``train[:1000]``, percents, sums) for a save_to_disk directory too, as
    the hf kind documents it: a slice was refused as "not a split" of a saved DatasetDict or Dataset."""
    import datasets

    whole, one = tmp_path / "dict", tmp_path / "one"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"story": STORIES[:20]}),
                          "test": datasets.Dataset.from_dict({"story": STORIES[20:]})}).save_to_disk(str(whole))
    datasets.Dataset.from_dict({"story": STORIES}).save_to_disk(str(one))
    cfg = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(whole), "split": split, "text_field": "story"}})
    assert _texts(load_corpus(cfg, progress=False)) == set(kept)
    if split.startswith("train["):  # a single saved Dataset is the split "train": its slices too
        cfg = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(one), "split": split.split("+")[0],
                                              "text_field": "story"}})  # fmt: skip
        start, stop = (int(x or 0) for x in split.split("+")[0][6:-1].split(":"))
        assert _texts(load_corpus(cfg, progress=False)) == set(STORIES[start:stop])
    bad = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": str(whole), "split": "train[:5",
                                          "text_field": "story"}})  # fmt: skip
    with pytest.raises(DataError, match=r"data.sources.st.split: 'train\[:5' is not a split .*nor a slice or sum"):
        load_corpus(bad, progress=False)


@pytest.mark.parametrize("form, split, splits", [("file", "validation", "train"), ("file", "train[:5", "train"),
                                                  ("mapping", "valid[:5]", "train, test"),
                                                  ("stream", "validation", "train"), ("stream", "train+", "train")])
def test_a_split_load_dataset_lacks_is_reported_under_the_split_key(tmp_path, jsonl_file, form, split, splits):
    """A split the dataset lacks, or a malformed one, failed under data.sources.<name> alone (as a failure of the
    whole source, in datasets' words): the error names the split key and the dataset's splits."""
    spec = {"kind": "hf", "path": str(jsonl_file), "text_field": "story", "split": split}
    if form == "mapping":
        spec.update(path="json", data_files={"train": str(jsonl_file), "test": str(jsonl_file)})
    spec["streaming"] = form == "stream"
    one = r".*a file, or a list of files, is the one split 'train'" if form != "mapping" else ""
    with pytest.raises(DataError, match=rf"^data\.sources\.st\.split: '{re.escape(split)}' is not a split of "
                                        rf".*\(splits: {splits}\), nor a slice or sum of them{one}"):  # fmt: skip
        load_corpus(make_data_cfg(tmp_path, {"st": spec}), progress=False)


@pytest.mark.parametrize("split", ["train[:0]", "train[5:2]", "train[30:]"])
@pytest.mark.parametrize("form", ["file", "disk"])
def test_a_slice_of_no_record_is_refused_under_the_split_key(tmp_path, jsonl_file, form, split):
    """A slice that selects nothing failed as datasets' 'Instruction "train[:0]" corresponds to no data!' under the
    source alone, as "cannot tell which records ... 0 records read" (train[5:2]), or, from a save_to_disk directory, as
    "the source yields no documents (skipped: nothing); check its paths/settings": none named split."""
    import datasets

    path = jsonl_file
    if form == "disk":
        path = tmp_path / "saved"
        datasets.Dataset.from_dict({"story": STORIES}).save_to_disk(str(path))
    spec = {"kind": "hf", "path": str(path), "text_field": "story", "split": split}
    with pytest.raises(DataError, match=rf"^data\.sources\.st\.split: '{re.escape(split)}' selects no records of "):
        read_source("st", parse_sources({"st": spec})["st"], progress=False)


def test_a_split_spec_with_spaces_is_refused_under_the_split_key_with_the_spec_to_write(tmp_path, jsonl_file):
    """'train[:2] + train[3:5]' failed with datasets' "Split name should match ... but got ' train'", reported under
    the source, not its split key, and not saying that the spaces were the trouble."""
    spec = {"kind": "hf", "path": str(jsonl_file), "text_field": "story", "split": "train[:2] + train[3:5]"}
    with pytest.raises(DataError, match=r"^data\.sources\.st\.split: 'train\[:2\] \+ train\[3:5\]' holds spaces, "
                                        r"which datasets' split specs do not take; write 'train\[:2\]\+train\[3:5\]'$"):
        load_corpus(make_data_cfg(tmp_path, {"st": spec}), progress=False)


def test_a_streamed_slice_is_refused_naming_split_and_max_docs(tmp_path, jsonl_file):
    """datasets cannot stream a slice: its "Bad split: train[:5]" came under data.sources.st alone; the error names
    the split key and the way to a quick run (max_docs), and the split's name alone streams."""
    spec = {"kind": "hf", "path": str(jsonl_file), "text_field": "story", "streaming": True, "split": "train[:5]"}
    with pytest.raises(DataError, match=r"data\.sources\.st\.split: 'train\[:5\]' is a slice, which datasets cannot "
                                        r"stream .*max_docs: N"):  # fmt: skip
        load_corpus(make_data_cfg(tmp_path, {"st": spec}), progress=False)
    spec.update(split="train", max_docs=5)
    assert len(_texts(load_corpus(make_data_cfg(tmp_path, {"st": spec}), progress=False))) == 5


def _named(entry: dict) -> dict:
    """name -> text of the documents an hf source reads."""
    docs = read_source("st", parse_sources({"st": {"kind": "hf", "text_field": "story", **entry}})["st"],
                       progress=False)  # fmt: skip
    return dict(zip(docs.names, docs.texts))


@pytest.fixture
def two_splits(tmp_path, monkeypatch):
    """A train file of 30 records (every 7th one empty, skipped) and a test file of 10, as files and as a saved
    DatasetDict; relative paths, so the records' names do not depend on tmp_path."""
    import datasets

    monkeypatch.chdir(tmp_path)
    records = {"train": ["" if i % 7 == 3 else t for i, t in enumerate(STORIES)],
               "test": [f"A test story {i} about a heron.\n" for i in range(10)]}  # fmt: skip
    for split, texts in records.items():
        Path(f"{split}.jsonl").write_text("".join(json.dumps({"story": t}) + "\n" for t in texts))
    saved = datasets.DatasetDict({k: datasets.Dataset.from_dict({"story": v}) for k, v in records.items()})
    saved.save_to_disk("saved")
    return {"train": "train.jsonl", "test": "test.jsonl"}


@pytest.mark.parametrize("form, split, n", [("file", "train[:20]", 17), ("file", "train[10:25]", 12),
                                            ("file", "train[-40%:]", 11), ("mapping", "train[5:]+test[:50%]", 27),
                                            ("disk", "train[:20]", 17), ("disk", "test[3:]+train[-5:]", 12),
                                            ("stream", "test+train", 30)])  # fmt: skip
def test_an_hf_record_is_named_by_its_split_and_index_there_however_the_split_is_sliced(two_splits, form, split, n):
    """The held-out hash names a record; the name held the split spec and the record's place among the rows read,
    so widening train[:1000] to train[:2000] renamed every record and held other documents out (ones held out
    before were trained on). A record of a slice, a sum, a save_to_disk split or a stream is named as in its whole
    split, skipped (empty) records counted in its index."""
    entry = {"mapping": {"path": "json", "data_files": two_splits}, "disk": {"path": "saved"},
             "file": {"path": "train.jsonl"}, "stream": {"path": "json", "data_files": two_splits,
                                                         "streaming": True, "max_docs": 30}}[form]  # fmt: skip
    whole = {k: v for s in ("train", "test") if form != "file" or s == "train"
             for k, v in _named({**entry, "split": s, "streaming": False, "max_docs": None}).items()}
    named = _named({**entry, "split": split})
    assert len(whole) == (26 if form == "file" else 36)  # (no record of train named as one of test)
    assert len(named) == n and named.items() <= whole.items()


def test_a_whole_hf_split_is_named_without_the_split_sizes_a_builder_records(monkeypatch):
    """A whole split's records are named by their order alone: a dataset that records no split sizes (info.splits
    None, as a Dataset built in memory has) is read, not refused for want of the sizes a slice is resolved by."""
    import datasets

    from minilm.data import sources

    ds = datasets.Dataset.from_dict({"text": ["a", "b", "c"]})
    assert ds.info.splits is None
    monkeypatch.setattr(sources, "_load_dataset", lambda *a, **k: ds)
    assert sources._load_split("data.sources.x", "p", None, "train", None, None) == (ds, [("train", 0, 3)])
    with pytest.raises(DataError, match=r"data\.sources\.x\.split: cannot tell which records"):
        sources._load_split("data.sources.x", "p", None, "train[:2]", None, None)


def test_widening_an_hf_slice_keeps_the_held_out_documents_held_out(tmp_path, two_splits):
    """What the names are for: a run on train[:20] and one on all of train validate on the same documents of the
    first 20, and none held out in the first run is trained on in the second."""

    def held_out_texts(split):
        cfg = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": "train.jsonl", "split": split,
                                              "text_field": "story"}}, val_fraction=0.2)  # fmt: skip
        corpus = load_corpus(cfg, progress=False)
        return {corpus.tokenizer.decode(corpus.val.doc(i)[:-1].tolist()) for i in range(corpus.val.n_docs)}

    narrow, wide = held_out_texts("train[:20]"), held_out_texts("train")
    assert narrow and narrow <= wide and wide - narrow <= set(STORIES[20:])


def test_the_corpus_key_of_an_hf_slice_or_sum_changed_with_its_record_names(two_splits):
    """A corpus prepared from a slice or sum before its records were named by split and index (2026-11-24) held
    other documents out: its key changed, so it is prepared again rather than served from the cache; a whole split's
    records had those names already, and its key stays (settings and files alone)."""
    from minilm.data.sources import source_fingerprint

    def fingerprint(split):
        spec = parse_sources({"st": {"kind": "hf", "path": "train.jsonl", "split": split}})["st"]
        return source_fingerprint("st", spec)

    assert set(fingerprint("train")) == {"settings", "files"}
    for split in ("train[:20]", "train+train", "train[:]"):
        assert set(fingerprint(split)) > {"settings", "files"}, split


def test_the_corpus_key_of_a_files_source_matching_a_csv_changed_when_csv_files_began_to_be_read(tmp_path):
    """A .csv a files glob matched was skipped before 2026-11-24 and is read since; the key held the same files and
    settings, so a corpus prepared before (without the .csv records) was served from the cache. A glob matching no
    .csv keeps its key."""
    from minilm.data.sources import source_fingerprint

    (tmp_path / "a.txt").write_text("some text\n")
    (tmp_path / "b.csv").write_text("text\nhello\n")

    def fingerprint(pattern):
        spec = parse_sources({"f": {"kind": "files", "paths": [str(tmp_path / pattern)]}})["f"]
        return source_fingerprint("f", spec)

    assert set(fingerprint("*.txt")) == {"settings", "files"}
    assert set(fingerprint("*")) > {"settings", "files"}


@pytest.mark.parametrize("form", ["glob", "dict"])
def test_hf_data_files_pattern_or_mapping_follows_the_files_it_matches(tmp_path, monkeypatch, form):
    """The cache key hashes the files ``data_files`` names, not the pattern: a glob gaining a file, or a file of a
    ``{split: [...]}`` mapping rewritten, prepares again (the key hashed only the literal strings / the mapping's
    split names, so the stale corpus was reused and the new records never trained)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shards").mkdir()

    def shard(name, texts):
        (tmp_path / "shards" / name).write_text("".join(json.dumps({"story": t}) + "\n" for t in texts))

    shard("a.jsonl", STORIES[:15])
    data_files = "shards/*.jsonl" if form == "glob" else {"train": ["shards/a.jsonl"]}
    cfg = make_data_cfg(tmp_path, {"st": {"kind": "hf", "path": "json", "data_files": data_files,
                                          "text_field": "story"}})  # fmt: skip
    first = load_corpus(cfg, progress=False)
    assert _texts(first) == set(STORIES[:15])
    if form == "glob":
        shard("b.jsonl", STORIES[15:])
    else:
        shard("a.jsonl", STORIES)
    again = load_corpus(cfg, progress=False)
    assert not again.from_cache and again.cache_dir != first.cache_dir
    assert _texts(again) == set(STORIES)


def test_files_kind_reads_records_and_text_files(tmp_path, parquet_file, tiny_text_dir):
    cfg = make_data_cfg(tmp_path, {"f": {"kind": "files", "text_field": "story",
                                         "paths": [str(parquet_file), f"{tiny_text_dir}/doc_00*.py"]}})  # fmt: skip
    texts = _texts(load_corpus(cfg, progress=False))
    assert set(STORIES) <= texts and len(texts) == len(STORIES) + 10


def test_files_kind_reads_csv_records_as_the_json_ones(tmp_path, csv_file):
    """A .csv file (compressed too) is records, its text in text_field, as a .jsonl one: it was skipped as a file of
    an unsupported suffix. Quoted commas and newlines are text; an empty cell is skipped as an empty record, and an
    empty or non-UTF-8 file as such a .jsonl file is."""
    import gzip

    (tmp_path / "more.csv.gz").write_bytes(gzip.compress(b'story,n\n"a tale, with a comma",1\n,2\n'))
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "latin1.csv").write_bytes(b"story\ncaf\xe9\n")
    entry = {"kind": "files", "paths": [str(csv_file), f"{tmp_path}/*.csv*"], "text_field": "story"}
    docs = read_source("f", parse_sources({"f": entry})["f"], progress=False)
    assert docs.texts == STORIES + ["a tale, with a comma"]
    assert dict(docs.skipped) == {"empty": 2, "non_utf8": 1}



# a tab-separated file as people write them: by hand (quotes and commas inside a cell are text), and as Python's csv
# module (or pandas) writes one, quoting a cell that holds a quote, a tab or a newline
TSV = (b'id\tstory\tn\n1\tshe said "hi", twice\t3\n'
       b'2\t"quoted, with a ""quote"", a\ttab and a\nnewline"\t4\n')  # fmt: skip
TSV_TEXTS = ['she said "hi", twice', 'quoted, with a "quote", a\ttab and a\nnewline']


def test_files_kind_reads_tsv_records_as_the_csv_ones_each_file_with_its_own_delimiter(tmp_path):
    """A .tsv file (compressed too) is records as a .csv one is, read with a tab as the delimiter: it was skipped as
    a file of an unsupported suffix. A .csv and a .tsv in one source are each read with their own delimiter (the
    files kind reads each record file on its own), and an empty, header-only or non-UTF-8 .tsv is skipped as such a
    .csv is."""
    import gzip

    (tmp_path / "a.tsv").write_bytes(TSV.replace(b"story", b"text"))
    (tmp_path / "b.tsv.gz").write_bytes(gzip.compress(b"text\tn\na gzipped, tab-separated record\t1\n"))
    (tmp_path / "c.csv").write_bytes(b'text,n\n"a comma, separated record",1\n')
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "head.tsv").write_text("text\tn\n\n")
    (tmp_path / "latin1.tsv").write_bytes(b"text\ncaf\xe9\n")
    entry = {"kind": "files", "paths": [f"{tmp_path}/*.[ct]sv*"]}
    docs = read_source("f", parse_sources({"f": entry})["f"], progress=False)
    assert docs.texts == TSV_TEXTS + ["a gzipped, tab-separated record", "a comma, separated record"]
    assert dict(docs.skipped) == {"empty": 2, "non_utf8": 1}
    assert docs.names[0] == f"{tmp_path / 'a.tsv'}:0"


@pytest.mark.parametrize("form", ["path", "path.gz", "data_files", "streaming"])
def test_hf_kind_reads_a_local_tsv_file_with_a_tab_as_the_delimiter(tmp_path, form):
    """An hf source's path naming a local .tsv was refused ("not a .tsv file; convert it"), and the csv builder given
    .tsv data_files read them with a comma: one column named 'id<TAB>story<TAB>n'."""
    import gzip

    path = tmp_path / ("stories.tsv.gz" if form == "path.gz" else "stories.tsv")
    path.write_bytes(gzip.compress(TSV) if form == "path.gz" else TSV)
    entry = ({"path": str(path)} if form.startswith("path") else
             {"path": "csv", "data_files": [str(path)], "streaming": form == "streaming"})  # fmt: skip
    docs = read_source("h", parse_sources({"h": {"kind": "hf", "text_field": "story", **entry}})["h"], progress=False)
    assert docs.texts == TSV_TEXTS


def test_an_hf_source_mixing_csv_and_tsv_data_files_is_refused_naming_one_of_each(tmp_path, csv_file):
    """datasets reads the data files of one load_dataset call with one delimiter: a .csv read with a tab, or a .tsv
    with a comma, is one column of joined names. Refused before any source is read, naming a file of each kind."""
    from minilm.data.sources import source_fingerprint

    (tmp_path / "more.tsv").write_bytes(TSV)
    for name, entry in (("h", {"path": "csv", "data_files": [str(csv_file), str(tmp_path / "more.tsv")]}),
                        ("d", {"path": str(tmp_path)})):  # a directory of data files: datasets infers the builder
        spec = parse_sources({name: {"kind": "hf", "text_field": "story", **entry}})[name]
        key = "data_files" if name == "h" else "path"
        with pytest.raises(DataError, match=rf"^data\.sources\.{name}\.{key}: {re.escape(str(csv_file))} is comma-"
                                            r"separated and .*more\.tsv tab-separated.*kind: files"):  # fmt: skip
            source_fingerprint(name, spec)


@pytest.mark.parametrize("kind", ["files", "hf"])
def test_a_tsv_file_without_the_named_field_names_the_file_and_its_columns(tmp_path, kind):
    path = tmp_path / "stories.tsv"
    path.write_bytes(TSV)
    entry = {"paths": [str(path)]} if kind == "files" else {"path": str(path)}
    cfg = make_data_cfg(tmp_path, {"x": {"kind": kind, **entry}})
    with pytest.raises(DataError, match=rf"data\.sources\.x\.text_field: 'text' is not a column of "
                                        rf"{re.escape(str(path))} \(columns: id, story, n\)") as err:  # fmt: skip
        load_corpus(cfg, progress=False)
    left_out = f"or leave {path} out of data.sources.x.paths (a .tsv file is read as records)"
    assert (left_out in str(err.value)) is (kind == "files")


def test_the_corpus_key_of_a_files_source_matching_a_tsv_changed_when_tsv_files_began_to_be_read(tmp_path):
    """A .tsv a files glob matched was skipped as an unsupported suffix and is read since; the key held the same
    files and settings, so a corpus prepared before (without the .tsv records) would be served from the cache. A
    glob matching .csv files alone keeps the key it had."""
    from minilm.data.sources import source_fingerprint

    (tmp_path / "a.csv").write_text("text\nhello\n")
    (tmp_path / "b.tsv").write_text("text\nhello\n")

    def fingerprint(pattern):
        spec = parse_sources({"f": {"kind": "files", "paths": [str(tmp_path / pattern)]}})["f"]
        return source_fingerprint("f", spec)

    assert set(fingerprint("*.csv")) == {"settings", "files", "csv"}
    assert set(fingerprint("*")) > {"settings", "files", "csv"}


def test_record_files_of_no_records_are_skipped_as_empty_and_an_hf_source_of_one_yields_no_documents(tmp_path,
                                                                                                    csv_file):
    """A .csv of a header alone (compressed too, blank lines after it), a .json of ``[]`` and a parquet file of no
    rows stopped the whole preparation with datasets' 'Instruction "train" corresponds to no data!' (parquet:
    "BatchSize must be greater than 0"), where an empty .jsonl is skipped and counted; an hf source of one such file
    said the same, naming no file."""
    import gzip

    (tmp_path / "head.csv").write_text("story,n\n\n")
    (tmp_path / "head.csv.gz").write_bytes(gzip.compress(b"story\n"))
    (tmp_path / "none.json").write_text("[ ]\n")
    pq.write_table(pa.table({"story": pa.array([], pa.string())}), tmp_path / "none.parquet")
    empty = ["head.csv", "head.csv.gz", "none.json", "none.parquet"]
    entry = {"kind": "files", "paths": [str(csv_file)] + [str(tmp_path / e) for e in empty], "text_field": "story"}
    docs = read_source("f", parse_sources({"f": entry})["f"], progress=False)
    assert docs.texts == STORIES and dict(docs.skipped) == {"empty": 4}
    for name in empty:
        hf = {"kind": "hf", "path": str(tmp_path / name), "text_field": "story"}
        with pytest.raises(DataError, match=r"^data\.sources\.h: the source yields no documents \(skipped: empty: 1 "
                                            rf"\(first: {re.escape(str(tmp_path / name))}\)\)"):  # fmt: skip
            read_source("h", parse_sources({"h": hf})["h"], progress=False)

def test_embedded_corpus_is_the_stdlib_without_site_packages():
    import sysconfig

    files = stdlib_files()
    assert len(files) > 500 and not any("site-packages" in p.parts for p in files)
    assert any(p.name == "os.py" for p in files)
    # the walk that skips installed packages lists what filtering every file under the stdlib does, in the same
    # order: the documents' order and the corpus cache key (prepared corpora stay valid) depend on it
    root = Path(sysconfig.get_paths()["stdlib"])
    assert files == sorted(p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))


def test_embedded_max_docs(tmp_path):
    cfg = make_data_cfg(tmp_path, {"embedded": {"kind": "embedded", "max_docs": 12}})
    corpus = load_corpus(cfg, progress=False)
    assert corpus.train.n_docs + corpus.val.n_docs + sum(corpus.stats["skipped"]["embedded"].values()) == 12


# ------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("sources, match", [
    ({}, "non-empty mapping"),
    ({"x": {"kind": "web"}}, r"data\.sources\.x\.kind: must be one of"),
    ({"x": {"kind": "files", "paths": ["a/*.txt"], "colour": 1}}, r"data\.sources\.x\.colour: unknown key"),
    ({"x": {"kind": "files", "paths": []}}, r"data\.sources\.x\.paths"),
    ({"x": {"kind": "embedded", "weight": -1}}, r"data\.sources\.x\.weight: must be a finite number >= 0"),
    # a YAML .nan / .inf weight normalized every weight to nan or 0: a misleading "no documents" error later
    ({"x": {"kind": "embedded", "weight": float("nan")}}, r"data\.sources\.x\.weight: must be a finite.*nan"),
    ({"x": {"kind": "embedded"}, "y": {"kind": "embedded", "weight": float("inf")}},
     r"data\.sources\.y\.weight: must be a finite.*inf"),
    ({"x": {"kind": "embedded", "weight": 0}, "y": {"kind": "embedded", "weight": 0}}, "all weights are zero"),
    ({"x": {"kind": "embedded", "max_docs": 0}}, r"data\.sources\.x\.max_docs"),
    ({"x": {"kind": "hf"}}, r"data\.sources\.x\.path"),
    # text_field names one column: a number, a list or "" is refused here, not when (or whether) records are read
    ({"x": {"kind": "files", "paths": ["a/*.jsonl"], "text_field": 3}},
     r"data\.sources\.x\.text_field: must be a non-empty string.*got 3"),
    ({"x": {"kind": "files", "paths": ["a/*.txt"], "text_field": ["a", "b"]}},
     r"data\.sources\.x\.text_field: must be a non-empty string.*got \['a', 'b'\]"),
    ({"x": {"kind": "hf", "path": "json", "text_field": ""}}, r"data\.sources\.x\.text_field: must be a non-empty"),
    ({"x": {"kind": "hf", "path": "json", "text_field": None}}, r"data\.sources\.x\.text_field: must be a non-empty"),
    # each went to the reader or to datasets as it was: a TypeError traceback, or (streaming) a string read as true
    ({"x": {"kind": "files", "paths": 5}}, r"data\.sources\.x\.paths: give a non-empty list of glob patterns"),
    ({"x": {"kind": "hf", "path": "json", "data_files": 5}}, r"data\.sources\.x\.data_files: give a file or glob"),
    ({"x": {"kind": "hf", "path": "json", "data_files": {"train": 5}}}, r"data\.sources\.x\.data_files: give"),
    ({"x": {"kind": "hf", "path": "a.jsonl", "split": ["train"]}}, r"data\.sources\.x\.split: give one split"),
    ({"x": {"kind": "hf", "path": "a.jsonl", "streaming": "yes_please"}}, r"data\.sources\.x\.streaming: must be"),
    ({"x": {"kind": "hf", "path": "a.jsonl", "name": 3}}, r"data\.sources\.x\.name: give the dataset's config"),
])  # fmt: skip
def test_bad_source_configs_name_the_key(sources, match):
    with pytest.raises(DataError, match=match):
        parse_sources(sources)


def test_a_name_that_selects_nothing_is_refused(tmp_path):
    """A local file and datasets' builders of data files have no configs: a name (a Hub config name kept on a local
    copy) was taken silently, and only renamed the records, so another held-out split, as for save_to_disk."""
    (tmp_path / "a.jsonl").write_text("".join(f'{{"text": "record {i}"}}\n' for i in range(5)))
    for src in ({"path": str(tmp_path / "a.jsonl")}, {"path": "json", "data_files": str(tmp_path / "a.jsonl")}):
        cfg = make_data_cfg(tmp_path, {"x": {"kind": "hf", "name": "wikitext-103-raw-v1", **src}})
        with pytest.raises(DataError, match=r"data\.sources\.x\.name: .* has no dataset configs: name "
                                            r"'wikitext-103-raw-v1' selects nothing .*; remove name"):
            load_corpus(cfg, progress=False)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("corpus-*"))


def test_glob_that_matches_nothing(tmp_path):
    cfg = make_data_cfg(tmp_path, {"x": {"kind": "files", "paths": [f"{tmp_path}/nothing/*.txt"]}})
    with pytest.raises(DataError, match=r"data\.sources\.x\.paths: the glob .* matches no file"):
        load_corpus(cfg, progress=False)


def test_hf_data_files_that_match_no_file_are_named(tmp_path):
    """datasets 5 ends a data_files glob that matches no file with a bare StopIteration, which was reported as
    "no records (an empty file?)"; now the key and the pattern are named, before any source is read."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text("".join(f'{{"text": "record {i}"}}\n' for i in range(5)))
    for entry, pattern in (({"path": "json", "data_files": f"{tmp_path}/nothing/*.jsonl"}, "nothing/*.jsonl"),
                           ({"path": "json", "data_files": {"train": f"{tmp_path}/d/a.jsonl",
                                                            "validation": f"{tmp_path}/d/b.jsonl"}}, "d/b.jsonl"),
                           ({"path": str(tmp_path / "d"), "data_files": "b*.jsonl"}, "b*.jsonl")):  # fmt: skip
        cfg = make_data_cfg(tmp_path, {"x": {"kind": "hf", **entry}})
        with pytest.raises(DataError, match=rf"^data\.sources\.x\.data_files: '[^']*{re.escape(pattern)}' matches no "
                                            r"file \(cwd: "):  # fmt: skip
            load_corpus(cfg, progress=False)
    ok = make_data_cfg(tmp_path, {"x": {"kind": "hf", "path": str(tmp_path / "d"), "data_files": "a*.jsonl"}})
    assert load_corpus(ok, progress=False).train.n_docs + load_corpus(ok, progress=False).val.n_docs == 5


@pytest.mark.parametrize("empty", ["a.jsonl", "a.json"])
def test_an_empty_hf_data_file_that_datasets_fails_on_is_named(tmp_path, empty):
    """A shard of blank lines, or a .json of [], read first among others: datasets fails with "CastError: Couldn't
    cast", naming no file (the files kind skips such a file); the error now names it."""
    d = tmp_path / "d"
    d.mkdir()
    (d / empty).write_text("\n\n" if empty.endswith("l") else "[]\n")
    (d / "b.jsonl").write_text("".join(f'{{"text": "record {i}"}}\n' for i in range(5)))
    for entry in ({"path": "json", "data_files": [str(d / empty), str(d / "b.jsonl")]}, {"path": str(d)}):
        cfg = make_data_cfg(tmp_path, {"x": {"kind": "hf", **entry}})
        with pytest.raises(DataError, match=rf"^data\.sources\.x: datasets.load_dataset.* failed: .*; "
                                            rf"{re.escape(str(d / empty))} holds no records, which datasets "
                                            r"does not skip \(the files kind does\)"):  # fmt: skip
            load_corpus(cfg, progress=False)


def test_a_directory_instead_of_a_glob_says_how_to_read_its_files(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "a.txt").write_text("nested document\n" * 20)
    cfg = make_data_cfg(tmp_path, {"x": {"kind": "files", "paths": [str(tmp_path / "d")]}})
    with pytest.raises(DataError, match=r"matches no file .*d is a directory: '.*d/\*\*/\*' reads the files"):
        load_corpus(cfg, progress=False)


def test_empty_source(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "a.txt").write_text("  \n")
    (tmp_path / "e" / "b.txt").write_bytes(b"\xff\xfe bad utf8")
    cfg = make_data_cfg(tmp_path, {"x": {"kind": "files", "paths": [f"{tmp_path}/e/*.txt"]}})
    with pytest.raises(DataError, match=r"data\.sources\.x: the source yields no documents .*empty.*non_utf8"):
        load_corpus(cfg, progress=False)


def test_a_file_of_an_unsupported_suffix_is_named_in_the_skip_warning(tmp_path, caplog):
    """The files kind named the first file of every skip reason but this one: '2 file(s) with unsupported suffix
    skipped' sent a user looking through a glob's matches for them."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("def f():\n    return 1\n" * 20)
    for name in ("b.rst", "c.log"):
        (tmp_path / "d" / name).write_text("x")
    cfg = make_data_cfg(tmp_path, {"f": {"kind": "files", "paths": [f"{tmp_path}/d/*"]}})
    load_corpus(cfg, progress=False)
    assert f"2 file(s) with unsupported suffix skipped (first: {tmp_path / 'd' / 'b.rst'}; allowed:" in caplog.text


def test_a_source_of_only_unsupported_files_names_the_first_in_its_error(tmp_path):
    """A glob matching only .rst / .log files: the error a run ends with said "the source yields no documents
    (skipped: not_text: 2)", naming no file, where every other skip reason names its first."""
    (tmp_path / "d").mkdir()
    for name in ("b.rst", "c.log"):
        (tmp_path / "d" / name).write_text("some text\n" * 20)
    cfg = make_data_cfg(tmp_path, {"f": {"kind": "files", "paths": [f"{tmp_path}/d/*"]}})
    with pytest.raises(DataError, match=r"data\.sources\.f: the source yields no documents \(skipped: not_text: 2 "
                                        rf"\(first: {re.escape(str(tmp_path / 'd' / 'b.rst'))}\)\)"):  # fmt: skip
        load_corpus(cfg, progress=False)


def test_empty_and_non_utf8_record_files_are_skipped_and_counted_like_text_files(tmp_path, jsonl_file, caplog):
    """A files source skips an empty or non-UTF-8 .jsonl and counts it, as it does a .txt (an empty one stopped
    the run with 'StopIteration: StopIteration', a Latin-1 one with a bare UnicodeDecodeError traceback). The
    warning names the first file of each reason: a count alone left a user looking for the file that one bad byte
    dropped whole."""
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"story": "caf\xe9"}\n')
    paths = [str(jsonl_file), str(tmp_path / "empty.jsonl"), str(tmp_path / "latin1.jsonl")]
    cfg = make_data_cfg(tmp_path, {"f": {"kind": "files", "paths": paths, "text_field": "story"}})
    corpus = load_corpus(cfg, progress=False)
    assert _texts(corpus) == set(STORIES)
    assert corpus.stats["skipped"]["f"] == {"empty": 1, "non_utf8": 1}
    named = f"empty: 1 (first: {tmp_path / 'empty.jsonl'}), non_utf8: 1 (first: {tmp_path / 'latin1.jsonl'})"
    assert named in caplog.text
    for bad, reason in (("empty.jsonl", "empty"), ("latin1.jsonl", "non_utf8")):  # the hf kind: nothing to read
        one = make_data_cfg(tmp_path, {"h": {"kind": "hf", "path": str(tmp_path / bad), "text_field": "story"}})
        with pytest.raises(DataError, match=rf"data\.sources\.h: the source yields no documents .*{reason}: 1 \(first: "
                                            rf".*{bad}\)"):  # fmt: skip
            load_corpus(one, progress=False)


@pytest.mark.parametrize("name, content, reason", [("latin1.csv", b"story\ncaf\xe9\n", "non_utf8"),
                                                   ("nul.csv", b"story\nab\0c\n", "binary"),
                                                   ("utf16.csv", "story\ncafé\n".encode("utf-16"), "non_utf8"),
                                                   ("cut.csv.gz", b"\x1f\x8b\x08\x00", "unreadable")])  # fmt: skip
def test_an_hf_path_naming_a_csv_file_that_cannot_give_records_yields_no_documents_as_a_files_glob_skips_it(
        tmp_path, name, content, reason):  # fmt: skip
    """The hf kind checked a single local .json/.jsonl file as the files kind checks its record files, but not a .csv
    one (the check predates .csv in the files kind): a NUL byte came through as a document, a Latin-1 file or a
    truncated archive as datasets' error, where docs/data.md says such a file yields no documents, naming it."""
    (tmp_path / name).write_bytes(content)
    for kind, entry in (("files", {"paths": [str(tmp_path / name)]}), ("hf", {"path": str(tmp_path / name)})):
        spec = parse_sources({"s": {"kind": kind, "text_field": "story", **entry}})["s"]
        with pytest.raises(DataError, match=rf"^data\.sources\.s: the source yields no documents \(skipped: {reason}: "
                                            rf"1 \(first: {re.escape(str(tmp_path / name))}\)\)"):  # fmt: skip
            read_source("s", spec, progress=False)


def test_a_utf16_text_file_is_skipped_as_not_utf8_not_as_binary(tmp_path, caplog):
    """A UTF-16 file (a Windows editor's, PowerShell's > redirect) holds NUL bytes and was counted as binary, which
    says nothing of the fix: it is text to re-encode as UTF-8."""
    (tmp_path / "notes.txt").write_text("notes from windows\n" * 20, encoding="utf-16")
    (tmp_path / "ok.txt").write_text("fine text\n" * 20)
    spec = parse_sources({"s": {"kind": "files", "paths": [f"{tmp_path}/*.txt"]}})["s"]
    docs = read_source("s", spec, progress=False)
    assert docs.texts == ["fine text\n" * 20] and dict(docs.skipped) == {"non_utf8": 1}


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_record_files_are_skipped_and_counted_as_uncompressed_ones(tmp_path, jsonl_file, suffix):
    """An empty .jsonl.gz shard among others in a glob stopped the whole preparation ("StopIteration: no records"),
    a truncated one with an EOFError, and a Latin-1 one with "record 0 ... is not valid UTF-8", where the same
    files uncompressed are skipped and counted."""
    import bz2
    import gzip
    import lzma

    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    (tmp_path / f"empty.jsonl{suffix}").write_bytes(compress(b"\n"))
    (tmp_path / f"latin1.jsonl{suffix}").write_bytes(compress(b'{"story": "caf\xe9"}\n'))
    (tmp_path / f"cut.jsonl{suffix}").write_bytes(compress(jsonl_file.read_bytes())[:-8])
    paths = [str(jsonl_file), str(tmp_path / f"*.jsonl{suffix}")]
    cfg = make_data_cfg(tmp_path, {"f": {"kind": "files", "paths": paths, "text_field": "story"}})
    corpus = load_corpus(cfg, progress=False)
    assert _texts(corpus) == set(STORIES)
    assert corpus.stats["skipped"]["f"] == {"unreadable": 1, "empty": 1, "non_utf8": 1}


def test_hf_record_that_is_not_utf8_names_the_record(tmp_path):
    """datasets' json builder keeps invalid bytes; taking the record then fails: a DataError naming the source,
    the file and the record, not a UnicodeDecodeError traceback."""
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"story": "fine"}\n{"story": "caf\xe9"}\n')
    cfg = make_data_cfg(tmp_path, {"h": {"kind": "hf", "path": "json", "data_files": str(path),
                                         "text_field": "story"}})  # fmt: skip
    with pytest.raises(DataError, match=r"data\.sources\.h: record 1 of json data_files=.*mixed\.jsonl is not valid"):
        load_corpus(cfg, progress=False)


@pytest.mark.parametrize("kind", ["files", "hf"])
@pytest.mark.parametrize("fixture", ["parquet_file", "csv_file"])
def test_a_record_file_without_the_named_field(tmp_path, request, fixture, kind):
    path = request.getfixturevalue(fixture)
    key = "paths" if kind == "files" else "path"
    value = [str(path)] if kind == "files" else str(path)
    cfg = make_data_cfg(tmp_path, {"x": {"kind": kind, key: value, "text_field": "text"}})
    with pytest.raises(DataError, match=rf"data\.sources\.x\.text_field: 'text' is not a column of "
                                        rf"{re.escape(str(path))} \(columns: id, story\)") as err:  # fmt: skip
        load_corpus(cfg, progress=False)
    # a glob over a tree matches a results table as it does a package.json: the files kind says to leave it out
    left_out = f"or leave {path} out of data.sources.x.paths (a .csv file is read as records)"
    assert (left_out in str(err.value)) is (kind == "files" and fixture == "csv_file")


@pytest.mark.parametrize("kind, form", [("files", "parquet_file"), ("hf", "parquet_file"), ("hf", "jsonl_file"),
                                        ("hf", "streaming"), ("hf", "save_to_disk"), ("files", "csv_file"),
                                        ("hf", "csv_file")])  # fmt: skip
def test_a_text_field_that_is_not_text_names_the_key_and_the_text_columns(tmp_path, request, kind, form):
    """text_field naming a number column (here ``id``): every record was skipped as not_text and the error said only
    "the source yields no documents (skipped: not_text: 30)", naming neither the key nor the text columns."""
    import datasets

    path = request.getfixturevalue("jsonl_file" if form == "streaming" else form) if form != "save_to_disk" else None
    if form == "save_to_disk":
        path = tmp_path / "saved"
        datasets.Dataset.from_dict({"id": list(range(len(STORIES))), "story": STORIES}).save_to_disk(str(path))
    spec = {"kind": kind, "text_field": "id", **({"paths": [str(path)]} if kind == "files" else {"path": str(path)}),
            **({"streaming": True} if form == "streaming" else {})}  # fmt: skip
    with pytest.raises(DataError, match=r"data\.sources\.x\.text_field: column 'id' of .* holds int64 values, not "
                                        r"text; set text_field to a text column: story"):  # fmt: skip
        load_corpus(make_data_cfg(tmp_path, {"x": spec}), progress=False)



@pytest.mark.parametrize("form", ["files", "hf", "streaming"])
def test_a_record_whose_text_is_a_number_or_a_list_is_skipped_not_the_whole_column_refused(tmp_path, form):
    """datasets (>= 4) reads a JSON field that is text in most records and a number or a list in a few as a Json
    column: the whole file was refused ("holds Json values, not text"), pointing text_field at another column,
    where the records with a string are documents and the others are skipped and counted as not_text."""
    import datasets

    if not hasattr(datasets, "Json"):
        pytest.skip("this datasets reads no column of mixed types")
    path = tmp_path / "mixed.jsonl"
    odd = {3: 404, 7: ["a", "list"], 11: {"an": "object"}}
    path.write_text("".join(json.dumps({"story": odd.get(i, t), "title": f"t{i}"}) + "\n"
                            for i, t in enumerate(STORIES)))  # fmt: skip
    spec = ({"kind": "files", "paths": [str(path)]} if form == "files"
            else {"kind": "hf", "path": str(path), "streaming": form == "streaming"})  # fmt: skip
    corpus = load_corpus(make_data_cfg(tmp_path, {"x": {**spec, "text_field": "story"}}), progress=False)
    assert _texts(corpus) == {t for i, t in enumerate(STORIES) if i not in odd}
    assert corpus.stats["skipped"]["x"] == {"not_text": len(odd)}
    # a column with no text in any record is still refused, naming the text columns
    path.write_text("".join(json.dumps({"story": [i] if i % 2 else i, "title": t}) + "\n"
                            for i, t in enumerate(STORIES)))  # fmt: skip
    with pytest.raises(DataError, match=r"data\.sources\.x\.text_field: column 'story' of .*mixed\.jsonl holds no "
                                        r"text .*set text_field to a text column: title"):  # fmt: skip
        load_corpus(make_data_cfg(tmp_path, {"x": {**spec, "text_field": "story"}}), progress=False)

def test_missing_hf_dataset(tmp_path):
    cfg = make_data_cfg(tmp_path, {"x": {"kind": "hf", "path": str(tmp_path / "no_such_dir")}})
    with pytest.raises(DataError, match=r"data\.sources\.x: datasets\.load_dataset"):
        load_corpus(cfg, progress=False)


def test_corpus_smaller_than_one_batch(files_cfg):
    cfg = files_cfg()
    corpus = load_corpus(cfg, progress=False)
    with pytest.raises(DataError, match="fewer than one batch"):
        make_sampler(corpus, "train", cfg, seq_len=4096, batch_size=64, seed=0, phase="p")


def test_long_fraction_without_long_documents(files_cfg):
    cfg = files_cfg(long_fraction=0.5)
    corpus = load_corpus(cfg, progress=False)
    with pytest.raises(DataError, match=r"long_fraction=0\.5 but no train document .* at least 2000 tokens"):
        make_sampler(corpus, "train", cfg, seq_len=2000, batch_size=1, seed=0, phase="p")


def test_phase_cannot_add_a_source(files_cfg, tmp_path):
    corpus = load_corpus(files_cfg(), progress=False)
    other = make_data_cfg(tmp_path, {"new": {"kind": "embedded"}})
    with pytest.raises(DataError, match="not in the prepared corpus"):
        make_sampler(corpus, "train", other, seq_len=16, batch_size=1, seed=0, phase="p")


def test_config_checks_data_values():
    from minilm.config import load_config
    from minilm.errors import ConfigError

    for override, key in [("data.synthetic.tasks=[maze]", "data.synthetic.tasks"),
                          ("data.restart_positions=true", "data.restart_positions"),
                          ("data.tokenizer.type=wordpiece", "data.tokenizer.type"),
                          ("data.synthetic.fraction=1.5", "data.synthetic.fraction"),
                          ("data.synthetic.loss=prompt", "data.synthetic.loss")]:  # fmt: skip
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [override])


def test_an_hf_directory_of_several_formats_is_refused_naming_one_file_of_each(tmp_path):
    """datasets infers a local directory's builder from its most common suffix and leaves the files of any other
    format out without a word: a directory of one .jsonl and two .csv files gave the .csv records alone. Refused
    before anything is read; a README, hidden files and metadata files do not count, and one format reads."""
    from minilm.data.sources import source_fingerprint

    d = tmp_path / "d"
    d.mkdir()
    (d / "a.jsonl").write_text('{"text": "from the jsonl"}\n')
    (d / "README.md").write_text("# a dataset card\n")
    (d / ".notes.csv").write_text("text\nhidden\n")
    spec = parse_sources({"d": {"kind": "hf", "path": str(d)}})["d"]
    source_fingerprint("d", spec)  # one format, beside files datasets leaves out: read
    assert read_source("d", spec, progress=False).texts == ["from the jsonl"]
    (d / "sub").mkdir()
    for name in ("b.csv", "c.csv"):
        (d / "sub" / name).write_text("text\nfrom a csv\n")
    with pytest.raises(DataError, match=rf"^data\.sources\.d\.path: {re.escape(str(d))} holds data files of 2 formats: "
                                        rf".*a\.jsonl \(json\), .*b\.csv \(csv\); datasets reads those of its most "
                                        r"common format alone .*kind: files$"):  # fmt: skip
        source_fingerprint("d", spec)


def test_an_hf_directory_of_text_files_is_refused_as_a_txt_path_is(tmp_path):
    """datasets reads a directory of .txt files with its text builder, one line = one document: a folder of notes
    became a corpus of single lines without a word, where a .txt path is refused. Refused before anything is read,
    naming the two ways to read them; path: text with data_files reads them by line, as asked."""
    from minilm.data.sources import source_fingerprint

    d = tmp_path / "notes"
    d.mkdir()
    (d / "a.txt").write_text("Title\n\nfirst line\nsecond line\n")
    (d / "README.md").write_text("# a dataset card\n")
    for entry, key in (({"path": str(d)}, "path"), ({"path": str(d), "data_files": "a.txt"}, "data_files")):
        spec = parse_sources({"d": {"kind": "hf", **entry}})["d"]
        with pytest.raises(DataError, match=rf"^data\.sources\.d\.{key}: {re.escape(str(d))} holds text files "
                                            r"\(.*a\.txt\), which datasets reads one line = one document; .*kind: "
                                            r"files .*path: text with data_files"):  # fmt: skip
            source_fingerprint("d", spec)
    by_line = parse_sources({"t": {"kind": "hf", "path": "text", "data_files": f"{d}/*.txt"}})["t"]
    source_fingerprint("t", by_line)
    assert read_source("t", by_line, progress=False).texts == ["Title", "first line", "second line"]


@pytest.mark.parametrize("builder, name, content, asks", [
    ("json", "a.csv", "text\nhello\n", "csv"),
    ("parquet", "b.jsonl", '{"text": "a"}\n', "json"),
    ("csv", "c.jsonl", '{"text": "a"}\n', "json"),
])  # fmt: skip
def test_a_record_builder_failing_on_a_file_of_another_format_names_the_builder_its_suffix_asks_for(
        tmp_path, builder, name, content, asks):  # fmt: skip
    """datasets' error said only that the text did not parse ("JSON parse error", "Parquet magic bytes not found",
    for a .jsonl read as csv "Instruction "train" corresponds to no data!"); the error now adds the builder the file's
    suffix asks for. (Not refused before reading: a suffix may lie.)"""
    path = tmp_path / name
    path.write_text(content)
    spec = parse_sources({"h": {"kind": "hf", "path": builder, "data_files": [str(path)]}})["h"]
    said = rf"; {re.escape(str(path))} is a {asks} file by its suffix, which path: {builder} reads with datasets' "
    with pytest.raises(DataError, match=said + rf"{builder} builder: set path: {asks}$"):
        read_source("h", spec, progress=False)
