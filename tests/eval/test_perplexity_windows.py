"""Which windows perplexity runs and which targets it scores, checked with a model that records its inputs: every
full window of L + 1 tokens (the last one included), documents of at least L + 1 tokens else the packed stream,
windows drawn without repeats, sliding windows per document (each document's first window scores all L targets,
later ones S), the default stride L/2, sliding windows drawn at random across the documents."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from minilm.errors import MinilmError
from minilm.eval.perplexity import eval_documents, perplexity, window_starts

V = 1000


class Recorder(nn.Module):
    """Uniform logits; remembers every input row it was run on."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(1))
        self.rows: list[tuple] = []

    def forward(self, idx, **_):
        self.rows += [tuple(r) for r in idx.tolist()]
        return torch.zeros(*idx.shape, V) + self.p


def _store(docs):
    lengths = np.array([len(d) for d in docs])
    return SimpleNamespace(tokens=np.concatenate(docs), doc_offsets=np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                           doc_lengths=lengths)  # fmt: skip


def _docs(*lengths):
    """Documents of distinct tokens (a window's first token says where it is)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [np.arange(s, s + n) for s, n in zip(starts, lengths)]


def test_every_full_window_is_a_start_the_last_one_included():
    assert window_starts(_docs(9), 8, 8) == [(0, 0)]  # exactly L + 1 tokens: one window
    assert window_starts(_docs(8), 8, 8) == []  # L tokens: L inputs but only L - 1 targets
    assert window_starts(_docs(17, 20), 8, 8) == [(0, 0), (0, 8), (1, 0), (1, 8)]
    assert window_starts(_docs(17), 8, 4) == [(0, 0), (0, 4), (0, 8)]


def test_documents_of_at_least_l_plus_1_tokens_else_the_packed_stream():
    docs, source = eval_documents(_store(_docs(8, 9, 5)), 8)
    assert source == "documents" and [len(d) for d in docs] == [9]
    docs, source = eval_documents(_store(_docs(8, 5)), 8)  # no document long enough: the stream of all 13
    assert source == "packed" and [len(d) for d in docs] == [13]
    with pytest.raises(MinilmError, match="fewer than one window of 9"):
        eval_documents(_store(_docs(4, 4)), 8)  # 8 tokens: not one window


def test_windows_mode_runs_each_window_at_most_once():
    """As many windows asked for as there are: each non-overlapping window exactly once, no repeats."""
    docs = _docs(41, 33)  # windows of 9 tokens every 8: 5 + 4
    model = Recorder()
    r = perplexity(model, docs, 8, mode="windows", n_windows=9, batch_size=4)
    assert r.windows == 9 and r.tokens == 9 * 8
    assert sorted(model.rows) == sorted(tuple(docs[d][s : s + 8]) for d, s in window_starts(docs, 8, 8))


def test_sliding_scores_each_documents_first_window_whole_and_the_stride_after():
    """Two documents of 25 tokens, L 8, S 4: windows start at 0, 4, 8, 12, 16 in each; the first scores 8
    targets, each later one the 4 new ones — 8 + 4·4 = 24 per document, every target once."""
    docs = _docs(25, 25)
    r = perplexity(Recorder(), docs, 8, mode="sliding", n_windows=100, batch_size=3, stride=4)
    assert r.windows == 10 and r.tokens == 2 * 24 and r.stride == 4
    # 27 tokens (26 targets): the same five windows; the last 2 targets, past the last full stride, are not scored
    # (the transformers recipe scores them with a shorter last step: docs/evaluation.md says so)
    r = perplexity(Recorder(), _docs(27), 8, mode="sliding", n_windows=100, batch_size=3, stride=4)
    assert r.windows == 5 and r.tokens == 24


def test_sliding_runs_at_most_n_windows_and_defaults_to_a_stride_of_half_the_length():
    model = Recorder()
    r = perplexity(model, _docs(200, 200), 16, mode="sliding", n_windows=5, batch_size=2)
    assert r.stride == 8 and r.to_dict()["stride"] == 8
    assert r.windows == 5 and len(model.rows) == 5
    with pytest.raises(MinilmError, match="eval.stride"):
        perplexity(model, _docs(200), 16, mode="sliding", stride=17)


def test_sliding_draws_its_windows_at_random_across_the_documents():
    """Six documents of three sliding windows each, a budget of six windows: whole documents taken in turn read two
    of them, and the number swung with which; the windows are now drawn across all, seeded, without repeats."""
    docs = _docs(*[20] * 6)  # windows of 9 tokens every 4: starts 0, 4, 8 in each
    spread = []
    for seed in range(12):
        model = Recorder()
        r = perplexity(model, docs, 8, mode="sliding", n_windows=6, batch_size=2, stride=4, seed=seed)
        assert r.windows == 6 and len(set(model.rows)) == 6  # no window twice
        spread.append(len({row[0] // 20 for row in model.rows}))  # the documents its windows came from
        again = Recorder()
        perplexity(again, docs, 8, mode="sliding", n_windows=6, batch_size=2, stride=4, seed=seed)
        assert again.rows == model.rows  # seeded: the same windows every time
        # a window at a document's start scores its 8 targets, any other the 4 no earlier window scores
        firsts = sum(row[0] % 20 == 0 for row in model.rows)
        assert r.tokens == 8 * firsts + 4 * (6 - firsts)
    assert min(spread) >= 3 and max(spread) >= 4, spread


@pytest.mark.parametrize("mode", ["windows", "sliding"])
def test_more_windows_measure_the_fewer_ones_and_more(mode):
    """eval.batches 8 after 4 (or a larger batch_tokens) measures the 4's windows and others: the draws of 4 and of 8
    windows had no window in common, so a longer evaluation measured other text rather than more of it."""
    docs = _docs(*[45] * 20)  # 100 windows of 9 tokens every 8 (200 every 4); tokens within the vocabulary

    def rows(n):
        model = Recorder()
        perplexity(model, docs, 8, mode=mode, n_windows=n, batch_size=4, stride=4, seed=[3, 1, 8])
        return set(model.rows)

    fewer, more = rows(4), rows(8)
    assert len(fewer) == 4 and len(more) == 8 and fewer <= more


class MaskRecorder(Recorder):
    """Uniform logits; remembers every row with the doc_ids and positions it was given (None: not given)."""

    def forward(self, idx, doc_ids=None, positions=None):
        for i, r in enumerate(idx.tolist()):
            self.rows.append((tuple(r), None if doc_ids is None else tuple(doc_ids[i].tolist()),
                              None if positions is None else tuple(positions[i].tolist())))  # fmt: skip
        return torch.zeros(*idx.shape, V) + self.p


@pytest.mark.parametrize("mode", ["windows", "sliding"])
def test_packed_windows_of_a_document_masked_run_get_the_training_sampler_s_doc_ids_and_positions(mode):
    """A run trained with data.document_mask (and restart_positions) never attended across documents: its packed
    held-out windows are scored with the doc_ids and positions its training sampler gives a packed row of the same
    tokens (minilm.data.sampler._gather), not as one document; without masking, the model gets neither."""
    from minilm.data.sampler import _gather, _Pool
    from minilm.eval.perplexity import packed_doc_ids

    store = _store(_docs(5, 3, 7, 4, 6))  # 25 tokens, token i at stream position i
    docs, source = eval_documents(store, 8)
    assert source == "packed"
    pool = _Pool.of(store, np.arange(5))
    for restart in (True, False):
        model = MaskRecorder()
        r = perplexity(model, docs, 8, mode=mode, n_windows=100, batch_size=3, stride=4,
                       doc_index=[packed_doc_ids(store)], restart_positions=restart)  # fmt: skip
        assert r.to_dict()["document_mask"] is True and r.to_dict()["restart_positions"] is restart
        assert len(model.rows) == r.windows > 1
        for row, doc_ids, positions in model.rows:
            tokens, seg, pos = _gather(store, pool, row[0], 9)
            assert row == tuple(tokens[:-1]) and doc_ids == tuple(seg[:-1])
            assert positions == (tuple(pos[:-1]) if restart else None)
        assert any(len(set(d)) > 1 for _, d, _ in model.rows)  # windows that do cross documents
    model = MaskRecorder()
    r = perplexity(model, docs, 8, mode=mode, n_windows=100, batch_size=3, stride=4)
    assert all(d is None and p is None for _, d, p in model.rows)
    assert "document_mask" not in r.to_dict()  # results of runs trained without masks are as they were
