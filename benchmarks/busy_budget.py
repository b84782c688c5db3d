"""The whole command against its time budget on a busy machine (#62): a laptop is rarely idle, so a budget must hold
while other work shares the cores. Starts ``--busy`` processes that spin on the CPU (each stops by itself after
``--busy-seconds``), runs one training command beside them, and reports its wall time against its budget; then the
same command with nothing beside it, for the cost of the load. Each command runs in a fresh process from the
checkout given by ``--checkout`` (default: this one), so two checkouts (before / after a change) compare alike.

    python benchmarks/busy_budget.py --work /tmp/busy                                   # the demo, 3-minute budget
    python benchmarks/busy_budget.py --work /tmp/busy --data ../shared/data/flowers5 --budget 2
    python benchmarks/busy_budget.py --work /tmp/busy --checkout /tmp/before --busy 4 --skip-idle

Prints one markdown row a command (machine, load, budget, wall time, ratio, epochs, val accuracy) and writes them to
``WORK/busy_budget.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, machine

from vit_flowers.runs import folders as runs

logger = logging.getLogger("benchmarks.busy_budget")

SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def spinners(n: int, seconds: float) -> list[subprocess.Popen]:
    """``n`` processes each keeping one core busy for ``seconds`` (then they end by themselves)."""
    return [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=seconds)]) for _ in range(n)]


def run_train(checkout: Path, out: Path, name: str, data: str | None, budget: float) -> dict:
    """One ``python -m vit_flowers.train`` from ``checkout``: its wall time, epochs and last val accuracy."""
    command = [sys.executable, "-m", "vit_flowers.train", "--out-dir", str(out), "--run-name", name,
               "--time-budget", f"{budget:g}", "--progress", "false"]
    if data:
        command += ["--data", data]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=checkout)
    wall = time.perf_counter() - start
    (out / f"{name}.log").write_text(result.stderr)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    rows = list(csv.DictReader((out / name / runs.METRICS).open()))
    stopped = sum("it stops after" in line for line in result.stderr.splitlines())
    return {"wall_s": wall, "budget_s": 60 * budget, "ratio": wall / (60 * budget), "epochs": len(rows),
            "val_acc": float(rows[-1]["val_acc"]) if rows else float("nan"), "epochs_cut_short": stopped}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="where the runs go")
    p.add_argument("--checkout", default=str(ROOT), help="the checkout whose vit_flowers runs (default: this one)")
    p.add_argument("--data", help="a folder of photos (default: the synthetic demo)")
    p.add_argument("--budget", type=float, default=3.0, help="--time-budget, minutes (default: %(default)s)")
    p.add_argument("--busy", type=int, default=4, help="spinning processes beside the run (default: %(default)s)")
    p.add_argument("--skip-idle", action="store_true", help="only the busy run")
    args = p.parse_args()
    work, checkout = Path(args.work), Path(args.checkout).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results = []
    arms = [("busy", args.busy)] + ([] if args.skip_idle else [("idle", 0)])
    for label, busy in arms:
        procs = spinners(busy, 60 * args.budget * 3)
        try:
            name = f"{label}-{time.strftime('%H%M%S')}"
            found = run_train(checkout, work / "runs", name, args.data, args.budget)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        found.update(arm=label, busy_processes=busy, checkout=str(checkout), data=args.data or "synthetic demo")
        results.append(found)
        logger.info("| %s | %s | %d busy | %.0f s budget | %.0f s (%.2fx) | %d epochs (%d cut short) | val %.1f%% |",
                    machine(), found["data"], busy, found["budget_s"], found["wall_s"], found["ratio"],
                    found["epochs"], found["epochs_cut_short"], 100 * found["val_acc"])
    (work / "busy_budget.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
