"""vit_flowers: a Vision Transformer flower classifier for laptop CPUs.

Models live in :mod:`vit_flowers.vit` (the ViT) and :mod:`vit_flowers.seq2seq`
(the encoder-decoder Transformer); both are built from :mod:`vit_flowers.layers`.
"""

from .layers import Attention, Block, DropPath, FeedForward, Transformer
from .seq2seq import Seq2SeqTransformer, causal_mask, padding_mask, target_mask
from .vit import PRESETS, ViT, create_vit

__version__ = "0.1.0"

__all__ = [
    "Attention", "Block", "DropPath", "FeedForward", "Transformer",
    "Seq2SeqTransformer", "causal_mask", "padding_mask", "target_mask",
    "PRESETS", "ViT", "create_vit",
]
