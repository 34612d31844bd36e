#!/usr/bin/env python
"""Prepare (or load from the cache) the corpus a config trains on, and print its stats.

    python scripts/prepare_data.py --config configs/tiny.yaml [key.sub=value ...] [--debug]

Trains the sentencepiece tokenizer and tokenizes every document into memory-mapped arrays under
``data.cache_dir`` (nothing is redone when the cache is current). Prints documents, tokens, the length histogram,
skipped files, and for each phase of the config the share of training tokens in documents at least as long as
that phase's seq_len (the documents its ``long_fraction`` rows can come from, in the sources it samples), and checks
each phase's data as training does before it starts. Bad input: message, exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import add_config_args, run_cli  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_args(ap, required=False)  # without --config: the schema defaults (the embedded corpus)
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def main(argv: list[str] | None = None) -> int:
    def run(args: argparse.Namespace) -> None:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        report(args.config, args.overrides, progress=not args.quiet)

    return run_cli(run, parser(), argv)


def report(config: str | None, overrides: list[str], progress: bool = True) -> None:
    import numpy as np

    from minilm.config import load_config, phase_config, phase_names
    from minilm.data import check_phase_data, format_stats, load_corpus, long_share, parse_sources
    from minilm.errors import DataError

    cfg = load_config(config, overrides)
    corpus = load_corpus(cfg.data, progress=progress)
    if corpus.from_cache or not progress:  # (with progress, load_corpus has just printed the stats it prepared)
        print(format_stats(corpus.stats, header=f"corpus: {corpus.cache_dir}" + (" (cached)" if corpus.from_cache
                                                                                 else "")))  # fmt: skip
    else:
        print(f"corpus: {corpus.cache_dir}")
    print(f"  tokenizer: {corpus.tokenizer.model_file} (vocab {corpus.tokenizer.vocab_size})")
    for name in phase_names(cfg):
        pcfg = phase_config(cfg, name)
        t, d = pcfg.train, pcfg.data
        min_tokens = d.long_min_tokens or t.seq_len
        # the phase's long rows come only from the sources it samples (weight > 0), as the sampler draws them
        try:  # (read before check_phase_data, which names the phase in its errors as train.py does: so here)
            specs = parse_sources(d.sources)
        except DataError as e:  # a phase's weight .nan, or every weight 0
            raise DataError(f"phase '{name}': {e}") from None
        sampled = [n for n, s in specs.items() if s.weight > 0 and n in corpus.source_names]
        store = corpus.train
        in_sampled = np.isin(store.doc_source, [store.source_names.index(n) for n in sampled])
        n_long = int((in_sampled & (store.doc_lengths >= min_tokens)).sum())
        print(f"  phase {name}: seq_len {t.seq_len}, long_fraction {d.long_fraction}: "
              f"{long_share(store, min_tokens, sampled):.1%} of the train tokens of {', '.join(sampled)} are in "
              f"the {n_long} docs >= {min_tokens} tokens")  # fmt: skip
        check_phase_data(corpus, pcfg, name, cfg.phases.get(name))  # what training checks before any phase starts


if __name__ == "__main__":
    sys.exit(main())
