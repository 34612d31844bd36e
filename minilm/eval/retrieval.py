"""Retrieval probes: passkey (length × depth), multi-key needle with distractors, key-value retrieval.

Prompts come from the same generators as the synthetic training rows (``minilm.data.synthetic``), with filler
cut from the held-out split exactly as the training sampler cuts it from the training split, so a model trained
with ``data.synthetic.fraction > 0`` is asked in the form it has seen. Every sample is ``(prompt_ids,
answer_ids)`` with ``len(prompt) + len(answer) == length``: the model reads at most ``length − 1`` tokens.

Scoring is exact greedy decoding, batched. Greedy decoding reproduces the answer a₁…aₙ exactly iff, for every
i, argmax p(· | prompt, a₁…aᵢ₋₁) = aᵢ — so one teacher-forced forward of ``prompt + answer[:-1]`` decides
exact-match for a whole batch of samples of one length, whatever their answer lengths (no padding, no
position shifts). ``greedy_decode`` (incremental, with ``minilm.model.cache.KVCache``) produces the actual
continuations shown in the report and is tested to agree with the teacher-forced verdict.

Tasks (RULER, Hsieh et al. 2024, names the family):

- ``passkey``: one 5-digit key at relative depth d in filler (Mohtashami & Jaggi 2023, the landmark-attention
  passkey test); ``make_passkey_sample``.
- ``needle``: ``needles`` key → 7-digit value lines, one of them asked for (at depth d) and the others
  distractors at random depths (RULER's niah_multikey); generated here in the passkey's surface style.
- ``kv``: as many random hex key → value pairs as fit, one asked for (RULER's key-value retrieval / the
  "lost in the middle" KV task); ``make_kv_sample``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch

from minilm.data.synthetic import (STYLES, filler_text, kv_length_needed, make_kv_sample, make_passkey_sample,
                                   newline_id, passkey_length_needed, snap_to_line, too_short)
from minilm.errors import DataError, MinilmError
from minilm.eval.perplexity import autocast, model_device

Sample = Tuple[List[int], List[int]]
TASKS = ("passkey", "needle", "kv")


# ------------------------------------------------------------------------------------------------------ filler


def cut_filler(tokens: np.ndarray, eos_id: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` tokens of held-out text from a random start (wrapping), EOS removed so the haystack reads as one
    document, and as many read on past the window in their place (``filler_text``) — the training sampler's
    ``_synthetic_row`` does the same on the training split."""
    total = int(tokens.shape[0])
    if total < n:  # wrapping around would repeat the same text inside one haystack
        raise DataError(f"the held-out split has {total} tokens, fewer than one haystack of {n}; evaluate shorter "
                        "lengths or hold out more data (data.val_fraction)")  # fmt: skip
    start = int(rng.integers(0, total))
    filler = filler_text(lambda at, m: tokens[(at + np.arange(m)) % total], start, n, total, eos_id)
    if len(filler) < n:  # (its EOS aside: one between each two documents)
        raise DataError(f"the held-out split has {len(filler)} tokens of text (its {total - len(filler)} EOS tokens "
                        f"aside), fewer than one haystack of {n}; evaluate shorter lengths or hold out more data "
                        "(data.val_fraction)")  # fmt: skip
    return filler


# ------------------------------------------------------------------------------------------------------ needle


def _digits(rng: np.random.Generator, n: int) -> str:
    return str(rng.integers(1, 10)) + "".join(str(d) for d in rng.integers(0, 10, size=n - 1))


def _name(rng: np.random.Generator) -> str:
    return "key_" + "".join("abcdefghijklmnopqrstuvwxyz"[i] for i in rng.integers(0, 26, size=4))


