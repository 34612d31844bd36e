"""Sampling training rows from a prepared corpus: a pure function of (seed, phase, index, rank).

Each batch plans its global batch (``batch_size · world_size`` rows) with a generator seeded by
``SeedSequence([seed, hash(phase), index])`` and draws global row g with ``SeedSequence([seed, hash(phase), index,
g])``, and nothing else; a rank takes its slice of rows. So a resumed run sees exactly the batches it would have
seen, and the DDP ranks draw their shares without coordination, together the rows of a one-process run. There is
no iterator state to checkpoint beyond the step.

Row kinds within a batch (counts per batch by stochastic rounding, so the measured shares match the configured
ones on average and per batch up to one row; rows then shuffled):

- ``synthetic`` (``data.synthetic.fraction`` of rows): a passkey / key-value retrieval sample of the row's
  length, with corpus text as filler (``minilm.data.synthetic``). With ``data.synthetic.loss: answer`` only the
  answer tokens of these rows have targets (the rest are ``IGNORE``), so the retrieval is what they train.
- ``long`` (``data.long_fraction`` of the remaining rows): a contiguous window that starts inside a document of
  at least ``data.long_min_tokens`` tokens (default: seq_len). Documents are chosen in proportion to their
  length and the window starts uniformly within it (over its L − n + 1 starts): a document's first and last
  n − 1 tokens fall in fewer windows than its middle ones, and the middle of a document not much longer than the
  window in more than those of a far longer one (about twice as many at L = 2n).
- ``short`` (the rest): a window of the packed stream of the *other* documents (EOS between documents). When
  ``long_fraction`` is 0 the packed stream holds every document (plain pretraining, nothing thrown away).

Sources: each row first picks a source by ``weight`` (among the sources that have documents for that kind of
row), then a position inside that source's pool, so per-source weights hold within each part.

Document masking (``data.document_mask``): ``doc_ids`` numbers the documents of a row 0, 1, 2, … in order; a
row that starts mid-document gives that piece id 0. ``data.restart_positions`` adds ``positions`` restarting at
0 at each document start (and at 0 at the row start for the first piece). An EOS belongs to the document it
ends, so the first token of the next document is predicted from the EOS position like a BOS would.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from minilm.config import SYNTHETIC_LOSSES, key_as_set
from minilm.data.prepare import Corpus, TokenStore
from minilm.data.sources import parse_sources
from minilm.data.synthetic import filler_text, kv_length_needed, make_sample, passkey_length_needed
from minilm.errors import DataError

log = logging.getLogger(__name__)

IGNORE = -100
KINDS = ("short", "long", "synthetic")


@dataclass
class _Pool:
    """Documents laid end to end in a virtual stream: doc i occupies [cum[i], cum[i+1])."""

    docs: np.ndarray  # (P,) indices into the store
    cum: np.ndarray  # (P+1,) int64

    @classmethod
    def of(cls, store: TokenStore, docs: np.ndarray) -> "_Pool":
        return cls(docs.astype(np.int64), np.concatenate([[0], np.cumsum(store.doc_lengths[docs])]).astype(np.int64))

    @property
    def total(self) -> int:
        return int(self.cum[-1])


def _gather(store: TokenStore, pool: _Pool, start: int, n: int):
    """``n`` tokens of the pool's stream from ``start`` (wrapping around), with each token's document-piece id
    and position within its piece. Returns tokens (n,), seg (n,), pos (n,), all int64."""
    p = (start + np.arange(n, dtype=np.int64)) % pool.total  # (n,) stream positions
    d = np.searchsorted(pool.cum, p, side="right") - 1  # (n,) pool-local doc index
    within = p - pool.cum[d]
    tokens = np.asarray(store.tokens[store.doc_offsets[pool.docs[d]] + within], dtype=np.int64)
    seg, pos = document_pieces(within == 0)  # (n,) 0, 0, 1, 1, 1, 2, ... and 0, 1, 0, 1, 2, 0, ...
    return tokens, seg, pos


def document_pieces(new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(piece ids, positions within each piece), int64, of a row of tokens (n,) where ``new`` marks the tokens that
    begin a document: ids 0, 1, 2, ... from the row's first token (which begins the row's first piece, whatever
    ``new`` says there), positions restarting at 0 at each piece's start. A packed row's doc_ids and positions
    (``_gather``), and the evaluation's packed windows' (minilm.eval.perplexity.window_pieces): one rule for both."""
    new = new.copy()
    new[0] = False
    seg = np.cumsum(new)  # (n,)
    seg_start = np.flatnonzero(np.concatenate([[True], new[1:]]))  # index where each piece starts in the row
    return seg.astype(np.int64), np.arange(len(new), dtype=np.int64) - seg_start[seg]


