"""The web app's start-up time and the time it takes to answer one photo.

    python benchmarks/app_latency.py --checkpoint checkpoints/latest --photo photo.jpg
    python benchmarks/app_latency.py --checkpoint checkpoints/latest --photo photo.jpg --starts 3 --rounds 10

Start-up: ``python -m vit_flowers.app`` in a fresh process until its page answers 200 (``--starts`` times), and
until it has answered its first photo. One photo: :func:`vit_flowers.app_engine.classify_files` + the HTML in this
process (decode, model, attention rollout, overlay), and the page's round trip through ``gradio_client``
(upload, queue, classify, result back: what the browser waits for, less drawing it). Medians, in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import harness  # noqa: F401  (puts the checkout on sys.path; after Gradio's setting)

from vit_flowers.app import engine as app_engine
from vit_flowers.app import page, server
from vit_flowers.cli import open_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(checkpoint: str) -> Iterator[tuple[Any, float, float]]:
    """A fresh ``python -m vit_flowers.app`` on a free port: yields (a gradio_client Client of it, the process's
    start time, seconds until its page answered); stops it afterwards."""
    from gradio_client import Client

    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "vit_flowers.app", "--checkpoint", checkpoint, "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        server.wait_until_serving(url, timeout=120, process=proc)
        yield Client(url, verbose=False), start, time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(20)


def classify_through_page(client: Any, photo: Path) -> float:
    """Seconds for one photo: upload, queue, classify, the result back."""
    from gradio_client import handle_file

    t = time.perf_counter()
    html = client.predict([handle_file(str(photo))], api_name="/classify")
    assert "vf-confidence" in html, html[:300]
    return time.perf_counter() - t


def start_once(checkpoint: str, photo: Path) -> tuple[float, float, float]:
    """(seconds to the page answering, seconds to the first photo answered, that first photo's round trip)."""
    with serving(checkpoint) as (client, start, page):
        first = classify_through_page(client, photo)
        return page, time.perf_counter() - start, first


def round_trips(checkpoint: str, photo: Path, rounds: int) -> list[float]:
    """The page's answer to one photo, ``rounds`` times, on one warm app (after one warm-up photo)."""
    with serving(checkpoint) as (client, _, _):
        classify_through_page(client, photo)
        return [classify_through_page(client, photo) for _ in range(rounds)]


def in_process(checkpoint: str, photo: Path, rounds: int) -> list[float]:
    engine = app_engine.Engine(open_model(checkpoint))
    page.classify_html(app_engine.classify_files(engine, [photo]), engine.rule)  # warm-up
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        page.classify_html(app_engine.classify_files(engine, [photo]), engine.rule)
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint file or run folder")
    p.add_argument("--photo", required=True, type=Path, help="the photo to classify")
    p.add_argument("--starts", type=int, default=3, help="fresh app processes to time (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=10, help="photos per warm measurement (default: %(default)s)")
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    starts = [start_once(args.checkpoint, args.photo) for _ in range(args.starts)]
    med = statistics.median
    print(f"start-up to the page answering: {med(s[0] for s in starts):.2f} s "
          f"({', '.join(f'{s[0]:.2f}' for s in starts)})")
    print(f"start-up to the first photo answered: {med(s[1] for s in starts):.2f} s "
          f"(first photo's round trip {med(s[2] for s in starts):.3f} s)")
    local = in_process(args.checkpoint, args.photo, args.rounds)
    print(f"classify one photo in-process (decode, model, rollout, overlay, HTML): {med(local) * 1000:.0f} ms "
          f"(min {min(local) * 1000:.0f})")
    trips = round_trips(args.checkpoint, args.photo, args.rounds)
    print(f"one photo through the page (upload, queue, classify, result): {med(trips) * 1000:.0f} ms "
          f"(min {min(trips) * 1000:.0f})")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