def make_needle_sample(tokenizer, filler_tokens: Sequence[int], length: int, depth: float, rng: np.random.Generator,
                       style: str = "code", needles: int = 4, digits: int = 7) -> Sample:  # fmt: skip
    """``needles`` lines ``name = "value"`` in the filler: the asked one at relative ``depth``, the distractors
    (other names, other values) at uniform random depths; then a question naming the asked one."""
    if style not in STYLES:
        raise DataError(f"synthetic style: must be one of {STYLES}, got {style!r}")
    if needles < 1:
        raise MinilmError(f"eval.needles: must be >= 1, got {needles}")
    names: List[str] = []
    while len(names) < needles:
        n = _name(rng)
        if n not in names:
            names.append(n)
    values = [_digits(rng, digits) for _ in names]
    line_ids = [tokenizer.encode(_needle_line(n, v, style)) for n, v in zip(names, values)]
    question, answer = _needle_question(names[0], values[0], style)
    q_ids, a_ids = tokenizer.encode(question), tokenizer.encode(answer)
    n_fill = length - sum(map(len, line_ids)) - len(q_ids) - len(a_ids)
    if n_fill < 0:  # (the length any names and values need, not these ones': the next ones may take more tokens)
        need = max(length - n_fill, needle_length_needed(tokenizer, style, needles, digits))
        raise DataError(_needle_too_short(needles, need, length))
    if len(filler_tokens) < n_fill:
        raise DataError(f"needle filler too short: need {n_fill} tokens, got {len(filler_tokens)}")
    filler = [int(t) for t in filler_tokens[:n_fill]]
    nl = newline_id(tokenizer)
    depths = [min(max(depth, 0.0), 1.0)] + [float(rng.random()) for _ in names[1:]]
    # the passkey's rule (make_passkey_sample): to the nearest line start, but never over more than one line's worth
    # of tokens, so long lines (prose paragraphs) do not pull every depth to one place
    at = [snap_to_line(filler, int(round(d * n_fill)), nl) for d in depths]
    out: List[int] = []
    prev = 0
    for pos, ids in sorted(zip(at, line_ids), key=lambda p: p[0]):  # stable: ties keep the asked needle first
        out += filler[prev:pos] + ids
        prev = pos
    return out + filler[prev:] + q_ids, a_ids


def _needle_line(name: str, value: str, style: str) -> str:
    if style == "code":
        return f'\n{name} = "{value}"\n'
    return f"\nOne of the special magic numbers for {name} is: {value}.\n"


def _needle_question(name: str, value: str, style: str) -> Tuple[str, str]:
    """(question, answer) asking for ``name``'s value."""
    if style == "code":
        return f'\nassert {name} == "', f'{value}"'
    return f"\nWhat is the special magic number for {name}? The special magic number for {name} is: ", value


def _needle_too_short(needles: int, need: int, length: int) -> str:
    return (f"a needle sample with {needles} needle{'s' * (needles != 1)} needs at least {need} tokens, asked for "
            f"{length}")  # fmt: skip


def needle_length_needed(tokenizer, style: str = "code", needles: int = 4, digits: int = 7, draws: int = 256) -> int:
    """The length a needle sample needs, without filler, whatever its names and values: the asked needle with its
    question and answer, and ``needles - 1`` distractors, each the longest of ``draws`` random names and values and
    of an all-nines value (how many tokens a name takes depends on how its four random letters tokenize; a seeded
    draw of its own, so the caller's generator is left as it was)."""
    rng = np.random.default_rng(0)
    pairs = [(_name(rng), _digits(rng, digits)) for _ in range(draws)]
    pairs += [(n, "9" * digits) for n, _ in pairs[:8]]
    line = [len(tokenizer.encode(_needle_line(n, v, style))) for n, v in pairs]
    asked = [x + sum(len(tokenizer.encode(t)) for t in _needle_question(n, v, style))
             for x, (n, v) in zip(line, pairs)]  # fmt: skip
    return max(asked) + (needles - 1) * max(line)


# ---------------------------------------------------------------------------------------------------- samples


def make_samples(task: str, tokenizer, val_tokens: np.ndarray, length: int, n: int, rng: np.random.Generator, *,
                 depth: float = 0.5, style: str = "code", needles: int = 4) -> List[Sample]:  # fmt: skip
    """``n`` samples of ``task`` at ``length`` (and ``depth`` for passkey / needle) with held-out filler. A length
    too short for some of the task's prompts is refused whatever this draw's prompts (which may all have fitted),
    giving the length that every prompt fits: measured only on the prompts that fit, a length scored names and keys
    that tokenize short, and whether it was measured at all changed with the seed and ``n``."""
    if task not in TASKS:
        raise MinilmError(f"eval.tasks: unknown retrieval task {task!r}; allowed: {', '.join(TASKS)}")
    if style not in STYLES:
        raise DataError(f"synthetic style: must be one of {STYLES}, got {style!r}")
    if task == "passkey" and length < (need := passkey_length_needed(tokenizer, style)):
        raise too_short(task, need, length)
    if task == "needle" and needles >= 1 and length < (need := needle_length_needed(tokenizer, style, needles)):
        raise DataError(_needle_too_short(needles, need, length))
    if task == "kv" and length < (need := kv_length_needed(tokenizer, np.random.default_rng(0), style)):
        raise too_short(task, need, length)
    out = []
    for _ in range(n):
        filler = cut_filler(val_tokens, tokenizer.eos_id, length, rng)
        if task == "passkey":
            out.append(make_passkey_sample(tokenizer, filler, length, depth, rng, style=style))
        elif task == "needle":
            out.append(make_needle_sample(tokenizer, filler, length, depth, rng, style=style, needles=needles))
        elif task == "kv":
            out.append(make_kv_sample(tokenizer, filler, length, rng, style=style))
        else:
            raise MinilmError(f"eval.tasks: unknown retrieval task {task!r}; allowed: {', '.join(TASKS)}")
    return out


