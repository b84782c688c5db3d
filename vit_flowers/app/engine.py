"""What the web app does, without Gradio or HTML: the engine (the loaded model and the page's settings), the
Classify tab's photos, the Folder tab's batch, the Model tab's facts and the Teach tab's new run."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from PIL import Image

from ..data.class_names import check_class_name
from ..data.images import ImageLoadError, load_image, printable_name
from ..inference import INFERENCE_BATCH, TOP_K
from ..inference.loaded import LoadedModel
from ..inference.unknown import UNKNOWN, UnknownRule
from ..runs import folders as runs

if TYPE_CHECKING:
    from ..runs.checkpoint import Checkpoint, ModelFacts

__all__ = ["Engine", "NoModel", "Classified", "FolderResult", "ModelCard", "check_upload", "classify_files",
           "predict_folder", "folder_table", "gallery_groups", "model_card", "run_zip", "Taught", "teach_class",
           "MAX_UPLOAD_BYTES", "DISPLAY_SIZE", "FOLDER_COLUMNS", "MAX_TEACH_PHOTOS"]

logger = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 50 * 2**20  # a bigger upload is refused with a message (--max-upload-mb)
DISPLAY_SIZE = 320  # photos and overlays are shown this many pixels wide or high (the longer side)


class NoModel(ValueError):
    """The page has no model yet (started on a folder without runs): the message says to train one."""


@dataclass
class Engine:
    """The loaded model (None until a run is trained or chosen) and the page's settings; ``lock`` keeps two
    requests from running the model at once (the page's queue does too), and a switch of model from happening
    under one. ``version`` counts the switches: a page that shows an older one refreshes what it says about the
    model."""

    loaded: LoadedModel | None
    top_k: int = TOP_K
    not_sure: float | None = None  # --not-sure: a top probability below this is "not sure" (replaces `unknown`)
    unknown: UnknownRule | None = None  # the run's "none of these" rule: what it rejects is "not sure"
    batch_size: int = INFERENCE_BATCH
    precision: str = "auto"
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    workdir: Path | None = None  # where the folder CSVs go (default: a fresh temporary folder, made when needed)
    runs_dir: Path | None = None  # where taught runs go (--work-dir; default: beside the loaded run's folder)
    runs_home: Path = Path(runs.RUNS_HOME)  # where runs live: the selector lists them, the Train tab adds to them
    device: Any = None  # where a model switched to runs (default: the loaded model's device, else the CPU)
    # the unknown rule of a run switched to, under the command line's --unknown-threshold / --no-unknown
    rule_for: Callable[[Any, Any, str], UnknownRule | None] | None = field(default=None, repr=False)
    version: int = 0
    training: Any = None  # the Train tab's vit_flowers.app.training.Training, while one runs and after

    def model(self) -> LoadedModel:
        """The loaded model, or :class:`NoModel` saying how to get one."""
        if self.loaded is None:
            raise NoModel("no model yet: make your classes and train one in the Train tab, or choose a run")
        return self.loaded

    @property
    def classes(self) -> list[str]:
        return list(self.loaded.ckpt["classes"]) if self.loaded is not None else []

    @property
    def rule(self) -> UnknownRule | None:
        """What makes a photo "not sure": ``--not-sure`` when given, else the run's unknown rule (or none)."""
        return UnknownRule("max_softmax", self.not_sure) if self.not_sure is not None else self.unknown

    @property
    def k(self) -> int:
        return max(1, min(self.top_k, len(self.classes)))

    def output_dir(self) -> Path:
        """Where the Folder tab's CSVs go: ``workdir`` (made when needed), else a fresh temporary folder."""
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="vit_flowers_app_"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir

    def teach_dir(self) -> Path:
        """Where the Teach tab writes its runs: ``runs_dir``, else the folder that holds the loaded run's folder
        (where runs live; never a temporary folder, so a taught run outlives the page)."""
        return self.runs_dir or Path(self.model().path).resolve().parent.parent

    def amp_dtype(self, num_images: int) -> Any:
        """--precision for a request of ``num_images`` (fp32 for a few photos, see ``precision.inference_dtype``)."""
        from ..inference.precision import inference_dtype  # (torch, already loaded with the model)

        return inference_dtype(self.model(), num_images, precision=self.precision, batch_size=self.batch_size)

    @staticmethod
    def warm_up() -> None:
        """Import what :meth:`switch` builds a model with (the pretrained trunk's timm models: a second or two of a
        2-core CPU), ahead of a switch at the end of a training: the new model is ready that much sooner."""
        import timm.models  # noqa: F401  (imported for what it loads: once per process)

        from ..runs import checkpoint  # noqa: F401

    def switch(self, run_dir: Path) -> None:
        """Use the run ``run_dir`` (its best.pt) from now on, with its own unknown rule (under the command line's
        options); raises CheckpointError / ValueError with a message, the model in use kept."""
        from ..inference.device import pick_device
        from ..runs.checkpoint import load_model, resolve_checkpoint

        path = resolve_checkpoint(run_dir)
        device = self.device or (self.loaded.device if self.loaded is not None else pick_device("cpu"))
        model, ckpt = load_model(path, device)
        rule = self.rule_for(ckpt, model, str(path)) if self.rule_for else None
        with self.lock:
            self.loaded, self.unknown = LoadedModel(model, ckpt, path, device), rule
            self.version += 1


# ---------------------------------------------------------------------------------------------- Classify


@dataclass
class Classified:
    """One photo of the Classify tab: top-k [(label, probability)] best first, display-sized photo and
    attention overlay; or an ``error``."""

    name: str
    top_k: list[tuple[str, float]] = field(default_factory=list)
    not_sure: bool = False
    photo: Image.Image | None = None
    overlay: Image.Image | None = None
    error: str | None = None


def check_upload(path: str | os.PathLike, max_bytes: int = MAX_UPLOAD_BYTES) -> str | None:
    """Why an uploaded file is refused before it is decoded (missing, a folder, too big), or None."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return f"cannot read the upload ({exc.strerror or exc})"
    if os.path.isdir(path):
        return "is a folder, not an image file"
    if size > max_bytes:
        return f"file is {_size(size)}, over the limit of {_size(max_bytes)}"
    return None


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} KB"


def _display_copy(path: Path, size: int = DISPLAY_SIZE) -> Image.Image:
    """The photo to show: its longer side ``size`` px (JPEGs decode at a reduced scale; a small photo is
    enlarged, so that the attention overlay drawn over it is smooth), read by ``images.load_image``."""
    img = load_image(path, min_size=size)
    scale = size / max(img.size)
    return img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                      Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC)


def classify_files(engine: Engine, paths: Sequence[str | os.PathLike]) -> list[Classified]:
    """Top-k, "not sure" and the attention-rollout overlay of each file, in input order; unreadable files
    get their reason (the same decoder and checks as ``predict``)."""
    from ..inference.batches import predict_files
    from ..reporting.attention_maps import explain, overlay

    model, ckpt, _, device = engine.model()
    out: dict[int, Classified] = {}
    accepted: list[tuple[int, Path]] = []
    for i, p in enumerate(map(Path, paths)):
        reason = check_upload(p, engine.max_upload_bytes)
        if reason:
            out[i] = Classified(printable_name(p.name), error=reason)
        else:
            accepted.append((i, p))
    rule = engine.rule
    with engine.lock:
        for batch, probs, scores in predict_files(model, [p for _, p in accepted], image_size=ckpt["image_size"],
                                                  mean=ckpt["mean"], std=ckpt["std"], device=device,
                                                  batch_size=engine.batch_size, unknown=rule,
                                                  amp_dtype=engine.amp_dtype(len(accepted))):
            for err in batch.errors:
                i, p = accepted[err.index]
                out[i] = Classified(printable_name(p.name), error=err.reason)
            if not batch.paths:
                continue
            rollout = explain(model, batch.images, ckpt["mean"], ckpt["std"], device).rollout  # (B, g, g)
            values, indices = probs.topk(engine.k, dim=1)  # (B, k)
            for j, index in enumerate(batch.indices):
                i, p = accepted[index]
                top = [(ckpt["classes"][c], float(v)) for v, c in zip(values[j].tolist(), indices[j].tolist())]
                unsure = rule is not None and scores is not None and bool(rule.rejects(scores[j:j + 1])[0])
                item = Classified(printable_name(p.name), top, not_sure=unsure)
                try:
                    item.photo = _display_copy(p)
                    item.overlay = overlay(item.photo, rollout[j])
                except (ImageLoadError, OSError, ValueError) as exc:  # changed since it was decoded
                    logger.warning("no overlay for %s: %s", printable_name(p), exc)
                out[i] = item
    return [out[i] for i in sorted(out)]





@dataclass
class FolderResult:
    """Every image file of a folder: its predictions (``predict``'s rows, errors included) and the CSV."""

    folder: Path
    rows: list[Any]  # vit_flowers.inference.predictions.Prediction
    csv_path: Path
    seconds: float

    @property
    def errors(self) -> list[Any]:
        return [r for r in self.rows if r.error]


def predict_folder(engine: Engine, folder: str | os.PathLike, recursive: bool = True,
                   progress: Callable[[int, int], None] | None = None) -> FolderResult:
    """``predict`` on every image of ``folder`` (sub-folders with ``recursive``), with its CSV written into the
    engine's work folder. Raises ValueError with a message when ``folder`` is not a folder or holds no image."""
    from ..inference.predictions import PredictionWriter, collect_files, predict_images, skipped_rows

    root = Path(os.path.expanduser(str(folder).strip()))
    if not str(folder).strip() or not root.is_dir():
        raise ValueError(f"not a folder on this computer: {printable_name(root)}")
    skipped: list[Path] = []
    files = collect_files([root], recursive=recursive, skipped_out=skipped)
    if not files:
        raise ValueError(f"no image files in {printable_name(root)}{'' if recursive else ' (include sub-folders?)'}")
    model, ckpt, _, device = engine.model()
    csv_path = engine.output_dir() / f"predictions-{time.strftime('%Y%m%d-%H%M%S')}-{root.name or 'folder'}.csv"
    rule = engine.rule
    writer, rows, start = PredictionWriter(csv_path, engine.k, scores=rule is not None), [], time.perf_counter()
    try:
        with engine.lock:
            for batch in predict_images(model, files, engine.classes, image_size=ckpt["image_size"],
                                        mean=ckpt["mean"], std=ckpt["std"], device=device, top_k=engine.k,
                                        batch_size=engine.batch_size, amp_dtype=engine.amp_dtype(len(files)),
                                        unknown=rule):
                writer.write(batch)
                rows += batch
                if progress:
                    progress(len(rows), len(files))
        writer.write(skipped_rows(skipped))  # the CSV lists every file, as predict's does
    finally:
        writer.close()
    return FolderResult(root, rows, csv_path, time.perf_counter() - start)


def relative_name(path: str, root: Path) -> str:
    try:
        return printable_name(Path(path).relative_to(root))
    except ValueError:
        return printable_name(path)


FOLDER_COLUMNS = ["file", "prediction", "confidence", "not sure", "next best", "error"]


def folder_table(result: FolderResult) -> list[list[Any]]:
    """One row per file (:data:`FOLDER_COLUMNS`), in the folder's order; "not sure": the unknown rule rejected
    it (its prediction is the best class all the same)."""
    table = []
    for r in result.rows:
        if r.error:
            table.append([relative_name(r.path, result.folder), "", None, "", "", r.error])
            continue
        others = ", ".join(f"{label} {p:.1%}" for label, p in r.top_k[1:])
        table.append([relative_name(r.path, result.folder), r.top_k[0][0], round(r.confidence, 4),
                      "yes" if r.label == UNKNOWN else "", others, ""])
    return table


def gallery_groups(rows: Sequence[Any], classes: Sequence[str]) -> dict[str, list[Any]]:
    """Predicted rows by predicted class (in the model's class order, empty classes left out), the least
    confident first within each class."""
    groups: dict[str, list[Any]] = {c: [] for c in classes}
    for r in rows:
        if not r.error:
            groups.setdefault(r.label, []).append(r)
    return {c: sorted(g, key=lambda r: r.confidence) for c, g in groups.items() if g}




@dataclass
class ModelCard:
    """What a checkpoint is and what its run folder says about it; figure and report paths exist or are None."""

    facts: list[tuple[str, str]]
    metrics: dict[str, Any] | None
    confusion: Path | None
    curves: Path | None
    report: Path | None


def _existing(*paths: Path) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


def _training_facts(ckpt: ModelFacts, run_dir: Path) -> list[tuple[str, str]]:
    """When and how the checkpoint was trained: its config and the run's metrics.csv."""
    cfg = ckpt["config"]
    data = cfg.get("data") or cfg.get("dataset")
    keys: tuple[str, ...] = ("time_budget",) if cfg.get("time_budget") else ("epochs",)  # with a budget, epochs: a cap
    keys += ("batch_size", "lr", "augment", "mixup", "cutmix", "precision", "pretrained")
    how = ", ".join(f"{k} {cfg[k]}{' min' if k == 'time_budget' else ''}" for k in keys
                    if cfg.get(k) not in (None, "", 0, 0.0))
    facts = [("trained on", str(data))] if data else []
    if how:
        facts.append(("recipe", how))
    try:
        epochs = runs.read_metrics(run_dir / runs.METRICS)  # one row per epoch; "seconds": its training time
    except OSError:
        return facts
    seconds = math.fsum(s for row in epochs if math.isfinite(s := row.get("seconds", math.nan)))
    facts.append(("training", f"{len(epochs)} epoch(s)" + (f", {seconds / 60:.1f} min" if seconds else "")))
    return facts


def model_card(loaded: LoadedModel) -> ModelCard:
    """The Model tab's content from the checkpoint and its run folder (its report, its training curves)."""
    model, _, path, device = loaded
    ckpt = cast("Checkpoint", loaded.ckpt)  # the app opens PyTorch checkpoints only (cli.open_model)
    run_dir = Path(path).resolve().parent
    mc = ckpt["model_config"]
    params = sum(p.numel() for p in model.parameters())
    trained = datetime.fromtimestamp(Path(path).stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    facts = [("checkpoint", printable_name(path)), ("classes", ", ".join(ckpt["classes"])),
             ("image size", f"{ckpt['image_size']} px"), ("parameters", f"{params / 1e6:.2f} M"),
             ("architecture", f"ViT, patch {mc.get('patch_size')} ({mc.get('patch_embed', 'linear')} embedding), "
                              f"width {mc.get('dim')}, depth {mc.get('depth')}, {mc.get('heads')} heads"),
             ("weights", f"{ckpt['weights']}, epoch {ckpt['epoch']}, saved {trained}"),
             ("device", str(device))]
    facts += _training_facts(ckpt, run_dir)
    metrics = None
    report = run_dir / runs.REPORT
    metrics_json = report / "metrics.json"
    if metrics_json.is_file():
        try:
            metrics = json.loads(metrics_json.read_text())
        except (OSError, ValueError) as exc:
            logger.warning("cannot read %s: %s", metrics_json, exc)
    if metrics is None and ckpt["best_accuracy"] is not None:
        facts.append(("best validation accuracy during training", f"{ckpt['best_accuracy']:.1%}"))
    return ModelCard(facts, metrics, _existing(report / "confusion_matrix.png"),
                     _existing(run_dir / runs.CURVES, report / "training_curves.png"),
                     _existing(report / "report.html"))



def run_zip(engine: Engine) -> Path:
    """The folder of the run in use as a zip in the engine's work folder (``<run>.zip``, its files under
    ``<run>/``), made afresh each time; raises NoModel or OSError (e.g. a full disk) with a message."""
    import shutil

    run_dir = Path(engine.model().path).resolve().parent
    base = engine.output_dir() / run_dir.name
    return Path(shutil.make_archive(str(base), "zip", root_dir=run_dir.parent, base_dir=run_dir.name))


# ---------------------------------------------------------------------------------------------- Teach

MAX_TEACH_PHOTOS = 50  # the most photos the Teach tab takes at once (5-20 are enough to start)


@dataclass
class Taught:
    """What the Teach tab shows: the new run's classes, the photos used, where the run is (kept), the same on the
    command line, the estimate of the taught class (one line, :func:`vit_flowers.teaching.estimate.advice`)
    and the warnings about its photos."""

    name: str
    classes: list[str]
    photos: int
    run_dir: Path
    command: str
    estimates: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _check_photos(paths: Sequence[str | os.PathLike], max_bytes: int) -> list[Path]:
    """The photos as paths; ValueError naming each one that cannot be used (too many, unreadable, not an image)."""
    files = [Path(p) for p in paths]
    if not 1 <= len(files) <= MAX_TEACH_PHOTOS:
        raise ValueError(f"drop 1 to {MAX_TEACH_PHOTOS} photos of the flower (5-20 are enough), not {len(files)}")
    bad = []
    for p in files:
        reason = check_upload(p, max_bytes)
        if reason is None:
            try:
                load_image(p)
            except (ImageLoadError, OSError) as exc:
                reason = str(exc)
        if reason:
            bad.append(f"{printable_name(p.name)}: {reason}")
    if bad:
        raise ValueError(f"{len(bad)} photo(s) cannot be used; remove them and teach again: " + "; ".join(bad))
    return files


def teach_class(engine: Engine, paths: Sequence[str | os.PathLike], name: str | None) -> Taught:
    """Teach the loaded model the class ``name`` (new, or more photos of one it has) from ``paths``: a new run in
    :meth:`Engine.teach_dir`, kept after the page stops (the loaded run is only read), which the engine then runs,
    with its unknown rule (an override of the command line kept). Raises ValueError / CheckpointError / OSError
    with a message."""
    from ..runs.checkpoint import load_model
    from ..teaching.estimate import advice
    from ..teaching.teach import teach

    name = check_class_name(name)
    files = _check_photos(paths, engine.max_upload_bytes)
    with engine.lock:
        old = engine.model()
        run_dir = Path(old.path).resolve().parent
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = runs.free_run_dir(engine.teach_dir(), f"{run_dir.name}-taught-{stamp}")  # never over one
        result = teach(old.path, [(name, files)], out)
        model, ckpt = load_model(result.best, old.device)
        engine.unknown = _next_rule(engine.unknown, old.ckpt, ckpt, str(result.best))
        engine.loaded = LoadedModel(model, ckpt, result.best, old.device)
        engine.version += 1
    command = f"vit-flowers teach {run_dir} --add {name}=FOLDER_OF_THESE_PHOTOS --output {out}"
    return Taught(name, list(ckpt["classes"]), len(files), out, command,
                  [advice(e) for e in result.estimates], result.warnings)


def _next_rule(rule: UnknownRule | None, old: ModelFacts, new: ModelFacts, where: str) -> UnknownRule | None:
    """The unknown rule after teaching: off stays off; a threshold the command line gave a run without a rule
    stays; else the new run's own rule (None where teach turned a logit rule off): at its own recalibrated threshold,
    or at the one the command line gave (``--unknown-threshold``)."""
    from ..inference.unknown import rule_from_checkpoint

    if rule is None or not old["unknown"]:
        return rule
    if not new["unknown"]:
        return None
    given = None if rule.threshold == rule.calibrated else rule.threshold
    return rule_from_checkpoint(new, threshold=given, where=where)
