"""Autoregressive sampling from a GPT, with a KV cache (minilm/model/cache.py) or without one.

``generate`` feeds the prompt once (prefill), then one token per step, reading the logits of the last position:
greedy (argmax) or sampled with temperature, top-k and top-p (nucleus, Holtzman et al. 2020) filtering. Without
a cache every step runs the whole sequence again — the reference the cached path is tested against.

A row ends at ``eos_id``, or at the token whose text completes one of the ``stop`` strings (read with the
tokenizer's ``decode`` as the tokens come, by ``TextStream``, which also holds back what a later token may complete
into one, so that a stream never prints past a stop string).

Encodings that declare ``supports_kv_cache = False`` (minilm/positions/base.py) are decoded without a cache,
with a warning. A training-free extension installed on the model (minilm.positions.training_free) applies to
the cached path unchanged: its methods work from position values, which the cache carries.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from minilm.errors import MinilmError
from minilm.model.cache import KVCache
from minilm.positions.base import tightest_limit

PREALLOCATE = 4096  # new tokens the KV cache makes room for before decoding starts (it doubles when full)


def cache_blockers(model) -> list[str]:
    """Names of the position modules of ``model`` that cannot decode with a KV cache (empty: all can)."""
    modules = [model.pos_emb, *model.position_modules()]
    return sorted({type(m).__name__ for m in modules if not getattr(m, "supports_kv_cache", True)})


def max_length(model) -> Optional[int]:
    """The longest sequence the model's encodings accept (None: unbounded)."""
    tightest = tightest_limit([model.pos_emb, *model.position_modules()])
    return tightest[0] if tightest else None


