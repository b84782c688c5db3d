"""A toy task for the encoder-decoder Transformer: reverse a sequence of digits ("3 1 4" -> "4 1 3").

Reversal is the task that shows cross-attention plainest: output position i copies input position S-1-i, so a
trained model's cross-attention is an anti-diagonal. Token ids: 0 padding, 1 BOS, 2 EOS, then the ten digits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["PAD", "BOS", "EOS", "VOCAB_SIZE", "ToyBatch", "reversal_batch", "tokens_to_text", "token_names"]

PAD, BOS, EOS = 0, 1, 2
DIGITS = 10
VOCAB_SIZE = 3 + DIGITS  # the same vocabulary on both sides


class ToyBatch(NamedTuple):
    """Source and target token ids, padded with :data:`PAD`: ``src`` (B, S); ``tgt`` (B, T) starts with BOS
    and ends with EOS (the decoder reads ``tgt[:, :-1]`` and learns ``tgt[:, 1:]``)."""
    src: torch.Tensor
    tgt: torch.Tensor


def reversal_batch(size: int, min_len: int, max_len: int, generator: torch.Generator) -> ToyBatch:
    """``size`` random digit sequences of ``min_len`` to ``max_len`` digits, each with its reversal."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    lengths = torch.randint(min_len, max_len + 1, (size,), generator=generator)
    digits = torch.randint(3, 3 + DIGITS, (size, max_len), generator=generator)
    src = torch.full((size, max_len), PAD, dtype=torch.long)
    tgt = torch.full((size, max_len + 2), PAD, dtype=torch.long)
    tgt[:, 0] = BOS
    for row, n in enumerate(lengths.tolist()):
        src[row, :n] = digits[row, :n]
        tgt[row, 1:n + 1] = digits[row, :n].flip(0)
        tgt[row, n + 1] = EOS
    return ToyBatch(src, tgt)


def tokens_to_text(tokens: torch.Tensor) -> str:
    """One row of token ids as the digits they spell ("4 1 3"), stopping at EOS; BOS and padding left out."""
    out = []
    for t in tokens.tolist():
        if t == EOS:
            break
        if t >= 3:
            out.append(str(t - 3))
    return " ".join(out)


def token_names(tokens: torch.Tensor) -> list[str]:
    """Each token id of a row as a label: its digit, or "BOS", "EOS", "PAD" (the axes of a heat map)."""
    special = {PAD: "PAD", BOS: "BOS", EOS: "EOS"}
    return [special.get(t, str(t - 3)) for t in tokens.tolist()]