def _phase_key(phase: str) -> int:
    return int.from_bytes(hashlib.sha256(phase.encode()).digest()[:8], "big")


def _stochastic_round(x: float, rng: np.random.Generator) -> int:
    lo = int(np.floor(x))
    return lo + int(rng.random() < x - lo)


class Sampler:
    """Batches of (input_ids, targets[, doc_ids][, positions]) as a pure function of the batch index."""

    def __init__(self, corpus: Corpus, store: TokenStore, *, seq_len: int, batch_size: int, seed: int, phase: str,
                 rank: int = 0, world_size: int = 1, weights: Optional[Dict[str, float]] = None,
                 long_fraction: float = 0.0, long_min_tokens: Optional[int] = None, document_mask: bool = False,
                 restart_positions: bool = False, synthetic_fraction: float = 0.0,
                 synthetic_tasks: tuple = (), synthetic_style: str = "code", synthetic_loss: str = "all",
                 split: str = "train", set_in: Any = None) -> None:  # fmt: skip
        """``set_in``: the phase's own section of the run config (``cfg.phases.get(phase)``; None: a run without
        phases, or not known), so that an error names each key as the run config sets it
        (``phases.b.data.long_fraction``), not as the phase's resolved config holds it (``data.long_fraction``)."""
        self.corpus, self.store, self.split, self.set_in = corpus, store, split, set_in
        self.seq_len, self.batch_size, self.seed, self.phase = int(seq_len), int(batch_size), int(seed), str(phase)
        self.rank, self.world_size = int(rank), int(world_size)
        self.long_fraction, self.synthetic_fraction = float(long_fraction), float(synthetic_fraction)
        self.long_min_tokens = int(long_min_tokens or seq_len)
        self.document_mask, self.restart_positions = bool(document_mask), bool(restart_positions)
        self.synthetic_tasks, self.synthetic_style = tuple(synthetic_tasks), synthetic_style
        if synthetic_loss not in SYNTHETIC_LOSSES:
            raise DataError(f"{self._key('data.synthetic.loss')}: must be one of {SYNTHETIC_LOSSES}, "
                            f"got {synthetic_loss!r}")
        self.synthetic_loss = synthetic_loss
        if store.n_tokens == 0:  # (held_out: only a source of 2+ documents gives one up; raising val_fraction won't)
            why = (": documents are held out only from a source of two or more documents, and each source here has "
                   "one" if split == "val" else "")  # fmt: skip
            raise DataError(f"the {split} split has no documents{why}; add documents")
        names = store.source_names
        w = np.array([(weights or {}).get(n, 1.0) for n in names], dtype=np.float64)
        self._weights = w
        self._all = _Pool.of(store, np.arange(store.n_docs))
        is_long = store.doc_lengths >= self.long_min_tokens
        self._long = self._pools(is_long) if self.long_fraction > 0 else {}
        if self.long_fraction > 0 and not self._long:
            sampled = self._weights[store.doc_source] > 0  # (D,) documents of the sources this phase draws from
            longest = int(store.doc_lengths[sampled].max()) if sampled.any() else 0
            fraction, min_tokens = self._key("data.long_fraction"), self._key("data.long_min_tokens")
            raise DataError(
                f"{fraction}={self.long_fraction} but no {split} document (of a source with weight > 0) "
                f"has at least {self.long_min_tokens} tokens (longest: {longest}); lower {fraction} or "
                f"{min_tokens}, or add a source with longer documents"
            )
        short_mask = ~is_long if self.long_fraction > 0 else np.ones(store.n_docs, bool)
        self._short = self._pools(short_mask)
        if not self._short and self._long:  # every document is long: pack from all of them rather than fail
            log.warning("no %s document is shorter than %d tokens: short rows pack long documents too", split,
                        self.long_min_tokens)  # fmt: skip
            self._short = self._pools(np.ones(store.n_docs, bool))
        if not self._short:  # (weights: plain floats in the message, not np.float64(...))
            sampled = {n: round(float(x), 6) for n, x in zip(names, w)}
            # (each sampled source has one document or none: raising data.val_fraction holds none of them out)
            hint = (" (documents are held out by a hash of their names, data.val_fraction of them and at least one "
                    "per source of two or more documents; a source of one document has none): add documents to a "
                    "source sampled, or sample a source with held-out documents"
                    if split == "val" else "")  # fmt: skip
            raise DataError(f"no {split} documents in any source with weight > 0 (weights: {sampled}){hint}")
        if self.synthetic_fraction > 0:
            self._check_synthetic_fits()
        if split == "train":
            self._warn_unmet_weights()

    def source_shares(self) -> Dict[str, float]:
        """Each source's expected share of the rows. A row picks its source by weight among the sources with
        documents for its part (long rows: documents of at least ``long_min_tokens`` tokens; short rows and the
        filler of synthetic ones: shorter documents), so a source with documents for one part only is not sampled at
        its weight's share."""
        syn = self.synthetic_fraction if self.synthetic_tasks else 0.0
        parts = ((1.0 - (1.0 - syn) * self.long_fraction, self._short), ((1.0 - syn) * self.long_fraction, self._long))
        shares = np.zeros(len(self._weights))
        for share, pools in parts:
            keys = list(pools)
            if share > 0 and keys:
                shares[keys] += share * self._weights[keys] / self._weights[keys].sum()
        return {n: float(x) for n, x in zip(self.store.source_names, shares)}

    def _warn_unmet_weights(self) -> None:
        """Say so when the sources' shares of the rows are not their weights' (a source of short documents alone in
        a phase with long rows): the weights' normalization was logged as the shares, and the mixture changed
        without a word."""
        names, w = self.store.source_names, self._weights / self._weights.sum()
        shares = self.source_shares()
        if max(abs(shares[n] - x) for n, x in zip(names, w)) <= 0.01:
            return
        said = (str(self.corpus.cache_dir), self.phase, tuple(round(x, 3) for x in shares.values()))
        if said in _UNMET:
            return
        _UNMET.add(said)
        sampled = [n for n, x in zip(names, w) if x > 0]
        no_long = [n for i, n in enumerate(names) if n in sampled and i not in self._long]
        no_short = [n for i, n in enumerate(names) if n in sampled and i not in self._short]
        why = "; ".join([f"{', '.join(no_long)} has no document of at least {self.long_min_tokens} tokens for the "
                         f"long rows"] * bool(no_long and self.long_fraction > 0)
                        + [f"{', '.join(no_short)} has no document shorter than {self.long_min_tokens} tokens for "
                           f"the short and synthetic rows"] * bool(no_short))  # fmt: skip
        log.warning("phase '%s': the sources' shares of the %s rows are %s, not their weights' %s: a row picks its "
                    "source by weight among the sources with documents for its part (long rows, %s=%g of the rows "
                    "not synthetic, draw documents of at least %s=%d tokens), and %s; re-weight the sources or "
                    "change %s to change the mixture", self.phase, self.split,
                    ", ".join(f"{n} {shares[n]:.3g}" for n in sampled),
                    ", ".join(f"{n} {x:.3g}" for n, x in zip(names, w) if x > 0), self._key("data.long_fraction"),
                    self.long_fraction, self._key("data.long_min_tokens"), self.long_min_tokens, why,
                    self._key("data.long_fraction"))  # fmt: skip

    def _check_synthetic_fits(self) -> None:
        """A retrieval sample needs a minimum length (its needle, question and answer): refuse a seq_len too short
        for a task now, naming the keys, rather than when the first such row is drawn, mid-phase. A few draws per
        task, and for kv the longest of many pairs (its length depends on how its random hex keys tokenize)."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed % 2**63, _phase_key(self.phase)]))
        tok, style = self.corpus.tokenizer, self.synthetic_style
        for task in self.synthetic_tasks:
            # the length every sample of the task fits (8 draws passed a length that a third of kv's pairs did not
            # fit: the phase stopped mid-way), so the message can say what seq_len to raise to: a row is seq_len + 1
            need = (kv_length_needed(tok, rng, style) if task == "kv"
                    else passkey_length_needed(tok, style) if task == "passkey" else 0)  # fmt: skip
            try:
                if need > self.seq_len + 1:
                    raise DataError(f"a {task} sample needs at least {need} tokens, a row has {self.seq_len + 1}")
                for _ in range(8):
                    self._synthetic_row(rng, self.seq_len + 1, task)
            except DataError as e:
                tasks = self._key("data.synthetic.tasks")
                # (a remedy for this phase alone: the phase's own key where the run has phases)
                fraction = (f"phases.{self.phase}.data.synthetic.fraction" if self.set_in is not None
                            else "data.synthetic.fraction")  # fmt: skip
                to = f" to at least {need - 1}" if need > self.seq_len + 1 else ""
                raise DataError(f"{tasks}: a '{task}' sample does not fit a row of seq_len "
                                f"{self.seq_len} ({e}); raise {self._key('train.seq_len')}{to}, or drop '{task}' "
                                f"from {tasks} or set {fraction} to 0 for this phase") from None  # fmt: skip

    def _key(self, key: str) -> str:
        """``key`` of the phase's config as the run config sets it (``set_in``)."""
        return key_as_set(key, self.phase, self.set_in)

    def _pools(self, mask: np.ndarray) -> Dict[int, _Pool]:
        """source index -> pool of that source's documents selected by ``mask`` (sources with weight 0 left out)."""
        out = {}
        for s in range(len(self.store.source_names)):
            docs = np.flatnonzero(mask & (self.store.doc_source == s))
            if len(docs) and self._weights[s] > 0:
                out[s] = _Pool.of(self.store, docs)
        return out

    def _rng(self, index: int, row: Optional[int] = None) -> np.random.Generator:
        """The batch's generator (row None: plans the global batch) or one global row's. No rank in the key: the
        global batch of ``batch_size · world_size`` rows is the same however many ranks share it, so a DDP run
        sees exactly the rows of a one-process run with the same global batch."""
        key = [self.seed % 2**63, _phase_key(self.phase), int(index)] + ([int(row)] if row is not None else [])
        return np.random.default_rng(np.random.SeedSequence(key))

    def _pick_source(self, pools: Dict[int, _Pool], rng: np.random.Generator) -> _Pool:
        keys = list(pools)
        w = self._weights[keys]
        return pools[keys[int(rng.choice(len(keys), p=w / w.sum()))]]

    def _global_rows(self) -> range:
        """This rank's share of the global batch: rows [rank·B, (rank+1)·B)."""
        return range(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)

    def row_plan(self, index: int) -> List[str]:
        """The kind of each of this rank's rows of batch ``index`` (for tests and stats; ``batch`` uses the same)."""
        kinds = self._plan(self._rng(index))
        return [kinds[g] for g in self._global_rows()]

    def _plan(self, rng: np.random.Generator) -> List[str]:
        B = self.batch_size * self.world_size  # the kinds are planned over the global batch
        n_syn = _stochastic_round(B * self.synthetic_fraction, rng) if self.synthetic_tasks else 0
        n_long = _stochastic_round((B - n_syn) * self.long_fraction, rng)
        kinds = ["synthetic"] * n_syn + ["long"] * n_long + ["short"] * (B - n_syn - n_long)
        return [kinds[i] for i in rng.permutation(B)]

    def batch(self, index: int) -> Dict[str, torch.Tensor]:
        kinds = self._plan(self._rng(index))
        rows = [self._row(kinds[g], self._rng(index, g)) for g in self._global_rows()]
        return _collate(rows, self.document_mask, self.restart_positions)

    def _row(self, kind: str, rng: np.random.Generator):
        """(tokens (n,), piece ids (n,), positions (n,), k): a row of n = seq_len + 1 tokens whose first k targets
        are ignored (k > 0 only for synthetic rows trained on their answer alone)."""
        n = self.seq_len + 1
        if kind == "long":
            pool = self._pick_source(self._long, rng)
            i = int(np.searchsorted(pool.cum, rng.random() * pool.total, side="right") - 1)  # ∝ length
            length = int(pool.cum[i + 1] - pool.cum[i])
            start = int(pool.cum[i]) + int(rng.integers(0, max(0, length - n) + 1))
            # the window may run past a document of exactly long_min_tokens: it continues into the next one
            return (*_gather(self.store, pool, start, n), 0)
        if kind == "synthetic":
            return self._synthetic_row(rng, n)
        pool = self._pick_source(self._short, rng)
        return (*_gather(self.store, pool, int(rng.integers(0, pool.total)), n), 0)

    def _synthetic_row(self, rng: np.random.Generator, n: int, task: Optional[str] = None):
        task = task or self.synthetic_tasks[int(rng.integers(0, len(self.synthetic_tasks)))]
        pool = self._pick_source(self._short, rng)
        # one document: no EOS inside the haystack, and text read on in their place (filler_text)
        filler = filler_text(lambda at, m: _gather(self.store, pool, at, m)[0], int(rng.integers(0, pool.total)), n,
                             pool.total, self.corpus.tokenizer.eos_id)  # fmt: skip
        if len(filler) < n:  # a pool of fewer tokens than a row repeats them, as its short rows do (warned of)
            filler = np.resize(filler, n)
        prompt, answer = make_sample(task, self.corpus.tokenizer, filler, n, rng, style=self.synthetic_style)
        tokens = np.asarray(prompt + answer, dtype=np.int64)
        ignored = len(prompt) - 1 if self.synthetic_loss == "answer" else 0  # target i predicts token i + 1
        return tokens, np.zeros(n, np.int64), np.arange(n, dtype=np.int64), ignored

    # ---------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> Dict[str, Any]:
        return {
            "seed": self.seed, "phase": self.phase, "split": self.split, "seq_len": self.seq_len,
            "batch_size": self.batch_size, "rank": self.rank, "world_size": self.world_size,
            "long_fraction": self.long_fraction, "long_min_tokens": self.long_min_tokens,
            "synthetic_fraction": self.synthetic_fraction, "synthetic_loss": self.synthetic_loss,
            "synthetic_tasks": list(self.synthetic_tasks), "synthetic_style": self.synthetic_style,
            "document_mask": self.document_mask, "restart_positions": self.restart_positions,
            "weights": {n: float(w) for n, w in zip(self.store.source_names, self._weights)},
            "corpus": self.corpus.cache_dir.name,
        }  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Nothing to restore (batches are a function of the index); check the sampler is the same one, so a
        resume with a changed seed, phase or corpus fails loudly instead of silently drawing other data."""
        mine = self.state_dict()
        strict = [k for k in mine if k not in ("rank", "world_size")]
        diff = {k: (state.get(k), mine[k]) for k in strict if state.get(k) != mine[k]}
        if diff:
            details = ", ".join(f"{k}: checkpoint {a!r} != now {b!r}" for k, (a, b) in diff.items())
            # the corpus key follows the source files' size and mtime too: with an unchanged config, a file was edited
            # (or minilm was upgraded: the key holds FORMAT_VERSION, bumped when the split or tokenizer changes)
            why = ("; the corpus is keyed by the source settings and by the path, size and mtime of every file they "
                   "read, so a source file added, removed, edited or only touched since gives another corpus, as does "
                   "a version of minilm that prepares data differently (minilm.data.prepare.FORMAT_VERSION)"
                   if "corpus" in diff else "")  # fmt: skip
            raise DataError(f"the data sampler does not match the checkpoint's ({details}){why}; resume with the "
                            f"same config and data or start a new run")  # fmt: skip
        if (state.get("rank"), state.get("world_size")) != (self.rank, self.world_size):
            log.warning("resuming on a different rank/world size (%s/%s -> %s/%s): batches differ from the "
                        "original run from here on", state.get("rank"), state.get("world_size"), self.rank,
                        self.world_size)  # fmt: skip


def _collate(rows, document_mask: bool, restart_positions: bool) -> Dict[str, torch.Tensor]:
    tokens = np.stack([r[0] for r in rows])  # (B, T+1)
    targets = tokens[:, 1:].copy()  # (B, T)
    for i, r in enumerate(rows):
        targets[i, : r[3]] = IGNORE
    out = {
        "input_ids": torch.from_numpy(tokens[:, :-1].copy()),  # (B, T)
        "targets": torch.from_numpy(targets),  # (B, T)
    }
    if document_mask:
        out["doc_ids"] = torch.from_numpy(np.stack([r[1][:-1] for r in rows]))  # (B, T)
        if restart_positions:
            out["positions"] = torch.from_numpy(np.stack([r[2][:-1] for r in rows]))  # (B, T)
    return out


# ---------------------------------------------------------------------------------------------- public API


def _weights(data_cfg: Any, corpus: Corpus, key: str = "data.sources") -> Dict[str, float]:
    specs = parse_sources(data_cfg.sources)
    missing = [n for n, s in specs.items() if s.weight > 0 and n not in corpus.source_names]
    if missing:
        raise DataError(f"{key}: {missing} are not in the prepared corpus ({corpus.source_names}); a phase "
                        f"can change the weights of the run's sources but not add sources")  # fmt: skip
    w = {n: specs[n].weight if n in specs else 0.0 for n in corpus.source_names}
    total = sum(w.values())
    shares = {n: v / total for n, v in w.items()}
    said = (str(corpus.cache_dir), tuple(w.items()))  # (not the key: validation_batches names no phase's)
    if abs(total - 1.0) > 1e-6 and said not in _NORMALIZED:  # once, not for each split's sampler
        _NORMALIZED.add(said)
        log.info("%s weights %s sum to %g: each source's share of the rows is %s", key,
                 ", ".join(f"{n} {v:g}" for n, v in w.items()), total,
                 ", ".join(f"{n} {v:.3g}" for n, v in shares.items()))  # fmt: skip
    return shares


_NORMALIZED: set = set()  # (corpus, weights) whose normalization was logged
_UNMET: set = set()  # (corpus, phase, shares) whose shares, other than the weights', were said (_warn_unmet_weights)


def synthetic_style(data_cfg: Any) -> str:
    """``auto`` means code-style prompts when the (code) embedded corpus is sampled (weight > 0), else prose. An
    embedded source kept at weight 0 gives no filler, so it put code-style needles into one's own prose."""
    style = data_cfg.synthetic.style
    if style != "auto":
        return style
    sampled = [s for s in parse_sources(data_cfg.sources).values() if s.weight > 0]
    return "code" if any(s.kind == "embedded" for s in sampled) else "text"


