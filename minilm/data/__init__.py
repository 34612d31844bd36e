"""The data pipeline: sources -> sentencepiece tokenizer -> cached token memmaps -> per-phase sampler.

    corpus = load_corpus(cfg.data)                       # prepare once (cached by content hash), then memmap
    sampler = make_sampler(corpus, "train", pcfg.data, seq_len, batch_size, seed, phase, rank, world_size)
    batch = sampler.batch(step)                          # pure function of (seed, phase, step, rank)
    val = validation_batches(corpus, pcfg.data, seq_len, batch_size, n_batches, seed)

See docs/data.md for the design, the cache layout and the measured preparation speed.
"""

from minilm.data.prepare import Corpus, TokenStore, corpus_stats, format_stats, held_out, load_corpus, long_share
from minilm.data.sampler import IGNORE, Sampler, check_phase_data, make_sampler, synthetic_style, validation_batches
from minilm.data.sources import EmbeddedSource, FilesSource, HfSource, parse_sources, stdlib_files
from minilm.data.synthetic import make_kv_sample, make_passkey_sample, make_sample
from minilm.data.tokenizer import Tokenizer

__all__ = [
    "Corpus",
    "TokenStore",
    "Tokenizer",
    "Sampler",
    "IGNORE",
    "load_corpus",
    "make_sampler",
    "validation_batches",
    "check_phase_data",
    "long_share",
    "corpus_stats",
    "format_stats",
    "held_out",
    "parse_sources",
    "stdlib_files",
    "synthetic_style",
    "EmbeddedSource",
    "FilesSource",
    "HfSource",
    "make_passkey_sample",
    "make_kv_sample",
    "make_sample",
]
