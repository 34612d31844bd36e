"""Synthetic retrieval samples: exact lengths, the answer is retrievable from the prompt, needle at the depth."""

from __future__ import annotations

import numpy as np
import pytest

from minilm.data import load_corpus, make_kv_sample, make_passkey_sample
from minilm.errors import DataError


@pytest.fixture
def setup(files_cfg):
    corpus = load_corpus(files_cfg(), progress=False)
    filler = np.asarray(corpus.train.tokens[:2000]).astype(np.int64)
    return corpus.tokenizer, filler[filler != corpus.tokenizer.eos_id]


@pytest.mark.parametrize("style", ["code", "text"])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_sample(setup, style, depth):
    tok, filler = setup
    prompt, answer = make_passkey_sample(tok, filler, 300, depth, np.random.default_rng(1), style=style)
    assert len(prompt) + len(answer) == 300
    key = tok.decode(answer).strip('"')
    assert len(key) == 5 and key.isdigit()
    text = tok.decode(prompt)
    needle = f'pass_key = "{key}"' if style == "code" else f"The pass key is {key}."
    assert text.count(needle) == 1
    assert text.endswith('assert pass_key == "' if style == "code" else "The pass key is ")
    fixed = len(tok.decode(tok.encode(needle))) + 60  # the needle line and the question are not filler
    where = text.index(needle) / (len(text) - fixed)
    assert abs(where - depth) < 0.2  # placed at the depth (snapped back to a line start)


def test_passkey_needle_is_a_line_of_its_own_at_every_depth(setup):
    """The needle goes at a line start of the filler — after a newline or at index 0 — never inside a line, also
    when the filler starts mid-line (as a training row's window does). Splicing it into the first partial line
    made the evaluation's depth 0 (needle first) a case training almost never showed."""
    tok, filler = setup
    nl = tok.encode("\n")[0]
    mid = next(i for i in range(1, len(filler)) if filler[i - 1] != nl and filler[i] != nl)
    at_start = 0
    for depth in np.linspace(0.0, 0.3, 31):
        prompt, answer = make_passkey_sample(tok, filler[mid:], 120, float(depth), np.random.default_rng(3))
        needle = tok.encode(f'\npass_key = "{tok.decode(answer)}\n')
        pos = next(i for i in range(len(prompt)) if prompt[i : i + len(needle)] == needle)
        assert pos == 0 or prompt[pos - 1] == nl, (depth, tok.decode(prompt[max(0, pos - 5) : pos + 3]))
        at_start += pos == 0
    assert 1 < at_start < 31  # small depths land on the first line start, larger ones further in


def test_passkey_depth_is_kept_on_average_at_short_lengths(setup):
    """The needle goes to the nearest line start, so over many windows of filler it sits at its depth on average,
    and depth 1 puts it last, just before the question. Moved back to its line's start it sat half a line early on
    average: at 128 tokens, where a line is a large share of the filler, depth 1 landed at 0.80 (the grid's depth
    axis shrank toward 0)."""
    tok, filler = setup
    nl = tok.encode("\n")[0]
    starts = [i + 1 for i in np.flatnonzero(filler[:-400] == nl)][:60]  # windows of the filler, each a line start
    assert len(starts) == 60
    for depth in (0.25, 0.5, 0.75, 1.0):
        where = []
        for i, s in enumerate(starts):
            prompt, answer = make_passkey_sample(tok, filler[s:], 128, depth, np.random.default_rng(i))
            needle = tok.encode(f'\npass_key = "{tok.decode(answer)}\n')
            pos = next(j for j in range(len(prompt)) if prompt[j : j + len(needle)] == needle)
            n_fill = len(prompt) - len(needle) - len(tok.encode('\nassert pass_key == "'))
            where.append(pos / n_fill)
            assert pos in (0, n_fill) or prompt[pos - 1] == nl  # at a line start of the filler, or at an end
        assert abs(np.mean(where) - depth) < 0.05, (depth, np.mean(where))
        if depth == 1.0:
            assert min(where) == 1.0  # last: the question follows the needle