def filter_logits(logits: Tensor, top_k: Optional[int] = None, top_p: Optional[float] = None) -> Tensor:
    """logits (B, V) with everything outside the top-k and outside the nucleus of mass top_p set to −inf.
    The most likely token always survives."""
    if top_k is not None and top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def check_sampling(max_new_tokens, temperature, top_k, top_p, names: Optional[dict] = None) -> None:
    """``generate``'s sampling arguments checked; ``names`` maps an argument to how the caller's user gives it
    (scripts/generate.py: ``{"top_k": "--top-k", ...}``), so that the error names the flag, not the parameter."""
    name = (names or {}).get
    for key, value in (("max_new_tokens", max_new_tokens), ("top_k", top_k)):  # (2.5 failed in range() or topk)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise MinilmError(f"{name(key, key)}: must be a whole number, got {value!r}")
    if max_new_tokens < 0:
        raise MinilmError(f"{name('max_new_tokens', 'max_new_tokens')}: must be >= 0, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):  # nan passes a plain `< 0` test
        raise MinilmError(f"{name('temperature', 'temperature')}: must be a finite number >= 0 (0: greedy), "
                          f"got {temperature}")  # fmt: skip
    if top_k is not None and top_k < 1:
        raise MinilmError(f"{name('top_k', 'top_k')}: must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise MinilmError(f"{name('top_p', 'top_p')}: must be in (0, 1], got {top_p}")


def check_stop(stop, names: Optional[dict] = None) -> tuple[str, ...]:
    """``generate``'s ``stop`` as a tuple of non-empty strings (None: none; one string: that one). ``names`` as
    ``check_sampling``'s (scripts/generate.py: ``--stop``)."""
    name = (names or {}).get("stop", "stop")
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    try:
        stops = tuple(stops)
    except TypeError:
        raise MinilmError(f"{name}: must be a string or a list of strings, got {stop!r}") from None
    for s in stops:
        if not isinstance(s, str) or not s:  # '' occurs in every text: it would stop before the first token
            raise MinilmError(f"{name}: each stop string must be a non-empty string, got {s!r}")
    return stops


def first_stop(text: str, stop: Sequence[str]) -> Optional[int]:
    """Where the first occurrence of any of the ``stop`` strings begins in ``text`` (None: none occurs), so that
    ``text[:first_stop(text, stop)]`` is the text before it, or the whole text."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(found) if found else None


def _stop_prefix_start(text: str, stop: Sequence[str]) -> int:
    """Where the longest end of ``text`` that begins a stop string starts (len(text): none does): text that the next
    tokens may complete into a stop string, not to be printed yet."""
    longest = max((len(s) for s in stop), default=1)
    for start in range(max(0, len(text) - longest + 1), len(text)):
        if any(s.startswith(text[start:]) for s in stop):
            return start
    return len(text)


def _check_room(model, prompt_len: int, max_new_tokens: int, names: Optional[dict] = None) -> None:
    """The positions the model reads within those its encodings accept (a learned table's max_positions): the prompt
    and every new token but the last, which is chosen from the logits of the one before and never read back (a
    64-position model continues a 64-token prompt by one token; that was refused). ``names`` as ``check_sampling``'s
    (scripts/generate.py: ``--prompt``, ``--max-new-tokens``)."""
    limit = max_length(model)
    read = prompt_len + max(max_new_tokens, 1) - 1
    if limit is None or read <= limit:
        return
    name = (names or {}).get
    room = limit - prompt_len + 1  # what is allowed, so the user need not work it out
    allowed = (f"at most {room} new tokens fit after this prompt" if room > 0 else
               f"shorten the prompt to at most {limit} tokens")  # fmt: skip
    raise MinilmError(f"{name('prompt', 'prompt')} ({prompt_len} tokens) + {name('max_new_tokens', 'max_new_tokens')} "
                      f"({max_new_tokens}) reads {read} positions (the last new token is not read back), more than "
                      f"the {limit} this model's {model.cfg.position.name} encoding supports; {allowed}")  # fmt: skip


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The ids ``generate`` continues for ``text``: its encoding, or for an empty text (sampling unconditionally) the
    tokenizer's EOS alone. minilm.data.prepare writes EOS after every document and no BOS anywhere, so EOS is the
    token every training document started after (the first token of a document is predicted from it) while BOS was
    never seen: its embedding is the untrained initialization. A non-empty text may still encode to no ids."""
    return tokenizer.encode(text) if text else [tokenizer.eos_id]


def _as_batch(prompt_ids: Union[Sequence[int], Tensor], device, vocab_size: int) -> Tensor:
    idx = prompt_ids if isinstance(prompt_ids, Tensor) else torch.tensor(list(prompt_ids))
    if idx.dim() == 1:
        idx = idx.unsqueeze(0)
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise MinilmError(
            f"prompt: need at least one token id, as a list or a (B, T) tensor; got shape {tuple(idx.shape)} (to "
            "sample unconditionally, start from [tokenizer.eos_id], the token every training document follows: "
            "encode_prompt(tokenizer, '') gives it)"
        )
    # ids are integers below the vocabulary size: 1.7 was cast to 1 without a word, and an id the embedding has no
    # row for (a prompt encoded with another run's tokenizer) was torch's "IndexError: index out of range in self"
    if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        raise MinilmError(f"prompt: token ids must be integers, got {idx.dtype} values")
    low, high = int(idx.min()), int(idx.max())
    if low < 0 or high >= vocab_size:
        raise MinilmError(f"prompt: token id {low if low < 0 else high} is outside this model's vocabulary (0 to "
                          f"{vocab_size - 1}); encode the prompt with the run's own tokenizer")  # fmt: skip
    return idx.to(device=device, dtype=torch.long)


@torch.no_grad()
def generate(
    model,
    prompt_ids: Union[Sequence[int], Tensor],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    greedy: bool = False,
    seed: Optional[int] = None,
    use_cache: bool = True,
    eos_id: Optional[int] = None,
    on_token: Optional[Callable[[Tensor], None]] = None,
    names: Optional[dict] = None,
    stop: Union[str, Sequence[str], None] = None,
    decode: Optional[Callable[[Sequence[int]], str]] = None,
) -> Tensor:
    """Continue ``prompt_ids`` (a list of ids, a (T,) or a (B, T) tensor; rows of equal length) by up to
    ``max_new_tokens`` tokens. Returns the ids (B, T + n), prompt included; n < max_new_tokens only when every row
    has ended, by producing ``eos_id`` or by reaching a ``stop`` string (rows that ended earlier are padded with
    ``eos_id``).

    ``greedy`` (or ``temperature == 0``) takes the argmax; otherwise samples from softmax(logits / temperature)
    restricted to ``top_k`` / ``top_p``, from a generator seeded with ``seed`` (None: torch's global RNG).
    ``on_token``, if given, is called with each step's new ids (B,) as soon as they are chosen (streaming).
    ``names``: how the caller's user gives the arguments, which the errors name (``check_sampling``).

    ``stop`` (a string or a list of them, with ``decode``, the tokenizer's ``decode``): a row also ends at the token
    whose text completes one of them, searched in the new tokens' text (not the prompt's); that token is the row's
    last but EOS padding (a batch of several rows needs ``eos_id``), and its text may go on past the stop string:
    ``text[:first_stop(text, stop)]`` is what comes before it. Each row stops on its own."""
    check_sampling(max_new_tokens, temperature, top_k, top_p, names)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):  # int() took 0.5 as 0
        raise MinilmError(f"{(names or {}).get('seed', 'seed')}: must be a whole number (None: torch's global RNG), "
                          f"got {seed!r}")  # fmt: skip
    stops = check_stop(stop, names)
    device = next(model.parameters()).device
    idx = _as_batch(prompt_ids, device, model.vocab_size)
    _check_room(model, idx.shape[1], max_new_tokens, names)
    stopped = _stop_reader(stops, decode, idx, eos_id, names) if stops else None
    use_cache = use_cache and _cache_usable(model)
    greedy = greedy or temperature == 0
    gen = None
    if seed is not None and not greedy:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed) % 2**64)  # any integer, as --seed of evaluate.py (torch's own range maps alike)

    def choose(logits: Tensor) -> Tensor:
        return _choose(logits.float(), greedy, temperature, top_k, top_p, gen)

    was_training = model.training
    model.eval()
    try:
        return _decode(model, idx, max_new_tokens, choose, use_cache, eos_id, on_token, stopped)
    finally:
        model.train(was_training)


