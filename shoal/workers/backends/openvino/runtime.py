"""Importing OpenVINO: the package is an optional extra, so a missing one is a load error that
says how to install it (never an ImportError traceback)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from shoal.errors import ErrorCode, ShoalError

EXTRA = "openvino"
INSTALL_HINT = f"pip install 'shoal[{EXTRA}]' (or pip install openvino)"


def openvino_installed() -> bool:
    """Whether the ``openvino`` package can be imported (without importing it)."""
    return importlib.util.find_spec("openvino") is not None


def import_openvino() -> Any:
    """The ``openvino`` module; UNSUPPORTED naming the extra when it is not installed."""
    try:
        import openvino  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise ShoalError(ErrorCode.UNSUPPORTED,
                         f"the openvino backend is not installed: {INSTALL_HINT} "
                         f"({exc})") from None
    return openvino


def openvino_message(exc: BaseException, path: str = "") -> str:
    """The useful line of an OpenVINO error: its last line that is not a "Exception from
    <source>" / "Check '...' failed at <source>" location line, with the model's absolute path
    cut down to ``<model>/<version>/<file>`` (messages never name absolute paths)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines
              if not line.startswith("Exception from") and not line.startswith("Check '")]
    text = (useful or lines or [type(exc).__name__])[-1]
    if not path:
        return text
    parts = os.path.normpath(path).split(os.sep)
    return text.replace(path, os.path.join(*parts[-3:]))
