"""The web app's Train tab end to end in a real browser: classes of flowers5 photos made in the page, trained with the
page's default length; the wall time from the Train click to a usable model (the page has switched to the new run),
the progress bar's updates per minute, and the new run's accuracy on held-out photos of the same classes.

    python benchmarks/app_train.py --data ../shared/data/flowers5 --per-class 30 --work /tmp/app-train --cli
    python benchmarks/app_train.py --data ../shared/data/flowers5 --folder --work /tmp/app-folder --cli

``--cli`` then trains the same photos with ``python -m vit_flowers.train --data PHOTOS --time-budget 2`` (the page's
default length; the same split and seed), timed from the outside as the page is; ``--folder`` types ``--data``
itself into the PHOTOS folder box (the app started with ``--allow-folders``) and scores the run on its own
validation split only.

Headless Chromium and chromedriver (Debian: apt-get install chromium chromium-driver) and Selenium (the dev extra).
The photos given to the page: ``--per-class`` of each class folder drawn with ``--seed``; held out: up to
``--held-out`` others of each class, copied into ``WORK/held-out`` and scored with ``python -m vit_flowers.evaluate``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import harness  # noqa: F401  (puts the checkout on sys.path)
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from vit_flowers.app.server import wait_until_serving
from vit_flowers.app.train_tab import DEFAULT_MINUTES
from vit_flowers.runs import folders as runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _choose(data: Path, per_class: int, held_out: int, seed: int, work: Path) -> dict[str, list[Path]]:
    """The photos given to the page, by class; the held-out ones copied into ``work/held-out/<class>/`` (a link
    out of a class folder is not followed)."""
    rng = random.Random(seed)
    given = {}
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.jpg"))
        rng.shuffle(files)
        given[folder.name] = files[:per_class]
        out = work / "held-out" / folder.name
        out.mkdir(parents=True)
        for f in files[per_class:per_class + held_out]:
            shutil.copy2(f, out / f.name)
    return given


def _browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000",
                 "--disable-dev-shm-usage"):
        options.add_argument(flag)
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")),
                            options=options)


def _make_classes(driver: webdriver.Chrome, given: dict[str, list[Path]]) -> None:
    for slot, (name, files) in enumerate(given.items()):
        if slot >= 2:
            driver.find_element(By.ID, "vf-class-add").click()
            WebDriverWait(driver, 20).until(ec.visibility_of_element_located((By.ID, f"vf-class-{slot}")))
        driver.find_element(By.CSS_SELECTOR, f"#vf-class-{slot}-name input, #vf-class-{slot}-name textarea"
                            ).send_keys(name)
        driver.find_element(By.CSS_SELECTOR, f"#vf-class-{slot}-photos input[type=file]").send_keys(
            "\n".join(str(f.resolve()) for f in files))
        WebDriverWait(driver, 120).until(ec.text_to_be_present_in_element(
            (By.ID, "vf-train-check"), f"{name}: {len(files)} photo(s)"))


def _train(driver: webdriver.Chrome, timeout: float) -> tuple[float, list[tuple[float, str]]]:
    """Click Train; (seconds until the page uses the new run, [(second, progress text)] at each change)."""
    driver.find_element(By.ID, "vf-train-go").click()
    start, changes, last = time.perf_counter(), [], None
    while time.perf_counter() - start < timeout:
        bar = driver.find_element(By.CSS_SELECTOR, "#vf-train-progress .vf-progress")
        state, text = bar.get_attribute("data-state"), bar.text
        if text != last:
            changes.append((time.perf_counter() - start, text))
            last = text
        if state in ("done", "failed", "cancelled"):
            if state != "done":
                raise SystemExit(f"the training {state}: {text}")
            WebDriverWait(driver, 30).until(ec.text_to_be_present_in_element((By.ID, "vf-header"), "classes"))
            return time.perf_counter() - start, changes
        time.sleep(0.25)
    raise SystemExit(f"no model after {timeout:.0f} s")


def _page(args: argparse.Namespace, given: dict[str, list[Path]] | None) -> dict:
    """Start the app, make the classes (``given``; None: type ``--data`` as the PHOTOS folder), train with the
    page's default length; the run, the seconds to a usable model and the progress bar's changes."""
    port, home = _free_port(), args.work / "runs"
    folders = ["--allow-folders"] if given is None else []
    with open(args.work / "app.log", "w") as log:
        app = subprocess.Popen([sys.executable, "-m", "vit_flowers.app", "--work-dir", str(home), "--port", str(port),
                                *folders], stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "GRADIO_TEMP_DIR": str(args.work / "gradio")})
        driver = _browser()
        try:
            wait_until_serving(f"http://127.0.0.1:{port}/", 120, app)
            driver.get(f"http://127.0.0.1:{port}/")
            WebDriverWait(driver, 60).until(ec.presence_of_element_located((By.ID, "vf-class-0-name")))
            if given is None:
                _give_folder(driver, args.data)
            else:
                _make_classes(driver, given)
            seconds, changes = _train(driver, args.timeout)
        finally:
            driver.quit()
            app.terminate()
            app.wait(30)
    (run,) = [d for d in home.iterdir() if d.is_dir() and not d.is_symlink() and not d.name.endswith("-photos")]
    (args.work / "progress.json").write_text(json.dumps(changes, indent=0))  # every change: where the waits were
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    longest = max(range(len(gaps)), key=gaps.__getitem__, default=None)
    return {"run": str(run), "seconds_to_model": round(seconds, 1), "val_accuracy": _val_accuracy(run),
            "progress_changes": len(changes), "progress_per_minute": round(60 * len(changes) / seconds, 1),
            "longest_gap_s": round(max(gaps, default=0.0), 1),
            "longest_gap_between": changes[longest:longest + 2] if longest is not None else []}


def _give_folder(driver: webdriver.Chrome, folder: Path) -> None:
    box = driver.find_element(By.CSS_SELECTOR, "#vf-train-folder input, #vf-train-folder textarea")
    box.send_keys(str(folder.resolve()))
    driver.execute_script("arguments[0].blur()", box)  # the box loses the focus: the page checks the folder
    WebDriverWait(driver, 300).until(ec.text_to_be_present_in_element((By.ID, "vf-train-check"), "photo(s)"))


def _val_accuracy(run: Path) -> float:
    return json.loads((run / runs.REPORT / "metrics.json").read_text())["accuracy"]


def _cli(photos: Path, minutes: float, out: Path) -> dict:
    """``train --data photos --time-budget minutes``, timed from the outside as the page is."""
    start = time.perf_counter()
    with open(out.parent / "cli.log", "w") as log:
        subprocess.run([sys.executable, "-m", "vit_flowers.train", "--data", str(photos), "--time-budget",
                        f"{minutes:g}", "--out-dir", str(out)], check=True, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    (run,) = [d for d in out.iterdir() if d.is_dir() and not d.is_symlink()]
    return {"cli_seconds": round(seconds, 1), "cli_val_accuracy": _val_accuracy(run)}


def _held_out(run: Path, work: Path) -> dict:
    subprocess.run([sys.executable, "-m", "vit_flowers.evaluate", "--checkpoint", str(run), "--data",
                    str(work / "held-out"), "--output", str(work / "held-out-report")], check=True,
                   stdout=subprocess.DEVNULL)
    metrics = json.loads((work / "held-out-report" / "metrics.json").read_text())
    return {"held_out_accuracy": metrics["accuracy"], "held_out_photos": metrics["n_images"]}


def _peer(given: dict[str, list[Path]], work: Path) -> dict:
    """The frozen-feature peer on the photos given to the page (Lite0's pooled features, a logistic regression at
    C 0.1, #60's), scored on the same held-out photos."""
    from harness import frozen_lite, peer_accuracy, pooled_features

    from vit_flowers.data.datasets import cache_images
    from vit_flowers.data.splits import scan_class_folders

    classes, held = scan_class_folders(work / "held-out")
    net = frozen_lite("lite0")
    ds = cache_images([p for p, _ in held], [y for _, y in held], classes, 224, desc="held out", progress=False)
    test = (pooled_features(net, ds.images, 224).numpy(), ds.labels.numpy())
    train = [(path, classes.index(name)) for name, paths in given.items() for path in paths]
    return {"peer_held_out_accuracy": peer_accuracy(train, test, classes, net, 0.1)[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="flowers5 (one folder per class)")
    p.add_argument("--per-class", type=int, default=30)
    p.add_argument("--held-out", type=int, default=100, help="held-out photos per class scored after")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, required=True, help="a new folder: the runs, the held-out links, the log")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--folder", action="store_true",
                   help="give the page --data itself as its PHOTOS folder (the app with --allow-folders); no held out")
    p.add_argument("--cli", action="store_true",
                   help="then train the same photos with `train --data PHOTOS --time-budget 2` (the page's default)")
    args = p.parse_args()
    args.work.mkdir(parents=True)
    given = None if args.folder else _choose(args.data, args.per_class, args.held_out, args.seed, args.work)
    result = {"classes": len(given) if given else "folder", "per_class": args.per_class if given else "all"}
    result.update(_page(args, given))
    run = Path(result["run"])
    if given:
        result.update(_held_out(run, args.work))
        result.update(_peer(given, args.work))
    if args.cli:
        photos = args.data if given is None else run.parent / f"{run.name}-photos"
        result.update(_cli(photos, DEFAULT_MINUTES, args.work / "cli"))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
