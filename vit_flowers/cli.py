"""What the commands share: logging, the options of every command that runs a trained model, loading that
model (or exiting with one clear line), and the ``vit-flowers`` entry point.

    vit-flowers train --data photos            # the same as python -m vit_flowers.train --data photos
    vit-flowers predict holiday/ --top-k 3     # python -m vit_flowers.predict ...
    vit-flowers --version
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from . import ENTRY_POINT, __version__
from .inference import INFERENCE_BATCH, PRECISIONS
from .inference.loaded import LoadedModel
from .runs.folders import RUNS_HOME

__all__ = ["COMMANDS", "setup_logging", "command_prog", "command_parser", "plain_text", "add_checkpoint_arguments",
           "add_model_arguments", "unknown_rule", "open_model", "load_model_from_args", "main"]

log = logging.getLogger(__name__)

_running_as: ContextVar[str | None] = ContextVar("running_as", default=None)  # ENTRY_POINT while main runs one
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # a Sphinx role: :func:`name`, :mod:`~a.b`
# What argparse takes for a negative number, so that `--unknown-threshold -1e3` (or `-inf`, refused then with its
# own message) is a value: argparse's own pattern knows only -300 and -.5, and calls the rest an unknown option
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)

# command -> (module, one line of help); modules are imported only when their command runs
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("vit_flowers.train", "train a ViT on photos (or the built-in synthetic flowers)"),
    "evaluate": ("vit_flowers.evaluate", "evaluate a checkpoint and write a report"),
    "predict": ("vit_flowers.predict", "predict the flower in image files and folders"),
    "explain": ("vit_flowers.explain", "draw where the model looks (attention maps)"),
    "app": ("vit_flowers.app.command", "a local web page: drop photos, see the flower and where the model looked"),
    "export": ("vit_flowers.export", "export a checkpoint to ONNX, a web page or LiteRT (checked against PyTorch)"),
    "check": ("vit_flowers.check", "find duplicates, train/val leaks and likely wrong labels in a folder of photos"),
    "teach": ("vit_flowers.teach", "teach a trained run a new flower from a few photos, without retraining"),
    "label": ("vit_flowers.label", "label a folder of unlabelled photos with a run's suggestions, and grow the run "
                                   "on them"),
    "cache": ("vit_flowers.cache", "list or clear the decoded photos that training keeps on disk"),
    "seq2seq_demo": ("vit_flowers.seq2seq_demo", "train the encoder-decoder Transformer to reverse digits (a minute "
                                                 "on a CPU) and draw its cross-attention"),
}
COMMAND_WIDTH = max(len(name) for name in COMMANDS)  # the column of the commands' help in `vit-flowers` alone


def setup_logging(quiet: bool = False, timestamps: bool = False) -> None:
    """INFO (WARNING with ``quiet``) to stderr; with ``timestamps`` each line starts with the time of day."""
    fmt = "%(asctime)s %(levelname)s %(message)s" if timestamps else "%(message)s"
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format=fmt, datefmt="%H:%M:%S")


def command_prog(command: str) -> str:
    """How the user started ``command`` (e.g. "predict"), for its usage line: ``vit-flowers predict`` from the
    entry point, else ``python -m vit_flowers.predict``."""
    entry = _running_as.get()
    return f"{entry} {command}" if entry else f"python -m vit_flowers.{command}"


def plain_text(doc: str | None) -> str | None:
    """A docstring as a terminal shows it: Sphinx roles and ``literals`` become `name` (as in Markdown)."""
    return None if doc is None else _ROLE.sub(r"`\1`", doc).replace("``", "`")


def command_parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``command``: its prog as started (:func:`command_prog`), ``doc`` (the module docstring, its
    examples kept as written) as the description in plain text."""
    return argparse.ArgumentParser(prog=command_prog(command), description=plain_text(doc),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """--checkpoint and --runs: which trained model a command reads."""
    parser.add_argument("--checkpoint", help="the trained model: a checkpoint file or a run folder (default: the "
                                             "best.pt of the newest run in --runs)")
    parser.add_argument("--runs", default=RUNS_HOME,
                        help="the folder of training runs where the newest run is looked for (default: %(default)s)")


def add_model_arguments(parser: argparse.ArgumentParser, tta: bool = False,
                        precision: bool = True) -> None:
    """The options of every command that runs a trained model: --checkpoint, --runs, --batch-size, --device,
    --unknown-threshold, --no-unknown (and --precision, --tta / --tta-scales where asked for: ``args.tta`` is
    "none", "flip" or "scales")."""
    add_checkpoint_arguments(parser)
    parser._negative_number_matcher = _NEGATIVE_NUMBER  # (argparse's own attribute, read while parsing)
    unknown = parser.add_mutually_exclusive_group()
    unknown.add_argument("--unknown-threshold", type=_threshold, metavar="SCORE",
                         help="label a photo 'unknown' when the model's unknown score is below SCORE, a finite number "
                              "on the scale of the run's rule (default: the threshold the run chose on its "
                              "validation photos; for a model trained without one, SCORE is a top probability)")
    unknown.add_argument("--no-unknown", action="store_true",
                         help="never answer 'unknown': always the most probable class")
    parser.add_argument("--batch-size", type=int, default=INFERENCE_BATCH,
                        help="images the model runs on at once (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="where the model runs: auto (cuda, then mps, then cpu), "
                                                         "cpu, cuda, cuda:N or mps (default: %(default)s)")
    if precision:
        parser.add_argument("--precision", default="auto", choices=PRECISIONS,
                            help="fp32, bf16 autocast, or auto: bf16 where a probe finds it faster on this machine, "
                                 "for runs of more than a few batches (default: %(default)s)")
    if tta:
        parser.add_argument("--tta", dest="tta", action="store_const", const="flip", default="none",
                            help="test-time augmentation: average each image with its mirror image (2x the time)")
        parser.add_argument("--tta-scales", dest="tta", action="store_const", const="scales",
                            help="--tta at the model's image size and at one patch more a side (4x the time; "
                                 "PyTorch checkpoints only)")


def _threshold(text: str) -> float:
    """``--unknown-threshold``'s value: a finite number (argparse names the option with the message)."""
    from .inference.unknown import finite_threshold

    try:
        return finite_threshold(text, "it")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def unknown_rule(args: argparse.Namespace, ckpt: Mapping[str, Any], model: Any = None, where: str = "the checkpoint",
                 threshold: float | None = None) -> Any:
    """The "none of these" rule (:class:`vit_flowers.inference.unknown.UnknownRule`, or None: off) of ``ckpt`` under
    ``--unknown-threshold`` (or ``threshold``) and ``--no-unknown``; logs it. Off, with a warning, when its rule
    needs features that ``model`` (e.g. an export made before the rule existed) does not give. Raises ValueError
    for an unreadable rule."""
    from .inference.unknown import rule_from_checkpoint

    given = args.unknown_threshold if args.unknown_threshold is not None else threshold
    rule = rule_from_checkpoint(ckpt, threshold=given, off=args.no_unknown, where=where)
    if rule is not None and rule.needs_features and model is not None and not _gives_features(model):
        log.warning("unknown: off (%s's %s rule needs features that this model does not give)", where, rule.rule)
        return None
    log.info("unknown: %s", rule.describe() if rule else "off")
    return rule


def _gives_features(model: Any) -> bool:
    """Whether ``model`` gives the unknown rule's features: an export answers itself (torch stays unimported)."""
    if hasattr(model, "gives_features"):
        return bool(model.gives_features)
    from .inference.batches import gives_features

    return gives_features(model)


def apply_tta(model: Any, tta: str) -> tuple[Any, bool]:
    """(the model to run, whether the pipeline flips) for ``--tta``: "scales" wraps the model
    (:class:`vit_flowers.inference.batches.TwoScaleTTA`, whose inputs are larger: use its ``image_size``), "flip" is the
    pipelines' own flag."""
    if tta == "scales":
        if not hasattr(model, "at_image_size"):  # an ONNX export: a graph of one input size
            raise ValueError("--tta-scales needs a PyTorch checkpoint: an ONNX export takes one image size")
        from .inference.batches import TwoScaleTTA

        return TwoScaleTTA(model), False
    return model, tta == "flip"


def open_model(checkpoint: str | Path | None = None, out_dir: str | Path = RUNS_HOME, device: str = "auto",
               command: str = "this command") -> LoadedModel:
    """The PyTorch model of ``checkpoint`` (a file or run folder; default: the newest run in ``out_dir``) on
    ``device`` ("auto", "cpu", "cuda", ...). ``command`` (e.g. "app") is named when ``checkpoint`` is an ONNX
    export. Raises CheckpointError or ValueError with a message for the user (the caller logs it as one line and
    exits)."""
    from .inference.device import pick_device
    from .inference.onnx_runtime import is_onnx_path
    from .runs.checkpoint import load_model, resolve_checkpoint

    if is_onnx_path(checkpoint):  # (predict and evaluate load an export themselves, before this)
        raise ValueError(f"--checkpoint {checkpoint} is an ONNX export: {command} runs a PyTorch checkpoint "
                         f"(a .pt file or a run folder); ONNX exports run in predict and evaluate")
    torch_device = pick_device(device)
    path = resolve_checkpoint(checkpoint, out_dir)
    model, ckpt = load_model(path, torch_device)
    return LoadedModel(model, ckpt, path, torch_device)


def load_model_from_args(args: argparse.Namespace, command: str = "this command") -> LoadedModel:
    """:func:`open_model` of ``--checkpoint``, ``--runs`` and ``--device``."""
    return open_model(args.checkpoint, args.runs, args.device, command)


def main(argv: Sequence[str] | None = None) -> int:
    """``vit-flowers COMMAND [options]``: runs ``python -m vit_flowers.COMMAND [options]``; alone, the help with
    the list of commands."""
    parser = argparse.ArgumentParser(
        prog=ENTRY_POINT, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"A ViT flower classifier. `{ENTRY_POINT} COMMAND --help` lists a command's options.",
        epilog="commands:\n" + "\n".join(f"  {name:<{COMMAND_WIDTH}} {text}" for name, (_, text) in COMMANDS.items()))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version of vit_flowers and exit")
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="the command to run: one of "
                        + ", ".join(COMMANDS) + " (below)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's options and arguments")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    token = _running_as.set(ENTRY_POINT)
    try:
        return importlib.import_module(COMMANDS[args.command][0]).main(args.args)
    finally:
        _running_as.reset(token)


if __name__ == "__main__":
    sys.exit(main())
