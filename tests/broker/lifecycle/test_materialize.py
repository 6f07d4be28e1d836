"""Materialised load overrides: hostile requests leave nothing on disk, accepted ones give
exactly the expected private tree, planted links are never followed, and removal stays inside
the temp root."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.lifecycle import materialize as materialize_module
from shoal.broker.lifecycle.materialize import (
    DIRECTORY_MODE,
    FILE_MODE,
    materialize,
    remove_materialized,
)
from shoal.config.load_overrides import LoadOverrides, parse_config_override
from shoal.config.model_config import load_config_file
from shoal.errors import ErrorCode, ShoalError
from tests.config.test_load_overrides import MODEL, NAME, config_json, hostile_requests


def tree(directory: Path) -> dict[str, int]:
    """Relative path -> permission bits of everything under ``directory`` (links not
    followed)."""
    found: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        for entry in [*dirnames, *filenames]:
            path = Path(dirpath) / entry
            found[str(path.relative_to(directory))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def error_of(call: Callable[[], object]) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        call()
    return info.value


def plant_in_fresh(monkeypatch: pytest.MonkeyPatch,
                   plant: Callable[[Path], None]) -> list[Path]:
    """Make the next fresh directory come with ``plant`` already done in it (as a racing
    process of the same user would); returns the fresh directories made."""
    made: list[Path] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(prefix: str, dir: str) -> str:  # tempfile's own keywords
        fresh = real_mkdtemp(prefix=prefix, dir=dir)
        made.append(Path(fresh))
        plant(Path(fresh))
        return fresh

    monkeypatch.setattr(materialize_module.tempfile, "mkdtemp", mkdtemp)
    return made


# ------------------------------------------------------------------ refused: nothing on disk


def _as_overrides(parameters: dict[str, Any]) -> LoadOverrides:
    """The request as a LoadOverrides built by hand (as if the frontend check were skipped)."""
    config = parameters.get("config", "")
    files = {k.removeprefix("file:"): v for k, v in parameters.items() if k.startswith("file:")}
    return LoadOverrides(config if isinstance(config, str) else "", files)


@pytest.mark.parametrize(("name", "parameters", "expected"), [
    case for case in hostile_requests() if "config-not-string" not in str(case.id)])
def test_hostile_overrides_create_nothing(tmp_path: Path, name: str,
                                          parameters: dict[str, Any], expected: str) -> None:
    root = tmp_path / "root"
    error = error_of(lambda: materialize(name, _as_overrides(parameters), str(root)))
    assert error.code == ErrorCode.INVALID_ARG
    assert expected in error.message
    assert not root.exists()
    assert list(tmp_path.iterdir()) == []


def test_no_config_override_is_refused(tmp_path: Path) -> None:
    error = error_of(lambda: materialize(NAME, LoadOverrides("", {}), str(tmp_path / "root")))
    assert error.code == ErrorCode.INVALID_ARG
    assert not (tmp_path / "root").exists()


# ------------------------------------------------------------------ accepted


def accepted() -> LoadOverrides:
    warmup = [{"name": "w", "batch_size": 1, "inputs": {"IN": {
        "data_type": "TYPE_FP32", "dims": [4], "input_data_file": "raw/in0"}}}]
    return LoadOverrides(config_json(model_warmup=warmup, instance_group=[{"count": 2}]), {
        "1/model.py": MODEL, "1/sub/deeper/weights.bin": bytes(range(256)) * 10,
        "3/model.py": b"", "warmup/raw/in0": b"\x00" * 16})


def test_accepted_overrides_materialise_exactly(tmp_path: Path) -> None:
    root = tmp_path / "root"
    overrides = accepted()
    model_dir = Path(materialize(NAME, overrides, str(root)))
    assert stat.S_IMODE(root.stat().st_mode) == DIRECTORY_MODE
    fresh = model_dir.parent
    assert model_dir.name == NAME and fresh.parent == root
    assert list(root.iterdir()) == [fresh]  # nothing else in the temp root
    assert list(tmp_path.iterdir()) == [root]  # nor outside it
    d, f = DIRECTORY_MODE, FILE_MODE
    assert tree(fresh) == {
        "m": d, "m/config.pbtxt": f, "m/1": d, "m/1/model.py": f, "m/1/sub": d,
        "m/1/sub/deeper": d, "m/1/sub/deeper/weights.bin": f, "m/3": d, "m/3/model.py": f,
        "m/warmup": d, "m/warmup/raw": d, "m/warmup/raw/in0": f}
    for path, data in overrides.files.items():
        assert (model_dir / path).read_bytes() == data
    written = load_config_file(str(model_dir / "config.pbtxt"))
    assert written == parse_config_override(NAME, overrides.config_json)


def test_config_override_without_name_is_written_with_it(tmp_path: Path) -> None:
    config = json.dumps({"backend": "python"})
    model_dir = materialize(NAME, LoadOverrides(config, {"1/model.py": MODEL}), str(tmp_path))
    written = load_config_file(os.path.join(model_dir, "config.pbtxt"))
    assert written is not None and written.name == NAME and written.backend == "python"


def test_each_load_gets_a_fresh_directory(tmp_path: Path) -> None:
    first = materialize(NAME, accepted(), str(tmp_path))
    second = materialize(NAME, accepted(), str(tmp_path))
    assert Path(first).parent != Path(second).parent
    assert Path(first).parent.parent == Path(second).parent.parent == tmp_path


def test_modes_do_not_depend_on_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        model_dir = Path(materialize(NAME, accepted(), str(tmp_path / "root")))
    finally:
        os.umask(old)
    modes = set(tree(model_dir.parent).values())
    assert modes == {DIRECTORY_MODE, FILE_MODE}
    assert stat.S_IMODE((tmp_path / "root").stat().st_mode) == DIRECTORY_MODE


# ------------------------------------------------------------------ the temp root


def test_a_link_planted_in_the_temp_root_is_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(mode=0o700)
    outside.mkdir()
    for name in ("load-", NAME, "evil"):
        (root / name).symlink_to(outside)
    model_dir = Path(materialize(NAME, accepted(), str(root)))
    assert list(outside.iterdir()) == []
    assert not model_dir.parent.is_symlink() and model_dir.parent.parent == root


@pytest.mark.parametrize("kind", ["world-writable", "group-writable", "a file"])
def test_a_temp_root_that_is_not_private_is_refused(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "root"
    if kind == "a file":
        root.write_bytes(b"")
    else:
        root.mkdir()
        root.chmod(0o777 if kind == "world-writable" else 0o770)
    error = error_of(lambda: materialize(NAME, accepted(), str(root)))
    assert error.code == ErrorCode.INTERNAL
    assert str(tmp_path) not in error.message  # no server paths in client messages
    if root.is_dir():
        assert list(root.iterdir()) == []


# ------------------------------------------------------------------ planted links in the tree


def _plant_model_link(outside: Path) -> Callable[[Path], None]:
    return lambda fresh: (fresh / NAME).symlink_to(outside)


def _plant_version_link(outside: Path) -> Callable[[Path], None]:
    def plant(fresh: Path) -> None:
        (fresh / NAME).mkdir()
        (fresh / NAME / "1").symlink_to(outside)
    return plant


def _plant_file_link(outside: Path) -> Callable[[Path], None]:
    def plant(fresh: Path) -> None:
        (fresh / NAME / "1").mkdir(parents=True)
        (fresh / NAME / "1" / "model.py").symlink_to(outside / "victim")
    return plant


def _plant_config_link(outside: Path) -> Callable[[Path], None]:
    def plant(fresh: Path) -> None:
        (fresh / NAME).mkdir()
        (fresh / NAME / "config.pbtxt").symlink_to(outside / "victim")
    return plant


def _plant_file_as_directory(outside: Path) -> Callable[[Path], None]:
    def plant(fresh: Path) -> None:
        (fresh / NAME).mkdir()
        (fresh / NAME / "1").write_bytes(b"")

    del outside
    return plant


@pytest.mark.parametrize("planter", [_plant_model_link, _plant_version_link, _plant_file_link,
                                     _plant_config_link, _plant_file_as_directory])
def test_links_planted_in_the_fresh_directory_are_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        planter: Callable[[Path], Callable[[Path], None]]) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious")
    made = plant_in_fresh(monkeypatch, planter(outside))
    error = error_of(lambda: materialize(NAME, accepted(), str(root)))
    assert error.code == ErrorCode.INTERNAL
    assert str(tmp_path) not in error.message
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"precious"
    assert len(made) == 1 and not made[0].exists()  # everything written was removed
    assert list(root.iterdir()) == []


def test_a_write_failure_removes_what_was_written(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_write_all = materialize_module._write_all

    def write_all(fd: int, data: bytes) -> None:
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_write_all(fd, data)

    monkeypatch.setattr(materialize_module, "_write_all", write_all)
    error = error_of(lambda: materialize(NAME, accepted(), str(tmp_path / "root")))
    assert error.code == ErrorCode.INTERNAL
    assert "No space left on device" in error.message
    assert list((tmp_path / "root").iterdir()) == []


# ------------------------------------------------------------------ removal


def test_remove_materialized(tmp_path: Path) -> None:
    root = tmp_path / "root"
    model_dir = materialize(NAME, accepted(), str(root))
    remove_materialized(model_dir, str(root))
    assert list(root.iterdir()) == []
    remove_materialized(model_dir, str(root))  # already gone: nothing to do


def test_remove_does_not_follow_links_inside(tmp_path: Path) -> None:
    assert shutil.rmtree.avoids_symlink_attacks  # fd-based rmtree on Linux
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep").write_bytes(b"keep")
    model_dir = Path(materialize(NAME, accepted(), str(root)))
    (model_dir / "1" / "link").symlink_to(outside)
    (model_dir / "2").symlink_to(outside / "sub")
    remove_materialized(str(model_dir), str(root))
    assert (outside / "sub" / "keep").read_bytes() == b"keep"
    assert list(root.iterdir()) == []


def test_remove_refuses_paths_outside_the_temp_root(tmp_path: Path) -> None:
    root, other = tmp_path / "root", tmp_path / "other"
    (other / "load-x" / NAME).mkdir(parents=True)
    model_dir = materialize(NAME, accepted(), str(root))
    (root / "load-link").symlink_to(other / "load-x")
    (root / "plain").mkdir()
    refused = [
        str(other / "load-x" / NAME),  # another directory
        str(root / NAME),  # the temp root itself
        str(root),  # its parent
        str(root / "load-link" / NAME),  # a link inside that leads outside
        str(root / "plain" / NAME),  # not a directory materialize made
        str(root / "load-x" / ".." / ".." / "other" / "load-x" / NAME),
        str(Path(model_dir) / "1" / "model.py"),  # below the fresh directory
    ]
    for path in refused:
        error = error_of(lambda path=path: remove_materialized(path, str(root)))
        assert error.code == ErrorCode.INTERNAL
    assert (other / "load-x" / NAME).is_dir()
    assert (root / "plain").is_dir() and Path(model_dir).is_dir()


def test_remove_refuses_a_fresh_directory_that_is_a_link(tmp_path: Path) -> None:
    root = tmp_path / "root"
    model_dir = Path(materialize(NAME, accepted(), str(root)))
    alias = root / "load-alias"
    alias.symlink_to(model_dir.parent.name)  # a link inside to a real fresh directory
    error = error_of(lambda: remove_materialized(str(alias / NAME), str(root)))
    assert error.code == ErrorCode.INTERNAL
    assert model_dir.is_dir()
