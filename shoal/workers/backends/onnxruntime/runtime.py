"""Importing ONNX Runtime: the package is an optional extra, so a missing one is a load error
that says how to install it (never an ImportError traceback)."""

from __future__ import annotations

from typing import Any

from shoal.errors import ErrorCode, ShoalError

EXTRA = "onnx"
INSTALL_HINT = f"pip install 'shoal[{EXTRA}]' (or pip install onnxruntime)"


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module; UNSUPPORTED naming the extra when it is not installed."""
    try:
        import onnxruntime  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise ShoalError(ErrorCode.UNSUPPORTED,
                         f"the onnxruntime backend is not installed: {INSTALL_HINT} "
                         f"({exc})") from None
    return onnxruntime
