"""The ``vit-flowers`` entry point (vit_flowers/cli.py)."""

import argparse
import importlib
import os
import re
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


def test_vit_flowers_alone_lists_the_commands(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: vit-flowers")
    for name, (_, text) in cli.COMMANDS.items():
        assert f"  {name:<{cli.COMMAND_WIDTH}} {text}" in out


def test_a_command_started_from_vit_flowers_names_itself_so(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["predict", "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: vit-flowers predict [-h]")
    with pytest.raises(SystemExit):  # and as python -m vit_flowers.predict once that run is over
        importlib.import_module("vit_flowers.predict").main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m vit_flowers.predict [-h]")


def _parser(command: str) -> argparse.ArgumentParser:
    """The parser of one of the commands."""
    return importlib.import_module(cli.COMMANDS[command][0]).build_parser()


SPHINX = re.compile(r"``|:(func|mod|class|meth|data|attr):")
PRIVATE = re.compile(r"(?<!\w)_[A-Za-z]\w*")  # _Writer, predict._rows, ...


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_option_of_every_command_says_what_it_does(command):
    parser = _parser(command)
    for action in parser._actions:
        what = re.sub(r"\(default: (%\(default\)s|[^)]*)\)", "", action.help or "")
        assert len(what.split()) >= 3, (command, action.option_strings or action.dest, action.help)
    text = parser.format_help()
    assert not SPHINX.search(text), (command, SPHINX.search(text))
    assert not PRIVATE.search(text), (command, PRIVATE.search(text))


def test_train_options_list_their_choices_and_defaults():
    from vit_flowers.training.config import key_choices

    actions = {a.dest: a for a in _parser("train")._actions}
    for key in ("augment", "dataset", "model", "precision", "patch_embed", "lr_schedule"):
        assert actions[key].metavar == "{" + ",".join(key_choices()[key]) + "}", key
    assert "(default: trivial)" in actions["augment"].help
    assert "(default: true; --ema false turns it off)" in actions["ema"].help


def test_the_precision_choices_of_the_model_commands_are_those_of_precision_py():
    from vit_flowers.inference.precision import PRECISIONS

    predict = {a.dest: a for a in _parser("predict")._actions}
    assert tuple(predict["precision"].choices) == PRECISIONS


# Interrupts the first import of torch, as a Ctrl-C in a command's first seconds does: sitecustomize runs before the
# command's module, and its finder raises KeyboardInterrupt when torch is looked for
_INTERRUPT_AT_TORCH = '''import sys
class _Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, _Interrupt())
'''


@pytest.mark.parametrize("command", [["-m", "vit_flowers.train"], ["-m", "vit_flowers.predict", "x.jpg"],
                                     ["ENTRY", "evaluate"]])
def test_ctrl_c_while_a_command_imports_is_one_line(tmp_path, command):
    """Ctrl-C while a command imports torch: one line, no traceback, the exit of a SIGINT (#53)."""
    (tmp_path / "sitecustomize.py").write_text(_INTERRUPT_AT_TORCH)
    if command[0] == "ENTRY":  # the console script, as pip installed it beside this Python
        script = Path(sys.executable).parent / cli.ENTRY_POINT
        if not script.is_file():
            pytest.skip(f"no {cli.ENTRY_POINT} script beside {sys.executable}")
        command = [str(script), *command[1:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=60)
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines() == ["interrupted"], proc.stderr
    assert proc.returncode in (-2, 130)  # killed by SIGINT, as Python exits on an uncaught KeyboardInterrupt


def test_a_program_that_imports_the_package_keeps_its_own_hook():
    """Only a command's start installs the quiet hook: a library user's uncaught Ctrl-C keeps its traceback."""
    code = "import sys, vit_flowers; print(sys.excepthook is sys.__excepthook__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.strip() == "True", proc.stderr
