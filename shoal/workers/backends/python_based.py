"""Where a Triton-style python-based backend's ``model.py`` is: ``<backend_directory>/<name>/``
holds a ``model.py`` (a ``TritonPythonModel``) and no shoal backend module of that name
(``registry.py``'s search order, step 3). Used by the worker's registry to run it and by the
broker to run its ``auto_complete_config`` (Triton completes such a model's config from the
backend's file). No imports beyond the standard library: the broker calls it.
"""

from __future__ import annotations

import os

MODULE_PREFIX = "shoal_backend_"


def shoal_module_in(name: str, directory: str) -> bool:
    """``directory`` has ``shoal_backend_<name>.py`` or the package ``shoal_backend_<name>/``."""
    return (os.path.isfile(os.path.join(directory, f"{MODULE_PREFIX}{name}.py"))
            or os.path.isfile(os.path.join(directory, f"{MODULE_PREFIX}{name}", "__init__.py")))


def python_based_backend_file(name: str, backend_directory: str) -> str | None:
    """``<backend_directory>/<name>/model.py`` when backend ``name`` is a python-based backend
    there, else None."""
    if not backend_directory or not name:
        return None
    directory = os.path.join(backend_directory, name)
    model_py = os.path.join(directory, "model.py")
    if shoal_module_in(name, directory) or not os.path.isfile(model_py):
        return None
    return model_py
