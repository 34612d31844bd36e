"""minilm: pretrain small GPT-style language models and study positional encodings and context extension."""

__version__ = "0.1.0"
