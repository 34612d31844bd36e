"""Sampling: exact restart, disjoint ranks, measured long fraction, document ids/positions against a reference
built by hand from the tokens, validation batches, synthetic rows."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from minilm.data import load_corpus, make_kv_sample, make_sampler, validation_batches
from minilm.errors import DataError
from tests.data.conftest import make_data_cfg

SEQ = 128


@pytest.fixture
def mixed_cfg(tmp_path, mixed_dir):
    def make(**overrides):
        return make_data_cfg(tmp_path, {"m": {"kind": "files", "paths": [f"{mixed_dir}/*.py"]}}, **overrides)

    return make


def _eq(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_batch_format(files_cfg):
    cfg = files_cfg(document_mask=True, restart_positions=True)
    corpus = load_corpus(cfg, progress=False)
    b = make_sampler(corpus, "train", cfg, seq_len=32, batch_size=4, seed=0, phase="p").batch(0)
    assert set(b) == {"input_ids", "targets", "doc_ids", "positions"}
    for v in b.values():
        assert v.shape == (4, 32) and v.dtype == torch.int64
    assert torch.equal(b["input_ids"][:, 1:], b["targets"][:, :-1])  # targets are the next tokens
    plain = make_sampler(corpus, "train", files_cfg(), seq_len=32, batch_size=4, seed=0, phase="p").batch(0)
    assert set(plain) == {"input_ids", "targets"}


def test_same_index_same_batch_after_a_simulated_restart(mixed_cfg):
    cfg = mixed_cfg(long_fraction=0.5, document_mask=True, restart_positions=True)
    corpus = load_corpus(cfg, progress=False)
    args = dict(seq_len=SEQ, batch_size=4, seed=7, phase="extend")
    a = make_sampler(corpus, "train", cfg, **args)
    seen = [a.batch(i) for i in range(6)]
    b = make_sampler(load_corpus(cfg, progress=False), "train", cfg, **args)  # fresh process, fresh objects
    b.load_state_dict(a.state_dict())
    assert _eq(b.batch(5), seen[5]) and _eq(b.batch(2), seen[2])  # any order, no hidden state
    assert not _eq(seen[0], seen[1])
    other = make_sampler(corpus, "train", cfg, **{**args, "phase": "other"})
    assert not _eq(other.batch(0), seen[0])
    with pytest.raises(DataError, match="seed"):
        make_sampler(corpus, "train", cfg, **{**args, "seed": 8}).load_state_dict(a.state_dict())


def test_ranks_draw_different_rows(mixed_cfg):
    cfg = mixed_cfg()
    corpus = load_corpus(cfg, progress=False)
    rows = []
    for rank in range(4):
        s = make_sampler(corpus, "train", cfg, seq_len=SEQ, batch_size=4, seed=1, phase="p", rank=rank, world_size=4)
        rows += [tuple(r.tolist()) for r in s.batch(3)["input_ids"]]
    assert len(set(rows)) == len(rows)


def test_ranks_together_draw_the_one_process_global_batch(mixed_cfg):
    """DDP with world_size w and per-rank batch B sees exactly the rows of one process with batch w·B."""
    cfg = mixed_cfg(long_fraction=0.5, long_min_tokens=SEQ + 1)
    corpus = load_corpus(cfg, progress=False)
    args = dict(seq_len=SEQ, seed=1, phase="p")
    whole = make_sampler(corpus, "train", cfg, batch_size=4, **args).batch(5)["input_ids"]
    parts = [make_sampler(corpus, "train", cfg, batch_size=2, rank=r, world_size=2, **args).batch(5)["input_ids"]
             for r in range(2)]  # fmt: skip
    assert torch.equal(torch.cat(parts), whole)


@pytest.mark.parametrize("fraction", [0.25, 0.6])
def test_measured_long_fraction_matches_config(mixed_cfg, fraction):
    cfg = mixed_cfg(long_fraction=fraction, long_min_tokens=SEQ + 1)
    corpus = load_corpus(cfg, progress=False)
    eos = corpus.tokenizer.eos_id
    lengths = np.sort(corpus.train.doc_lengths)
    assert lengths[-1] > 4 * SEQ and lengths[lengths < SEQ].size + (lengths > SEQ + 1).sum() == lengths.size
    s = make_sampler(corpus, "train", cfg, seq_len=SEQ, batch_size=8, seed=3, phase="p")
    # measured from the content: a long row is a window inside one long document, so it holds no EOS; a short row
    # packs documents shorter than SEQ, so it always holds one
    ids = torch.cat([s.batch(i)["input_ids"] for i in range(150)])
    measured = (ids == eos).sum(1).eq(0).float().mean().item()
    assert measured == pytest.approx(fraction, abs=0.04)
    planned = np.mean([k == "long" for i in range(150) for k in s.row_plan(i)])
    assert planned == pytest.approx(measured, abs=1e-6)


def test_doc_ids_and_positions_equal_a_reference_built_from_the_tokens(mixed_cfg):
    cfg = mixed_cfg(document_mask=True, restart_positions=True, long_fraction=0.3)
    corpus = load_corpus(cfg, progress=False)
    eos = corpus.tokenizer.eos_id
    s = make_sampler(corpus, "train", cfg, seq_len=SEQ, batch_size=8, seed=0, phase="p")
    for i in range(5):
        b = s.batch(i)
        for row, ids, pos in zip(b["input_ids"].tolist(), b["doc_ids"].tolist(), b["positions"].tolist()):
            doc, start, ref_ids, ref_pos = 0, 0, [], []
            for t, tok in enumerate(row):  # a new document starts after each EOS
                if t > 0 and row[t - 1] == eos:
                    doc, start = doc + 1, t
                ref_ids.append(doc)
                ref_pos.append(t - start)
            assert ids == ref_ids and pos == ref_pos
        # the mask a model builds from doc_ids (same id, causal) equals the interval reference: query q sees
        # keys from the start of its document (q - position) up to q
        d, q, k = b["doc_ids"], torch.arange(SEQ)[:, None], torch.arange(SEQ)[None, :]
        mask = (d[:, :, None] == d[:, None, :]) & (k <= q)
        ref = (k <= q) & (k >= q - b["positions"][:, :, None])
        assert torch.equal(mask, ref)


def test_source_weights_hold_within_the_packed_part(tmp_path, caplog):
    for name, word in (("a", "alpha"), ("b", "omega")):  # each source's text is recognizable in any window
        (tmp_path / name).mkdir()
        for i in range(12):
            (tmp_path / name / f"{i}.txt").write_text(f"{word} = {word} + {i}\n" * (3 + i))
    cfg = make_data_cfg(tmp_path, {
        "a": {"kind": "files", "paths": [f"{tmp_path}/a/*.txt"], "weight": 3.0},
        "b": {"kind": "files", "paths": [f"{tmp_path}/b/*.txt"], "weight": 1.0},
    })  # fmt: skip
    corpus = load_corpus(cfg, progress=False)
    with caplog.at_level("INFO", logger="minilm.data.sampler"):
        s = make_sampler(corpus, "train", cfg, seq_len=16, batch_size=8, seed=0, phase="p")
        make_sampler(corpus, "val", cfg, seq_len=16, batch_size=8, seed=0, phase="p")
    # the normalization is said once (prepare_data.py printed it for each split) with the shares, not the weights
    said = [r.getMessage() for r in caplog.records if "weights" in r.getMessage()]
    assert said == ["data.sources weights a 3, b 1 sum to 4: each source's share of the rows is a 0.75, b 0.25"], said
    texts = [corpus.tokenizer.decode(r.tolist()) for i in range(100) for r in s.batch(i)["input_ids"]]
    assert all(("alpha" in t) != ("omega" in t) for t in texts)  # a row never mixes sources
    assert np.mean(["alpha" in t for t in texts]) == pytest.approx(0.75, abs=0.05)


def test_sources_sampled_off_their_weights_are_said_with_the_shares_realised(tmp_path, caplog):
    """A source of short documents alone gives no long rows: with weights 1:1 and long_fraction 0.25 it takes 3/4
    of the rows. The weights' normalization was logged as the shares of the rows, and nothing said otherwise."""
    for name, word, lines in (("a", "alpha", 1), ("b", "omega", 40)):  # a: short documents only, b: long ones
        (tmp_path / name).mkdir()
        for i in range(12):
            (tmp_path / name / f"{i}.txt").write_text(f"{word} = {word} + {i}\n" * lines)
    cfg = make_data_cfg(tmp_path, {"a": {"kind": "files", "paths": [f"{tmp_path}/a/*.txt"]},
                                   "b": {"kind": "files", "paths": [f"{tmp_path}/b/*.txt"]}},
                        long_fraction=0.25)  # fmt: skip
    corpus = load_corpus(cfg, progress=False)
    with caplog.at_level("WARNING", logger="minilm.data.sampler"):
        s = make_sampler(corpus, "train", cfg, seq_len=32, batch_size=8, seed=0, phase="p")
    said = [r.getMessage() for r in caplog.records if "shares of the train rows" in r.getMessage()]
    assert len(said) == 1 and "are a 0.75, b 0.25, not their weights' a 0.5, b 0.5" in said[0], said
    assert "b has no document shorter than 32 tokens" in said[0] and "data.long_fraction" in said[0]
    assert s.source_shares() == pytest.approx({"a": 0.75, "b": 0.25})
    texts = [corpus.tokenizer.decode(r.tolist()) for i in range(100) for r in s.batch(i)["input_ids"]]
    assert np.mean(["alpha" in t for t in texts]) == pytest.approx(0.75, abs=0.05)  # the shares said are the ones drawn


