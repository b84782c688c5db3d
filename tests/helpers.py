"""Test helpers: a tiny trained run folder and image folders written on the spot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD, eval_transform
from vit_flowers.data.datasets import TensorImageDataset
from vit_flowers.data.synthetic import CLASSES, make_synthetic_flowers
from vit_flowers.inference.batches import predict_batch
from vit_flowers.models.vit import create_vit
from vit_flowers.runs.checkpoint import make_checkpoint, mark_latest, save_checkpoint
from vit_flowers.training.config import TrainConfig, load_config, save_config

IMAGE_SIZE = 32
SEED = 3
SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def smoke_config(tmp_path: Path, **overrides) -> TrainConfig:
    """configs/smoke.yaml (a run of seconds) writing under ``tmp_path/ck``, on one thread, without progress
    bars, deterministic unless ``overrides`` say otherwise."""
    return load_config(SMOKE, {"out_dir": str(tmp_path / "ck"), "progress": False, "deterministic": True,
                               "threads": 1, **overrides})


def train_micro_run(out_dir: Path, epochs: int = 20, run_name: str = "micro") -> Path:
    """Train a ``vit_micro`` (32 px) for ~2 s on synthetic flowers and write a run folder like train.py
    does: ``out_dir/run_name/{best.pt, config.yaml, metrics.csv}`` and ``out_dir/latest``."""
    torch.manual_seed(SEED)
    cfg = load_config(None, dict(model="vit_micro", image_size=IMAGE_SIZE, cache_size=IMAGE_SIZE, seed=SEED,
                                 synthetic_train_per_class=40, synthetic_val_per_class=6, out_dir=str(out_dir),
                                 run_name=run_name, epochs=8, drop_path=0.0))
    images, labels = make_synthetic_flowers(cfg.data.synthetic_train_per_class, IMAGE_SIZE, seed=SEED)
    x = eval_transform(images, IMAGE_SIZE, IMAGENET_MEAN, IMAGENET_STD)  # (N, 3, 32, 32)
    model = create_vit("vit_micro", num_classes=len(CLASSES), **cfg.model_kwargs())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    rows = []
    for epoch in range(1, epochs + 1):
        model.train()
        perm = torch.randperm(len(x))
        losses, correct = [], 0
        for i in range(0, len(x), 25):
            idx = perm[i:i + 25]
            logits = model(x[idx])
            loss = torch.nn.functional.cross_entropy(logits, labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            correct += (logits.argmax(-1) == labels[idx]).sum().item()
        lr = sched.get_last_lr()[0]
        sched.step()
        acc = correct / len(x)
        rows.append(f"{epoch},{np.mean(losses):.4f},{acc:.4f},{np.mean(losses) * 1.1:.4f},{acc * 0.9:.4f},"
                    f"{lr:.6f},0.1,2000")
    run = Path(out_dir) / run_name
    model.eval()
    save_checkpoint(make_checkpoint(model, classes=list(CLASSES), image_size=IMAGE_SIZE, mean=list(IMAGENET_MEAN),
                                    std=list(IMAGENET_STD), config=cfg.flat(), epoch=epoch,
                                    best_accuracy=0.5), run / "best.pt")
    save_config(cfg, run / "config.yaml")
    (run / "metrics.csv").write_text(
        "epoch,train_loss,train_acc,val_loss,val_acc,lr,seconds,images_per_s\n" + "\n".join(rows) + "\n")
    mark_latest(run)
    return run


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
