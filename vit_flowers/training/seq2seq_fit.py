"""Training the encoder-decoder Transformer on the toy reversal task, scoring its greedy decodings, and reading
its cross-attention: the library side of ``python -m vit_flowers.seq2seq_demo``."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from ..data.toy_sequences import BOS, EOS, PAD, VOCAB_SIZE, ToyBatch, reversal_batch, token_names
from ..models.seq2seq import Seq2SeqTransformer

__all__ = ["ToyFit", "GreedyScore", "AttentionExample", "small_seq2seq", "fit_reversal", "greedy_score",
           "attention_example"]

log = logging.getLogger(__name__)


@dataclass
class ToyFit:
    """What :func:`fit_reversal` returns: the trained model, its held-out sequences, its last training loss, the
    steps it took and their seconds (fewer steps than asked when the time budget ran out)."""
    model: Seq2SeqTransformer
    held_out: ToyBatch
    loss: float
    steps: int
    seconds: float


@dataclass
class GreedyScore:
    """Greedy decoding scored against the targets: ``token_accuracy`` over every target token after BOS (the
    digits and EOS), ``sequence_accuracy`` the share of rows right token for token; ``decoded`` (B, L) the
    decodings, BOS first."""
    token_accuracy: float
    sequence_accuracy: float
    decoded: torch.Tensor


@dataclass
class AttentionExample:
    """One decoding's cross-attention, ready to draw: ``weights`` (T, S), row t where output token ``output[t]``
    looked among the ``source`` tokens."""
    weights: torch.Tensor
    source: list[str]
    output: list[str]


def small_seq2seq(d_model: int = 64, layers: int = 2) -> Seq2SeqTransformer:
    """The paper's architecture at toy size: ``layers`` + ``layers`` layers of width ``d_model``, 4 heads (a CPU
    trains the default in well under a minute)."""
    return Seq2SeqTransformer(src_vocab_size=VOCAB_SIZE, tgt_vocab_size=VOCAB_SIZE, d_model=d_model, n_heads=4,
                              num_encoder_layers=layers, num_decoder_layers=layers, d_ff=2 * d_model,
                              dropout=0.0, pad_idx=PAD)


def fit_reversal(steps: int, *, seed: int = 0, batch_size: int = 64, min_len: int = 3, max_len: int = 8,
                 lr: float = 1e-3, held_out: int = 200, time_budget: float = math.inf, log_every: int = 100,
                 progress: bool = True, model: Seq2SeqTransformer | None = None) -> ToyFit:
    """Train :func:`small_seq2seq` for ``steps`` Adam steps (or until ``time_budget`` seconds have passed) on
    fresh random reversals (teacher forcing, cross-entropy on the target shifted left); logs the loss every
    ``log_every`` steps. ``held_out`` sequences, drawn first from the seed, never train: a training batch drops
    any row equal to one of them. ``model``: default :func:`small_seq2seq`."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    test = reversal_batch(held_out, min_len, max_len, gen)
    seen = {tuple(row.tolist()) for row in test.src}
    model = model if model is not None else small_seq2seq()
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD)
    loss, done, start = torch.tensor(float("nan")), 0, time.perf_counter()
    model.train()
    for step in tqdm(range(1, steps + 1), desc="seq2seq", unit="step", leave=False,
                     disable=None if progress else True):
        batch = reversal_batch(batch_size, min_len, max_len, gen)
        keep = torch.tensor([tuple(row.tolist()) not in seen for row in batch.src])
        src, tgt = batch.src[keep], batch.tgt[keep]
        logits = model(src, tgt[:, :-1])  # (B, T-1, V)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        done = step
        if log_every and step % log_every == 0:
            log.info("step %d: training loss %.4f", step, loss.item())
        if time.perf_counter() - start >= time_budget:
            log.info("time budget of %.0f s spent after %d of %d steps", time_budget, step, steps)
            break
    seconds = time.perf_counter() - start
    log.info("trained %d steps in %.1f s; last training loss %.4f", done, seconds, loss.item())
    return ToyFit(model, test, loss.item(), done, seconds)


def greedy_score(model: Seq2SeqTransformer, data: ToyBatch) -> GreedyScore:
    """Decode ``data.src`` greedily and score it against ``data.tgt`` (see :class:`GreedyScore`)."""
    out = model.greedy_decode(data.src, max_len=data.tgt.shape[1], bos_idx=BOS, eos_idx=EOS)
    width = data.tgt.shape[1]
    padded = torch.full((out.shape[0], width), PAD, dtype=torch.long)
    padded[:, :out.shape[1]] = out[:, :width]
    real = data.tgt[:, 1:] != PAD  # the digits and EOS of each target
    right = (padded[:, 1:] == data.tgt[:, 1:]) & real
    return GreedyScore(token_accuracy=right.sum().item() / max(1, int(real.sum().item())),
                       sequence_accuracy=(padded == data.tgt).all(dim=1).float().mean().item(), decoded=out)


def attention_example(model: Seq2SeqTransformer, src: torch.Tensor, decoded: torch.Tensor,
                      layer: int = -1) -> AttentionExample:
    """The cross-attention of decoder layer ``layer``, averaged over its heads, for one sequence: ``src`` (S,)
    its source (padding dropped here), ``decoded`` (L,) its greedy decoding (BOS first). The decoder reads BOS
    and the decoded tokens before EOS, so row t is the step that wrote output token t (the last one EOS)."""
    source = src[src != PAD]
    tokens = decoded.tolist()
    end = tokens.index(EOS) + 1 if EOS in tokens else len(tokens)
    written = decoded[1:end]  # the output tokens, EOS included where the model wrote it
    maps = model.cross_attention(source[None], decoded[None, :end - 1])
    weights = maps[layer][0].mean(dim=0)  # (T, S), each row a distribution over the source
    return AttentionExample(weights, token_names(source), token_names(written))
