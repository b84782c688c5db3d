"""The web app's Teach tab, engine level (no browser): a new class from a few uploads, classified right away; the
loaded run is never changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import file_digests, smoke_config
from PIL import Image

from vit_flowers import train as train_mod
from vit_flowers.app.engine import Engine, classify_files, teach_class
from vit_flowers.cli import open_model
from vit_flowers.data.synthetic import CLASSES

skimage_data = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return train_mod.train(smoke_config(tmp_path_factory.mktemp("teach_tab"), run_name="s")).run_dir


@pytest.fixture
def engine(run, tmp_path) -> Engine:
    loaded = open_model(run, device="cpu")
    return Engine(loaded, top_k=3, unknown=None, batch_size=8, workdir=tmp_path / "csv", runs_dir=tmp_path / "work")


def _crops(name: str, folder: Path, count: int, seed: int) -> list[Path]:
    """``count`` random 40% crops of scikit-image's ``name`` photo, as PNGs in ``folder`` (as test_teach's)."""
    image = getattr(skimage_data, name)()
    h, w = image.shape[:2]
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    paths = []
    for i in range(count):
        y, x = rng.integers(0, h - int(0.4 * h)), rng.integers(0, w - int(0.4 * w))
        paths.append(folder / f"{name}_{i}.png")
        Image.fromarray(image[y:y + int(0.4 * h), x:x + int(0.4 * w)]).save(paths[-1])
    return paths


def test_teaching_a_class_makes_the_engine_classify_it_and_leaves_the_run_alone(engine, run, tmp_path):
    before = file_digests(run)
    taught = teach_class(engine, _crops("brick", tmp_path / "teach", 8, seed=0), "  brick ")
    assert taught.classes == [*CLASSES, "brick"] and engine.classes == taught.classes and taught.photos == 8
    assert taught.run_dir.parent == tmp_path / "work" and (taught.run_dir / "best.pt").is_file()
    assert Path(engine.loaded.path) == taught.run_dir / "best.pt" and "vit-flowers teach" in taught.command
    results = classify_files(engine, _crops("brick", tmp_path / "held", 12, seed=1))
    assert sum(r.top_k[0][0] == "brick" for r in results) >= 9  # chance: 1 in 6
    assert file_digests(run) == before
    again = teach_class(engine, _crops("coffee", tmp_path / "more", 6, seed=2), "coffee")
    assert again.run_dir != taught.run_dir and again.classes == [*CLASSES, "brick", "coffee"]
    assert (taught.run_dir / "best.pt").is_file()  # the first taught run is not overwritten


def test_bad_names_and_photos_get_a_message_naming_the_fault(engine, run, tmp_path):
    photos = _crops("brick", tmp_path / "c", 3, seed=0)
    for bad in ("  ", "a/b", "..", "../../etc", "li\nly", "unknown", "UNKNOWN"):  # the command line's rule
        with pytest.raises(ValueError, match=r"class name .* refused: .* not '\.', '\.\.' or 'unknown'"):
            teach_class(engine, photos, bad)
    with pytest.raises(ValueError, match="not 0"):
        teach_class(engine, [], "brick")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    with pytest.raises(ValueError, match="broken.png"):
        teach_class(engine, [*photos, broken], "brick")
    assert engine.classes == list(CLASSES) and not (tmp_path / "work").exists()  # nothing written, model kept


def test_the_page_has_a_teach_tab(engine):
    pytest.importorskip("gradio")
    from vit_flowers.app import server

    demo = server.build_page(engine)
    labels = [c.get("props", {}).get("label") for c in demo.config["components"]]
    assert "Teach" in labels and "Its name" in labels
    assert "/teach" in demo.get_api_info()["named_endpoints"]


def test_a_taught_run_is_kept_beside_the_run_and_the_page_follows(run, tmp_path):
    """Without --work-dir the taught run lives where runs live (beside the loaded run's folder), not in a temporary
    folder deleted at exit; the page says where, shows the estimate and the warning about few photos, and its header
    counts the new class."""
    pytest.importorskip("gradio")
    from vit_flowers.app.server import header_markdown, taught_markdown

    engine = Engine(open_model(run, device="cpu"), unknown=None, batch_size=8)
    assert "knows 5 classes" in header_markdown(engine)
    taught = teach_class(engine, _crops("brick", tmp_path / "teach", 3, seed=0), "brick")
    try:
        assert taught.run_dir.parent == run.parent and taught.run_dir.name.startswith(f"{run.name}-taught-")
        assert "knows 6 classes" in header_markdown(engine) and "brick" in header_markdown(engine)
        page = taught_markdown(taught)
        assert "only 3 photo(s)" in page and "**Estimate:** brick: about" in page
        assert f"`{taught.run_dir}`" in page and "kept after the page stops" in page
        assert engine.workdir is None  # no temporary folder was made
    finally:
        shutil.rmtree(taught.run_dir)


@pytest.mark.parametrize("given", [None, -5.0])
def test_after_teaching_the_page_uses_the_recalibrated_rule_or_the_threshold_given(engine, tmp_path, given):
    from vit_flowers.inference.unknown import rule_from_checkpoint
    from vit_flowers.runs.checkpoint import load_checkpoint

    engine.unknown = rule_from_checkpoint(engine.loaded.ckpt, threshold=given)
    taught = teach_class(engine, _crops("brick", tmp_path / "teach", 6, seed=0), "brick")
    stored = load_checkpoint(taught.run_dir / "best.pt")["unknown"]
    assert engine.unknown is not None and engine.unknown.offsets is not None and len(engine.unknown.offsets) == 6
    assert engine.unknown.threshold == (stored["threshold"] if given is None else given)
