"""Sampler properties the module doc promises, on hand-made token stores (no tokenizer training, so fast): every
token id occurs once in a store, so a row's first token says which document it came from and where.

Long rows are drawn from documents of at least ``long_min_tokens`` tokens (default seq_len), in proportion to
their length, from any start of a full window; the long fraction applies to the rows that are not synthetic;
per-batch counts are stochastically rounded; with long_fraction 0 (or only long documents) the packed stream
holds every document; validation ignores long/synthetic settings; a phase's unlisted source is not sampled."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minilm.data import make_sampler, synthetic_style, validation_batches
from minilm.data.prepare import TokenStore
from minilm.data.sampler import Sampler
from tests.data.conftest import make_data_cfg

EOS = 0


def store_of(lengths, sources=None, names=("a",)) -> TokenStore:
    """Documents of the given lengths (EOS included), each token id unique: document i's j-th token is
    ``first[i] + j`` and its last is EOS."""
    tokens, offsets, nxt = [], [], 1
    for n in lengths:
        offsets.append(len(tokens))
        tokens += list(range(nxt, nxt + n - 1)) + [EOS]
        nxt += n - 1
    return TokenStore(np.array(tokens, np.int64), np.array(offsets, np.int64), np.array(lengths, np.int64),
                      np.array(sources if sources is not None else [0] * len(lengths), np.int64), list(names))


class CharTokenizer:
    """One token per character (digits are single tokens, as the synthetic tasks assume); never emits EOS."""

    eos_id = EOS

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def corpus_of(train: TokenStore, val: TokenStore | None = None):
    return SimpleNamespace(tokenizer=CharTokenizer(), train=train, val=val if val is not None else train,
                           source_names=train.source_names, cache_dir=Path("corpus"))


def where(store: TokenStore, token: int) -> tuple[int, int]:
    """(document, offset in it) of a non-EOS token id."""
    i = int(np.flatnonzero(store.doc_offsets <= np.flatnonzero(np.asarray(store.tokens) == token)[0])[-1])
    return i, int(np.flatnonzero(np.asarray(store.tokens) == token)[0] - store.doc_offsets[i])


def sampler(store, **kw) -> Sampler:
    args = dict(seq_len=16, batch_size=8, seed=0, phase="p")
    return Sampler(corpus_of(store), store, **{**args, **kw})


def long_rows(s: Sampler, batches: int):
    """(document, start offset) of every long row of the first ``batches`` batches."""
    out = []
    for i in range(batches):
        ids = s.batch(i)["input_ids"]
        out += [where(s.store, int(ids[r, 0])) for r, kind in enumerate(s.row_plan(i)) if kind == "long"]
    return out


def test_long_documents_are_drawn_in_proportion_to_their_length():
    """Every long-document token equally likely: a 4x longer document starts 4x as many long rows (uniform over
    documents would give 1:1)."""
    store = store_of([100, 400, 10, 10, 10])
    s = sampler(store, long_fraction=1.0, long_min_tokens=50)
    docs = Counter(d for d, _ in long_rows(s, 60))
    assert set(docs) == {0, 1}  # only documents of at least long_min_tokens start a long row
    assert docs[1] / (docs[0] + docs[1]) == pytest.approx(0.8, abs=0.05)


def test_a_long_window_starts_anywhere_a_full_window_fits_in_its_document():
    """A 40-token document and rows of 17 tokens: starts 0..23 all occur (the last full window included), no
    other start does."""
    store = store_of([40, 5, 5])
    s = sampler(store, long_fraction=1.0, long_min_tokens=30)
    starts = Counter(start for d, start in long_rows(s, 80) if d == 0)
    assert set(starts) == set(range(40 - 17 + 1))


def test_a_document_of_exactly_long_min_tokens_is_long_and_the_default_is_seq_len():
    """"at least data.long_min_tokens tokens (default: seq_len)": a document of exactly that length starts long
    rows (and its window runs on into the next document)."""
    store = store_of([20, 19, 5, 5])
    for min_tokens, seq_len in ((20, 16), (None, 20)):
        s = sampler(store, long_fraction=1.0, long_min_tokens=min_tokens, seq_len=seq_len)
        assert s.state_dict()["long_min_tokens"] == 20
        assert {d for d, _ in long_rows(s, 10)} == {0}  # never the 19-token one


def test_a_long_window_is_one_document_where_it_fits_it_and_runs_on_into_long_documents_where_not():
    """docs/data.md said long windows were one document each; with long_min_tokens below seq_len a long document is
    shorter than the row, and the window runs on into the next long documents (never a short one), each its own
    doc_id, as for packed rows."""
    store = store_of([40, 12, 12, 12, 12, 3, 3])
    fits = sampler(store, long_fraction=1.0, long_min_tokens=20, document_mask=True)  # only the 40-token document
    assert all(int(fits.batch(i)["doc_ids"].max()) == 0 for i in range(5))
    runs = sampler(store, long_fraction=1.0, long_min_tokens=10, document_mask=True, seq_len=30)
    for i in range(5):
        b = runs.batch(i)
        assert int(b["doc_ids"].max()) >= 1
        ids = {int(t) for t in b["input_ids"].flatten() if t != EOS}
        assert all(where(store, t)[0] <= 4 for t in ids)  # the 3-token documents are short: never in a long row


def test_without_long_rows_the_packed_stream_holds_every_document():
    """long_fraction 0: plain pretraining, nothing thrown away — the long document is packed like the others."""
    store = store_of([100, 10, 10])
    s = sampler(store, long_fraction=0.0, long_min_tokens=50)
    firsts = {where(store, int(t))[0] for i in range(20) for t in s.batch(i)["input_ids"][:, 0] if t != EOS}
    assert 0 in firsts and firsts <= {0, 1, 2}


def test_when_every_document_is_long_short_rows_pack_the_long_ones(caplog):
    store = store_of([60, 70, 80])
    with caplog.at_level(logging.WARNING, logger="minilm.data.sampler"):
        s = sampler(store, long_fraction=0.5, long_min_tokens=50)
    assert "short rows pack long documents too" in caplog.text
    kinds = [k for i in range(10) for k in s.row_plan(i)]
    assert "short" in kinds and "long" in kinds
    for i in range(10):
        assert s.batch(i)["input_ids"].shape == (8, 16)


def test_the_long_fraction_is_a_share_of_the_rows_that_are_not_synthetic():
    """synthetic 0.5, long 0.5: a quarter of all rows are long (half of the non-synthetic half)."""
    store = store_of([200, 10, 10, 10])
    s = sampler(store, long_fraction=0.5, long_min_tokens=100, synthetic_fraction=0.5,
                synthetic_tasks=("passkey",), seq_len=96)  # fmt: skip
    kinds = Counter(k for i in range(100) for k in s.row_plan(i))
    total = sum(kinds.values())
    assert kinds["synthetic"] / total == pytest.approx(0.5, abs=0.03)
    assert kinds["long"] / total == pytest.approx(0.25, abs=0.03)


def test_row_counts_are_stochastically_rounded_per_batch():
    """long_fraction 0.3 of 2 rows: each batch has 0 or 1 long rows (never more: floor or ceil of 0.6), and on
    average the share is 0.3 — rounding 0.6 to 1 every batch would make it 0.5."""
    store = store_of([200, 10, 10, 10])
    s = sampler(store, long_fraction=0.3, long_min_tokens=100, batch_size=2)
    per_batch = [s.row_plan(i).count("long") for i in range(400)]
    assert set(per_batch) == {0, 1}
    assert np.mean(per_batch) / 2 == pytest.approx(0.3, abs=0.03)


def test_synthetic_haystacks_hold_no_eos():
    """The filler is read as one document: the EOS between corpus documents is taken out of the haystack."""
    store = store_of([12] * 40)  # an EOS every 12 tokens of the stream
    s = sampler(store, synthetic_fraction=1.0, synthetic_tasks=("passkey",), seq_len=96)
    for i in range(5):
        assert set(s.row_plan(i)) == {"synthetic"}
        assert not (s.batch(i)["input_ids"] == EOS).any()


def test_resuming_on_another_world_size_warns_but_is_allowed(caplog):
    """rank and world size are the only state_dict entries a resume may change (load_state_dict's doc)."""
    store = store_of([50] * 4)
    one = sampler(store)
    two = sampler(store, rank=1, world_size=2)
    with caplog.at_level(logging.WARNING, logger="minilm.data.sampler"):
        two.load_state_dict(one.state_dict())
    assert "different rank/world size" in caplog.text


def test_validation_ignores_long_and_synthetic_settings(tmp_path):
    """"no long/short mixing, no synthetic rows": a config whose long_min_tokens no held-out document reaches
    (a training sampler refuses it) still validates, on windows of the whole held-out stream."""
    store = store_of([30, 20, 25])
    cfg = make_data_cfg(tmp_path, {"a": {"kind": "files", "paths": ["x/*.py"]}}, long_fraction=0.5,
                        long_min_tokens=10**6, **{"synthetic.fraction": 0.5})  # fmt: skip
    batches = validation_batches(corpus_of(store), cfg, seq_len=16, batch_size=4, n_batches=3, seed=0)
    stream = np.concatenate([store.tokens, store.tokens]).tobytes()
    for b in batches:
        for row in b["input_ids"].numpy():
            assert row.astype(np.int64).tobytes() in stream


def test_a_source_the_phase_does_not_list_is_not_sampled(tmp_path):
    """A phase can re-weight the run's sources; a prepared source it leaves out gets weight 0."""
    store = store_of([30] * 6, sources=[0, 0, 0, 1, 1, 1], names=("a", "b"))
    cfg = make_data_cfg(tmp_path, {"a": {"kind": "files", "paths": ["x/*.py"]}})
    # (a batch of 4 x 17 tokens fits in the 90 tokens of a, the one source sampled)
    s = make_sampler(corpus_of(store), "train", cfg, seq_len=16, batch_size=4, seed=0, phase="p")
    docs = {where(store, int(t))[0] for i in range(40) for t in s.batch(i)["input_ids"][:, 0] if t != EOS}
    assert docs and docs <= {0, 1, 2}


def test_auto_style_is_code_when_an_embedded_source_is_sampled(tmp_path):
    files = {"kind": "files", "paths": ["x/*.py"]}
    assert synthetic_style(make_data_cfg(tmp_path, {"f": files})) == "text"
    assert synthetic_style(make_data_cfg(tmp_path, {"f": files, "e": {"kind": "embedded"}})) == "code"
    # an embedded source at weight 0 gives no filler: prose filler got code-style needles
    assert synthetic_style(make_data_cfg(tmp_path, {"f": files, "e": {"kind": "embedded", "weight": 0}})) == "text"
    assert synthetic_style(make_data_cfg(tmp_path, {"e": {"kind": "embedded"}}, **{"synthetic.style": "text"})) \
        == "text"  # an explicit style wins
