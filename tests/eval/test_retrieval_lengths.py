"""A retrieval length too short for a task's prompts: refused whatever the draw, and the message gives the length
that every prompt of the task fits — not the length the prompt that happened to fail needed, which the next
prompt could exceed (names, keys and values tokenize to more or fewer tokens)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minilm.errors import DataError
from minilm.eval.retrieval import make_samples


class _RareLongNames:
    """The corpus's tokenizer, but a needle name beginning ``key_q`` (one in 26) takes 6 tokens more, as a name
    whose letters merge into no piece does in a larger tokenizer than the test corpus's."""

    def __init__(self, tok):
        self.tok, self.eos_id = tok, tok.eos_id

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text) + [5] * 6 * len(re.findall(r"key_q[a-z]{3}", text))

    def decode(self, ids) -> str:
        return self.tok.decode(ids)


@pytest.mark.parametrize("style", ["code", "text"])
@pytest.mark.parametrize("task", ["passkey", "needle", "kv", "needle-rare-long-names"])
def test_a_too_short_length_names_the_length_every_prompt_fits(eval_data, task, style):
    tok, val = eval_data.tokenizer, eval_data.val.tokens
    if task == "needle-rare-long-names":
        task, tok = "needle", _RareLongNames(tok)
    with pytest.raises(DataError) as e:
        make_samples(task, tok, val, 16, 1, np.random.default_rng(0), style=style, needles=2)
    need = int(re.search(r"needs at least (\d+) tokens", str(e.value))[1])
    for seed in range(30):  # one length short: refused, saying the same length, whatever the prompts drawn
        with pytest.raises(DataError, match=f"needs at least {need} tokens.*, asked for {need - 1}$"):
            make_samples(task, tok, val, need - 1, 4, np.random.default_rng(seed), style=style, needles=2)
    for seed in range(30):  # at the length it gives, every prompt fits
        samples = make_samples(task, tok, val, need, 4, np.random.default_rng(seed), style=style, needles=2)
        assert {len(p) + len(a) for p, a in samples} == {need}
