"""Memory and start-up of ``train --data`` at 10,000 to 100,000 photos (issue #53): the peak anonymous resident
memory (RssAnon: what the OS cannot drop; a memory-mapped file's pages it can) of the whole command, and how soon its
first epoch starts, on a first run and on a second run over the same photos (the photo cache's reuse).

The photos are made up here (``make``): small JPEGs of varied content (shapes, gradients and noise in colours of
their class), 5-100 classes, written where you say, never into the repository. ``run`` starts one training command
as a child, polls ``/proc/PID/status`` every 0.2 s, times its log lines as they arrive, and prints one JSON line.

    python benchmarks/memory_at_scale.py make --photos 10000 --classes 20 --out /tmp/made10k
    python benchmarks/memory_at_scale.py run --data /tmp/made10k --cache /tmp/cache --label first
    python benchmarks/memory_at_scale.py run --data /tmp/made10k --cache /tmp/cache --label second
    python benchmarks/memory_at_scale.py run --data /tmp/made10k --python OTHER/bin/python --label main
    python benchmarks/memory_at_scale.py watch --cache /tmp/cache --label eval -- evaluate --checkpoint RUN/best.pt

``--cache`` is the child's ``XDG_CACHE_HOME`` (so an older version without ``--cache-dir`` runs the same command);
``--max-seconds`` stops the command (Ctrl-C, then a kill) after that long and reports what it saw until then.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter

EVENTS = {  # what a log line starting so marks, the first time it is seen
    "data": "data:",  # the photos scanned, split and decoded
    "trunk": "token cache:",  # the trunk's pass done: the head start's first epoch starts
    "epoch1": "epoch 1/",  # the first epoch done
}


_STAMP = re.compile(r"^\d\d:\d\d:\d\d (INFO|WARNING|ERROR) ")


def _photo(args: tuple[Path, int, int, int]) -> None:
    """One made-up JPEG: a gradient, ellipses and rectangles in colours of its class, noise, a blur."""
    path, label, classes, seed = args
    rng = random.Random(seed)
    hue = label / classes
    w, h = rng.choice([(320, 240), (300, 300), (400, 300), (240, 320)])
    base = tuple(int(255 * (0.5 + 0.5 * math.sin(2 * math.pi * (hue + k / 3)))) for k in range(3))
    img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
    img = Image.blend(img, Image.new("RGB", (w, h), base), 0.6)
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(3, 12)):
        x, y, r = rng.randrange(w), rng.randrange(h), rng.randint(8, 80)
        colour = tuple(min(255, max(0, c + rng.randint(-90, 90))) for c in base)
        (draw.ellipse if rng.random() < 0.6 else draw.rectangle)((x - r, y - r, x + r, y + r), fill=colour)
    noise = Image.effect_noise((w, h), rng.uniform(10, 60)).convert("RGB")
    img = Image.blend(img, noise, 0.15).filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.5)))
    img.save(path, quality=rng.randint(70, 92))


def make(out: Path, photos: int, classes: int, workers: int) -> None:
    """``photos`` made-up JPEGs in ``out/class_NNN/`` (added to what is there: a folder of 10,000 grows to 30,000
    keeping its first 10,000)."""
    jobs = []
    for i in range(photos):
        label = i % classes
        folder = out / f"class_{label:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"made_{i:06d}.jpg"
        if not path.exists():
            jobs.append((path, label, classes, i))
    with Pool(workers) as pool:
        for done, _ in enumerate(pool.imap_unordered(_photo, jobs, chunksize=64), 1):
            if done % 5000 == 0:
                print(f"{done} of {len(jobs)} photos made", file=sys.stderr)
    print(f"{out}: {photos} photos in {classes} classes ({len(jobs)} made now)", file=sys.stderr)


def _rss_anon(pid: int) -> int:
    """The process's RssAnon in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def run(args: argparse.Namespace) -> dict:
    """One training command, watched: peak RssAnon, when each of :data:`EVENTS` was logged, the wall time."""
    out_dir = Path(tempfile.mkdtemp(prefix="memory-at-scale-"))
    cmd = [args.python, "-m", "vit_flowers.train", "--data", str(args.data), "--time-budget", str(args.time_budget),
           "--out-dir", str(out_dir), "--run-name", args.label, *args.extra]
    return watch(args, cmd, {"photos": sum(1 for _ in Path(args.data).rglob("*.jpg")),
                             "run_dir": str(out_dir / args.label)})


