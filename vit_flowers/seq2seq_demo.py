"""Train the encoder-decoder Transformer of "Attention Is All You Need" on a toy task, reversing digit sequences
("3 1 4" -> "4 1 3"), and show that it works: greedy decodings of sequences it never trained on, their token and
sequence accuracy, and a heat map of where the decoder looked in the source (an anti-diagonal: output token i
copies source token S-1-i).

    python -m vit_flowers.seq2seq_demo                              # 600 steps: about 20 s on one idle CPU core
    vit-flowers seq2seq_demo --output seq2seq-demo --overwrite      # again, into the same folder
    vit-flowers seq2seq_demo --max-len 12 --steps 2000 --seed 1     # longer sequences need more steps
    vit-flowers seq2seq_demo --time-budget 30 --threads 2           # stop training after 30 s, on 2 threads

It writes into --output: cross_attention.png (the last decoder layer's cross-attention, averaged over its heads,
for the longest held-out sequence) and metrics.json (the settings, the steps and seconds trained, the last
training loss, the token and sequence accuracy on the held-out sequences, a few examples). The model is 2 + 2
layers of width 64 (models/seq2seq.py); the held-out sequences never appear in training.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .cli import command_parser, setup_logging
from .data.toy_sequences import PAD, ToyBatch, tokens_to_text
from .reporting.seq2seq_figure import cross_attention_figure
from .runs.folders import check_new_output
from .training.seq2seq_fit import ToyFit, attention_example, fit_reversal, greedy_score

__all__ = ["FIGURE", "METRICS", "examples", "write_outputs", "build_parser", "main"]

log = logging.getLogger(__name__)

FIGURE = "cross_attention.png"
METRICS = "metrics.json"


def examples(data: ToyBatch, decoded: torch.Tensor, count: int) -> list[dict[str, Any]]:
    """The first ``count`` sequences of ``data`` with their decodings, as text: source, target, decoded, right."""
    rows = []
    for i in range(min(count, len(data.src))):
        source, target, got = (tokens_to_text(t) for t in (data.src[i], data.tgt[i], decoded[i]))
        rows.append({"source": source, "target": target, "decoded": got, "right": got == target})
    return rows


def write_outputs(output: Path, fit: ToyFit, settings: dict[str, Any], count: int) -> dict[str, Any]:
    """Score ``fit``'s model on its held-out sequences, log the scores and ``count`` examples, and write the heat
    map and metrics.json into ``output`` (made if missing). Returns what metrics.json holds."""
    score = greedy_score(fit.model, fit.held_out)
    log.info("held-out sequences (%d): token accuracy %.1f%%, sequence accuracy %.1f%%", len(fit.held_out.src),
             100 * score.token_accuracy, 100 * score.sequence_accuracy)
    shown = examples(fit.held_out, score.decoded, count)
    for row in shown:
        verdict = "right" if row["right"] else f"wrong, want {row['target']}"
        log.info("  %s  ->  %s  (%s)", row["source"], row["decoded"], verdict)
    longest = int((fit.held_out.src != PAD).sum(dim=1).argmax())
    example = attention_example(fit.model, fit.held_out.src[longest], score.decoded[longest])
    output.mkdir(parents=True, exist_ok=True)
    layers = len(fit.model.decoder)
    cross_attention_figure(example.weights, example.source, example.output, output / FIGURE,
                           title=f"decoder layer {layers} of {layers}, mean of its heads")
    metrics = {**settings, "steps_trained": fit.steps, "seconds": round(fit.seconds, 2),
               "last_training_loss": fit.loss, "held_out": len(fit.held_out.src),
               "token_accuracy": score.token_accuracy, "sequence_accuracy": score.sequence_accuracy,
               "examples": shown, "figure": {"file": FIGURE, "source": example.source, "output": example.output}}
    (output / METRICS).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    log.info("wrote %s and %s", output / FIGURE, output / METRICS)
    return metrics


def _positive(kind: type) -> Any:
    """An argparse type: a number of ``kind`` above 0, or an error that says so."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not value > 0 or value == math.inf:
            raise argparse.ArgumentTypeError(f"{text!r} must be above 0 (and finite)")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("seq2seq_demo", __doc__)
    p.add_argument("--steps", type=_positive(int), default=600, help="Adam steps to train for (default: %(default)s)")
    p.add_argument("--time-budget", type=_positive(float), metavar="SECONDS",
                   help="stop training after SECONDS, even before --steps (default: no limit)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and of every sequence "
                                                       "(default: %(default)s)")
    p.add_argument("--min-len", type=_positive(int), default=3, help="the shortest sequence, in digits "
                                                                     "(default: %(default)s)")
    p.add_argument("--max-len", type=_positive(int), default=8, help="the longest sequence, in digits "
                                                                     "(default: %(default)s)")
    p.add_argument("--examples", type=_positive(int), default=5, help="held-out decodings to show "
                                                                      "(default: %(default)s)")
    p.add_argument("--threads", type=_positive(int), help="CPU threads torch may use (default: torch's choice)")
    p.add_argument("--output", default="seq2seq-demo", metavar="DIR",
                   help="the folder for the heat map and metrics.json (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="let the demo replace its files in an existing DIR")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.min_len > args.max_len:
        parser.error(f"--min-len {args.min_len} is above --max-len {args.max_len}")
    setup_logging()
    output = Path(args.output)
    try:
        check_new_output(output, args.overwrite, "folder")  # before training: a minute not spent in vain
    except ValueError as exc:
        log.error("error: %s", exc)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = {"seed": args.seed, "steps": args.steps, "time_budget": args.time_budget, "min_len": args.min_len,
                "max_len": args.max_len, "threads": torch.get_num_threads()}
    log.info("training the encoder-decoder Transformer to reverse %d-%d digits: %s", args.min_len, args.max_len,
             settings)
    fit = fit_reversal(args.steps, seed=args.seed, min_len=args.min_len, max_len=args.max_len,
                       time_budget=args.time_budget or math.inf)
    try:
        write_outputs(output, fit, settings, args.examples)
    except OSError as exc:
        log.error("error: cannot write into %s: %s", output, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
