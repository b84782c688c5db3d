"""The page of ``vit-flowers export --web`` in a real browser: Debian's headless Chromium (Selenium + chromedriver)
opens the exported folder from a local http.server on 127.0.0.1 (no internet), is given photos through its file
input, and must answer as ``predict`` does: the same top-1, probabilities within 1e-3, the unknown rule's answer
the same. Also: the webcam path (Chromium's fake camera), a browser without WebAssembly SIMD (the page says so),
a run without an unknown rule (the page says it has no "not sure"), and no request to any other host.

Skipped, with the reason, without Chromium / chromedriver / Selenium, the onnx extra, or ONNX Runtime Web (`npm ci`
in web/); .ci/run installs all of them, so CI runs it.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from conftest import FLOWERS5
from helpers import headless_chromium, run_without_rule, write_crops
from PIL import Image

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("no Chromium / chromedriver (apt-get install chromium chromium-driver)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="Selenium is not installed (pip install -e '.[dev]')")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from vit_flowers.data.synthetic import make_synthetic_flowers
from vit_flowers.export import main as export_main
from vit_flowers.inference import web_export
from vit_flowers.inference.predictions import predict_images
from vit_flowers.inference.unknown import rule_from_checkpoint
from vit_flowers.runs.checkpoint import load_checkpoint, load_model

try:
    web_export.find_ort()
except ValueError as exc:
    pytest.skip(str(exc), allow_module_level=True)

PROBABILITY_TOLERANCE = 1e-3
# Pillow decodes a JPEG at least four times the model's size at 1/2-1/8 scale (image_files.load_image's draft); a
# browser cannot, and the page averages the full decode's blocks instead (preprocess.js): a few grey levels off.
DRAFT_TOLERANCE = 0.05


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _served(folder: Path) -> Iterator[str]:
    """``folder`` on a free port of 127.0.0.1 (what a static web server or GitHub Pages does), its index's URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/index.html"
    finally:
        server.shutdown()
        thread.join()


def _export(run: Path, folder: Path) -> Path:
    assert export_main(["--checkpoint", str(run), "--web", str(folder), "--quiet"]) == 0
    return folder


