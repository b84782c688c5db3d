"""Tests for vit_flowers.reporting.report: figures, CSV, markdown and self-contained HTML."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from vit_flowers.reporting import report
from vit_flowers.runs.folders import KeptWeights

CLASSES = ["daisy", "rose", "tulip"]


def _metrics() -> dict:
    row = {"precision": 0.5, "recall": 0.25, "f1": 1 / 3, "support": 4}
    return {"accuracy": 0.75, "top_k": 2, "top_k_accuracy": 0.9, "n_images": 12, "n_failed": 1,
            "images_per_second": 321.0, "checkpoint": "runs/x/best.pt", "dataset": "folder <photos> & co",
            "device": "cpu", "per_class": dict.fromkeys(CLASSES, row), "macro_avg": row, "weighted_avg": row}


def test_training_curves(tmp_path):
    csv_path = tmp_path / "metrics.csv"
    csv_path.write_text("epoch,train_loss,train_acc,val_loss,val_acc,lr,seconds,images_per_s\n"
                        "1,1.5,0.3,1.6,0.25,0.001,2.0,100\n"
                        "2,1.2,0.5,,,0.0008,2.0,100\n"  # an epoch without validation
                        "3,1.0,0.6,1.1,0.55,0.0005,2.0,100\n")
    out = report.plot_training_curves(csv_path, tmp_path / "sub" / "curves.png")
    assert out == tmp_path / "sub" / "curves.png"
    with Image.open(out) as img:
        assert img.width > 600 and img.height > 200
        assert np.asarray(img.convert("L")).std() > 5  # something was drawn


def test_training_curves_header_only_and_missing(tmp_path):
    csv_path = tmp_path / "metrics.csv"
    csv_path.write_text("epoch,train_loss,train_acc,val_loss,val_acc,lr,seconds,images_per_s\n")
    assert report.plot_training_curves(csv_path, tmp_path / "c.png") is None
    assert not (tmp_path / "c.png").exists()
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        report.plot_training_curves(tmp_path / "nope.csv", tmp_path / "c.png")


def test_confusion_matrix_png_and_csv(tmp_path):
    cm = np.array([[5, 1, 0], [2, 3, 0], [0, 0, 0]])  # last class has no images: no division by zero
    png = report.plot_confusion_matrix(cm, CLASSES, tmp_path / "cm.png", title="t")
    with Image.open(png) as img:
        assert img.width > img.height > 300
    path = report.write_confusion_csv(cm, CLASSES, tmp_path / "cm.csv")
    rows = list(csv.reader(path.open()))
    assert rows[0][1:] == CLASSES
    assert [r[0] for r in rows[1:]] == CLASSES
    assert np.array([[int(v) for v in r[1:]] for r in rows[1:]]).tolist() == cm.tolist()
    with pytest.raises(ValueError, match="3 classes"):
        report.plot_confusion_matrix(np.zeros((2, 2)), CLASSES, tmp_path / "bad.png")


def test_confusion_matrix_many_classes(tmp_path):
    n = 40
    rng = np.random.default_rng(0)
    cm = rng.integers(0, 5, (n, n)) + np.eye(n, dtype=int) * 20
    png = report.plot_confusion_matrix(cm, [f"class_{i}" for i in range(n)], tmp_path / "cm.png")
    assert png.stat().st_size > 10_000


def test_top_confusions():
    cm = np.array([[5, 1, 3], [2, 3, 0], [0, 0, 4]])
    top = report.top_confusions(cm, CLASSES, k=5)
    assert top[0] == ("daisy", "tulip", 3, pytest.approx(3 / 9))
    assert [(t, p, n) for t, p, n, _ in top] == [("daisy", "tulip", 3), ("rose", "daisy", 2), ("daisy", "rose", 1)]
    assert report.top_confusions(np.eye(3, dtype=int), CLASSES) == []


def test_mistakes_grid(tmp_path):
    rng = np.random.default_rng(0)
    mistakes = [report.Mistake(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), 0, 1, 0.9 - i / 10,
                               f"/x/img_{i}.jpg") for i in range(7)]
    png = report.plot_mistakes(mistakes, CLASSES, tmp_path / "m.png", columns=4)
    with Image.open(png) as img:
        assert img.height > 400  # two rows
    empty = report.plot_mistakes([], CLASSES, tmp_path / "none.png")
    assert empty.stat().st_size > 1000


def test_markdown_and_html_are_complete_and_self_contained(tmp_path):
    fig = tmp_path / "fig.png"
    Image.new("RGB", (20, 10), (200, 10, 10)).save(fig)
    confusions = [("rose", "tulip", 3, 0.75)]
    md = report.write_markdown(_metrics(), tmp_path / "report.md", {"A figure": "fig.png"}, confusions, "My title")
    text = md.read_text()
    assert text.startswith("# My title")
    for expected in ("75.0%", "Top-2 accuracy", "| daisy | 50.0% | 25.0% | 33.3% | 4 |", "![A figure](fig.png)",
                     "| rose | tulip | 3 | 75.0% |", "Unreadable files"):
        assert expected in text, expected

    html_path = report.write_html(_metrics(), tmp_path / "report.html", {"A figure": "fig.png", "Gone": "nope.png"},
                                  confusions, "My <title>")
    page = html_path.read_text()
    assert page.count("data:image/png;base64,") == 1  # the missing figure is left out
    assert not re.search(r'src="(?!data:)', page)  # nothing loaded from other files
    assert "My &lt;title&gt;" in page and "folder &lt;photos&gt; &amp; co" in page  # escaped
    assert all(c in page for c in CLASSES)


def test_thumbnail_falls_back(tmp_path):
    fallback = np.zeros((4, 4, 3), dtype=np.uint8)
    assert report.thumbnail(tmp_path / "missing.jpg", fallback) is fallback
    Image.new("RGB", (600, 300), (0, 128, 0)).save(tmp_path / "big.png")
    assert report.thumbnail(tmp_path / "big.png", fallback, size=100).shape == (50, 100, 3)


def test_training_curves_mark_the_weights_kept_in_best_pt_and_the_legend_covers_no_line(tmp_path):
    """The issue's case: the best raw accuracy is epoch 3's (80%), but best.pt holds epoch 2's EMA weights (85%)."""
    rows = report.read_metrics(_metrics_csv(tmp_path, "epoch,train_loss,train_acc,val_loss,val_acc,val_acc_ema,lr\n"
                                                      "1,1.5,0.3,1.6,0.50,0.55,0.001\n"
                                                      "2,1.2,0.5,1.3,0.70,0.85,0.0008\n"
                                                      "3,1.0,0.6,1.1,0.80,0.82,0.0005\n"))
    fig = report.training_curves_figure(rows, KeptWeights(epoch=2, weights="ema"))
    acc = fig.axes[1]
    marks = [line for line in acc.lines if line.get_label().startswith("kept in best.pt")]
    assert [m.get_label() for m in marks] == ["kept in best.pt: 85.0% (epoch 2, EMA weights)"]
    assert list(marks[0].get_xydata()[0]) == [2.0, 0.85]
    assert "val (EMA weights)" in [line.get_label() for line in acc.lines]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes[:2]:
        legend = ax.get_legend().get_window_extent(renderer)
        assert not any(legend.overlaps(a.get_window_extent(renderer)) for a in fig.axes), "the legend covers a plot"
    raw = report.training_curves_figure(rows, KeptWeights(epoch=3, weights="raw"))
    assert [line.get_label() for line in raw.axes[1].lines if "kept" in line.get_label()] == \
        ["kept in best.pt: 80.0% (epoch 3, raw weights)"]
    assert not [line for line in report.training_curves_figure(rows).axes[1].lines if "kept" in line.get_label()]


def _metrics_csv(tmp_path, text: str):
    path = tmp_path / "metrics.csv"
    path.write_text(text)
    return path