def test_validation_batches_are_fixed_and_held_out(mixed_cfg):
    cfg = mixed_cfg(document_mask=True)
    corpus = load_corpus(cfg, progress=False)
    a = validation_batches(corpus, cfg, seq_len=32, batch_size=4, n_batches=3, seed=0)
    b = validation_batches(corpus, cfg, seq_len=32, batch_size=4, n_batches=3, seed=0)
    assert len(a) == 3 and all(_eq(x, y) for x, y in zip(a, b))
    assert set(a[0]) == {"input_ids", "targets", "doc_ids"}
    val = np.asarray(corpus.val.tokens).astype(np.int64)
    cyc = np.concatenate([val, val]).tobytes()
    for batch in a:
        for row in batch["input_ids"].numpy():
            assert row.astype(np.int64).tobytes() in cyc  # a window of the held-out stream


def test_ranks_together_validate_the_one_process_rows(mixed_cfg):
    """Validation is sharded like training: 2 ranks x batch 2 hold exactly the rows of 1 process x batch 4, so
    val loss does not depend on the device count (each rank used to validate the same batch-2 rows)."""
    cfg = mixed_cfg()
    corpus = load_corpus(cfg, progress=False)
    one = validation_batches(corpus, cfg, seq_len=32, batch_size=4, n_batches=2, seed=0)
    ranks = [validation_batches(corpus, cfg, seq_len=32, batch_size=2, n_batches=2, seed=0, rank=r, world_size=2)
             for r in range(2)]  # fmt: skip
    for i in range(2):
        together = torch.cat([ranks[r][i]["input_ids"] for r in range(2)])
        assert torch.equal(together, one[i]["input_ids"])


