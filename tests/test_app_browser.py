"""End to end in a real browser: start ``python -m vit_flowers.app`` on a free loopback port, drive Debian's
headless Chromium (Selenium + chromedriver) to upload a real photo and a corrupt file, read what the page says,
save a screenshot, and check that the page asked nothing of any host but this one.

Skipped, with the reason, when Chromium, chromedriver, Selenium or Gradio is missing (``.ci/run`` installs
Chromium first, so CI always runs it). ``VF_APP_SCREENSHOT=docs/app.png`` also writes the screenshot there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import FLOWERS5
from helpers import headless_chromium, write_class_folders

from vit_flowers.app.server import wait_until_serving
from vit_flowers.data.synthetic import CLASSES, make_synthetic_flowers

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}

if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("no Chromium / chromedriver (apt-get install chromium chromium-driver)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="Selenium is not installed (pip install -e '.[dev]')")
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

# Runs the app with an audit hook that reports every connection (and name lookup) to a host off this computer.
WATCHED_APP = r"""
import runpy, sys
def watch(event, args):
    host = None
    if event == "socket.connect" and isinstance(args[1], tuple):
        host = args[1][0]
    elif event == "socket.getaddrinfo":
        host = args[0].decode() if isinstance(args[0], bytes) else args[0]
    if host is not None and host not in ("localhost", "::1") and not str(host).startswith("127."):
        sys.stderr.write(f"OUTBOUND {event} {host}\n")
sys.addaudithook(watch)
sys.argv[0] = "vit_flowers.app"
runpy.run_module("vit_flowers.app", run_name="__main__", alter_sys=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _photos(tmp_path: Path, n: int = 2) -> list[Path]:
    """``n`` real photos of different classes from ../shared/data/flowers5 when present, else synthetic flower
    PNGs."""
    if FLOWERS5.is_dir():
        folders = [sorted(f.glob("*.jpg")) for f in sorted(FLOWERS5.iterdir()) if f.is_dir()]
        photos = [files[len(files) // 2] for files in folders if files][:n]
        if len(photos) == n:
            return photos
    from PIL import Image

    images, _ = make_synthetic_flowers(1, 128, seed=1)  # one of each class
    for i in range(n):
        Image.fromarray(images[i].permute(1, 2, 0).numpy()).save(tmp_path / f"flower_{i}.png")
    return [tmp_path / f"flower_{i}.png" for i in range(n)]


@contextlib.contextmanager
def _app(args: list[str], log_path: Path, gradio_dir: Path, **env: str):
    """The app in its own process (watched for connections off this computer) with ``args`` on a free loopback
    port; yields its URL, stops it afterwards."""
    pytest.importorskip("gradio", reason="Gradio is not installed (pip install -e '.[app]')")
    port = _free_port()
    log = log_path.open("a+")
    env = {**os.environ, "GRADIO_TEMP_DIR": str(gradio_dir), "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.Popen([sys.executable, "-c", WATCHED_APP, *args, "--port", str(port), "--device", "cpu"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        try:
            wait_until_serving(url, timeout=180, process=proc)  # a busy machine: the tests run at idle priority
        except (RuntimeError, TimeoutError) as exc:
            log.seek(0)
            pytest.fail(f"{exc}:\n{log.read()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    """The app on the session's micro run; yields its URL and its log file."""
    checkpoint = Path(os.environ.get("VF_APP_CHECKPOINT") or request.getfixturevalue("micro_run"))
    log_path = tmp_path_factory.mktemp("app-log") / "app.log"
    with _app(["--checkpoint", str(checkpoint)], log_path, tmp_path_factory.mktemp("gradio")) as url:
        yield url, log_path


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = headless_chromium(CHROMIUM, CHROMEDRIVER, tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


def _requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] in ("Network.requestWillBeSent", "Network.webSocketCreated"):
            urls.append(message["params"].get("request", message["params"]).get("url", ""))
    return urls


def _upload(driver, paths: list[Path], wait_for: str):
    """Send ``paths`` to the Classify tab's file input and wait for ``wait_for`` (a CSS selector) to appear."""
    clear = driver.find_elements(By.CSS_SELECTOR, "#vf-upload .icon-button-wrapper button[aria-label='Clear']")
    if clear:  # the previous upload: removing it empties the results, so the next ones are new
        driver.execute_script("arguments[0].click()", clear[0])  # even under a toast
        WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#vf-results .vf-empty")))
    field = WebDriverWait(driver, 20).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "#vf-upload input[type=file]")))
    field.send_keys("\n".join(map(str, paths)))  # several files at once
    return WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, wait_for)))


