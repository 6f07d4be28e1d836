"""Backend search order: version dir, model dir, backend dir, entry points, built-ins."""

from __future__ import annotations

import importlib.metadata
import pathlib
from typing import Any

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.workers.backends import registry
from shoal.workers.backends.python.backend import PythonBackend
from shoal.workers.backends.pytorch.backend import PytorchBackend
from shoal.workers.backends.registry import create_backend
from tests.workers.helpers import write


def backend_module(origin: str) -> str:
    return f'''
class ShoalBackend:
    origin = "{origin}"
    def load(self, ctx): pass
    def execute(self, requests): return []
    def unload(self): pass
'''


class EntryPointBackend:
    origin = "entry point"

    def load(self, ctx: Any) -> None: ...
    def execute(self, requests: list[Any]) -> list[Any]: return []
    def unload(self) -> None: ...


@pytest.fixture
def dirs(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    model_dir = tmp_path / "repo" / "m"
    version_dir = model_dir / "1"
    backend_dir = tmp_path / "backends"
    for d in (version_dir, backend_dir):
        d.mkdir(parents=True)
    return model_dir, version_dir, backend_dir


def create(name: str, dirs: tuple[pathlib.Path, pathlib.Path, pathlib.Path]) -> Any:
    model_dir, version_dir, backend_dir = dirs
    return create_backend(name, str(model_dir), str(version_dir), str(backend_dir))


def test_version_dir_wins_over_model_dir_and_backend_dir(dirs: Any) -> None:
    model_dir, version_dir, backend_dir = dirs
    write(version_dir / "shoal_backend_custom.py", backend_module("version"))
    write(model_dir / "shoal_backend_custom.py", backend_module("model"))
    write(backend_dir / "custom" / "shoal_backend_custom.py", backend_module("backend dir"))
    assert create("custom", dirs).origin == "version"


def test_model_dir_is_searched_before_backend_dir(dirs: Any) -> None:
    model_dir, _, backend_dir = dirs
    write(model_dir / "shoal_backend_custom" / "__init__.py", backend_module("model package"))
    write(backend_dir / "custom" / "shoal_backend_custom.py", backend_module("backend dir"))
    assert create("custom", dirs).origin == "model package"


def test_backend_dir_module_then_python_based_backend(dirs: Any) -> None:
    _, _, backend_dir = dirs
    write(backend_dir / "custom" / "shoal_backend_custom.py", backend_module("backend dir"))
    assert create("custom", dirs).origin == "backend dir"
    write(backend_dir / "pyrt" / "model.py", "class TritonPythonModel: pass\n")
    assert isinstance(create("pyrt", dirs), PythonBackend)


def test_out_of_tree_module_overrides_a_builtin(dirs: Any) -> None:
    _, version_dir, _ = dirs
    write(version_dir / "shoal_backend_python.py", backend_module("override"))
    assert create("python", dirs).origin == "override"


def test_entry_point_comes_before_builtins(dirs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = importlib.metadata.EntryPoint(
        name="python", value="tests.workers.test_registry:EntryPointBackend",
        group=registry.ENTRY_POINT_GROUP)

    def entry_points(**query: str) -> list[importlib.metadata.EntryPoint]:
        return [entry] if query == {"group": entry.group, "name": entry.name} else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert create("python", dirs).origin == "entry point"


def test_builtins(dirs: Any) -> None:
    assert isinstance(create("python", dirs), PythonBackend)
    assert isinstance(create("pytorch", dirs), PytorchBackend)
    assert isinstance(create("pytorch_libtorch", dirs), PytorchBackend)


def test_unknown_backend_is_invalid_arg(dirs: Any) -> None:
    with pytest.raises(ShoalError) as info:
        create("nope", dirs)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message.startswith("unknown backend 'nope'")
    assert str(dirs[0]) not in info.value.message


def test_module_without_backend_class_is_rejected(dirs: Any) -> None:
    _, version_dir, _ = dirs
    write(version_dir / "shoal_backend_broken.py", "x = 1\n")
    with pytest.raises(ShoalError, match="does not define class ShoalBackend"):
        create("broken", dirs)


def test_names_that_could_escape_a_directory_are_rejected(dirs: Any) -> None:
    with pytest.raises(ShoalError, match="invalid backend name"):
        create("../evil", dirs)


@pytest.mark.parametrize("name", ["tensorflow", "tensorrt", "dali"])
def test_tritons_other_backends_are_not_installed_with_a_way_out(
        dirs: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.workers.backends.tensorflow import runtime

    monkeypatch.setattr(runtime, "tensorflow_installed", lambda: False)  # as without the extra
    with pytest.raises(ShoalError) as info:
        create(name, dirs)
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert info.value.message.startswith(f"backend '{name}' is not installed")
    assert "onnxruntime" in info.value.message or "python model" in info.value.message


def test_openvino_is_built_in_when_its_package_is_installed(
        dirs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.workers.backends.openvino import runtime

    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name: object())
    assert create("openvino", dirs).__class__.__name__ == "OpenvinoBackend"
    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ShoalError) as info:
        create("openvino", dirs)
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert info.value.message.startswith("backend 'openvino' is not installed")
    assert "pip install 'shoal[openvino]'" in info.value.message


def test_a_users_own_backend_of_a_tritons_name_wins(dirs: Any) -> None:
    _, version_dir, _ = dirs
    write(version_dir / "shoal_backend_tensorflow.py",
          "from shoal.workers.backends.python.backend import PythonBackend as ShoalBackend\n")
    assert create("tensorflow", dirs).__class__.__name__ == "PythonBackend"