@pytest.mark.parametrize("style", ["code", "text"])
def test_passkey_depth_holds_in_filler_without_newlines(setup, style):
    """Prose with few newlines (one-line jsonl records, long paragraphs): the needle still goes at its depth.
    Snapping back to the line start took every depth to the filler's start there, so training rows and the
    evaluation's depth sweep all had the key first."""
    tok, filler = setup
    nl = tok.encode("\n")[0]
    one_line = np.resize(filler[filler != nl], 1200)  # a single 1200-token line
    where = []
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        prompt, answer = make_passkey_sample(tok, one_line, 1000, depth, np.random.default_rng(4), style=style)
        key = tok.decode(answer).strip('"')
        needle = tok.encode(f'\npass_key = "{key}"\n' if style == "code" else f"\nThe pass key is {key}.")
        pos = next(i for i in range(len(prompt)) if prompt[i : i + len(needle)] == needle)
        assert prompt[:pos] == one_line[:pos].tolist()  # the filler before the needle, untouched
        where.append(pos)
    assert where[0] == 0 and where[-1] > 0.85 * 1000, where  # depth 1: after all of the filler
    assert np.ptp(np.diff(where)) <= 1, where  # evenly spaced, as the depths are


def test_passkey_is_deterministic_per_rng(setup):
    tok, filler = setup
    a = make_passkey_sample(tok, filler, 200, 0.3, np.random.default_rng(5))
    b = make_passkey_sample(tok, filler, 200, 0.3, np.random.default_rng(5))
    assert a == b


@pytest.mark.parametrize("length", [120, 600])
def test_kv_sample(setup, length):
    tok, filler = setup
    prompt, answer = make_kv_sample(tok, filler, length, np.random.default_rng(2))
    assert len(prompt) + len(answer) == length
    text = tok.decode(prompt)
    key = text.rsplit('kv["', 1)[1].split('"')[0]
    value = tok.decode(answer).rstrip('"')
    assert f'"{key}": "{value}",' in text


def test_too_short_for_a_sample(setup):
    tok, filler = setup
    with pytest.raises(DataError, match="passkey"):
        make_passkey_sample(tok, filler, 5, 0.5, np.random.default_rng(0))
    with pytest.raises(DataError, match="key-value"):
        make_kv_sample(tok, filler, 10, np.random.default_rng(0))


class MergingTokenizer:
    """Characters, plus '",' as one token — as a sentencepiece model trained on code has it."""

    PIECES = ['",']

    def encode(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            piece = next((p for p in self.PIECES if text.startswith(p, i)), text[i])
            out.append(1000 + self.PIECES.index(piece) if piece in self.PIECES else ord(piece))
            i += len(piece)
        return out

    def decode(self, ids) -> str:
        return "".join(self.PIECES[t - 1000] if t >= 1000 else chr(t) for t in ids)


@pytest.mark.parametrize("style", ["code", "text"])
def test_kv_answer_is_copied_token_for_token_from_its_pair(style):
    """The asked value, as answer tokens, stands token for token in the prompt's pair, so a model that copies it is
    scored right. The answer used to end with a closing '"' while the pair has the value followed by '",' (one
    token): a perfect copier failed every sample."""
    tok = MergingTokenizer()
    for seed in range(5):
        prompt, answer = make_kv_sample(tok, [ord("x")] * 400, 300, np.random.default_rng(seed), style=style)
        assert len(prompt) + len(answer) == 300
        text, value = tok.decode(prompt), tok.decode(answer)
        key = text.rsplit("kv[" if style == "code" else "key ", 1)[1].split('"')[1]  # the asked key
        assert f'"{key}": "{value}",' in text
        assert any(prompt[j : j + len(answer)] == answer for j in range(len(prompt)))  # token for token
