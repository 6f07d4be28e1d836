"""Finding a backend by name, in Triton's search order (docs/architecture.md §7).

``create_backend(name, model_dir, version_dir, backend_directory)`` looks, in order, for:

1. ``<version_dir>/shoal_backend_<name>.py`` or the package ``<version_dir>/shoal_backend_<name>/``
2. the same in ``<model_dir>/``
3. the same in ``<backend_directory>/<name>/``; failing that, a Triton-style python-based backend
   ``<backend_directory>/<name>/model.py`` (a ``TritonPythonModel`` run by the python backend)
4. an installed entry point in group ``shoal.backends`` whose name is the backend name
5. the built-ins, each with its entry in its own folder (``catalog.py``): ``python``,
   ``pytorch`` (alias ``pytorch_libtorch``), ``onnxruntime`` (alias ``onnxruntime_onnx``; needs
   the ``onnx`` extra), ``fil`` (tree models; needs the ``trees`` extra), ``openvino`` (when
   the ``openvino`` package is installed: the ``openvino`` extra),
   ``tensorflow`` (SavedModels, when TensorFlow is installed: the ``tensorflow`` extra),
   ``llm`` and ``identity`` (Triton's test backend: ``INPUT<n>`` answered as ``OUTPUT<n>``);
   Triton's ``tensorrt``, ``dali`` (and ``openvino`` or ``tensorflow`` without its
   package) are refused as not installed, saying how to serve such a model here
   (``not_built_in.py``)

An out-of-tree module (1-3) must define ``ShoalBackend``, and an entry point must point at, a class
implementing ``shoal.workers.backends.base.Backend`` that takes no constructor arguments (the
backend learns everything in ``load``). Backend names are ``[A-Za-z0-9_.-]+``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import logging
import os
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.workers.backends.base import Backend
from shoal.workers.backends.catalog import builtin_backend, builtin_backends
from shoal.workers.backends.not_built_in import not_built_in
from shoal.workers.backends.python_based import MODULE_PREFIX, python_based_backend_file

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "shoal.backends"
BACKEND_CLASS = "ShoalBackend"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_import_counter = itertools.count()


def create_backend(name: str, model_dir: str, version_dir: str,
                   backend_directory: str = "") -> Backend:
    """A new, not yet loaded backend instance for ``name`` (see the module docstring)."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise invalid_arg(f"invalid backend name '{name}'")
    for directory in (version_dir, model_dir):
        backend = _from_directory(name, directory)
        if backend is not None:
            return backend
    if backend_directory:
        backend = _from_backend_directory(name, os.path.join(backend_directory, name))
        if backend is not None:
            return backend
    backend = _from_entry_point(name)
    if backend is not None:
        return backend
    factory = _builtin(name)
    if factory is not None:
        return factory()
    known_elsewhere = not_built_in(name)
    if known_elsewhere is not None:
        raise known_elsewhere
    raise ShoalError(
        ErrorCode.INVALID_ARG,
        f"unknown backend '{name}': no {MODULE_PREFIX}{name}.py in the model's version or model "
        f"directory, no '{name}' in the backend directory, no '{ENTRY_POINT_GROUP}' entry point "
        f"named '{name}', and not a built-in backend ({', '.join(builtin_names())})")


def builtin_names() -> list[str]:
    """The installed built-ins' names (not aliases), sorted."""
    return sorted({e.name for e in builtin_backends().values() if e.installed()})


def _from_directory(name: str, directory: str) -> Backend | None:
    module_file = os.path.join(directory, f"{MODULE_PREFIX}{name}.py")
    package_init = os.path.join(directory, f"{MODULE_PREFIX}{name}", "__init__.py")
    for path, is_package in ((module_file, False), (package_init, True)):
        if os.path.isfile(path):
            logger.info("backend '%s' from out-of-tree module %s", name, path)
            return _instantiate(name, _import_file(name, path, is_package))
    return None


def _from_backend_directory(name: str, directory: str) -> Backend | None:
    backend = _from_directory(name, directory)
    if backend is not None:
        return backend
    model_py = python_based_backend_file(name, os.path.dirname(directory))
    if model_py is not None:
        from shoal.workers.backends.python.backend import PythonBackend

        logger.info("backend '%s' is a python-based backend (%s)", name, model_py)
        return PythonBackend(model_path=model_py)
    return None


def _from_entry_point(name: str) -> Backend | None:
    matches = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)
    for entry_point in matches:
        logger.info("backend '%s' from entry point %s", name, entry_point.value)
        backend_class = entry_point.load()
        return _construct(name, backend_class, f"entry point '{entry_point.value}'")
    return None


def _builtin(name: str) -> Callable[[], Backend] | None:
    """The built-in's factory (``catalog.py``), or None: unknown, or its package missing."""
    entry = builtin_backend(name)
    if entry is None or not entry.installed():
        return None
    return entry.make


def _import_file(name: str, path: str, is_package: bool) -> ModuleType:
    module_name = f"_{MODULE_PREFIX}{name.replace('.', '_').replace('-', '_')}_" \
                  f"{next(_import_counter)}"
    locations = [os.path.dirname(path)] if is_package else None
    spec = importlib.util.spec_from_file_location(module_name, path,
                                                  submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise invalid_arg(f"cannot import backend module '{MODULE_PREFIX}{name}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _instantiate(name: str, module: ModuleType) -> Backend:
    backend_class = getattr(module, BACKEND_CLASS, None)
    if backend_class is None:
        raise invalid_arg(f"backend module '{MODULE_PREFIX}{name}' does not define class "
                          f"{BACKEND_CLASS}")
    return _construct(name, backend_class, f"module '{MODULE_PREFIX}{name}'")


def _construct(name: str, backend_class: Any, origin: str) -> Backend:
    backend = backend_class()
    for method in ("load", "execute", "unload"):
        if not callable(getattr(backend, method, None)):
            raise invalid_arg(f"backend '{name}' from {origin} does not implement {method}()")
    result: Backend = backend
    return result
