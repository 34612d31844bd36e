"""Synthetic retrieval samples: passkey (needle in a haystack) and key-value retrieval.

Used two ways: mixed into training rows (``data.synthetic.fraction``) and by the evaluation code, which builds
the same prompts at chosen lengths and depths and checks the greedy continuation against ``answer_ids``.

Every generator returns ``(prompt_ids, answer_ids)`` with ``len(prompt_ids) + len(answer_ids) == length``
exactly, so a training row of ``seq_len + 1`` tokens or an evaluation prompt of a target length is built without
trimming. The filler is real corpus text (token ids), so the haystack looks like the training distribution.

Two surface styles: ``code`` (for the stdlib-code corpus: ``pass_key = "80517"`` … ``assert pass_key == "``)
and ``text`` (prose: "The pass key is 80517." … "What is the pass key? The pass key is"). Digits are single
tokens (the tokenizer splits digits), so a 5-digit key is 5 answer tokens.
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import numpy as np

from minilm.errors import DataError

TASKS = ("passkey", "kv")
STYLES = ("code", "text")

Sample = Tuple[List[int], List[int]]


def newline_id(tokenizer) -> int | None:
    ids = tokenizer.encode("\n")
    return ids[0] if len(ids) == 1 else None


def _digits(rng: np.random.Generator, n: int) -> str:
    return str(rng.integers(1, 10)) + "".join(str(d) for d in rng.integers(0, 10, size=n - 1))


def _hex(rng: np.random.Generator, n: int) -> str:
    return "".join("0123456789abcdef"[d] for d in rng.integers(0, 16, size=n))


def filler_text(read: Callable[[int, int], np.ndarray], start: int, n: int, total: int, eos_id: int) -> np.ndarray:
    """Up to ``n`` tokens of a stream of ``total`` tokens read in order from ``start`` (``read(at, m)``: the ``m``
    tokens from ``at``, wrapping), its EOS tokens left out so the haystack reads as one document; past them it reads
    on, as many tokens again, rather than repeat its own start: filled up with ``np.resize``, a window of short
    documents ended with the text it began with, a copy a model can match instead of reading (one EOS in ten
    tokens: a tenth of the haystack). Fewer than ``n`` only when the whole stream holds fewer."""
    parts, have, done = [], 0, 0
    while have < n and done < total:
        m = min(n - have, total - done)
        chunk = np.asarray(read((start + done) % total, m), dtype=np.int64)
        parts.append(chunk[chunk != eos_id])
        have, done = have + len(parts[-1]), done + m
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


MAX_LINE_TOKENS = 128  # farthest a needle moves to a line start (stdlib code at vocab 2048: 99.9% of lines < 70)


def snap_to_line(filler: Sequence[int], pos: int, nl: int | None) -> int:
    """Move an insertion point to the nearest line start of the filler — just after a newline, its start or its end
    (the question follows on a line of its own) — so the needle is a line of its own, never spliced into a line; a
    tie goes back. Nearest, not back: moved back to its line's start, a needle sat on average half a line before
    its depth, and at short lengths, where a line is a large share of the prompt, the depth axis shrank (passkey at
    128 tokens: depths 0.25 / 0.5 / 0.75 / 1 placed at 0.17 / 0.41 / 0.66 / 0.91 on average). Depth 0 is the
    filler's start, trained on as any other line start. Only within ``MAX_LINE_TOKENS``: in prose with few newlines
    (one-line records, long paragraphs) the nearest line start can be the filler's start or end for every depth;
    there the needle goes at the depth itself (its own leading and trailing newline still make it a line)."""
    if nl is None or pos == 0 or pos >= len(filler):
        return pos
    lo, hi = max(0, pos - MAX_LINE_TOKENS), min(len(filler), pos + MAX_LINE_TOKENS)
    before = np.flatnonzero(np.asarray(filler[lo:pos]) == nl)  # a newline at i starts a line at i + 1
    after = np.flatnonzero(np.asarray(filler[pos - 1 : hi]) == nl)  # (a newline just before pos: pos starts one)
    starts = ([lo + int(before[-1]) + 1] if len(before) else [0] if lo == 0 else []) + (
        [pos + int(after[0])] if len(after) else [len(filler)] if hi == len(filler) else [])  # fmt: skip
    return min(starts, key=lambda s: (abs(s - pos), s)) if starts else pos


def make_passkey_sample(tokenizer, filler_tokens: Sequence[int], length: int, depth: float,
                        rng: np.random.Generator, style: str = "code", digits: int = 5) -> Sample:  # fmt: skip
    """A passkey hidden at relative ``depth`` (0 = start, 1 = end) of corpus filler, then a question whose answer
    is the key. ``filler_tokens`` must hold at least ``length`` tokens."""
    if style not in STYLES:
        raise DataError(f"data.synthetic.style: must be one of {STYLES} (or auto), got {style!r}")
    needle, question, answer = _passkey_texts(_digits(rng, digits), style)
    needle_ids, q_ids, a_ids = tokenizer.encode(needle), tokenizer.encode(question), tokenizer.encode(answer)
    n_fill = length - len(needle_ids) - len(q_ids) - len(a_ids)
    if n_fill < 0:  # (the length any key needs, not this one's: a length this key fits may not fit the next)
        raise too_short("passkey", max(length - n_fill, passkey_length_needed(tokenizer, style, digits)), length)
    if len(filler_tokens) < n_fill:
        raise DataError(f"passkey filler too short: need {n_fill} tokens, got {len(filler_tokens)}")
    filler = [int(t) for t in filler_tokens[:n_fill]]
    pos = snap_to_line(filler, int(round(min(max(depth, 0.0), 1.0) * n_fill)), newline_id(tokenizer))
    return filler[:pos] + needle_ids + filler[pos:] + q_ids, a_ids


def _passkey_texts(key: str, style: str) -> Tuple[str, str, str]:
    """(needle, question, answer) of a passkey sample hiding ``key``."""
    if style == "code":
        return f'\npass_key = "{key}"\n', '\nassert pass_key == "', f'{key}"'
    return (f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n",
            "\nWhat is the pass key? The pass key is ", key)  # fmt: skip


def too_short(task: str, need: int, length: int) -> DataError:
    """The refusal of a ``length`` below ``need``, the length every ``task`` (passkey, kv) sample fits: one message
    where a sample is made and where minilm.eval.retrieval.make_samples checks a length first."""
    what = "a passkey sample" if task == "passkey" else "a key-value sample"
    hold = " to hold one pair of any key and value" if task == "kv" else ""
    return DataError(f"{what} needs at least {need} tokens{hold}, asked for {length}")


def passkey_length_needed(tokenizer, style: str = "code", digits: int = 5, draws: int = 64) -> int:
    """The length a passkey sample needs, without filler, for the longest of ``draws`` random keys and of an
    all-nines one (a seeded draw of its own: the caller's generator is left as it was). With the tokenizer trained
    here a digit is a token of its own, so every key takes as many tokens; a ``model_file`` tokenizer may merge
    digits, and then keys differ."""
    rng = np.random.default_rng(0)
    keys = ["9" * digits] + [_digits(rng, digits) for _ in range(draws)]
    return max(sum(len(tokenizer.encode(t)) for t in _passkey_texts(key, style)) for key in keys)


def make_kv_sample(tokenizer, filler_tokens: Sequence[int], length: int, rng: np.random.Generator,
                   style: str = "code", key_chars: int = 6) -> Sample:  # fmt: skip
    """As many random hex key -> value pairs as fit, then a query for one of them; corpus filler pads the front
    to the exact length. The queried pair is uniform over the pairs, so all depths are trained/evaluated."""
    if style not in STYLES:
        raise DataError(f"data.synthetic.style: must be one of {STYLES} (or auto), got {style!r}")
    head_ids, close_ids = _kv_frame(tokenizer, style)
    pairs: List[Tuple[str, str, List[int]]] = []
    # budget for pairs: length minus fixed parts minus a worst-case query/answer (measured on the first pair)
    used = len(head_ids) + len(close_ids)
    while True:
        k, v = _hex(rng, key_chars), _hex(rng, key_chars)
        line, need = _kv_pair_need(tokenizer, k, v, style)
        if used + need > length:
            break
        pairs.append((k, v, line))
        used += len(line)
    if not pairs:  # (the length any pair needs, not this one's: a length this pair fits may not fit the next)
        need = max(used + need, kv_length_needed(tokenizer, np.random.default_rng(0), style, key_chars=key_chars))
        raise too_short("kv", need, length)
    k, v, _ = pairs[int(rng.integers(0, len(pairs)))]
    q_ids, a_ids = _kv_query(tokenizer, k, v, style)
    body = head_ids + [t for _, _, line in pairs for t in line] + close_ids + q_ids
    n_fill = length - len(body) - len(a_ids)
    if n_fill < 0 or len(filler_tokens) < n_fill:
        raise DataError(f"key-value sample: cannot fill {length} tokens (filler {len(filler_tokens)})")
    return [int(t) for t in filler_tokens[:n_fill]] + body, a_ids


def _kv_frame(tokenizer, style: str) -> Tuple[List[int], List[int]]:
    """The tokens that open and close a key-value sample's pairs."""
    return tokenizer.encode("\nkv = {\n" if style == "code" else "\nJSON data:\n{\n"), tokenizer.encode("}\n")


def _kv_pair_need(tokenizer, key: str, value: str, style: str) -> Tuple[List[int], int]:
    """(the pair's line, the tokens it takes with a query and answer of its own and 8 of slack for a longer
    query than this pair's)."""
    line = tokenizer.encode(f'    "{key}": "{value}",\n')
    q, a = _kv_query(tokenizer, key, value, style)
    return line, len(line) + len(q) + len(a) + 8


def kv_length_needed(tokenizer, rng: np.random.Generator, style: str = "code", draws: int = 256,
                     key_chars: int = 6) -> int:  # fmt: skip
    """The length a key-value sample needs to hold one pair of the longest of ``draws`` random pairs and of an
    all-digit one: how many tokens a pair takes depends on how its random hex key and value tokenize, so a length
    that a few samples fit can be too short for another (a digit is a token of its own with the tokenizer trained
    here, so no pair is longer than the all-digit one)."""
    frame = sum(map(len, _kv_frame(tokenizer, style)))
    pairs = [("9" * key_chars, "9" * key_chars)] + [(_hex(rng, key_chars), _hex(rng, key_chars)) for _ in range(draws)]
    return frame + max(_kv_pair_need(tokenizer, k, v, style)[1] for k, v in pairs)


def _kv_query(tokenizer, key: str, value: str, style: str) -> Sample:
    """(question, answer): the answer is the value alone, without its closing quote. In the pairs the value is
    followed by '",' — one token in a tokenizer trained on code — so a model that copies the value exactly, and
    then the token that followed it, would have been scored wrong on a closing '"' it never saw there."""
    if style == "code":
        return tokenizer.encode(f'assert kv["{key}"] == "'), tokenizer.encode(value)
    return tokenizer.encode(f'The value of key "{key}" is "'), tokenizer.encode(value)


def make_sample(task: str, tokenizer, filler_tokens: Sequence[int], length: int, rng: np.random.Generator,
                style: str = "code") -> Sample:  # fmt: skip
    """One sample of ``task`` (passkey at a uniform random depth, or kv)."""
    if task == "passkey":
        return make_passkey_sample(tokenizer, filler_tokens, length, float(rng.random()), rng, style=style)
    if task == "kv":
        return make_kv_sample(tokenizer, filler_tokens, length, rng, style=style)
    raise DataError(f"data.synthetic.tasks: unknown task {task!r}; allowed: {', '.join(TASKS)}")
