"""Importing a Triton python model file the way Triton's stub does.

Triton appends the version dir and the model dir to ``sys.path`` and imports the file as module
``<version>.model``, so a model can import sibling files directly (``import helpers``) or
relatively (``from .helpers import x``). shoal does the same under a unique package name per load
(``_shoal_pymodel_<n>``), so two models (or two loads of one) never share module objects.
``triton_python_backend_utils`` (and ``c_python_backend_utils``, ``c_utils.py``) is installed
in ``sys.modules`` first.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import types

from shoal.errors import invalid_arg
from shoal.workers.backends.python import c_utils, pb_utils

PB_UTILS_MODULE = "triton_python_backend_utils"
C_UTILS_MODULE = "c_python_backend_utils"  # the stub's compiled module, imported by a few
_load_counter = itertools.count()


def install_pb_utils() -> None:
    sys.modules[PB_UTILS_MODULE] = pb_utils
    sys.modules[C_UTILS_MODULE] = c_utils


def import_model_file(model_path: str) -> types.ModuleType:
    """Import ``model_path`` (``<model_dir>/<version>/<file>.py``) and return the module.

    Raises INVALID_ARG when the file does not exist; exceptions raised by the model's own
    top-level code propagate unchanged.
    """
    if not os.path.isfile(model_path):
        raise invalid_arg(f"python model file '{os.path.basename(model_path)}' not found")
    install_pb_utils()
    version_dir = os.path.dirname(os.path.abspath(model_path))
    model_dir = os.path.dirname(version_dir)
    for directory in (version_dir, model_dir):
        if directory not in sys.path:
            sys.path.append(directory)
    package_name = f"_shoal_pymodel_{next(_load_counter)}"
    package = types.ModuleType(package_name)
    package.__path__ = [version_dir]
    package.__package__ = package_name
    sys.modules[package_name] = package
    stem = os.path.splitext(os.path.basename(model_path))[0]
    spec = importlib.util.spec_from_file_location(f"{package_name}.{stem}", model_path)
    if spec is None or spec.loader is None:
        raise invalid_arg(f"cannot import python model file '{os.path.basename(model_path)}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        del sys.modules[package_name]
        raise
    return module