def test_synthetic_rows_are_mixed_in(files_cfg):
    cfg = files_cfg(**{"synthetic.fraction": 0.5, "synthetic.tasks": ["passkey", "kv"], "synthetic.style": "code"})
    corpus = load_corpus(cfg, progress=False)
    s = make_sampler(corpus, "train", cfg, seq_len=96, batch_size=8, seed=0, phase="p")
    texts = [corpus.tokenizer.decode(r.tolist()) for i in range(10) for r in s.batch(i)["input_ids"]]
    n_syn = sum(("pass_key" in t) or ("kv = {" in t) for t in texts)
    assert n_syn == pytest.approx(40, abs=6)
    assert any("assert pass_key ==" in t for t in texts) and any('assert kv["' in t for t in texts)


def test_synthetic_filler_of_short_documents_is_text_read_on_not_repeated(tmp_path):
    """A synthetic row's haystack is the packed text with its EOS tokens left out and as much text read on in their
    place: it was filled up with its own first tokens again, so with short documents (here 40 of a row's EOS) the
    row's last lines before the question repeated its first ones."""
    docs = tmp_path / "short"
    docs.mkdir()
    rng = np.random.default_rng(0)
    for i in range(300):
        (docs / f"d{i:03d}.txt").write_text(f"{rng.choice(['alpha', 'beta', 'gamma'])} {i}")
    cfg = make_data_cfg(tmp_path, {"s": {"kind": "files", "paths": [f"{docs}/*.txt"]}},
                        **{"synthetic.fraction": 0.9, "synthetic.tasks": ["passkey"], "synthetic.style": "code",
                           "synthetic.loss": "answer"})  # fmt: skip
    corpus = load_corpus(cfg, progress=False)
    tok, store = corpus.tokenizer, corpus.train
    text = np.asarray(store.tokens)
    stream = text[text != tok.eos_id].tolist() * 2  # the documents' text in order, EOS aside, wrapping once
    s = make_sampler(corpus, "train", cfg, seq_len=256, batch_size=4, seed=0, phase="p")
    checked = 0
    for i in range(3):
        b = s.batch(i)
        for row, targets in zip(b["input_ids"].tolist(), b["targets"]):
            if (targets != -100).all():
                continue
            prompt_len = int((targets == -100).sum()) + 1  # targets up to the answer's first are ignored
            key = tok.decode(targets[targets != -100].tolist()).strip('"')
            prompt = row[:prompt_len]
            needle, question = tok.encode(f'\npass_key = "{key}"\n'), tok.encode('\nassert pass_key == "')
            at = next(j for j in range(len(prompt)) if prompt[j : j + len(needle)] == needle)
            filler = prompt[:at] + prompt[at + len(needle) : -len(question)]
            assert len(filler) > 200
            start = next(j for j in range(len(stream)) if stream[j : j + 20] == filler[:20])
            assert stream[start : start + len(filler)] == filler  # read on in order, nothing repeated
            checked += 1
    assert checked >= 6


