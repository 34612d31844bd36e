"""The sentencepiece tokenizer: training on a bounded character sample of the mixture, and a small wrapper.

Training settings are chosen so that ``decode(encode(text)) == text`` for any text (code included) but one
character: U+2581 ``▁``, sentencepiece's own whitespace marker, decodes as a space (a limit of sentencepiece):
identity normalization, no extra-whitespace removal, no dummy prefix, whitespace-only pieces allowed (so
indentation becomes a few tokens), ``\\n`` as a user-defined piece (sentencepiece otherwise cannot represent
newlines except as bytes), digits split (so passkeys are one token per digit), and byte fallback (no UNK for
unseen characters). Special ids are fixed: pad 0, unk 1, bos 2, eos 3.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, List, Sequence

import sentencepiece as spm

from minilm.errors import DataError

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
CHUNK_CHARS = 4000  # sentencepiece trains on "sentences"; documents are cut into chunks of at most this size
MODEL_TYPES = ("bpe", "unigram")
RESERVED_PIECES = 4 + 1  # pad, unk, bos, eos, and "\n" (a user-defined piece)
BYTE_PIECES = 256  # one piece per byte under byte_fallback
WITH_BYTES = RESERVED_PIECES + BYTE_PIECES  # the pieces reserved under byte_fallback


class Tokenizer:
    """A thin, picklable wrapper over ``SentencePieceProcessor`` (worker processes reload it from the file)."""

    def __init__(self, model_file: str | Path, where: str = "data.tokenizer.model_file"):
        """``where``: what the file is, for the errors (a run's tokenizer.model is not a config key's)."""
        self.model_file = str(model_file)
        self.where = where
        self._sp = _load_processor(self.model_file, where)
        self.vocab_size: int = self._sp.get_piece_size()
        self.eos_id: int = self._sp.eos_id()
        self.bos_id: int = self._sp.bos_id()
        # a loaded .model may have no pad piece (-1): EOS then pads (training packs rows and never pads; the loss
        # ignores targets of -100, not a pad id)
        self.pad_id: int = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_id
        if self.eos_id < 0:
            raise DataError(f"{where}: {self.model_file} has no EOS piece; documents need one")

    def encode(self, text: str) -> List[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> List[List[int]]:
        return self._sp.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def __getstate__(self) -> dict:
        return {"model_file": self.model_file, "where": self.where}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_file"], state.get("where", "data.tokenizer.model_file"))

    def __repr__(self) -> str:
        return f"Tokenizer({self.model_file!r}, vocab_size={self.vocab_size})"


def _load_processor(model_file: str, where: str) -> spm.SentencePieceProcessor:
    if not Path(model_file).is_file():
        raise DataError(f"{where}: no such file: {model_file}")
    sp = spm.SentencePieceProcessor()
    try:
        sp.load(model_file)
    except (OSError, RuntimeError) as e:
        raise DataError(f"{where}: {model_file} is not a sentencepiece model: {e}") from None
    return sp


def file_digest(path: str | Path) -> str:
    """sha256 of ``data.tokenizer.model_file`` (part of the cache key); a missing file is a ``DataError``."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise DataError(f"data.tokenizer.model_file: cannot read {path} ({e.strerror}); give the path of an "
                        f"existing sentencepiece .model, or null to train one") from None  # fmt: skip


def sample_chunks(texts: Sequence[str], order: Sequence[int], sample_chars: int) -> Iterator[str]:
    """Chunks of the documents taken in ``order`` until ``sample_chars`` characters, whole but for the last one,
    cut where the sample is full: a bounded, deterministic sample, so tokenizer training time does not grow with the
    corpus."""
    total = 0
    for i in order:
        text = texts[i]
        for start in range(0, len(text), CHUNK_CHARS):
            chunk = text[start : start + CHUNK_CHARS]
            yield chunk
            total += len(chunk)
            if total >= sample_chars:
                return


