"""The held-out split's guarantees (``held_out``'s doc): identical texts share the split of their first name in
sorted order; at least one document is held out, the lowest hash (the first one any val_fraction holds out); at
least one stays in training."""

from __future__ import annotations

import numpy as np

from minilm.data import held_out

NAMES = [f"pkg/mod_{i:03d}.py" for i in range(60)]


def test_identical_texts_take_the_split_of_their_first_name_in_sorted_order():
    alone = held_out(NAMES, 0.3)
    val, train = NAMES[int(np.flatnonzero(alone)[0])], NAMES[int(np.flatnonzero(~alone)[0])]
    for a, b in ((val, train), (train, val)):
        first = min(a, b)
        split = held_out([a, b] + NAMES, 0.3, ["same", "same"] + [f"text {n}" for n in NAMES])
        assert split[0] == split[1] == alone[NAMES.index(first)]


def test_with_val_fraction_0_the_one_held_out_document_is_the_lowest_hash():
    """The lowest hash is the document every positive val_fraction holds out first."""
    none = held_out(NAMES, 0.0)
    assert none.sum() == 1
    i = int(np.flatnonzero(none)[0])
    for f in (0.02, 0.1, 0.5, 0.9):
        assert held_out(NAMES, f)[i]


def test_with_val_fraction_1_one_document_stays_in_training():
    """The highest hash: the last one any val_fraction < 1 would hold out."""
    everything = held_out(NAMES, 1.0)
    assert (~everything).sum() == 1
    i = int(np.flatnonzero(~everything)[0])
    for f in (0.1, 0.5, 0.98):
        assert not held_out(NAMES, f)[i]


def test_with_sources_each_source_of_two_or_more_documents_has_a_held_out_one_and_a_trained_one():
    """A phase validates on the held-out documents of the sources it samples: a 3-file corpus beside a large
    source (the embedded corpus at weight 0, say) usually had none held out, and the phase refused to start."""
    small = ["mine/a.txt", "mine/b.txt", "mine/c.txt"]
    sources = [0] * len(NAMES) + [1] * len(small)
    assert not held_out(NAMES + small, 0.02)[len(NAMES):].any()  # the case: by hash alone, none of them
    split = held_out(NAMES + small, 0.02, sources=sources)
    for s in (0, 1):
        mine = split[np.asarray(sources) == s]
        assert mine.any() and not mine.all()
    assert np.array_equal(split[: len(NAMES)], held_out(NAMES, 0.02))  # the large source's split is its own


def test_with_sources_a_one_document_source_is_trained_on():
    """Its document could be the corpus's lowest hash, held out as the corpus's one validation document: the
    source was then never trained on, whatever its weight."""
    lone = next(n for n in (f"tiny/doc_{k}.txt" for k in range(10_000)) if held_out(NAMES + [n], 0.0)[-1])
    split = held_out(NAMES + [lone], 0.0, sources=[0] * len(NAMES) + [1])
    assert not split[-1] and split[:-1].sum() == 1


def test_with_sources_every_source_of_one_document_keeps_it_in_training():
    """Two sources of one big file each: the corpus-wide fallback "hold one out all the same" held the first
    source's only document out, and that source was never trained on (its train pool empty, dropped silently)."""
    split = held_out(["wiki/all.txt", "code/all.txt"], 0.1, ["wiki text", "code text"], sources=[0, 1])
    assert not split.any()


def test_with_sources_a_source_of_identical_documents_holds_one_out():
    """The fallback for a source whose documents all share one text still applies, per source."""
    split = held_out(["a/x", "a/y", "b/z"], 0.1, ["same", "same", "other"], sources=[0, 0, 1])
    assert split[:2].sum() == 1 and not split[2]



def test_a_source_sharing_a_file_with_a_one_document_source_still_holds_one_out():
    """Two sources reading one file (a directory, and one of its files again at a higher weight): the one-document
    source took that file back into training after the directory's source had held it out as its lowest hash, and
    the directory's source had no held-out document at all (here the corpus none: "each source here has one")."""
    texts = [f"text of {n}" for n in NAMES]
    lowest = int(np.flatnonzero(held_out(NAMES, 0.0, texts))[0])  # the directory's one held-out document
    names, sources = NAMES + ["z_again/" + NAMES[lowest]], [0] * len(NAMES) + [1]  # (its copy's name sorts last)
    for f in (0.0, 0.02, 0.1, 0.3):  # each source a trained and a held-out document; the copies share a split
        split = held_out(names, f, texts + [texts[lowest]], sources=sources)
        assert split[: len(NAMES)].any() and not split[: len(NAMES)].all(), f
        assert not split[-1] and not split[lowest], f  # the one-document source is trained on, the copy too
    assert held_out(names, 0.0, texts + [texts[lowest]], sources=sources)[: len(NAMES)].sum() == 1
