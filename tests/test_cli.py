"""The ``vit-flowers`` entry point (vit_flowers/cli.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import vit_flowers
from vit_flowers import cli

ROOT = Path(__file__).resolve().parents[1]


def test_version_exits_0_and_prints_the_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"vit-flowers {vit_flowers.__version__}"


def test_version_from_the_command_line():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "vit_flowers.cli", "--version"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"vit-flowers {vit_flowers.__version__}"
