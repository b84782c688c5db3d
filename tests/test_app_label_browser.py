"""The Label tab in a real browser (headless Chromium, as tests/test_app_browser.py): a folder labelled a class at a
time, a wrong suggestion moved to its class in one click, the page reloaded and the app restarted mid-way, and the
user's folder unchanged (its files' hashes before and after). Skipped where Chromium, chromedriver, Selenium or
Gradio is missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import file_digests, write_class_folders
from test_app_browser import CHROMEDRIVER, CHROMIUM, _app, _tab, browser  # noqa: F401  (browser: a fixture)

if CHROMIUM is None or CHROMEDRIVER is None:  # (test_app_browser skips itself, and so this module, already)
    pytest.skip("no Chromium / chromedriver", allow_module_level=True)
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from vit_flowers.labelling.state import state_path


def _folder(tmp_path: Path) -> Path:
    """15 synthetic flowers named by their true class (the model never sees names), and a text file."""
    drawn = write_class_folders(tmp_path / "drawn", 3, seed=21)
    folder = tmp_path / "summer"
    folder.mkdir()
    for p in sorted(drawn.rglob("*.png")):
        shutil.copyfile(p, folder / f"IMG_{p.parent.name}_{p.stem}.png")
    (folder / "notes.txt").write_text("not a photo\n")
    return folder


def _grid(driver, timeout: float = 60):
    """The grid's class and its photos, once drawn."""
    grid = WebDriverWait(driver, timeout).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "#vf-label-grid[data-label]")))
    return grid.get_attribute("data-label"), grid.find_elements(By.CSS_SELECTOR, ".vf-pick")


def _truth(figure) -> str:
    return figure.get_attribute("data-name").split("_")[1]


def _revision(driver) -> str:
    return driver.find_element(By.ID, "vf-label-grid").get_attribute("data-revision")


def _accept(driver) -> str:
    """Press Accept; wait until the grid shows the next revision of the state file; return the summary."""
    before = _revision(driver)
    driver.find_element(By.ID, "vf-label-accept").click()
    WebDriverWait(driver, 60).until(lambda d: _revision(d) not in (before, None))
    return driver.find_element(By.ID, "vf-label-summary").text


def test_label_a_folder_move_a_wrong_one_reload_and_restart(micro_run, browser, tmp_path):  # noqa: F811
    photos = write_class_folders(tmp_path / "photos", 2, seed=5)
    folder = _folder(tmp_path)
    before = file_digests(folder)
    args = ["--checkpoint", str(micro_run), "--work-dir", str(tmp_path)]  # the state file lives where runs live
    log_path, gradio_dir = tmp_path / "app.log", tmp_path / "gradio"
    moved: dict[str, str] = {}
    with _app(args, log_path, gradio_dir) as url:
        browser.get(url)
        _tab(browser, "Label").click()
        browser.find_element(By.CSS_SELECTOR, "#vf-label-folder textarea, #vf-label-folder input").send_keys(
            str(folder))
        browser.find_element(By.CSS_SELECTOR, "#vf-label-photos textarea, #vf-label-photos input").send_keys(
            str(photos))
        browser.find_element(By.ID, "vf-label-go").click()
        label, figures = _grid(browser)
        summary = browser.find_element(By.ID, "vf-label-summary").text
        assert "15 photo(s) suggested" in summary and "notes.txt" in summary
        assert all(f.find_element(By.CSS_SELECTOR, ".vf-yes input").is_selected() for f in figures)  # pre-ticked
        # class by class until a grid holds a wrong suggestion: moved to its class in one click, the rest accepted
        while not moved:
            wrong = [f for f in figures if _truth(f) != label]
            for f in wrong[:1]:
                f.find_element(By.XPATH, f".//label[span[text()='→ {_truth(f)}']]").click()
                moved[f.get_attribute("data-sha")] = _truth(f)
            summary = _accept(browser)
            assert "photo(s) labelled" in summary
            label, figures = _grid(browser)
        done = json.loads(state_path(photos).read_text())["entries"]
        (sha, truth), = moved.items()
        assert done[sha]["label"] == truth and done[sha]["source"] == "user"
        assert (photos / done[sha]["copy"]).is_file()
        labelled = sum(e["source"] != "training" for e in done.values())

        browser.get(url)  # the tab reloaded: the labelling is where it was, from the file
        _tab(browser, "Label").click()
        again, figures = _grid(browser)
        assert again == label and figures
        assert browser.find_element(By.CSS_SELECTOR, "#vf-label-folder textarea, #vf-label-folder input"
                                    ).get_attribute("value") == str(folder)
        figures[0].find_element(By.CSS_SELECTOR, ".vf-no").click()  # ✗: left for later
        summary = _accept(browser)
        assert "1 unticked, left for later" in summary
        now = json.loads(state_path(photos).read_text())["entries"]
        assert sum(e["source"] != "training" for e in now.values()) == labelled + len(figures) - 1

    with _app(args, log_path, gradio_dir) as url:  # the app restarted: the same again
        browser.get(url)
        _tab(browser, "Label").click()
        label, figures = _grid(browser)
        summary = browser.find_element(By.ID, "vf-label-summary").text
        assert "Labelled: " in summary and figures
        while figures:  # every photo labelled, a grid at a time
            summary = _accept(browser)
            label, figures = _grid(browser) if browser.find_elements(By.CSS_SELECTOR, "#vf-label-grid[data-label]") \
                else (None, [])
        WebDriverWait(browser, 30).until(ec.text_to_be_present_in_element((By.ID, "vf-label-grid-box"),
                                                                          "Nothing left to check"))
    final = json.loads(state_path(photos).read_text())["entries"]
    assert sum(e["source"] != "training" for e in final.values()) == 15
    assert file_digests(folder) == before  # the user's folder: not a byte changed
