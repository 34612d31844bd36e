"""Retrieval scoring and sample construction against references computed by hand, with a bigram stub model (no
corpus): a sample's scores do not depend on the other samples of its batch (answers of different lengths share
one teacher-forced forward), the log-probability is the answer's own, one length per call is enforced; filler is
EOS-free; the needles' names are distinct."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from minilm.errors import DataError, MinilmError
from minilm.eval import retrieval
from minilm.eval.retrieval import cut_filler, make_needle_sample, score_samples

V = 12


class Bigram(nn.Module):
    """logits at position t depend on token t only: log p(b | a) = log_softmax(table[a])[b]."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(V, V, generator=torch.Generator().manual_seed(0)) * 3)

    def forward(self, idx, **_):
        return self.table[idx]


def reference(model: Bigram, prompt, answer):
    """(exact, token accuracy, log p(answer | prompt)) straight from the bigram table."""
    logp = torch.log_softmax(model.table.detach(), -1)
    prev = [prompt[-1]] + answer[:-1]
    hits = [int(logp[a].argmax()) == b for a, b in zip(prev, answer)]
    return all(hits), float(np.mean(hits)), float(sum(logp[a, b] for a, b in zip(prev, answer)))


def test_scores_are_each_samples_own_whatever_the_batch():
    """Answers of 1, 3 and 5 tokens (total 12 each) in one batch: exact match, token accuracy and answer
    log-probability equal the hand reference of each sample alone — the padding of the short answers counts
    for nothing."""
    model = Bigram()
    rng = np.random.default_rng(1)
    samples = []
    for a_len in (1, 3, 5, 3, 1):
        seq = rng.integers(0, V, size=12).tolist()
        samples.append((seq[: 12 - a_len], seq[12 - a_len :]))
    # one answer the model gets right token for token, so exact is not trivially all False
    logp = torch.log_softmax(model.table.detach(), -1)
    good = [3]
    for _ in range(4):
        good.append(int(logp[good[-1]].argmax()))
    samples.append(([1] * 7 + good[:1], good[1:]))
    together = score_samples(model, samples, batch_size=len(samples))
    for i, (p, a) in enumerate(samples):
        exact, acc, lp = reference(model, p, a)
        assert together.exact[i] == exact and together.token_acc[i] == pytest.approx(acc)
        assert together.logprob[i] == pytest.approx(lp, abs=1e-4)
    assert together.exact.any() and not together.exact.all()


def test_samples_of_different_lengths_are_refused():
    with pytest.raises(MinilmError, match="must share one length"):
        score_samples(Bigram(), [([1, 2, 3], [4]), ([1, 2], [3, 4, 5])], batch_size=4)


def test_filler_is_n_tokens_without_eos():
    """Held-out text read as one document: EOS between documents removed, still exactly n tokens."""
    eos = 0
    tokens = np.array(([5, 6, 7, 8, eos]) * 20)
    for seed in range(5):
        f = cut_filler(tokens, eos, 30, np.random.default_rng(seed))
        assert len(f) == 30 and not (f == eos).any()


def test_filler_of_short_documents_reads_on_instead_of_repeating_its_start():
    """Each EOS left out is replaced by the text after the window, not by the filler's own first tokens again: with
    documents of 9 tokens a 100-token window held 10 EOS, and the haystack ended with the 10 tokens it began with."""
    eos = 0
    tokens = np.arange(1, 1001)
    tokens[9::10] = eos  # documents of 9 tokens, each followed by its EOS; every other token id appears once
    for seed in range(5):
        f = cut_filler(tokens, eos, 100, np.random.default_rng(seed))
        assert len(f) == 100 and not (f == eos).any()
        assert len(set(f.tolist())) == 100  # no text repeated within one haystack
    with pytest.raises(DataError, match=r"has 90 tokens of text \(its 10 EOS tokens aside\), fewer than one "
                                        r"haystack of 95"):  # fmt: skip
        cut_filler(tokens[:100], eos, 95, np.random.default_rng(0))


class CharTokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(t) for t in ids)


def test_needle_names_are_distinct_even_when_the_generator_repeats_one(monkeypatch):
    """A distractor with the asked needle's name would make the question ambiguous: a repeated name is drawn
    again, not used."""
    names = iter(["key_aaaa", "key_aaaa", "key_bbbb", "key_aaaa", "key_cccc", "key_dddd"])
    monkeypatch.setattr(retrieval, "_name", lambda rng: next(names))
    tok = CharTokenizer()
    prompt, _ = make_needle_sample(tok, [ord("x")] * 400, 300, 0.5, np.random.default_rng(0), needles=4)
    text = tok.decode(prompt)
    for name in ("key_aaaa", "key_bbbb", "key_cccc", "key_dddd"):
        assert text.count(f"\n{name} = ") == 1