def _cache_usable(model) -> bool:
    """Whether every encoding of ``model`` decodes with a KV cache; warns, naming those that cannot, if not."""
    blockers = cache_blockers(model)
    if blockers:
        warnings.warn(
            f"{', '.join(blockers)} cannot decode with a KV cache (supports_kv_cache = False); decoding without one "
            "(every step recomputes the whole sequence)",
            stacklevel=4,  # generate's caller: above this function, generate and torch.no_grad's wrapper of it
        )
    return not blockers


def _stop_reader(stops: tuple[str, ...], decode, idx: Tensor, eos_id: Optional[int], names: Optional[dict]):
    """``stopped(new ids (B,), done (B,)) -> (B,) bool`` for ``_decode``: whether each row's new text (after
    ``idx``'s prompt) has reached one of ``stops``, read by a ``TextStream`` per row fed the ids of the rows not yet
    done."""
    name = (names or {}).get("stop", "stop")
    if decode is None:
        raise MinilmError(f"{name}: stop strings are read in the decoded text; give decode= (the tokenizer's "
                          "decode, e.g. run.tokenizer.decode)")  # fmt: skip
    if idx.shape[0] > 1 and eos_id is None:
        raise MinilmError(f"{name}: with {idx.shape[0]} rows, a row that stops is padded with eos_id until the "
                          "others end; give eos_id (e.g. run.tokenizer.eos_id)")  # fmt: skip
    streams = [TextStream(decode, context=row[-TextStream.CONTEXT :], stop=stops) for row in idx.tolist()]

    def stopped(nxt: Tensor, done: Tensor) -> Tensor:
        for stream, token, finished in zip(streams, nxt.tolist(), done.tolist()):
            if not finished:
                stream.push(token)
        return torch.tensor([stream.stopped for stream in streams], device=nxt.device)

    return stopped


