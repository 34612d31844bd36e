"""Preparation: tokenizer round trip, store layout, held-out split, cache hits and invalidation, stats."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from minilm.data import held_out, load_corpus, long_share
from minilm.data import prepare as prepare_mod
from minilm.errors import DataError


def test_tokenizer_round_trips_code_unicode_and_whitespace(files_cfg):
    tok = load_corpus(files_cfg(), progress=False).tokenizer
    for text in [
        "def f(x, y=3):\n    return x + 3 * y\n",
        "\tmixed\t tabs  and   spaces\n\n\n  ",
        "naïve café — ünïcödé 漢字 🙂 not in the training sample",
        'pass_key = "80517"\n',
    ]:
        assert tok.decode(tok.encode(text)) == text
    assert len({tok.eos_id, tok.bos_id, tok.pad_id}) == 3
    assert tok.encode("80517") == [tok.encode(d)[0] for d in "80517"]  # digits are single tokens


def test_store_layout_eos_after_each_document_and_texts_decode(files_cfg, tiny_text_dir):
    corpus = load_corpus(files_cfg(), progress=False)
    texts = {p.name: p.read_text() for p in tiny_text_dir.glob("*.py")}
    n_docs = corpus.train.n_docs + corpus.val.n_docs
    assert n_docs == len(texts) and corpus.val.n_docs >= 1
    for store in (corpus.train, corpus.val):
        assert isinstance(store.tokens, np.memmap) and store.tokens.dtype == np.uint16
        assert store.doc_offsets.dtype == np.int64 and store.doc_lengths.dtype == np.int64
        assert np.array_equal(store.doc_offsets[1:], np.cumsum(store.doc_lengths)[:-1])
        assert store.doc_lengths.sum() == store.n_tokens
        ends = store.doc_offsets + store.doc_lengths - 1
        assert np.all(store.tokens[ends] == corpus.tokenizer.eos_id)
        assert (store.tokens == corpus.tokenizer.eos_id).sum() == store.n_docs  # EOS only at the ends
        decoded = {corpus.tokenizer.decode(store.doc(i)[:-1].tolist()) for i in range(store.n_docs)}
        assert decoded <= set(texts.values())


def test_held_out_split_is_a_deterministic_per_name_hash():
    names = [f"src/doc_{i}.py" for i in range(2000)]
    a = held_out(names, 0.1)
    assert abs(a.mean() - 0.1) < 0.03
    b = held_out(list(reversed(names)) + ["src/new.py"], 0.1)  # order and other documents do not matter
    assert np.array_equal(a, b[:-1][::-1])


def test_identical_documents_share_one_split():
    """The split hashed names only, so a file and its copy (the stdlib has 19: boilerplate __main__.py files, a
    test data file twice) could land one in training, one held out: validation then scored text trained on."""
    names = [f"src/doc_{i}.py" for i in range(3000)]
    texts = [f"text {i % 1000}" for i in range(3000)]  # every text three times, under three names
    is_val = held_out(names, 0.1, texts)
    val_texts = {t for t, v in zip(texts, is_val) if v}
    assert val_texts and not val_texts & {t for t, v in zip(texts, is_val) if not v}
    assert abs(is_val.mean() - 0.1) < 0.05
    unique = [f"unique {i}" for i in range(3000)]
    assert np.array_equal(held_out(names, 0.1, unique), held_out(names, 0.1))  # distinct texts: split by name
    assert held_out(["a", "b"], 0.1, ["same", "same"]).tolist().count(True) == 1  # still one held out, one trained


def test_prepared_corpus_has_no_held_out_text_in_training(tmp_path):
    from tests.data.conftest import make_data_cfg

    (tmp_path / "c").mkdir()
    for i in range(60):
        (tmp_path / "c" / f"d{i:02d}.txt").write_text(f"document number {i % 20} " * 30)  # each text 3 times
    corpus = load_corpus(make_data_cfg(tmp_path, {"c": {"kind": "files", "paths": [f"{tmp_path}/c/*.txt"]}},
                                       val_fraction=0.2), progress=False)  # fmt: skip

    def texts(store):
        return {corpus.tokenizer.decode(store.doc(i)[:-1].tolist()) for i in range(store.n_docs)}

    assert texts(corpus.val) and not texts(corpus.val) & texts(corpus.train)


def test_second_load_is_a_cache_hit_without_retokenizing(files_cfg, monkeypatch):
    cfg = files_cfg()
    first = load_corpus(cfg, progress=False)
    assert not first.from_cache

    def boom(*a, **k):
        raise AssertionError("re-prepared although the cache is current")

    monkeypatch.setattr(prepare_mod, "_prepare", boom)
    second = load_corpus(cfg, progress=False)
    assert second.from_cache and second.cache_dir == first.cache_dir
    assert np.array_equal(second.train.tokens, first.train.tokens)


def test_cache_key_follows_file_contents_and_tokenizer_settings_but_not_weights(files_cfg, tiny_text_dir):
    base = load_corpus(files_cfg(), progress=False).cache_dir
    assert load_corpus(files_cfg(**{"sources.tiny.weight": 3.0}), progress=False).cache_dir == base
    assert load_corpus(files_cfg(**{"tokenizer.vocab_size": 300}), progress=False).cache_dir != base
    (tiny_text_dir / "doc_000.py").write_text("x = 1\n" * 50)
    assert load_corpus(files_cfg(), progress=False).cache_dir != base


def test_the_order_of_the_sources_is_part_of_the_cache_key(tmp_path, mixed_dir):
    """The corpus is written, and its tokenizer sampled, in the sources' order: both orders shared one key, so the
    same config trained on whichever order was prepared first into its cache."""
    from tests.data.conftest import make_data_cfg

    a = {"kind": "files", "paths": [f"{mixed_dir}/short_*.py"]}
    b = {"kind": "files", "paths": [f"{mixed_dir}/long_*.py"]}
    ab = load_corpus(make_data_cfg(tmp_path, {"a": a, "b": b}), progress=False)
    ba = load_corpus(make_data_cfg(tmp_path, {"b": b, "a": a}), progress=False)
    assert not ba.from_cache and ba.cache_dir != ab.cache_dir
    assert ab.source_names == ["a", "b"] and ba.source_names == ["b", "a"]


def test_stats_are_saved_and_count_skipped_files(tmp_path, tiny_text_dir):
    from tests.data.conftest import make_data_cfg

    (tiny_text_dir / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    (tiny_text_dir / "binary.py").write_bytes(b"\x00\x01\x02 binary")
    (tiny_text_dir / "empty.py").write_text("   \n")
    cfg = make_data_cfg(tmp_path, {"tiny": {"kind": "files", "paths": [f"{tiny_text_dir}/*.py"]}})
    corpus = load_corpus(cfg, progress=False)
    saved = json.loads((corpus.cache_dir / "stats.json").read_text())
    assert saved["skipped"]["tiny"] == {"non_utf8": 1, "binary": 1, "empty": 1}
    assert saved["train"]["docs"] + saved["val"]["docs"] == 40
    assert saved["train"]["tokens"] == corpus.train.n_tokens
    assert sum(saved["train"]["length_histogram"].values()) == corpus.train.n_docs
    assert saved["train"]["long_share"]["64"] == pytest.approx(long_share(corpus.train, 64), abs=1e-4)


def test_a_file_whose_name_is_not_utf8_is_read(tmp_path, tiny_text_dir):
    """A file name of Latin-1 bytes (an old archive unpacked) is a str with lone surrogates in Python: hashing it for
    the cache key, the held-out split and the tokenizer sample with a plain encode() stopped the preparation with a
    UnicodeEncodeError traceback."""
    import os

    from tests.data.conftest import make_data_cfg

    try:
        with open(os.path.join(os.fsencode(tiny_text_dir), b"caf\xe9.py"), "w") as f:
            f.write("caf\u00e9 = 'a file whose name is Latin-1'\n")
    except (OSError, UnicodeError):  # a file system that takes UTF-8 names alone (macOS)
        pytest.skip("this file system refuses a file name that is not UTF-8")
    cfg = make_data_cfg(tmp_path, {"tiny": {"kind": "files", "paths": [f"{tiny_text_dir}/*.py"]}})
    corpus = load_corpus(cfg, progress=False)
    assert corpus.train.n_docs + corpus.val.n_docs == 41  # the 40 of tiny_text_dir and that one
    texts = {corpus.tokenizer.decode(s.doc(i)[:-1].tolist()) for s in (corpus.train, corpus.val)
             for i in range(s.n_docs)}  # fmt: skip
    assert "caf\u00e9 = 'a file whose name is Latin-1'\n" in texts


def test_long_share_counts_tokens_in_long_documents(files_cfg):
    store = load_corpus(files_cfg(), progress=False).train
    n = int(np.median(store.doc_lengths))
    expected = store.doc_lengths[store.doc_lengths >= n].sum() / store.doc_lengths.sum()
    assert long_share(store, n) == pytest.approx(expected)
    assert long_share(store, 1) == 1.0 and long_share(store, 10**9) == 0.0


def test_existing_model_file_is_used_as_is(files_cfg):
    first = load_corpus(files_cfg(), progress=False)
    again = load_corpus(files_cfg(**{"tokenizer.model_file": first.tokenizer.model_file}), progress=False)
    assert again.cache_dir != first.cache_dir
    assert again.tokenizer.encode("def f(x):\n") == first.tokenizer.encode("def f(x):\n")


def test_a_model_files_key_is_its_content_not_its_path_or_the_unused_training_settings(files_cfg, tmp_path):
    """With a model_file, vocab_size / type / sample_chars do nothing, and a copy of the file is the same tokenizer:
    each gave a corpus of its own, all alike."""
    first = load_corpus(files_cfg(), progress=False)
    copy = tmp_path / "copy.model"
    shutil.copyfile(first.tokenizer.model_file, copy)
    given = load_corpus(files_cfg(**{"tokenizer.model_file": first.tokenizer.model_file}), progress=False)
    other = files_cfg(**{"tokenizer.model_file": str(copy), "tokenizer.vocab_size": 999, "tokenizer.type": "unigram"})
    again = load_corpus(other, progress=False)
    assert again.from_cache and again.cache_dir == given.cache_dir


def test_missing_model_file_is_a_data_error_naming_the_key(files_cfg, tmp_path):
    with pytest.raises(DataError, match="data.tokenizer.model_file: cannot read .*nope.model"):
        load_corpus(files_cfg(**{"tokenizer.model_file": str(tmp_path / "nope.model")}), progress=False)


@pytest.mark.parametrize("problem", ["not_a_model", "no_eos"])
def test_a_model_file_that_cannot_serve_is_refused_before_any_source_is_read(files_cfg, tmp_path, monkeypatch,
                                                                              problem):  # fmt: skip
    """A file that is no sentencepiece model, or one trained without an EOS piece (eos_id=-1), was found out
    only after every source had been read: minutes on a large corpus."""
    import sentencepiece as spm

    path = tmp_path / "own.model"
    if problem == "not_a_model":
        path.write_text("not a model")
    else:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(["some text to train on, more text"] * 50),
                                       model_prefix=str(tmp_path / "own"), vocab_size=16, eos_id=-1,
                                       minloglevel=2)  # fmt: skip

    def no_reading(*a, **k):
        raise AssertionError("sources read before the tokenizer file was checked")

    monkeypatch.setattr(prepare_mod, "read_source", no_reading)
    says = r"data\.tokenizer\.model_file: .*own\.model (is not a sentencepiece|has no EOS)"
    with pytest.raises(DataError, match=says):
        load_corpus(files_cfg(**{"tokenizer.model_file": str(path)}), progress=False)


def test_vocab_below_the_sample_characters_says_to_raise_it(files_cfg):
    """sentencepiece needs a piece per character it must cover: a vocab below that is too small, and the advice
    is to raise it (the generic advice, a smaller vocab, would make it worse)."""
    with pytest.raises(DataError, match=r"vocab_size \(40\) is below the characters the sample needs.*raise it$"):
        load_corpus(files_cfg(**{"tokenizer.vocab_size": 40, "tokenizer.byte_fallback": False}), progress=False)


@pytest.mark.parametrize("vocab_size", [64, 261])
def test_a_vocab_without_room_beside_the_byte_pieces_is_refused_before_any_reading(files_cfg, monkeypatch,
                                                                                    vocab_size):  # fmt: skip
    """Under byte_fallback sentencepiece reserves 256 byte pieces beside the specials and "\n": a vocab_size the
    config accepts (>= 64) but below 262 failed only after every source had been read, saying the vocab was below
    'the characters the sample needs (262)' of a sample with a few dozen characters."""
    def no_reading(*a, **k):
        raise AssertionError("sources read before the vocab size was checked")

    monkeypatch.setattr(prepare_mod, "read_source", no_reading)
    says = rf"data\.tokenizer\.vocab_size: must be > 261 with data\.tokenizer\.byte_fallback: true .*got {vocab_size}"
    with pytest.raises(DataError, match=says):
        load_corpus(files_cfg(**{"tokenizer.vocab_size": vocab_size}), progress=False)


def test_cache_dir_that_cannot_be_written_is_a_data_error_before_any_reading(files_cfg, tmp_path, monkeypatch):
    """A cache_dir that is a file (or unwritable) was an OSError traceback, after the sources were read."""
    (tmp_path / "a_file").write_text("")

    def no_reading(*a, **k):
        raise AssertionError("sources read although the corpus cannot be written")

    monkeypatch.setattr(prepare_mod, "read_source", no_reading)
    with pytest.raises(DataError, match=r"data\.cache_dir: cannot write the prepared corpus under .*a_file"):
        load_corpus(files_cfg(cache_dir=str(tmp_path / "a_file")), progress=False)


@pytest.mark.parametrize("damage", ["delete_index", "truncate_tokens", "bad_json", "shorter_tokens", "delete_meta",
                                    "empty_stats"])
def test_damaged_cache_says_to_delete_the_directory(files_cfg, damage):
    """A cache directory with a file deleted, truncated or garbled was a numpy/json traceback (or, with tokens
    cut to a whole number of items, silently a corpus whose index points past its end). Without its meta.json
    (an interrupted rm -r) the corpus was prepared again in full, then the rename onto the damaged directory was
    an OSError traceback."""
    cfg = files_cfg()
    d = load_corpus(cfg, progress=False).cache_dir
    if damage == "delete_index":
        (d / "val.index.npz").unlink()
    elif damage == "delete_meta":
        (d / "meta.json").unlink()
    elif damage == "truncate_tokens":
        with open(d / "train.tokens.npy", "r+b") as f:
            f.truncate(1000)
    elif damage == "bad_json":
        (d / "stats.json").write_text("{")
    elif damage == "empty_stats":  # valid JSON without the stats: prepare_data.py's format_stats was a KeyError
        (d / "stats.json").write_text("{}")
    else:
        tokens = np.load(d / "train.tokens.npy")
        np.save(d / "train.tokens.npy", tokens[:-10])
    with pytest.raises(DataError, match=rf"data\.cache_dir: the prepared corpus {d} is damaged .*delete that dir"):
        load_corpus(cfg, progress=False)


def test_prepared_directory_follows_the_umask_and_leaves_no_temporary(files_cfg):
    """mkdtemp made the corpus directory 0700, unreadable to the other users of a shared cache."""
    import os

    umask = os.umask(0o022)
    try:
        d = load_corpus(files_cfg(), progress=False).cache_dir
    finally:
        os.umask(umask)
    assert d.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in d.parent.iterdir()] == [d.name]


def test_vocab_larger_than_the_sample_supports_is_announced(files_cfg, caplog):
    """sentencepiece (hard_vocab_limit off) takes fewer pieces than asked from a small sample; the model is then
    built with that vocab. It was silent: now a warning names the key and both sizes."""
    with caplog.at_level("WARNING", logger="minilm.data.tokenizer"):
        tok = load_corpus(files_cfg(**{"tokenizer.vocab_size": 20000}), progress=False).tokenizer
    assert tok.vocab_size < 20000
    assert f"data.tokenizer.vocab_size is 20000 but the training sample supports only {tok.vocab_size}" in caplog.text


def test_tokenizer_training_does_not_depend_on_num_proc(tmp_path):
    """data.num_proc is not part of the cache key (it says how, not what), but the tokenizer was trained on num_proc
    threads, and a unigram tokenizer trained on 2 had other pieces at some ids than one trained on 1: two machines (or
    a cache deleted and prepared again) gave different token ids under one key."""
    from types import SimpleNamespace

    from minilm.data.sources import stdlib_files
    from minilm.data.tokenizer import Tokenizer

    files = stdlib_files()[:80]
    names, texts = [str(p) for p in files], [p.read_text(errors="replace") for p in files]
    pieces = []
    for num_proc in (1, 2):
        tok_cfg = SimpleNamespace(type="unigram", vocab_size=512, byte_fallback=True, model_file=None,
                                  sample_chars=300_000)  # fmt: skip
        dest = tmp_path / f"tok{num_proc}.model"
        prepare_mod._make_tokenizer(SimpleNamespace(tokenizer=tok_cfg, num_proc=num_proc), names, texts, dest)
        tok = Tokenizer(dest)
        pieces.append([(tok.id_to_piece(i), tok._sp.get_score(i)) for i in range(tok.vocab_size)])
    assert pieces[0] == pieces[1]


def test_a_long_document_is_encoded_in_pieces_cut_at_newlines_with_the_same_ids(files_cfg, monkeypatch):
    """sentencepiece needs ~50 bytes per character of one encoded string: a corpus that is one 51 MB file took
    2.7 GB, and a 1 GB one could not be prepared. A long document is now encoded in pieces cut after newlines,
    which gives the ids of the whole (BPE: no piece but "\\n" itself contains a newline)."""
    from minilm.data.tokenizer import Tokenizer

    cfg = files_cfg()
    whole = load_corpus(cfg, progress=False)
    longest = int(whole.train.doc_lengths.max())
    seen = []
    encode_batch = Tokenizer.encode_batch
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda self, texts, num_threads=1: (
        seen.extend(len(t) for t in texts), encode_batch(self, texts, num_threads))[1])  # fmt: skip
    monkeypatch.setattr(prepare_mod, "ENCODE_CHUNK_CHARS", 100)

    shutil.rmtree(whole.cache_dir)
    pieces = load_corpus(cfg, progress=False)
    assert max(seen) < 200 < longest  # no string much longer than the limit reached the encoder
    for split in ("train", "val"):
        assert np.array_equal(getattr(pieces, split).tokens, getattr(whole, split).tokens)
        assert np.array_equal(getattr(pieces, split).doc_lengths, getattr(whole, split).doc_lengths)
