"""Training the encoder-decoder Transformer on the toy reversal task, scoring its greedy decodings, and reading
its cross-attention: the library side of ``python -m vit_flowers.seq2seq_demo``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from ..data.toy_sequences import BOS, EOS, PAD, VOCAB_SIZE, ToyBatch, reversal_batch
from ..models.seq2seq import Seq2SeqTransformer

__all__ = ["ToyFit", "small_seq2seq", "fit_reversal", "exact_match"]

log = logging.getLogger(__name__)


@dataclass
class ToyFit:
    """What :func:`fit_reversal` returns: the trained model, its held-out sequences and its last training loss."""
    model: Seq2SeqTransformer
    held_out: ToyBatch
    loss: float


def small_seq2seq(d_model: int = 64, layers: int = 2) -> Seq2SeqTransformer:
    """The paper's architecture at toy size: ``layers`` + ``layers`` layers of width ``d_model``, 4 heads (a CPU
    trains the default in well under a minute)."""
    return Seq2SeqTransformer(src_vocab_size=VOCAB_SIZE, tgt_vocab_size=VOCAB_SIZE, d_model=d_model, n_heads=4,
                              num_encoder_layers=layers, num_decoder_layers=layers, d_ff=2 * d_model,
                              dropout=0.0, pad_idx=PAD)


def fit_reversal(steps: int, *, seed: int = 0, batch_size: int = 64, min_len: int = 3, max_len: int = 8,
                 lr: float = 1e-3, held_out: int = 200, progress: bool = True,
                 model: Seq2SeqTransformer | None = None) -> ToyFit:
    """Train :func:`small_seq2seq` for ``steps`` Adam steps on fresh random reversals (teacher forcing,
    cross-entropy on the target shifted left). ``held_out`` sequences, drawn first from the seed, never train:
    a training batch drops any row equal to one of them. ``model``: default :func:`small_seq2seq`."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    test = reversal_batch(held_out, min_len, max_len, gen)
    seen = {tuple(row.tolist()) for row in test.src}
    model = model if model is not None else small_seq2seq()
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD)
    loss = torch.tensor(float("nan"))
    model.train()
    for _ in tqdm(range(steps), desc="seq2seq", unit="step", leave=False, disable=None if progress else True):
        batch = reversal_batch(batch_size, min_len, max_len, gen)
        keep = torch.tensor([tuple(row.tolist()) not in seen for row in batch.src])
        src, tgt = batch.src[keep], batch.tgt[keep]
        logits = model(src, tgt[:, :-1])  # (B, T-1, V)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    log.info("trained %d steps; last training loss %.4f", steps, loss.item())
    return ToyFit(model, test, loss.item())


def exact_match(model: Seq2SeqTransformer, data: ToyBatch) -> tuple[float, torch.Tensor]:
    """The share of ``data`` whose greedy decoding equals the target token for token (up to its EOS), and the
    decodings (B, L)."""
    out = model.greedy_decode(data.src, max_len=data.tgt.shape[1], bos_idx=BOS, eos_idx=EOS)
    width = data.tgt.shape[1]
    padded = torch.full((out.shape[0], width), PAD, dtype=torch.long)
    padded[:, :out.shape[1]] = out[:, :width]
    return (padded == data.tgt).all(dim=1).float().mean().item(), out