def test_synthetic_answer_loss_keeps_only_the_answer_targets(files_cfg):
    """``data.synthetic.loss: answer``: a synthetic row's targets are IGNORE up to its answer, which is kept
    whole (5 digits and the closing quote decode to the key); other rows keep every target. Same tokens as
    ``loss: all``, so only the loss changes."""
    args = dict(seq_len=64, batch_size=8, seed=0, phase="p")
    answer = files_cfg(**{"synthetic.fraction": 0.5, "synthetic.tasks": ["passkey"], "synthetic.style": "code",
                          "synthetic.loss": "answer"})  # fmt: skip
    corpus = load_corpus(answer, progress=False)
    plain = make_sampler(corpus, "train", files_cfg(**{"synthetic.fraction": 0.5, "synthetic.tasks": ["passkey"],
                                                       "synthetic.style": "code"}), **args)  # fmt: skip
    s = make_sampler(corpus, "train", answer, **args)
    seen = 0
    for i in range(4):
        b, p = s.batch(i), plain.batch(i)
        kept_mask = b["targets"] != -100
        assert torch.equal(b["input_ids"], p["input_ids"])
        assert torch.equal(b["targets"][kept_mask], p["targets"][kept_mask]) and (p["targets"] != -100).all()
        for row, kept in zip(b["input_ids"], b["targets"]):
            text = corpus.tokenizer.decode(row.tolist())
            if "assert pass_key ==" not in text:
                assert (kept != -100).all()
                continue
            seen += 1
            n_ignored = int((kept == -100).sum())
            assert (kept[:n_ignored] == -100).all() and (kept[n_ignored:] != -100).all()
            key = text.split('pass_key = "')[1][:5]
            assert corpus.tokenizer.decode(kept[n_ignored:].tolist()) == f'{key}"'
    assert seen >= 8
    with pytest.raises(DataError, match="synthetic_loss"):
        make_sampler(corpus, "train", answer, **args).load_state_dict(plain.state_dict())


def test_a_seq_len_too_short_for_a_synthetic_task_fails_when_the_sampler_is_made(files_cfg):
    """Not mid-phase, when the first retrieval row happens to be drawn: when the sampler is built (train.py builds
    every phase's sampler before the first phase trains), naming the keys to change."""
    cfg = files_cfg(**{"synthetic.fraction": 0.1, "synthetic.tasks": ["kv"]})
    corpus = load_corpus(cfg, progress=False)
    with pytest.raises(DataError, match="data.synthetic.tasks: a 'kv' sample does not fit a row of seq_len 16"):
        make_sampler(corpus, "train", cfg, seq_len=16, batch_size=2, seed=0, phase="p")
    make_sampler(corpus, "train", cfg, seq_len=256, batch_size=2, seed=0, phase="p").batch(0)