# ---------------------------------------------------------------------------------------------------- scoring


@dataclass
class Scores:
    exact: np.ndarray  # (N,) bool: greedy decoding reproduces the whole answer
    token_acc: np.ndarray  # (N,) share of answer tokens whose greedy prediction (given the true prefix) is right
    logprob: np.ndarray  # (N,) log p(answer | prompt), nats


def _answer_logits(model, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Logits only at the rows' answer positions: (B, T) inputs, idx (B, A) positions -> (B, A, V). Uses
    ``model.hidden`` + ``lm_head`` when the model has them, so long prompts never materialize (B, T, V)."""
    with autocast(x.device):
        if hasattr(model, "hidden") and hasattr(model, "lm_head"):
            h = model.hidden(x)  # (B, T, D)
            h = torch.gather(h, 1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))  # (B, A, D)
            return model.lm_head(h).float()
        logits = model(x)  # (B, T, V)
    return torch.gather(logits.float(), 1, idx.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))


@torch.inference_mode()
def score_samples(model, samples: Sequence[Sample], batch_size: int) -> Scores:
    """Teacher-forced exact-match of greedy decoding for samples of one total length (see the module doc)."""
    if not samples:
        return Scores(np.zeros(0, bool), np.zeros(0), np.zeros(0))
    total = {len(p) + len(a) for p, a in samples}
    if len(total) != 1:
        raise MinilmError(f"score_samples: samples must share one length, got {sorted(total)}")
    device = model_device(model)
    A = max(len(a) for _, a in samples)
    exact, acc, lp = [], [], []
    for i in range(0, len(samples), batch_size):
        chunk = samples[i : i + batch_size]
        seq = torch.tensor([p + a for p, a in chunk], device=device)  # (B, L)
        x = seq[:, :-1]  # (B, L-1): the last answer token is never read
        # position t predicts token t+1: answer token j sits at len(p)+j, so is predicted at len(p)+j-1;
        # shorter answers are padded by repeating their last position (masked out below)
        idx = torch.tensor([[len(p) - 1 + min(j, len(a) - 1) for j in range(A)] for p, a in chunk], device=device)
        mask = torch.tensor([[j < len(a) for j in range(A)] for _, a in chunk], device=device)  # (B, A)
        target = torch.gather(seq, 1, idx + 1)  # (B, A)
        logits = _answer_logits(model, x, idx)  # (B, A, V)
        hit = (logits.argmax(-1) == target) | ~mask
        logp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, A)
        exact.append(hit.all(-1).cpu())
        acc.append(((hit & mask).sum(-1).float() / mask.sum(-1)).cpu())
        lp.append((logp * mask).sum(-1).cpu())
    return Scores(torch.cat(exact).numpy(), torch.cat(acc).numpy(), torch.cat(lp).double().numpy())


@torch.inference_mode()
def greedy_decode(model, prompt: Sequence[int], n_new: int) -> List[int]:
    """The ``n_new`` greedy tokens after ``prompt``: with ``minilm.model.cache.KVCache`` when the model takes
    one (a GPT: one forward of the prompt, then one token per step), else by full recomputation — also for an
    encoding that declares ``supports_kv_cache = False`` (``conv``), whose cached decode reads zeros and continued
    with other tokens than the verdict scored, as generate() decodes it."""
    from minilm.model import GPT
    from minilm.model.cache import KVCache
    from minilm.model.generate import cache_blockers

    device = model_device(model)
    x = torch.tensor([list(prompt)], device=device)  # (1, T)
    out: List[int] = []
    if isinstance(model, GPT) and not cache_blockers(model):
        cache = KVCache.for_model(model, max_length=len(prompt) + n_new)
        with autocast(device):
            logits = model(x, cache=cache)
        for _ in range(n_new):
            nxt = int(logits[0, -1].float().argmax())
            out.append(nxt)
            if len(out) == n_new:
                break
            with autocast(device):
                logits = model(torch.tensor([[nxt]], device=device), cache=cache)
        return out
    for _ in range(n_new):
        with autocast(device):
            logits = model(x)
        nxt = int(logits[0, -1].float().argmax())
        out.append(nxt)
        x = torch.cat([x, torch.tensor([[nxt]], device=device)], dim=1)
    return out