def test_upload_photos_a_corrupt_file_and_a_huge_one(server, browser, tmp_path):
    server, log_path = server
    browser.get(server)
    photos = _photos(tmp_path)
    card = _upload(browser, photos, "#vf-results .vf-card[data-label]")  # the first photo's card
    label = card.find_element(By.CSS_SELECTOR, ".vf-label").text
    confidence = card.find_element(By.CSS_SELECTOR, ".vf-confidence").text
    assert label in CLASSES
    assert confidence.endswith("%") and 0 < float(confidence[:-1]) <= 100
    assert len(card.find_elements(By.CSS_SELECTOR, "img")) == 2  # the photo and the attention overlay
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#vf-results .vf-card[data-label] .vf-name")]
    assert names == [p.name for p in photos]
    shot = tmp_path / "app.png"
    browser.save_screenshot(str(shot))
    if os.environ.get("VF_APP_SCREENSHOT"):
        shutil.copy(shot, os.environ["VF_APP_SCREENSHOT"])

    corrupt = tmp_path / "broken.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    error = _upload(browser, [corrupt], "#vf-results .vf-error-text")
    assert "broken.jpg" in browser.find_element(By.CSS_SELECTOR, "#vf-results .vf-error .vf-name").text
    assert "not an image" in error.text or "corrupt" in error.text

    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(51 * 2**20)  # over the 50 MB limit (a sparse file: the browser refuses it by its size)
    browser.find_element(By.CSS_SELECTOR, "#vf-upload input[type=file]").send_keys(str(huge))
    toast = WebDriverWait(browser, 20).until(ec.presence_of_element_located(
        (By.XPATH, "//*[contains(text(), 'exceed the maximum allowed size')]")))
    assert "huge.jpg" in toast.get_attribute("textContent")

    _upload(browser, photos[:1], "#vf-results .vf-card[data-label]")  # and the app still answers
    urls = _requested_urls(browser)
    assert any(u.startswith(server) for u in urls)
    outside = [u for u in urls if urlsplit(u).scheme in ("http", "https", "ws", "wss")
               and urlsplit(u).hostname not in LOCAL_HOSTS]
    assert not outside, f"the page called out to: {outside}"
    outbound = [line for line in log_path.read_text().splitlines() if line.startswith("OUTBOUND")]
    assert not outbound, f"the app called out: {outbound}"
    if os.environ.get("VF_APP_REQUESTS"):
        Path(os.environ["VF_APP_REQUESTS"]).write_text("\n".join(urls) + "\n")


# ---------------------------------------------------------------------------------------------- the Train tab

TRAIN_YAML = Path(__file__).resolve().parent / "data" / "app_train.yaml"  # the tiny recipe: seconds, not minutes


def _class_photos(root: Path, per_class: int = 10) -> dict[str, list[Path]]:
    """Three classes of synthetic flower PNGs (what the page is given), by class."""
    write_class_folders(root, per_class, classes=["daisy", "rose", "tulip"])
    return {d.name: sorted(d.iterdir()) for d in sorted(root.iterdir())}


def _fill_class(driver, slot: int, name: str, photos: list[Path]) -> None:
    """Type the class's name and upload its photos into slot ``slot``; wait until the page's check counts them."""
    box = driver.find_element(By.CSS_SELECTOR, f"#vf-class-{slot}-name textarea, #vf-class-{slot}-name input")
    box.send_keys(name)
    field = driver.find_element(By.CSS_SELECTOR, f"#vf-class-{slot}-photos input[type=file]")
    field.send_keys("\n".join(map(str, photos)))
    WebDriverWait(driver, 60).until(ec.text_to_be_present_in_element(
        (By.CSS_SELECTOR, "#vf-train-check"), f"{name}: {len(photos)} photo(s)"))


def _progress(driver) -> tuple[str, float, str]:
    """The progress bar's state, fraction and text."""
    bar = driver.find_element(By.CSS_SELECTOR, "#vf-train-progress .vf-progress")
    return bar.get_attribute("data-state"), float(bar.get_attribute("data-fraction")), bar.text