def make_sampler(corpus: Corpus, split: str, data_cfg: Any, seq_len: int, batch_size: int, seed: int, phase: str,
                 rank: int = 0, world_size: int = 1, set_in: Any = None) -> Sampler:  # fmt: skip
    """``split``'s sampler of phase ``phase``; ``set_in``: the phase's own section of the run config, as ``Sampler``
    takes it (its errors name the keys as the run config sets them)."""
    if split not in ("train", "val"):
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    store = corpus.train if split == "train" else corpus.val
    weights = _weights(data_cfg, corpus, key_as_set("data.sources", phase, set_in))
    need = batch_size * (seq_len + 1)
    # the tokens of the sources sampled (weight > 0): a few sentences of one's own beside the embedded corpus at
    # weight 0 passed a check of the whole corpus, and every row repeated those few tokens over and over
    sampled = [n for n in store.source_names if weights.get(n, 0) > 0]
    n_tokens = int(store.doc_lengths[store.of_sources(sampled)].sum())
    if split == "train" and n_tokens < need:
        of = ("the corpus has" if len(sampled) == len(store.source_names)
              else f"the sources sampled ({', '.join(sampled)}) have")  # fmt: skip
        raise DataError(f"{of} {n_tokens} training tokens, fewer than one batch "
                        f"(batch_size {batch_size} x (seq_len {seq_len} + 1) = {need}); add documents or lower "
                        f"{key_as_set('train.batch_size', phase, set_in)} / "
                        f"{key_as_set('train.seq_len', phase, set_in)}")  # fmt: skip
    syn = data_cfg.synthetic
    return Sampler(
        corpus, store, seq_len=seq_len, batch_size=batch_size, seed=seed, phase=phase, rank=rank,
        world_size=world_size, weights=weights, long_fraction=data_cfg.long_fraction,
        long_min_tokens=data_cfg.long_min_tokens, document_mask=data_cfg.document_mask,
        restart_positions=data_cfg.restart_positions, synthetic_fraction=syn.fraction,
        synthetic_tasks=tuple(syn.tasks), synthetic_style=synthetic_style(data_cfg), synthetic_loss=syn.loss,
        split=split, set_in=set_in,
    )  # fmt: skip


