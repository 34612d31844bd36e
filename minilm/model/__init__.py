from minilm.model.attention import Attention, AttentionMask
from minilm.model.transformer import GPT

__all__ = ["GPT", "Attention", "AttentionMask"]