@pytest.fixture(scope="module")
def site(micro_run, tmp_path_factory) -> Iterator[str]:
    with _served(_export(micro_run, tmp_path_factory.mktemp("web") / "site")) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = headless_chromium(CHROMIUM, CHROMEDRIVER, tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


def _open(driver, url: str, timeout: float = 60) -> str:
    """Load the page and wait until it has loaded its model or said why it cannot; its state."""
    driver.get(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = driver.execute_script("return window.vf ? window.vf.state : 'loading'")
        if state != "loading":
            return state
        time.sleep(0.05)
    raise AssertionError(f"the page did not load its model in {timeout} s: "
                         f"{driver.find_element('id', 'status').text}")


def _results(driver, count: int, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        results = driver.execute_script("return window.vf.results")
        if len(results) >= count:
            return results
        time.sleep(0.05)
    raise AssertionError(f"the page answered {len(results)} of {count} photos in {timeout} s")


def _photos(folder: Path) -> tuple[list[Path], list[Path]]:
    """(photos that take the Python path's full decode, JPEGs that Pillow decodes at a reduced scale): synthetic
    flowers as 48 px PNGs and 120 x 90 JPEGs (under four times the micro run's 32 px), and 400 x 300 JPEGs or, when
    ../shared/data/flowers5 is there, real photos (all of them four times 32 px or more)."""
    folder.mkdir()
    images, _ = make_synthetic_flowers(2, 48, seed=21)
    exact, draft = [], []
    for i, image in enumerate(images):
        pil = Image.fromarray(image.permute(1, 2, 0).numpy())
        pil.save(folder / f"flower_{i}.png")
        exact.append(folder / f"flower_{i}.png")
        if i % 2 == 0:
            pil.resize((120, 90), Image.Resampling.BICUBIC).save(folder / f"flower_{i}.jpg", quality=90)
            exact.append(folder / f"flower_{i}.jpg")
        else:
            pil.resize((400, 300), Image.Resampling.BICUBIC).save(folder / f"big_{i}.jpg", quality=90)
            draft.append(folder / f"big_{i}.jpg")
    if FLOWERS5.is_dir():
        draft = [sorted(c.glob("*.jpg"))[7] for c in sorted(FLOWERS5.iterdir()) if c.is_dir()]
    return exact, draft


def _predicted(run: Path, files: list[Path]) -> list[Any]:
    model, ckpt = load_model(run / "best.pt")
    return [row for rows in predict_images(model, files, ckpt["classes"], image_size=ckpt["image_size"],
                                           mean=ckpt["mean"], std=ckpt["std"], top_k=len(ckpt["classes"]),
                                           unknown=rule_from_checkpoint(ckpt)) for row in rows]


def _largest_difference(row: Any, result: dict[str, Any], classes: list[str]) -> float:
    probs = dict(row.top_k)
    return max(abs(probs[c] - p) for c, p in zip(classes, result["probabilities"]))


def test_the_page_answers_as_predict(browser, site, micro_run, tmp_path):
    assert _open(browser, site) == "ready", browser.find_element("id", "status").text
    exact, draft = _photos(tmp_path / "photos")
    files = exact + draft
    browser.find_element("id", "files").send_keys("\n".join(str(f) for f in files))
    results = _results(browser, len(files))
    classes = list(load_checkpoint(micro_run / "best.pt")["classes"])
    rows = _predicted(micro_run, files)
    assert [r["name"] for r in results] == [f.name for f in files] and all("error" not in r for r in results)
    for row, result in zip(rows[:len(exact)], results):
        assert (result["label"], result["unknown"]) == (row.label, row.label == "unknown"), result["name"]
        assert result["top"][0][0] == row.top_k[0][0], result["name"]
        assert _largest_difference(row, result, classes) <= PROBABILITY_TOLERANCE, result["name"]
        assert result["score"] == pytest.approx(row.known_score, abs=1e-2)
    same = sum(r["top"][0][0] == row.top_k[0][0] for row, r in zip(rows[len(exact):], results[len(exact):]))
    assert same >= len(draft) - 1
    assert max(_largest_difference(row, r, classes) for row, r in zip(rows[len(exact):], results[len(exact):])) \
        <= DRAFT_TOLERANCE
    cards = browser.find_elements("css selector", "#results .card")
    assert len(cards) == len(files) and "%" in cards[-1].text


def test_a_taught_run_answers_with_its_taught_class_and_rule(browser, micro_run, tmp_path):
    """A run taught a class (teach): its classes and its rule's per-class offsets on the page, as predict uses them."""
    pytest.importorskip("skimage.data", reason="scikit-image is not installed (pip install -e '.[dev]')")
    from vit_flowers.teach import main as teach_main

    taught = tmp_path / "taught"
    brick = write_crops("brick", tmp_path / "brick", 8, seed=0)
    assert teach_main([str(micro_run), "--add", f"brick={brick}", "--output", str(taught)]) == 0
    files = sorted(write_crops("brick", tmp_path / "held", 3, seed=1).iterdir())
    images, _ = make_synthetic_flowers(1, 48, seed=8)
    for i, image in enumerate(images[:2]):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(tmp_path / f"flower_{i}.png")
        files.append(tmp_path / f"flower_{i}.png")
    with _served(_export(taught, tmp_path / "site")) as url:
        assert _open(browser, url) == "ready"
        browser.find_element("id", "files").send_keys("\n".join(str(f) for f in files))
        results = _results(browser, len(files))
    classes = list(load_checkpoint(taught / "best.pt")["classes"])
    assert classes[-1] == "brick" and "brick" in browser.find_element("id", "about").text
    for row, result in zip(_predicted(taught, files), results):
        assert (result["label"], result["top"][0][0]) == (row.label, row.top_k[0][0]), result["name"]
        assert _largest_difference(row, result, classes) <= PROBABILITY_TOLERANCE, result["name"]
        assert result["score"] == pytest.approx(row.known_score, abs=1e-2)


def test_the_webcam_is_classified_from_a_frame(browser, site):
    assert _open(browser, site) == "ready"
    browser.find_element("id", "camera-start").click()
    deadline = time.monotonic() + 20
    while not browser.execute_script("return document.getElementById('video').videoWidth > 0"):
        assert time.monotonic() < deadline, "the fake camera gave no frame"
        time.sleep(0.05)
    browser.find_element("id", "snap").click()
    (result,) = _results(browser, 1)
    assert result["source"] == "webcam" and "error" not in result, result
    assert sum(result["probabilities"]) == pytest.approx(1, abs=1e-6) and len(result["top"]) == 3
    browser.find_element("id", "camera-stop").click()


def test_an_unreadable_file_gets_its_own_card_and_the_next_photo_its_answer(browser, site, tmp_path):
    assert _open(browser, site) == "ready"
    (tmp_path / "broken.jpg").write_bytes(b"not a photo")
    images, _ = make_synthetic_flowers(1, 48, seed=2)
    Image.fromarray(images[0].permute(1, 2, 0).numpy()).save(tmp_path / "fine.png")
    browser.find_element("id", "files").send_keys(f"{tmp_path / 'broken.jpg'}\n{tmp_path / 'fine.png'}")
    broken, fine = _results(browser, 2)
    assert broken["name"] == "broken.jpg" and broken["error"] and "error" not in fine
    assert "Could not read it" in browser.find_element("css selector", "#results .card:last-child").text


def test_the_page_asks_nothing_of_another_host(browser, site):
    browser.get_log("performance")  # what earlier tests requested
    assert _open(browser, site) == "ready"
    hosts = set()
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            hosts.add(urlsplit(message["params"]["request"]["url"]).hostname)
    assert hosts <= {"127.0.0.1", None}, hosts  # None: data: URLs


def test_a_browser_without_webassembly_simd_is_told(browser, site):
    script = "WebAssembly.validate = () => false;"  # as a browser without SIMD answers the page's probe
    added = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": script})
    try:
        assert _open(browser, site) == "unsupported"
        assert "no WebAssembly SIMD" in browser.find_element("id", "status").text
        assert browser.find_element("id", "files").get_attribute("disabled") is not None
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": added["identifier"]})


def test_a_run_without_an_unknown_rule_says_it_has_no_not_sure(browser, micro_run, tmp_path):
    run = run_without_rule(micro_run, tmp_path / "no-rule")
    with _served(_export(run, tmp_path / "site")) as url:
        assert _open(browser, url) == "ready"
        assert 'no "not sure" rule' in browser.find_element("id", "about").text
        images, _ = make_synthetic_flowers(1, 48, seed=4)
        Image.fromarray(images[0].permute(1, 2, 0).numpy()).save(tmp_path / "one.png")
        browser.find_element("id", "files").send_keys(str(tmp_path / "one.png"))
        (result,) = _results(browser, 1)
        assert result["unknown"] is False and result["score"] is None
        assert result["label"] == result["top"][0][0]
        assert result["probabilities"][int(np.argmax(result["probabilities"]))] == result["top"][0][1]
