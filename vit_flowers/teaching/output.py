"""Where ``teach`` writes its new run (``--output``): the checks before anything is read, and the write itself, in
one go at the end.

An output is refused when it is the run being taught or inside it, a link or a file, holds a run (unless
``--overwrite``), or holds other files (a user's, never deleted or mixed with a run's). The new run is written into a
hidden staging folder beside it and renamed into place at the end: an exception or Ctrl-C leaves nothing of it (and,
with ``--overwrite``, the old run where it was).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..runs import folders as runs
from ..runs.checkpoint import Checkpoint, save_checkpoint

__all__ = ["check_output", "write_run"]


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def check_output(source_dir: Path, output: Path, overwrite: bool) -> None:
    """ValueError / RunExistsError with one line naming ``--output`` when teach may not write ``output`` (see the
    module's docstring); writes nothing."""
    where, source = output.resolve(), source_dir.resolve()
    if where == source or source in where.parents:
        raise ValueError(f"--output {output} is {'' if where == source else 'inside '}the run being taught "
                         f"({source_dir}): teach never changes it; choose a new folder")
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise ValueError(f"--output {output} is {'a link' if output.is_symlink() else 'a file'}: choose a new folder")
    if not output.is_dir():
        return
    held = runs.results_in(output)
    if held and not overwrite:
        raise runs.RunExistsError(f"--output {output} already holds a run ({', '.join(held)}): choose a new folder, "
                                  f"or replace it with --overwrite")
    found = sorted(p.name for p in output.iterdir())
    foreign = [name for name in found if name not in runs.RUN_FILES] if held else found
    if foreign:
        raise ValueError(f"--output {output} holds files that are not a run's ({_listed(foreign)}): teach neither "
                         f"mixes a run with them nor deletes them; choose a new folder")


def write_run(output: Path, overwrite: bool, state: Checkpoint, source_dir: Path) -> None:
    """The new run folder: ``state`` as best.pt, and the trained run's config.yaml and split.json (what its photos
    were), written into a staging folder beside ``output`` and renamed into place (``overwrite``: the old run moved
    aside first, deleted once the new one is in place). On any failure nothing of it is left."""
    staging = output.parent / f".{output.name}.teach-{os.getpid()}.tmp"
    made = runs.make_run_dir(staging)
    try:
        for name in (runs.CONFIG, runs.SPLIT):
            if (source_dir / name).is_file():
                shutil.copyfile(source_dir / name, staging / name)
        save_checkpoint(state, staging / runs.BEST)
        _into_place(staging, output, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        runs.remove_new_folders(made[1:])
        raise


def _into_place(staging: Path, output: Path, overwrite: bool) -> None:
    """Rename ``staging`` to ``output``: over an empty folder, or (``overwrite``) over a run, which is moved aside
    first and put back when the rename fails."""
    if not (overwrite and output.is_dir() and any(output.iterdir())):
        if output.is_dir():
            output.rmdir()  # empty (check_output): os.replace would not replace it on every system
        os.replace(staging, output)
        return
    aside = output.parent / f".{output.name}.replaced-{os.getpid()}.tmp"
    os.replace(output, aside)
    try:
        os.replace(staging, output)
    except BaseException:
        os.replace(aside, output)
        raise
    shutil.rmtree(aside, ignore_errors=True)