def _decode(model, idx: Tensor, max_new_tokens: int, choose: Callable[[Tensor], Tensor], use_cache: bool,
            eos_id: Optional[int], on_token: Optional[Callable[[Tensor], None]],
            stopped: Optional[Callable[[Tensor, Tensor], Tensor]] = None) -> Tensor:  # fmt: skip
    """``generate``'s loop: append ``choose(last logits)`` to ``idx`` (B, T) up to ``max_new_tokens`` times, with a
    KV cache where ``use_cache``; rows that produced ``eos_id``, or whose text ``stopped(new ids, done)`` says reached a
    stop string, go on with ``eos_id`` until every row has ended."""
    # room for the whole output at once, up to PREALLOCATE new tokens: max_new_tokens is an upper bound (EOS may
    # come first), and a large one must not allocate its whole cache up front; beyond it the cache grows
    room = idx.shape[1] + min(max_new_tokens, PREALLOCATE)
    cache = KVCache.for_model(model, max_length=room) if use_cache else None
    done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    step_input = idx
    for _ in range(max_new_tokens):
        logits = model(step_input, cache=cache)[:, -1] if cache is not None else model(idx)[:, -1]  # (B, V)
        nxt = choose(logits)  # (B,)
        ended = torch.zeros_like(done)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            ended = nxt == eos_id
        if stopped is not None:
            ended = ended | stopped(nxt, done)
        done = done | ended
        idx = torch.cat([idx, nxt.unsqueeze(1)], dim=1)
        if on_token is not None:
            on_token(nxt)
        step_input = nxt.unsqueeze(1)
        if bool(done.all()):
            break
    return idx


class TextStream:
    """Turns token ids, fed one at a time, into text that can be printed as it comes: ``push(id)`` returns the
    text the new id completes. A character split over several byte-fallback tokens decodes to U+FFFD until its
    last byte arrives, so trailing U+FFFD is held back; ``flush()`` returns whatever is still held. The pieces
    joined equal ``decode(all ids)``, or with ``context`` (the prompt's last ids) what the new ids add to
    ``decode(context)``: a sentencepiece model with a dummy prefix (its defaults) drops the space of a text's first
    piece, so the first new word was printed glued to the prompt ('defmain' where the model wrote 'def main').

    With ``stop`` strings the pieces end where the first of them begins in the new text, and ``stopped`` turns True
    (later ids add nothing); until then the end of the text that begins a stop string is held back, since the next
    ids may complete it (a stop string may span several tokens)."""

    CONTEXT = 4  # the prompt's last ids a caller passes as ``context``: one is enough for the space, a few are cheap

    def __init__(self, decode: Callable[[Sequence[int]], str], context: Sequence[int] = (), stop: Sequence[str] = ()):
        self._decode = decode
        self._context = [int(i) for i in context]
        self._base = decode(self._context) if self._context else ""
        self._stop = check_stop(stop)
        self._ids: list[int] = []
        self._shown = ""
        self.stopped = False

    def _text(self) -> Optional[str]:
        """The new ids' text: what they add to the context's, None where decoding changed the context's own text."""
        text = self._decode(self._context + self._ids)
        return text[len(self._base) :] if text.startswith(self._base) else None

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(int(token_id))
        text = self._text()
        if text is None:  # decoding rewrote the context's text: hold everything to the end, but a stop string in
            # the new ids' own text still ends the stream (it ran to max_new_tokens)
            self.stopped = bool(self._stop) and first_stop(self._decode(self._ids), self._stop) is not None
            return ""
        stable = text.rstrip("\ufffd")
        if self._stop:  # what precedes a stop string, or what cannot be the start of one yet
            cut = first_stop(stable, self._stop)
            self.stopped = cut is not None
            stable = stable[:cut] if self.stopped else stable[: _stop_prefix_start(stable, self._stop)]
        if not stable.startswith(self._shown):  # decoding rewrote text already shown: hold everything to the end
            return ""  # (whether a stop string came is still read above)
        new, self._shown = stable[len(self._shown) :], stable
        return new

    def flush(self) -> str:
        if self.stopped:
            return ""
        text = self._text()
        return text[len(self._shown) :] if text is not None and text.startswith(self._shown) else ""


def _choose(logits: Tensor, greedy: bool, temperature: float, top_k, top_p, gen) -> Tensor:
    if greedy:
        return logits.argmax(-1)
    # shifted so the largest logit is 0 before dividing: a tiny temperature then sends the others to -inf (the
    # argmax limit) instead of every logit to ±inf, whose softmax is nan. At least the dtype's smallest normal
    # number: a subnormal temperature is read as 0 where subnormals are flushed (every CLI does, minilm.cli), and
    # 0 / 0 is nan again; any temperature below it has the same argmax limit.
    temperature = max(temperature, torch.finfo(logits.dtype).tiny)
    logits = filter_logits((logits - logits.amax(-1, keepdim=True)) / temperature, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)
