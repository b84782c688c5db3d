"""The confusion matrix whose counts open their photos (vit_flowers.reporting.confusion_cells): in report.html and
the web app's Model tab."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from helpers import write_class_folders

from vit_flowers.evaluate import main as evaluate_main
from vit_flowers.reporting.confusion_cells import CONFUSION_CSS, CellPhoto, cells, confusion_html, read_predictions


def _photos(tmp_path: Path) -> tuple[list[str], list[CellPhoto]]:
    files = sorted((write_class_folders(tmp_path / "photos", 3, classes=["daisy", "rose"])).rglob("*.png"))
    classes = ["daisy", "rose"]
    # daisy: two right (0.9, 0.6), one taken for a rose (0.7); rose: one right (0.8), two taken for daisies
    rows = [("daisy", "daisy", 0.9), ("daisy", "daisy", 0.6), ("daisy", "rose", 0.7),
            ("rose", "rose", 0.8), ("rose", "daisy", 0.55), ("rose", "daisy", 0.95)]
    return classes, [CellPhoto(str(f), t, p, c) for f, (t, p, c) in zip(files, rows)]


def test_cells_put_the_worst_first(tmp_path):
    _, photos = _photos(tmp_path)
    by_cell = cells(photos)
    assert [p.confidence for p in by_cell[("daisy", "daisy")]] == [0.6, 0.9]  # right: the least sure first
    assert [p.confidence for p in by_cell[("rose", "daisy")]] == [0.95, 0.55]  # wrong: the surest first
    assert ("daisy", "rose") in by_cell and ("rose", "rose") in by_cell


def test_each_count_links_to_its_photos(tmp_path):
    classes, photos = _photos(tmp_path)
    page = confusion_html(classes, photos, per_cell=1)
    links = re.findall(r'<a href="#(vf-cell-\d-\d)"[^>]*>(\d+)</a>', page)
    assert links == [("vf-cell-0-0", "2"), ("vf-cell-0-1", "1"), ("vf-cell-1-0", "2"), ("vf-cell-1-1", "1")]
    for anchor, _ in links:
        assert f'id="{anchor}"' in page
    section = page[page.index('id="vf-cell-1-0"'):]
    section = section[:section.index("</section>")]
    assert 'data-true="rose" data-predicted="daisy"' in section and "the 1 worst shown" in section
    assert section.count("<img") == 1 and "daisy 95%" in section  # the surest mistake
    assert ".vf-cell:target" in CONFUSION_CSS  # a section shows once its link is followed


def test_predictions_csv_read_back(tmp_path):
    path = tmp_path / "predictions.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "true", "predicted", "confidence", "correct"])
        writer.writerow(["/x/a.jpg", "daisy", "rose", "0.75", "0"])
        writer.writerow(["/x/b.jpg", "", "", "", "error: not an image"])
    assert read_predictions(path) == [CellPhoto("/x/a.jpg", "daisy", "rose", 0.75)]


def test_report_html_holds_the_clickable_matrix(micro_run, tmp_path):
    data = write_class_folders(tmp_path / "garden", per_class=2)
    assert evaluate_main(["--checkpoint", str(micro_run), "--data", str(data), "--output", str(tmp_path / "r"),
                          "--quiet"]) == 0
    page = (tmp_path / "r" / "report.html").read_text()
    counts = [int(n) for n in re.findall(r'<a href="#vf-cell-\d-\d"[^>]*>(\d+)</a>', page)]
    assert sum(counts) == 10 and page.count('class="vf-cell"') == len(counts)
    assert page.count("data:image/jpeg;base64,") == 10  # every photo's thumbnail embedded: no server needed
