"""The evaluation reads the held-out documents of the sources the run trains on, not every source prepared."""

import numpy as np
import pytest
from omegaconf import OmegaConf

from minilm.config import on_schema
from minilm.data import TokenStore
from minilm.errors import MinilmError
from minilm.eval.suite import eval_data, sampled_sources
from tests.eval.conftest import make_cfg


def _two_sources(tmp_path, weights, phases=None, one_doc=False):
    for name, n in (("own", 1 if one_doc else 12), ("other", 12)):
        d = tmp_path / name
        d.mkdir()
        for i in range(n):
            word = "alpha" if name == "own" else "omega"
            (d / f"{name}_{i:02d}.txt").write_text(f"{word} {i} " * 40 + "\n")
    cfg = make_cfg(tmp_path / "cache", tmp_path / "own", **{"data.val_fraction": 0.3})
    cfg = OmegaConf.to_container(cfg)
    cfg["data"]["sources"] = {name: {"kind": "files", "paths": [f"{tmp_path / name}/*.txt"], "weight": w}
                              for name, w in weights.items()}  # fmt: skip
    cfg["phases"] = phases or {}
    return on_schema(cfg)


def _sources_of(store: TokenStore) -> set:
    return {store.source_names[s] for s in np.unique(store.doc_source)}


def test_a_source_at_weight_zero_is_not_evaluated_on(tmp_path):
    """The embedded stdlib kept at weight 0 beside one's own text was read by perplexity and retrieval filler."""
    cfg = _two_sources(tmp_path, {"own": 1.0, "other": 0.0})
    data = eval_data(cfg)
    assert _sources_of(data.val) == {"own"}
    text = data.tokenizer.decode(np.asarray(data.val.tokens).tolist())
    assert "alpha" in text and "omega" not in text
    for i in range(data.val.n_docs):  # the copied store indexes its own documents
        assert data.tokenizer.decode(data.val.doc(i)[:-1].tolist()).startswith("alpha")


def test_a_source_any_phase_samples_is_evaluated_on_in_every_phase(tmp_path):
    phases = {"pretrain": {"steps": 2}, "extend": {"steps": 2, "data": {"sources": {"other": {"weight": 0.5}}}}}
    cfg = _two_sources(tmp_path, {"own": 1.0, "other": 0.0}, phases)
    assert sampled_sources(cfg) == ["own", "other"]
    assert _sources_of(eval_data(cfg).val) == {"own", "other"}


def test_no_held_out_document_in_the_sampled_sources_is_an_error_naming_them(tmp_path):
    cfg = _two_sources(tmp_path, {"own": 1.0, "other": 0.0}, one_doc=True)
    with pytest.raises(MinilmError, match=r"no held-out documents in the sources the run trains on \(own\)"):
        eval_data(cfg)


def test_only_keeps_the_store_itself_when_nothing_is_left_out():
    store = TokenStore(np.arange(6), np.array([0, 2]), np.array([2, 4]), np.array([0, 1]), ["a", "b"])
    assert store.only(["a", "b"]) is store
    kept = store.only(["b"])
    assert kept.tokens.tolist() == [2, 3, 4, 5] and kept.doc_offsets.tolist() == [0] and kept.n_docs == 1
    assert store.only([]).n_tokens == 0


def test_a_corpus_that_holds_out_other_documents_than_the_run_did_is_refused(fake_run, corpus_setup):
    """A corpus prepared again (its files changed, or another minilm split it otherwise) could hold out documents the
    run trained on, with the very same tokenizer: the tokenizer check passed and the scores were of trained-on text."""
    import json

    cfg, corpus = corpus_setup
    assert eval_data(cfg, fake_run).val.n_docs == corpus.val.n_docs  # no record (a run from before it): not checked
    record = fake_run / "held_out.json"
    record.write_text(json.dumps({"corpus": corpus.cache_dir.name, "digest": corpus.val.digest()}))
    assert eval_data(cfg, fake_run).val.n_docs == corpus.val.n_docs
    moved = TokenStore(np.asarray(corpus.val.tokens), corpus.val.doc_offsets, corpus.val.doc_lengths[::-1].copy(),
                       corpus.val.doc_source, corpus.val.source_names)  # fmt: skip
    record.write_text(json.dumps({"digest": moved.digest()}))
    with pytest.raises(MinilmError, match=r"are not those the run held out in training .*held_out\.json"):
        eval_data(cfg, fake_run)
    record.write_text("{")
    with pytest.raises(MinilmError, match=r"held_out\.json: cannot be read"):
        eval_data(cfg, fake_run)


def test_a_run_whose_model_file_moved_is_evaluated_with_the_run_s_copy(fake_run, corpus_setup, tmp_path):
    """A run trained with data.tokenizer.model_file keeps a copy of it (its tokenizer.model, the same bytes, by which
    the corpus is keyed); once the file the config named was moved or deleted, every evaluation stopped with
    'data.tokenizer.model_file: no such file', and evaluate.py takes no override to point it elsewhere."""
    import shutil

    from minilm.config import save_config

    cfg, corpus = corpus_setup
    given = tmp_path / "given.model"
    shutil.copyfile(corpus.tokenizer.model_file, given)
    run_cfg = OmegaConf.to_container(cfg)
    run_cfg["data"]["tokenizer"]["model_file"] = str(given)
    run_cfg["data"]["cache_dir"] = str(tmp_path / "cache")
    run_cfg = on_schema(run_cfg)
    save_config(run_cfg, fake_run / "config.yaml")
    first = eval_data(run_cfg, fake_run)
    given.unlink()
    again = eval_data(run_cfg, fake_run)
    assert again.val.digest() == first.val.digest() and again.tokenizer.vocab_size == first.tokenizer.vocab_size
