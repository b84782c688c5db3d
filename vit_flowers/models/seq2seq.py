"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Post-norm layers (sublayer, dropout, residual, then LayerNorm), sinusoidal positions,
embeddings scaled by sqrt(d_model), padding masks from ``pad_idx`` and a causal mask on
decoder self-attention. It reuses the package's :class:`~vit_flowers.models.layers.Attention`
and :class:`~vit_flowers.models.layers.FeedForward`.

Masks follow the package convention: bool, broadcastable to (B, heads, N_query, N_key),
True = may attend.

    >>> model = Seq2SeqTransformer(src_vocab_size=1000, tgt_vocab_size=1000)
    >>> logits = model(src, tgt_in)                      # (B, T, 1000)
    >>> out = model.greedy_decode(src, max_len=20, bos_idx=1, eos_idx=2)
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from .layers import Attention, FeedForward, sinusoidal_positions

__all__ = [
    "padding_mask",
    "causal_mask",
    "target_mask",
    "sinusoidal_positions",
    "PositionalEncoding",
    "EncoderLayer",
    "DecoderLayer",
    "Seq2SeqTransformer",
]


def padding_mask(tokens: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """(B, S) token ids -> (B, 1, 1, S) bool, True where the key is a real token."""
    return (tokens != pad_idx)[:, None, None, :]


def causal_mask(size: int, device: torch.device | None = None) -> torch.Tensor:
    """(1, 1, T, T) bool, True where key position <= query position."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()[None, None]


def target_mask(tgt: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """Decoder self-attention mask: causal and not padding, (B, 1, T, T)."""
    return padding_mask(tgt, pad_idx) & causal_mask(tgt.shape[1], tgt.device)


class PositionalEncoding(nn.Module):
    """Adds fixed sinusoidal positions, then dropout."""

    pe: torch.Tensor  # a buffer (register_buffer: typed here, not as nn.Module's "Tensor | Module")

    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positions(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > self.pe.shape[0]:
            raise ValueError(f"sequence length {x.shape[1]} exceeds max_len {self.pe.shape[0]}")
        return self.dropout(x + self.pe[: x.shape[1]])  # (B, L, d)


class EncoderLayer(nn.Module):
    """Post-norm encoder layer: ``x = norm1(x + attn(x)); x = norm2(x + ff(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = Attention(d_model, heads=n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout=dropout, activation="relu")
        self.norm1 = nn.LayerNorm(d_model, eps=norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.norm1(x + self.self_attn(x, mask=mask))
        return self.norm2(x + self.ff(x))


class DecoderLayer(nn.Module):
    """Post-norm decoder layer: masked self-attention, attention over the encoder's memory, MLP."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = Attention(d_model, heads=n_heads, dropout=dropout)
        self.cross_attn = Attention(d_model, heads=n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout=dropout, activation="relu")
        self.norm1 = nn.LayerNorm(d_model, eps=norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.norm1(x + self.self_attn(x, mask=tgt_mask))
        x = self.norm2(x + self.cross_attn(x, context=memory, mask=memory_mask))
        return self.norm3(x + self.ff(x))

    def forward_with_cross_attention(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`, and the cross-attention weights (B, heads, T, S) (the explicit softmax path)."""
        x = self.norm1(x + self.self_attn(x, mask=tgt_mask))
        attended, weights = self.cross_attn(x, context=memory, mask=memory_mask, return_attn=True)
        x = self.norm2(x + attended)
        return self.norm3(x + self.ff(x)), weights


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer over batch-first ``LongTensor`` token ids."""

    def __init__(
        self,
        *,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 128,
        n_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        d_ff: int = 512,
        dropout: float = 0.1,
        max_len: int = 5000,
        pad_idx: int = 0,
    ) -> None:
        """
        Args:
            src_vocab_size: source vocabulary size.
            tgt_vocab_size: target vocabulary size.
            d_model: model width (divisible by ``n_heads``).
            n_heads: attention heads.
            num_encoder_layers: encoder depth.
            num_decoder_layers: decoder depth.
            d_ff: hidden width of the position-wise MLP.
            dropout: dropout on embeddings, attention weights and sublayer outputs.
            max_len: longest sequence the positional table covers.
            pad_idx: padding token id in both vocabularies (masked out, embedding zero).
        """
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model = d_model
        self.pad_idx = pad_idx
        self.src_embed = nn.Embedding(src_vocab_size, d_model, padding_idx=pad_idx)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model, padding_idx=pad_idx)
        self.pos = PositionalEncoding(d_model, dropout, max_len)
        self.encoder = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(num_encoder_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(num_decoder_layers)
        )
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        self.init_weights()

    def init_weights(self) -> None:
        """Xavier-uniform for matrices (as the Annotated Transformer), zero biases, zero pad embedding."""
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        with torch.no_grad():
            self.src_embed.weight[self.pad_idx].zero_()
            self.tgt_embed.weight[self.pad_idx].zero_()

    def _embed(self, embed: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return self.pos(embed(tokens) * math.sqrt(self.d_model))  # (B, L, d)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src (B, S) -> memory (B, S, d_model)."""
        mask = padding_mask(src, self.pad_idx)  # (B, 1, 1, S)
        x = self._embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, mask)
        return x

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """tgt (B, T), memory (B, S, d), src (B, S) for its padding -> hidden states (B, T, d_model)."""
        tgt_mask = target_mask(tgt, self.pad_idx)  # (B, 1, T, T)
        memory_mask = padding_mask(src, self.pad_idx)  # (B, 1, 1, S)
        x = self._embed(self.tgt_embed, tgt)
        for layer in self.decoder:
            x = layer(x, memory, tgt_mask, memory_mask)
        return x

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt (B, T) (shifted right, starting with BOS) -> logits (B, T, tgt_vocab_size)."""
        return self.generator(self.decode(tgt, self.encode(src), src))

    @torch.no_grad()
    def cross_attention(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """The cross-attention weights of every decoder layer, each (B, heads, T, S), for decoder input ``tgt``
        (teacher forcing: BOS and the tokens so far) over ``src``; the model runs in eval mode for it."""
        was_training = self.training
        self.eval()
        memory = self.encode(src)
        tgt_mask = target_mask(tgt, self.pad_idx)
        memory_mask = padding_mask(src, self.pad_idx)
        x = self._embed(self.tgt_embed, tgt)
        maps = []
        for layer in self.decoder:  # a ModuleList's items are typed Module: the cast names the method's owner
            x, weights = cast(DecoderLayer, layer).forward_with_cross_attention(x, memory, tgt_mask, memory_mask)
            maps.append(weights)
        self.train(was_training)
        return maps

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, max_len: int, bos_idx: int, eos_idx: int) -> torch.Tensor:
        """Decode greedily, the whole batch at once.

        Returns (B, L) token ids with L <= max_len, starting with ``bos_idx``; after a
        sequence's ``eos_idx`` the rest of its row is ``pad_idx``. Decoding stops early
        once every sequence has produced EOS.
        """
        was_training = self.training
        self.eval()
        memory = self.encode(src)
        ys = torch.full((src.shape[0], 1), bos_idx, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len - 1):
            logits = self.generator(self.decode(ys, memory, src)[:, -1])  # (B, V)
            next_token = logits.argmax(dim=-1)
            next_token = next_token.masked_fill(done, self.pad_idx)
            ys = torch.cat([ys, next_token[:, None]], dim=1)
            done |= next_token == eos_idx
            if done.all():
                break
        self.train(was_training)
        return ys