def _warn_short_sources(store: TokenStore, weights: Dict[str, float], seq_len: int, what: str) -> None:
    """A row is drawn from one source's documents and wraps around them: a sampled source with fewer tokens than a
    row repeats its text within every row of it. (The held-out split as a whole was checked, so the few held-out
    tokens of a small source beside a large one went unnoticed.)"""
    for i, name in enumerate(store.source_names):
        n = int(store.doc_lengths[store.doc_source == i].sum())
        if weights.get(name, 0) > 0 and 0 < n < seq_len + 1:
            log.warning("%s: source %s has %d tokens in the %s split, fewer than one row of %d: its rows repeat "
                        "them", what, name, n, "val" if what == "validation" else "train", seq_len + 1)  # fmt: skip


def validation_batches(corpus: Corpus, data_cfg: Any, seq_len: int, batch_size: int, n_batches: int,
                       seed: int, rank: int = 0, world_size: int = 1) -> List[Dict[str, torch.Tensor]]:  # fmt: skip
    """Fixed validation batches per (seq_len, seed): packed windows of the held-out documents (all of them,
    no long/short mixing, no synthetic rows), in the same format as ``Sampler.batch``. Like training batches,
    batch i is the global batch of ``batch_size · world_size`` rows, and a DDP rank gets its slice: the ranks
    together validate exactly the rows one process with the whole batch would (not the same rows on each)."""
    store = corpus.val
    weights = _weights(data_cfg, corpus)
    if n_batches > 0:  # (0 batches: a check that the sampler builds)
        _warn_short_sources(store, weights, seq_len, "validation")
    s = Sampler(corpus, store, seq_len=seq_len, batch_size=batch_size, seed=seed, phase=f"validation/{seq_len}",
                weights=weights, document_mask=data_cfg.document_mask,
                restart_positions=data_cfg.restart_positions, split="val",
                rank=rank, world_size=world_size)  # fmt: skip
    return [s.batch(i) for i in range(n_batches)]


