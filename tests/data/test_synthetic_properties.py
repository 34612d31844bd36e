"""Synthetic samples, properties the module promises, with a one-token-per-character tokenizer (no corpus): the
key-value query is uniform over the pairs and the filler pads the front; ``make_sample`` hides the passkey at a
random depth; keys are 5-digit numbers; out-of-range depths clamp to the ends; a filler too short is refused."""

from __future__ import annotations

import numpy as np
import pytest

from minilm.data import make_kv_sample, make_passkey_sample
from minilm.data.synthetic import make_sample
from minilm.errors import DataError


class CharTokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(t) for t in ids)


TOK = CharTokenizer()
FILLER = [ord(c) for c in "x = y + 1\n" * 200]  # lines of 10 tokens, no digits that could look like a key


def _pairs(text: str) -> list[str]:
    """The keys of a kv sample's pairs, in order."""
    body = text.split("kv = {\n", 1)[1].split("}\n", 1)[0]
    return [line.split('"')[1] for line in body.splitlines()]


def test_the_asked_kv_pair_is_uniform_over_the_pairs():
    """"The queried pair is uniform over the pairs, so all depths are trained/evaluated": over many samples the
    first, a middle and the last pair are each asked for, about equally often."""
    asked = []
    for seed in range(300):
        prompt, _ = make_kv_sample(TOK, FILLER, 200, np.random.default_rng(seed))
        text = TOK.decode(prompt)
        keys = _pairs(text)
        asked.append(keys.index(text.rsplit('kv["', 1)[1].split('"')[0]) / (len(keys) - 1))
    asked = np.array(asked)
    assert len(keys) >= 5
    assert (asked == 0).any() and (asked == 1).any()
    assert np.mean(asked < 0.5) == pytest.approx(0.5, abs=0.1) and np.mean(asked) == pytest.approx(0.5, abs=0.08)


def test_kv_filler_pads_the_front():
    """Corpus filler first (to the exact length), then the pairs and the query: the pairs end right before the
    question, as close to it as the length allows."""
    prompt, answer = make_kv_sample(TOK, FILLER, 300, np.random.default_rng(0))
    text = TOK.decode(prompt)
    head = text.index("\nkv = {\n")
    assert head > 0 and prompt[:head] == FILLER[:head]
    assert text[head:].startswith("\nkv = {\n") and '}\nassert kv["' in text[head:]
    assert len(prompt) + len(answer) == 300


def test_a_kv_filler_too_short_for_the_length_is_refused():
    """Never a sample shorter than asked for (a training row of seq_len + 1 tokens is built from it)."""
    prompt, _ = make_kv_sample(TOK, FILLER, 300, np.random.default_rng(0))
    n_fill = TOK.decode(prompt).index("\nkv = {\n")  # what this sample needs
    assert n_fill > 0
    with pytest.raises(DataError, match="key-value sample: cannot fill"):
        make_kv_sample(TOK, FILLER[: n_fill - 1], 300, np.random.default_rng(0))


def test_make_sample_hides_the_passkey_at_a_random_depth():
    """Training rows get the needle at a uniform random depth, so every depth is trained: not always one place."""
    where = []
    for seed in range(60):
        prompt, answer = make_sample("passkey", TOK, FILLER, 400, np.random.default_rng(seed))
        where.append(TOK.decode(prompt).index("pass_key =") / len(prompt))
    where = np.array(where)
    assert where.min() < 0.2 and where.max() > 0.7
    assert np.mean(where < 0.45) == pytest.approx(0.5, abs=0.2)


@pytest.mark.parametrize("style", ["code", "text"])
def test_passkeys_are_five_digit_numbers(style):
    """A 5-digit key (like 80517): five digits, never a leading zero (which would be a shorter number)."""
    for seed in range(200):
        _, answer = make_passkey_sample(TOK, FILLER, 200, 0.5, np.random.default_rng(seed), style=style)
        key = TOK.decode(answer).rstrip('"')
        assert len(key) == 5 and key.isdigit() and key[0] != "0", key


def test_a_depth_outside_0_1_is_the_nearest_end():
    """Depth is relative (0 = start, 1 = end): below 0 is the start, above 1 the end."""
    def sample(depth):
        return make_passkey_sample(TOK, FILLER, 300, depth, np.random.default_rng(4))

    assert sample(-0.5) == sample(0.0) and sample(1.5) == sample(1.0)
    assert sample(0.0) != sample(1.0)