def _keep_common_characters(chunks: List[str], tok_cfg) -> List[str]:
    """sentencepiece reserves one piece per character of the sample (up to ``character_coverage``, at least
    0.98) and fails when they do not fit the vocab, which happens with small vocabs on code with some Unicode.
    With byte fallback, rare characters are better left to bytes anyway: keep only the most frequent characters
    that fit in half of the non-special pieces and delete the others from the training sample. They still encode
    (as bytes) and round-trip exactly."""
    if not tok_cfg.byte_fallback:
        return chunks
    counts: Counter = Counter()
    for chunk in chunks:
        counts.update(chunk)
    room = max(1, (tok_cfg.vocab_size - WITH_BYTES) // 2)
    if len(counts) <= room:
        return chunks
    drop = {ord(c): None for c, _ in counts.most_common()[room:]}
    return [c for c in (chunk.translate(drop) for chunk in chunks) if c]


def check_trainable(tok_cfg) -> None:
    """Refuse a vocab_size with no piece left for a character beside those sentencepiece reserves (the specials,
    "\n" and, under byte_fallback, one per byte): it failed only after every source had been read, with
    sentencepiece's count of required pieces, which the hint called the sample's characters."""
    if tok_cfg.byte_fallback and not tok_cfg.model_file and tok_cfg.vocab_size <= WITH_BYTES:
        raise DataError(f"data.tokenizer.vocab_size: must be > {WITH_BYTES} with data.tokenizer.byte_fallback: true "
                        f"({BYTE_PIECES} byte pieces, 4 special ids and '\\n' are reserved), got "
                        f"{tok_cfg.vocab_size}; raise it, or set data.tokenizer.byte_fallback: false")  # fmt: skip


def train_tokenizer(chunks: Iterable[str], out_file: Path, tok_cfg, num_threads: int = 1) -> Tokenizer:
    """Train a sentencepiece model on ``chunks`` and write it to ``out_file``."""
    if tok_cfg.type not in MODEL_TYPES:
        raise DataError(f"data.tokenizer.type: must be one of {MODEL_TYPES}, got {tok_cfg.type!r}")
    chunks = list(chunks)  # at most sample_chars characters; read twice (coverage, training)
    chunks = _keep_common_characters(chunks, tok_cfg)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(chunks),
            model_writer=buf,
            model_type=tok_cfg.type,
            vocab_size=tok_cfg.vocab_size,
            byte_fallback=tok_cfg.byte_fallback,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            user_defined_symbols=["\n"],
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            max_sentence_length=4 * CHUNK_CHARS + 16,  # bytes; a chunk of CHUNK_CHARS characters always fits
            character_coverage=0.9995 if tok_cfg.byte_fallback else 1.0,
            hard_vocab_limit=False,  # a tiny sample may not support the full vocab: take what it supports
            num_threads=max(1, num_threads),
            minloglevel=2,
        )  # fmt: skip
    except RuntimeError as e:
        if "smaller than required_chars" in str(e):  # every distinct character of the sample needs a piece
            hint = (f"data.tokenizer.vocab_size ({tok_cfg.vocab_size}) is below the characters the sample needs "
                    f"(the second number: its characters and {RESERVED_PIECES} reserved pieces); raise it")
            if not tok_cfg.byte_fallback and tok_cfg.vocab_size > WITH_BYTES:  # (room for bytes)
                hint += ", or set data.tokenizer.byte_fallback: true (rare characters become bytes)"
        else:
            hint = "a larger sample or a smaller data.tokenizer.vocab_size usually fixes this"
        raise DataError(f"data.tokenizer: sentencepiece training failed ({e}); {hint}") from None
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_bytes(buf.getvalue())
    tok = Tokenizer(out_file)
    if tok.vocab_size < tok_cfg.vocab_size:  # hard_vocab_limit=False took fewer pieces: say so, the model is smaller
        log.warning("data.tokenizer.vocab_size is %d but the training sample supports only %d pieces: the tokenizer "
                    "(and the model's embedding) has %d; give more text (sources or data.tokenizer.sample_chars) or "
                    "a smaller vocab_size", tok_cfg.vocab_size, tok.vocab_size, tok.vocab_size)  # fmt: skip
    return tok