def check_phase_data(corpus: Corpus, pcfg: Any, phase: str, set_in: Any = None) -> None:
    """Build phase ``phase``'s samplers once (``pcfg``: its config, minilm.config.phase_config), so that what only
    its data can refuse (too few tokens for a batch, no document long enough for its long_fraction, every source
    weighted 0) fails before any phase trains — in train.py, a study and prepare_data.py alike — not when the phase
    is reached after the earlier ones have run. ``set_in``: the phase's own section of the run config
    (``cfg.phases.get(phase)``), so that the errors name each key as the run config sets it
    (``phases.b.data.long_fraction=0.5``, not the phase config's ``data.long_fraction``)."""
    t = pcfg.train
    try:
        make_sampler(corpus, "train", pcfg.data, t.seq_len, t.batch_size, pcfg.run.seed, phase, set_in=set_in)
        validation_batches(corpus, pcfg.data, t.seq_len, t.batch_size, 0, pcfg.run.seed)
    except DataError as e:
        raise DataError(f"phase '{phase}': {e}") from None
    # training rows wrap around a source's documents as validation rows do: a few sentences of one's own at weight
    # 0.5 beside a large source passed the one-batch check, and half the rows repeated them (here: once per phase)
    _warn_short_sources(corpus.train, _weights(pcfg.data, corpus), t.seq_len, f"phase '{phase}'")
