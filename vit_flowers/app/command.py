"""A local web page for the classifier: make one from your photos, drop photos, see the flower, its confidence and
where the model looked.

    pip install -e ".[app]"                                    # Gradio, as an optional extra
    python -m vit_flowers.app                                  # newest run in checkpoints/ on http://127.0.0.1:7860
    python -m vit_flowers.app --checkpoint checkpoints/my-run --port 8080
    python -m vit_flowers.app --work-dir my-runs               # runs listed, trained and taught in my-runs/
    python -m vit_flowers.app --host 0.0.0.0 --allow-folders   # on the network, with the Folder tab (reads this disk)

Six tabs: Classify (upload, drag, paste or the webcam; top-k with confidence bars, the attention-rollout
overlay and "not sure" where the run's unknown rule rejects the photo), Train (classes made in the page from
uploads or webcam shots, or a PHOTOS folder; checked, then trained by ``python -m vit_flowers.train --data`` in a
process of its own with a progress bar and Cancel; the new run, its photos beside it, used at once), Folder (every
image of a folder on this computer: a table, a gallery grouped by predicted class with the least confident first,
a CSV, the unreadable files with their reason), Label (a folder of unlabelled photos labelled with the model's
suggestions, a class at a time: a grid of pre-ticked photos, a wrong one moved to its class in one click, Accept; the
accepted photos copied into training photos, a new run trained on them; kept in a file, resumed after a restart;
``vit-flowers label`` does the same from the command line), Teach (a new class from 5-20 photos and its name: a new
run, used at once, with an estimate of how well it will be recognised; kept beside the loaded run's folder, or in
``--work-dir``) and Model (what the checkpoint is, its validation report, a confusion matrix whose counts open
their photos, training curves, the run folder as a zip). A selector lists the finished runs where runs live
(``--work-dir``, else ``--runs``) and switches between them; with no run there, the page opens on Train.

The page runs on the package's own engine: the same checks of every file (size and pixel limits, truncated
and non-image files), the same numbers and CSV as ``python -m vit_flowers.predict``, the attention maps of
``python -m vit_flowers.explain``.

Offline by design: no analytics, no share link, no fonts or scripts from the internet; it listens on loopback
unless ``--host`` says otherwise, and then the Folder and Label tabs (and the Train tab's PHOTOS folder) are off unless
``--allow-folders`` is given. Requests queue: the model never runs twice at once.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ..cli import add_model_arguments, command_parser, load_model_from_args, setup_logging, unknown_rule
from ..inference import TOP_K
from ..inference.device import pick_device
from ..inference.loaded import LoadedModel
from ..inference.unknown import UnknownRule
from ..runs.checkpoint import CheckpointError
from ..runs.folders import make_run_dir
from .engine import MAX_UPLOAD_BYTES, Engine
from .run_list import list_runs
from .server import build_page, gradio, is_loopback, launch

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("app", __doc__)
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="the address the page listens on (default: %(default)s, this computer only)")
    p.add_argument("--port", type=int, default=7860, help="the port the page listens on (default: %(default)s)")
    p.add_argument("--allow-folders", action="store_true",
                   help="keep the Folder tab (which reads this computer's disk) with a --host other than loopback")
    p.add_argument("--top-k", type=int, default=TOP_K,
                   help="the most probable classes shown per photo (default: %(default)s)")
    p.add_argument("--not-sure", type=float, metavar="P",
                   help="deprecated: a top probability below P is 'not sure' (the same as --unknown-threshold P on a "
                        "run trained without an unknown rule). Default: the run's own unknown rule (a run trained "
                        "before it: never 'not sure')")
    p.add_argument("--work-dir", type=Path, metavar="DIR",
                   help="where the runs live for the page (the selector lists them, the Train and Teach tabs add "
                        "to them) and the Folder tab's CSVs go, kept after the page stops (default: --runs, taught "
                        "runs beside the loaded run's folder, CSVs in a temporary folder deleted at exit)")
    p.add_argument("--max-upload-mb", type=float, default=MAX_UPLOAD_BYTES / 2**20,
                   help="uploads larger than this many MB are refused (default: %(default)s)")
    return p


def _open_run(args: argparse.Namespace, home: Path) -> tuple[LoadedModel | None, UnknownRule | None]:
    """The model the page starts with and its unknown rule: ``--checkpoint``, else the newest finished run in
    ``home`` (where runs live), else none (the page opens on its Train tab)."""
    if args.checkpoint is None:
        runs = list_runs(home)
        if not runs:
            return None, None
        args.checkpoint = str(runs[0].path)
    loaded = load_model_from_args(args, "app")
    return loaded, unknown_rule(args, loaded.ckpt, loaded.model, str(loaded.path))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up requests to the page
    if (args.top_k <= 0 or args.batch_size <= 0 or args.max_upload_mb <= 0
            or (args.not_sure is not None and not 0 <= args.not_sure <= 1)):
        logger.error("error: --top-k, --batch-size and --max-upload-mb must be positive, --not-sure in [0, 1]")
        return 2
    gradio()  # fail early, before loading the model, when Gradio is not installed
    try:  # a work folder that cannot be written fails at start, not at the first teach
        if args.work_dir is not None:
            make_run_dir(args.work_dir, what="--work-dir")
    except CheckpointError as exc:
        logger.error("error: %s", exc)
        return 2
    if args.not_sure is not None:
        logger.warning("--not-sure is deprecated: the run's own unknown rule decides what is 'not sure'; "
                       "--not-sure %g overrides it with a top probability cut-off", args.not_sure)
    home = args.work_dir or Path(args.runs)
    try:
        loaded, rule = _open_run(args, home)
    except (CheckpointError, ValueError) as exc:
        logger.error("error: %s", exc)
        return 1
    engine = Engine(loaded, top_k=args.top_k, not_sure=args.not_sure, unknown=rule, batch_size=args.batch_size,
                    precision=args.precision, max_upload_bytes=int(args.max_upload_mb * 2**20),
                    workdir=args.work_dir, runs_dir=args.work_dir, runs_home=home, device=pick_device(args.device),
                    rule_for=lambda ckpt, model, where: unknown_rule(args, ckpt, model, where))
    folders = args.allow_folders or is_loopback(args.host)
    if not folders:
        logger.warning("listening on %s: the Folder tab is off (add --allow-folders to let anyone who reaches the "
                       "page read this computer's folders)", args.host)
    demo = build_page(engine, folders=folders)
    if loaded is not None:
        logger.info("model %s (%d classes); starting the page", loaded.path, len(engine.classes))
    else:
        logger.info("no run in %s yet: the page opens on its Train tab", home)
    try:
        url = launch(demo, engine, args.host, args.port, block=False)
    except OSError as exc:  # the port is taken, or the address is not this computer's
        logger.error("error: cannot listen on %s:%d (%s); pass another --port or --host", args.host, args.port, exc)
        return 1
    logger.info("open %s in a browser (Ctrl+C stops)", url)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` cleans up like Ctrl+C
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        if engine.training is not None:  # a training of the page's: ended, its run folder removed
            engine.training.cancel()
        demo.close()
        if engine.workdir and args.work_dir is None:  # the temporary folder of the CSVs (never a taught run)
            shutil.rmtree(engine.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
