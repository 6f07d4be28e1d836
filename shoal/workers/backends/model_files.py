"""Where auto-complete finds a model's file: the broker reads the newest version that has one."""

from __future__ import annotations

import os
from collections.abc import Callable


def newest_version_path(model_dir: str, filename: str,
                        usable: Callable[[str], str | None]) -> str | None:
    """``usable(<model_dir>/<version>/<filename>)`` for the highest numeric version directory
    (Triton's rule: ASCII digits, no leading zero except "0" itself) where it is not None; None
    when no version has it. ``usable`` returns the path to read (possibly resolved further, e.g.
    a directory's inner file) or None."""
    versions = sorted((int(d) for d in os.listdir(model_dir)
                       if d.isascii() and d.isdigit() and (d == "0" or d[0] != "0")),
                      reverse=True)
    for version in versions:
        path = usable(os.path.join(model_dir, str(version), filename))
        if path is not None:
            return path
    return None


def existing_path(path: str) -> str | None:
    return path if os.path.exists(path) else None


def existing_file(path: str) -> str | None:
    return path if os.path.isfile(path) else None


def existing_dir(path: str) -> str | None:
    return path if os.path.isdir(path) else None