@pytest.mark.parametrize("task", ["passkey", "kv"])
def test_a_seq_len_too_short_for_a_synthetic_task_names_the_seq_len_every_sample_fits(files_cfg, task):
    """The message said to raise train.seq_len but not to what, and the length it gave for kv was that of the pair
    drawn (a seq_len of 50 gave 'needs 51', and 50 then failed with 'needs 55'): it gives the least seq_len, which
    builds, whatever the seed, and one less is refused."""
    cfg = files_cfg(**{"synthetic.fraction": 0.5, "synthetic.tasks": [task]})
    corpus = load_corpus(cfg, progress=False)
    with pytest.raises(DataError) as e:
        make_sampler(corpus, "train", cfg, seq_len=8, batch_size=2, seed=0, phase="p")
    least = int(re.search(r"raise train\.seq_len to at least (\d+),", str(e.value))[1])
    for seed in range(6):
        with pytest.raises(DataError, match=f"raise train\\.seq_len to at least {least},"):
            make_sampler(corpus, "train", cfg, seq_len=least - 1, batch_size=2, seed=seed, phase="p")
        make_sampler(corpus, "train", cfg, seq_len=least, batch_size=2, seed=seed, phase="p").batch(0)


class _LongDigitPairs:
    """The corpus's tokenizer, but a kv pair whose key and value are both digits alone (one pair in 280 drawn) takes
    40 tokens more, as digits, split one a token, make all-digit hex keys the longest in a real tokenizer."""

    def __init__(self, tok):
        self.tok, self.eos_id = tok, tok.eos_id

    def encode(self, text: str) -> list[int]:
        pair = re.search(r'"([0-9a-f]{6})": "([0-9a-f]{6})"', text)
        return self.tok.encode(text) + [5] * 40 * bool(pair and pair[1].isdigit() and pair[2].isdigit())

    def decode(self, ids) -> str:
        return self.tok.decode(ids)


def test_a_seq_len_too_short_for_a_rare_kv_pair_fails_when_the_sampler_is_made(files_cfg):
    """A kv sample needs room for one pair, and a pair's length depends on how its random key and value tokenize:
    8 samples drawn to check the seq_len passed one too short for a rare long pair, and the phase stopped when the
    first such row was drawn."""
    cfg = files_cfg(**{"synthetic.fraction": 0.5, "synthetic.tasks": ["kv"]})
    corpus = load_corpus(cfg, progress=False)
    corpus.tokenizer = _LongDigitPairs(corpus.tokenizer)
    rng = np.random.default_rng(0)
    fits = [len(sum(make_kv_sample(corpus.tokenizer, [7] * 200, 100, rng), [])) == 100 for _ in range(50)]
    assert all(fits)  # a seq_len of 99 holds the usual pairs
    with pytest.raises(DataError, match="data.synthetic.tasks: a 'kv' sample does not fit a row of seq_len 99"):
        make_sampler(corpus, "train", cfg, seq_len=99, batch_size=2, seed=0, phase="p")
    make_sampler(corpus, "train", cfg, seq_len=160, batch_size=2, seed=0, phase="p")  # every pair fits


def test_a_phase_sampler_names_each_key_as_the_run_config_sets_it(files_cfg):
    """A phase's errors named the keys of its resolved config (data.synthetic.tasks, train.seq_len), so a user whose
    phase sets them was told to change keys the run's sections hold: ``set_in`` (the phase's own section) names the
    ones the phase sets as ``phases.<name>.…``, and a remedy for the phase alone as the phase's key."""
    from omegaconf import OmegaConf

    cfg = files_cfg(**{"synthetic.fraction": 0.1, "synthetic.tasks": ["kv"]})
    corpus = load_corpus(cfg, progress=False)
    own = OmegaConf.create({"seq_len": 16, "data": {"synthetic": {"tasks": ["kv"]}}})
    with pytest.raises(DataError) as e:
        make_sampler(corpus, "train", cfg, seq_len=16, batch_size=2, seed=0, phase="p", set_in=own)
    assert str(e.value).startswith("phases.p.data.synthetic.tasks: a 'kv' sample does not fit a row of seq_len 16")
    assert re.search(r"raise phases\.p\.seq_len to at least \d+, or drop 'kv' from phases\.p\.data\.synthetic\."
                     r"tasks or set phases\.p\.data\.synthetic\.fraction to 0 for this phase", str(e.value))
    with pytest.raises(DataError, match=r"lower phases\.p\.batch_size / train\.seq_len$"):
        make_sampler(corpus, "train", cfg, seq_len=16, batch_size=100000, seed=0, phase="p",
                     set_in=OmegaConf.create({"batch_size": 100000}))
