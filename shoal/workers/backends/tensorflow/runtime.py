"""Importing TensorFlow: the package is an optional extra, so a missing one is a load error that
says how to install it (never an ImportError traceback). Imported only in a worker's ``load``
(the broker reads signatures without it, ``signature.py``)."""

from __future__ import annotations

import os
from typing import Any

from shoal.errors import ErrorCode, ShoalError

EXTRA = "tensorflow"
INSTALL_HINT = f"pip install 'shoal[{EXTRA}]' (or pip install tensorflow-cpu)"


def tensorflow_installed() -> bool:
    """Whether ``import tensorflow`` can succeed, without importing it (seconds, and threads)."""
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None


def import_tensorflow() -> Any:
    """The ``tensorflow`` module; UNSUPPORTED naming the extra when it is not installed. TF's
    C++ INFO and WARNING lines are off unless the environment sets TF_CPP_MIN_LOG_LEVEL."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise ShoalError(ErrorCode.UNSUPPORTED,
                         f"the tensorflow backend is not installed: {INSTALL_HINT} "
                         f"({exc})") from None
    return tensorflow
