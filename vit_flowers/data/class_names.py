"""The one rule for a class name that a user gives (``teach --add NAME=...`` and the app's Teach tab): a name that is
safe as a folder name, a CSV cell and a label, and is not the label of a photo that none of the classes fits.

Only the standard library: :mod:`vit_flowers.inference.unknown` (numpy only, for ONNX deployments) takes
:data:`UNKNOWN` from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["UNKNOWN", "MAX_NAME_LENGTH", "NAME_RULE", "check_class_name", "case_clash"]

UNKNOWN = "unknown"  # the label of a photo that the "none of these" rule rejects (never a class's name)
MAX_NAME_LENGTH = 64
NAME_RULE = (f"a class name has 1 to {MAX_NAME_LENGTH} characters, no '/', '\\', newline or other control "
             f"character, and is not '.', '..' or {UNKNOWN!r} (the label of a photo that none of the classes fits)")
_BAD = re.compile(r"[\x00-\x1f\x7f/\\]")  # control characters (a newline among them) and path separators


def check_class_name(name: str | None) -> str:
    """``name`` without surrounding spaces; ValueError with one line (the name as Python writes it, then
    :data:`NAME_RULE`) when it is empty, too long, holds a path separator or a control character, is ``.`` or
    ``..``, or is :data:`UNKNOWN` in any case."""
    cleaned = (name or "").strip()
    if (not cleaned or _BAD.search(cleaned) or cleaned in (".", "..") or len(cleaned) > MAX_NAME_LENGTH
            or cleaned.lower() == UNKNOWN):
        raise ValueError(f"class name {name or ''!r} refused: {NAME_RULE}")
    return cleaned


def case_clash(names: Iterable[str]) -> tuple[str, str] | None:
    """The first two of ``names`` that differ only in case ("Rose" and "rose"), or None. Such classes are one folder
    on a file system that ignores case (macOS, Windows), so a run's photos would differ from machine to machine, and
    a person cannot tell their labels apart."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            return other, name
    return None