def watch(args: argparse.Namespace, cmd: list[str], facts: dict) -> dict:
    """``cmd`` run as a child, watched (``args``: cache, max_seconds, label, json): peak RssAnon, when each of
    :data:`EVENTS` was logged, the wall time; ``facts`` go into the result as they are."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.cache:
        env["XDG_CACHE_HOME"] = str(args.cache)
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict[str, float] = {}
    lines: list[str] = []

    def read() -> None:
        assert child.stderr is not None
        for raw in child.stderr:
            line = _STAMP.sub("", raw.rstrip())  # train's lines start with the time and the level
            lines.append(line)
            for name, prefix in EVENTS.items():
                if name not in seen and line.startswith(prefix):
                    seen[name] = time.perf_counter() - start

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak, peak_at, stopped = 0, 0.0, False
    rises: list[tuple[float, float, str]] = []  # (s, GB, the log's last line then): each 100 MB the peak rose by
    while child.poll() is None:
        now = _rss_anon(child.pid)
        if now > peak:
            peak, peak_at = now, time.perf_counter() - start
            if now > (rises[-1][1] * 1e9 if rises else 0) + 100e6:
                rises.append((round(peak_at, 1), round(now / 1e9, 2), lines[-1][:120] if lines else ""))
        if args.max_seconds and not stopped and time.perf_counter() - start > args.max_seconds:
            child.send_signal(signal.SIGINT)
            stopped = True
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
        time.sleep(0.2)
    reader.join(5)
    result = {
        "label": args.label, **facts,
        "peak_rss_anon_gb": round(peak / 1e9, 3), "peak_at_s": round(peak_at, 1),
        "wall_s": round(time.perf_counter() - start, 1),
        "stopped_at_s": args.max_seconds if stopped else None, "rc": child.returncode,
        **{f"{name}_s": round(t, 1) for name, t in seen.items()},
        "cache_gb": round(_folder_bytes(Path(args.cache)) / 1e9, 3) if args.cache else None,
        "rises": rises,
        "log_tail": [line for line in lines if line.startswith(("photo cache", "data:", "token cache", "the whole"))],
    }
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make", help="make up photos")
    m.add_argument("--photos", type=int, required=True)
    m.add_argument("--classes", type=int, default=20)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    r = sub.add_parser("run", help="run train --data on them, watched")
    r.add_argument("--data", type=Path, required=True)
    r.add_argument("--python", default=sys.executable, help="the Python whose vit_flowers runs (another checkout's)")
    r.add_argument("--cache", type=Path, help="the child's XDG_CACHE_HOME (default: yours)")
    r.add_argument("--label", default="run")
    r.add_argument("--time-budget", type=float, default=2)
    r.add_argument("--max-seconds", type=float, default=0, help="stop the command after this long (0: never)")
    r.add_argument("--json", type=Path, help="append the result here too")
    r.add_argument("extra", nargs="*", help="more train options (after --)")
    w = sub.add_parser("watch", help="any vit_flowers command (evaluate, predict, check), watched the same way")
    w.add_argument("--python", default=sys.executable)
    w.add_argument("--cache", type=Path, help="the child's XDG_CACHE_HOME (default: yours)")
    w.add_argument("--label", default="watch")
    w.add_argument("--max-seconds", type=float, default=0, help="stop the command after this long (0: never)")
    w.add_argument("--json", type=Path, help="append the result here too")
    w.add_argument("command", nargs="+", help="the module and its options, after --: evaluate --checkpoint RUN")
    args = parser.parse_args(argv)
    if args.what == "make":
        make(args.out, args.photos, args.classes, args.workers)
    elif args.what == "run":
        run(args)
    else:
        module, *options = args.command
        watch(args, [args.python, "-m", f"vit_flowers.{module}", *options], {"command": " ".join(args.command)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