def _tab(driver, name: str):
    """The button of the tab ``name`` (once the page has drawn it)."""
    def find(d):
        return next((b for b in d.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.text.strip() == name), None)

    return WebDriverWait(driver, 30).until(find)


def _runs(work: Path) -> list[str]:
    return sorted(p.name for p in work.iterdir() if p.is_dir() and not p.is_symlink())


def test_make_classes_train_classify_reopen_and_cancel(browser, tmp_path):
    """From an empty work folder: three classes made from uploads, trained through the page (the tiny recipe) with
    the progress bar moving, a held-out photo classified by the new run, its confusion matrix's photos opened, the
    model downloaded as ONNX; the app restarted reopens it; while a second training runs, another tab classifies,
    the tab that started it is closed and the training goes on; cancelled from the other tab, it leaves no run
    folder."""
    work, photos = tmp_path / "runs", _class_photos(tmp_path / "given", 11)
    held_out = {name: files.pop() for name, files in photos.items()}  # never given to the page
    log_path, gradio_dir = tmp_path / "app.log", tmp_path / "gradio"
    args = ["--work-dir", str(work)]
    with _app(args, log_path, gradio_dir, VF_APP_TRAIN_CONFIG=str(TRAIN_YAML)) as url:
        browser.get(url)
        assert _tab(browser, "Train").get_attribute("aria-selected") == "true"  # no run yet: the page opens there
        assert "No model yet" in browser.find_element(By.ID, "vf-header").text
        for slot, (name, files) in enumerate(photos.items()):
            if slot >= 2:
                browser.find_element(By.ID, "vf-class-add").click()
                WebDriverWait(browser, 20).until(ec.visibility_of_element_located((By.ID, f"vf-class-{slot}")))
            _fill_class(browser, slot, name, files)
        assert "Cannot train" not in browser.find_element(By.ID, "vf-train-check").text
        browser.find_element(By.ID, "vf-train-go").click()
        seen, deadline = [], time.monotonic() + 180
        while time.monotonic() < deadline:
            state, fraction, text = _progress(browser)
            seen.append((state, fraction, text))
            if state in ("done", "failed", "cancelled"):
                break
            time.sleep(0.2)
        assert state == "done", (seen[-1], log_path.read_text()[-3000:])
        moving = sorted({f for s, f, _ in seen if s == "running"})
        assert len(moving) >= 3 and 0 < moving[1] < 1, seen  # it moved, and not only from empty to full
        assert any("epoch" in t for _, _, t in seen) and any("accuracy" in t for _, _, t in seen)
        (run,) = [name for name in _runs(work) if not name.endswith("-photos")]
        assert (work / run / "best.pt").is_file() and not (work / run / ".in-progress.tmp").exists()
        assert "epoch 1/" in (work / run / "train.log").read_text()  # train's own log, kept with the run
        assert f"the page uses {run} now" in seen[-1][2]
        kept = work / f"{run}-photos"
        assert sorted(p.name for p in kept.iterdir()) == sorted(photos)
        assert all(len(list((kept / name).iterdir())) == len(files) for name, files in photos.items())
        assert f"--data {kept}" in browser.find_element(By.ID, "vf-train-result").text
        WebDriverWait(browser, 20).until(ec.text_to_be_present_in_element((By.ID, "vf-header"), "3 classes"))
        _tab(browser, "Classify").click()
        card = _upload(browser, [held_out["rose"]], "#vf-results .vf-card[data-label]")
        assert card.find_element(By.CSS_SELECTOR, ".vf-label").text in photos  # the new run's classes
        _tab(browser, "Model").click()  # its validation confusion matrix: a count opens its photos
        link = WebDriverWait(browser, 30).until(
            ec.element_to_be_clickable((By.CSS_SELECTOR, "#vf-model-cells a[href*='#vf-cell-']")))
        section = browser.find_element(By.ID, link.get_attribute("href").split("#")[1])
        assert not section.is_displayed()
        link.click()
        WebDriverWait(browser, 10).until(lambda d: section.is_displayed())
        assert len(section.find_elements(By.CSS_SELECTOR, "img")) == min(int(link.text), 24)
        browser.find_element(By.ID, "vf-model-onnx").click()  # the model as ONNX, checked against PyTorch
        WebDriverWait(browser, 120).until(ec.text_to_be_present_in_element((By.ID, "vf-model-onnx-check"),
                                                                           "the same label on"))
        offered = browser.find_element(By.ID, "vf-model-onnx-file").text.replace("\n", "")  # (name, extension apart)
        assert f"{run}.onnx" in offered
        browser.find_element(By.ID, "vf-model-web").click()  # beside it, the same model as a web page (#64)
        WebDriverWait(browser, 120).until(ec.text_to_be_present_in_element((By.ID, "vf-model-web-check"),
                                                                           "any web server"))
        assert f"{run}-web" in browser.find_element(By.ID, "vf-model-web-file").text.replace("\n", "")

    long_recipe = tmp_path / "long.yaml"  # the tiny model, but as many epochs as a minute holds: time to cancel
    long_recipe.write_text(TRAIN_YAML.read_text().replace("epochs: 6", "epochs: 100000"))
    with _app(args, log_path, gradio_dir, VF_APP_TRAIN_CONFIG=str(long_recipe)) as url:
        browser.get(url)
        assert _tab(browser, "Classify").get_attribute("aria-selected") == "true"  # the run reopened
        assert "daisy, rose, tulip" in browser.find_element(By.ID, "vf-header").text
        chosen = browser.find_element(By.CSS_SELECTOR, "#vf-model-select input").get_attribute("value")
        assert chosen.startswith(run) and "daisy, rose, tulip" in chosen  # the selector: name, classes, ...
        _tab(browser, "Train").click()
        for slot, (name, files) in enumerate(list(photos.items())[:2]):
            _fill_class(browser, slot, name, files)
        before = _runs(work)
        browser.find_element(By.ID, "vf-train-go").click()
        WebDriverWait(browser, 120).until(lambda d: _progress(d)[0] == "running" and "epoch" in _progress(d)[2])
        assert len(_runs(work)) == len(before) + 2  # the run and its photos, while it trains
        training_tab = browser.current_window_handle
        browser.switch_to.new_window("tab")  # a second session classifies while the first one's model trains
        browser.get(url)
        card = _upload(browser, [held_out["tulip"]], "#vf-results .vf-card[data-label]")
        assert card.find_element(By.CSS_SELECTOR, ".vf-label").text in photos
        second = browser.current_window_handle
        browser.switch_to.window(training_tab)
        browser.close()  # the tab that started the training is closed: the training goes on, as the page says
        browser.switch_to.window(second)
        _tab(browser, "Train").click()  # the other tab follows it
        assert "closing the tab does not stop it" in browser.find_element(By.ID, "vf-train-intro").text
        WebDriverWait(browser, 20).until(lambda d: _progress(d)[0] == "running")
        epochs = int(browser.find_element(By.CSS_SELECTOR, "#vf-train-progress .vf-progress").get_attribute(
            "data-epochs"))
        WebDriverWait(browser, 60).until(lambda d: int(d.find_element(
            By.CSS_SELECTOR, "#vf-train-progress .vf-progress").get_attribute("data-epochs")) > epochs)
        start = time.monotonic()
        browser.find_element(By.ID, "vf-train-cancel").click()
        WebDriverWait(browser, 10).until(lambda d: _progress(d)[0] == "cancelled")
        assert time.monotonic() - start < 5
        assert _runs(work) == before  # no half-written run, no photos folder left


def test_webcam_shots_join_a_class(server, browser):
    """Chromium's fake camera: two shots taken in the Train tab become two photos of the class."""
    browser.get(server[0])
    _tab(browser, "Train").click()
    browser.find_element(By.CSS_SELECTOR, "#vf-class-0-name input, #vf-class-0-name textarea").send_keys("sky")
    camera = browser.find_element(By.ID, "vf-class-0-camera")
    for shots in (1, 2):
        WebDriverWait(camera, 30).until(lambda c: c.find_elements(
            By.XPATH, ".//button[contains(., 'Access Webcam') or @aria-label='capture photo']"))[0].click()
        capture = WebDriverWait(camera, 30).until(
            ec.element_to_be_clickable((By.CSS_SELECTOR, "button[aria-label='capture photo']")))
        capture.click()
        WebDriverWait(browser, 30).until(ec.text_to_be_present_in_element((By.ID, "vf-train-check"),
                                                                          f"sky: {shots} photo(s)"))
