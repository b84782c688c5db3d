"""Test helpers: a tiny trained run folder and image folders written on the spot."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vit_flowers.data.datasets import TensorImageDataset
from vit_flowers.data.synthetic import CLASSES, make_synthetic_flowers
from vit_flowers.inference.batches import predict_batch
from vit_flowers.train import train
from vit_flowers.training.config import TrainConfig, load_config

IMAGE_SIZE = 32  # configs/smoke.yaml's image_size
SEED = 3  # the micro run's
# what the micro run changes of configs/smoke.yaml: more photos, epochs and a higher lr, so that its model is well
# above chance on the synthetic flowers (48-64% on 50 validation flowers over seeds 0-4, chance 20%), in ~7 CPU
# seconds (1 thread, report included)
MICRO: dict[str, Any] = dict(synthetic_train_per_class=60, synthetic_val_per_class=10, epochs=6, batch_size=30,
                             lr=3e-3, warmup_epochs=1.0)
MICRO_MIN_ACCURACY = 0.4  # what the micro run's validation accuracy stays above (twice chance)
SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def smoke_config(tmp_path: Path, **overrides) -> TrainConfig:
    """configs/smoke.yaml (a run of seconds) writing under ``tmp_path/ck``, on one thread, without progress
    bars, deterministic unless ``overrides`` say otherwise."""
    return load_config(SMOKE, {"out_dir": str(tmp_path / "ck"), "progress": False, "deterministic": True,
                               "threads": 1, **overrides})


def train_micro_run(out_dir: Path, run_name: str = "micro", **overrides: Any) -> Path:
    """The shared micro run: configs/smoke.yaml with :data:`MICRO`'s changes, trained by the real trainer
    (:func:`vit_flowers.train.train`, its report included), deterministic on one thread. Returns the run folder
    ``out_dir/run_name`` (best.pt, last.pt, config.yaml, metrics.csv, curves.png, report/), ``out_dir/latest``
    naming it: what a user's run writes, its metrics real."""
    return train(smoke_config(Path(out_dir), out_dir=str(out_dir), run_name=run_name, seed=SEED,
                              **{**MICRO, **overrides})).run_dir


def write_class_folders(root: Path, per_class: int, classes: list[str] | None = None, seed: int = 11,
                        names: dict[str, str] | None = None) -> Path:
    """Synthetic flowers as PNG files in ``root/<class>/`` (optionally renaming class folders)."""
    images, labels = make_synthetic_flowers(per_class, 48, seed=seed)
    for img, label in zip(images, labels):
        cls = CLASSES[int(label)]
        if classes is not None and cls not in classes:
            continue
        folder = root / (names or {}).get(cls, cls)
        folder.mkdir(parents=True, exist_ok=True)
        n = len(list(folder.iterdir()))
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(folder / f"img_{n:03d}.png")  # (H, W, 3)
    return root


def write_messy_folder(root: Path) -> tuple[list[str], list[str]]:
    """Every kind of file `predict` must cope with. Returns (readable image names, bad file names), as paths
    relative to ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    images, _ = make_synthetic_flowers(2, 64, seed=5)
    rgb = [Image.fromarray(im.permute(1, 2, 0).numpy()) for im in images]  # (H, W, 3) each
    rgb[0].save(root / "plain.jpg", quality=90)
    rgba = rgb[1].convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgba.size))
    rgba.save(root / "rgba.png")
    rgb[2].convert("P", palette=Image.Palette.ADAPTIVE, colors=32).save(root / "palette.png")
    rgb[3].convert("L").save(root / "gray.jpg")
    wide = rgb[4].resize((96, 64))  # stored landscape, EXIF says: rotate 90 degrees for display
    exif = Image.Exif()
    exif[0x0112] = 6
    wide.save(root / "rotated.jpg", exif=exif.tobytes())
    rgb[5].save(root / "photo.webp")
    rgb[6].save(root / "photo.bmp")
    (root / "nested" / "deeper").mkdir(parents=True)
    rgb[7].save(root / "nested" / "deeper" / "inner.png")
    good = ["plain.jpg", "rgba.png", "palette.png", "gray.jpg", "rotated.jpg", "photo.webp", "photo.bmp",
            "nested/deeper/inner.png"]
    data = (root / "plain.jpg").read_bytes()
    (root / "corrupt.jpg").write_bytes(data[: len(data) // 3])  # truncated JPEG
    (root / "empty.jpg").write_bytes(b"")
    (root / "notes.jpg").write_text("this is not an image\n")
    (root / "README.txt").write_text("not an image, and not named like one: ignored\n")
    return good, ["corrupt.jpg", "empty.jpg", "notes.jpg"]


def predict_dataset(model: torch.nn.Module, dataset: TensorImageDataset, mean, std, device, batch_size: int = 256,
                    tta: bool = False) -> torch.Tensor:
    """Probabilities float32 (N, num_classes) of every image of an in-memory dataset, through predict_batch."""
    out = [predict_batch(model, dataset.images[i:i + batch_size], mean, std, device, tta)
           for i in range(0, len(dataset), batch_size)]
    return torch.cat(out) if out else torch.empty(0, model.num_classes)


def file_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (sub-folders too), by its path there: a folder before and after."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write_crops(name: str, folder: Path, count: int, seed: int) -> Path:
    """``count`` random 40% crops of scikit-image's ``name`` photo, as PNGs in ``folder``: a class of its own."""
    import skimage.data

    image = getattr(skimage.data, name)()
    h, w = image.shape[:2]
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(count):
        y, x = rng.integers(0, h - int(0.4 * h)), rng.integers(0, w - int(0.4 * w))
        Image.fromarray(image[y:y + int(0.4 * h), x:x + int(0.4 * w)]).save(folder / f"{name}_{i}.png")
    return folder


def headless_chromium(binary: str, chromedriver: str, profile: Path) -> Any:
    """Debian's Chromium headless through Selenium, as the browser tests drive it: a fake webcam of test frames,
    no background traffic, every request the page makes logged (``performance``). The caller quits it."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1000",
                 "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",  # a webcam of test frames
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # every request the page makes
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(30)
    return driver


def run_without_rule(run: Path, folder: Path) -> Path:
    """A copy of ``run``'s best.pt and config.yaml in ``folder`` without the "none of these" rule, as a run trained
    before the rule existed."""
    from vit_flowers.runs.checkpoint import load_checkpoint, save_checkpoint

    folder.mkdir()
    ckpt = load_checkpoint(run / "best.pt")
    ckpt["unknown"] = None
    save_checkpoint(ckpt, folder / "best.pt")
    shutil.copy(run / "config.yaml", folder / "config.yaml")
    return folder
