"""The networks: the shared pre-norm encoder (:mod:`.layers`), patch embeddings, the ViT, the encoder-decoder
Transformer of "Attention Is All You Need" and the timm weight port (:func:`from_timm`, one way: it imports
the ViT, the ViT never imports it)."""

from .layers import Attention, Block, DropPath, FeedForward, Transformer
from .seq2seq import Seq2SeqTransformer, causal_mask, padding_mask, target_mask
from .timm_port import from_timm
from .vit import PRESETS, ViT, create_vit

__all__ = ["Attention", "Block", "DropPath", "FeedForward", "Transformer", "Seq2SeqTransformer", "causal_mask",
           "padding_mask", "target_mask", "PRESETS", "ViT", "create_vit", "from_timm"]
