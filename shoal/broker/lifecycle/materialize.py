"""Write checked load overrides (``config/load_overrides.py``) to a fresh private model
directory.

Layout: ``<temp_root>/<fresh>/<name>/`` where ``<fresh>`` is a new ``tempfile.mkdtemp``
directory per load; it holds ``config.pbtxt`` (the parsed override, as text) and every
``file:`` entry. Never the model repository. Contracts:

- the pure checks are run again before anything is created, so a hostile request leaves no
  trace, not even ``temp_root``;
- ``temp_root`` is created if missing (0o700) and must be a directory owned by this user and
  not writable by group or others (nobody else can plant links in it);
- every directory below ``<fresh>`` is entered through a descriptor opened with ``O_NOFOLLOW``
  after an ``lstat``, every file is created with ``O_EXCL|O_NOFOLLOW``: a symbolic link found on
  the way is never followed, the load fails instead; modes are 0o700 (directories) and 0o600
  (files), whatever the umask; each written file is checked with ``realpath`` to lie inside
  ``<fresh>``;
- on any failure everything under ``<fresh>`` is removed before the error is raised.
  Client-facing messages name the model, never a path (paths go to the log).

``remove_materialized`` is the only way these directories go away (the broker calls it when the
generation that used them is gone). Synchronous filesystem work: the broker's load threads.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from typing import Final

from google.protobuf import text_format

from shoal.broker.repository import CONFIG_FILENAME
from shoal.config.load_overrides import LoadOverrides, check_overrides, shown
from shoal.errors import internal, invalid_arg

logger = logging.getLogger(__name__)

DIRECTORY_MODE: Final = 0o700
FILE_MODE: Final = 0o600
FRESH_PREFIX: Final = "load-"
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _UnsafeTree(Exception):
    """Something in the fresh directory is not what this module created (a link, a file where a
    directory should be): somebody else is writing there."""


def materialize(name: str, overrides: LoadOverrides, temp_root: str) -> str:
    """Write ``overrides`` (which must carry a config) to a new private directory under
    ``temp_root`` and return the model directory ``<temp_root>/<fresh>/<name>``. Raises
    INVALID_ARG for overrides the pure checks refuse (nothing created), INTERNAL when the disk
    or the temp root fails (nothing left behind)."""
    config = check_overrides(name, overrides)
    if config is None:
        raise invalid_arg(f"failed to load '{shown(name)}': there is no config override to "
                          "write a model directory from")
    files: dict[str, bytes] = {CONFIG_FILENAME: text_format.MessageToString(config).encode()}
    files.update(overrides.files)  # no collision: override files live in subdirectories
    root = _private_temp_root(temp_root, name)
    fresh = tempfile.mkdtemp(prefix=FRESH_PREFIX, dir=root)
    try:
        _write_tree(fresh, name, files)
    except BaseException as exc:
        shutil.rmtree(fresh, ignore_errors=True)
        if isinstance(exc, _UnsafeTree):
            logger.error("model '%s': load override directory %s: %s", shown(name), fresh, exc)
            raise internal(f"failed to load '{shown(name)}': the load override directory was "
                           "changed by someone else while it was written") from None
        if isinstance(exc, OSError):
            logger.error("model '%s': cannot write load overrides to %s: %s",
                         shown(name), fresh, exc)
            raise internal(f"failed to load '{shown(name)}': cannot write the load override "
                           f"files: {exc.strerror or type(exc).__name__}") from None
        raise
    return os.path.join(fresh, name)


def _private_temp_root(temp_root: str, name: str) -> str:
    """The resolved temp root, created 0o700 when missing; refused unless private."""
    try:
        os.makedirs(temp_root, mode=DIRECTORY_MODE, exist_ok=True)
        root = os.path.realpath(temp_root)
        info = os.lstat(root)
    except OSError as exc:
        logger.error("model temp root %s cannot be created: %s", temp_root, exc)
        raise internal(f"failed to load '{shown(name)}': the server's model temp directory "
                       f"cannot be created: {exc.strerror or type(exc).__name__}") from None
    private = (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
               and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    if not private:
        logger.error("model temp root %s is not a private directory (mode %o, uid %d)",
                     root, info.st_mode, info.st_uid)
        raise internal(f"failed to load '{shown(name)}': the server's model temp directory is "
                       "not private (it must be owned by the server's user and writable only "
                       "by it)")
    return root


def _write_tree(fresh: str, name: str, files: Mapping[str, bytes]) -> None:
    """``fresh/name/`` and every file of ``files`` (relative paths, already checked)."""
    fresh_real = os.path.realpath(fresh)
    fresh_fd = os.open(fresh, _DIRECTORY_FLAGS)
    try:
        model_fd = _enter_directory(fresh_fd, name)
        try:
            for path, data in sorted(files.items()):
                _write_file(model_fd, path, data)
                written = os.path.realpath(os.path.join(fresh, name, path))
                if os.path.commonpath([fresh_real, written]) != fresh_real:
                    raise _UnsafeTree(f"{path} resolves outside the directory")
        finally:
            os.close(model_fd)
    finally:
        os.close(fresh_fd)


def _enter_directory(parent_fd: int, part: str) -> int:
    """A descriptor of directory ``part`` of ``parent_fd``, made (0o700) when missing. An
    existing entry must be a real directory: ``lstat`` says so, and ``O_NOFOLLOW`` keeps a link
    swapped in after the ``lstat`` from being followed."""
    try:
        os.mkdir(part, DIRECTORY_MODE, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        created = False
    if not stat.S_ISDIR(os.lstat(part, dir_fd=parent_fd).st_mode):
        raise _UnsafeTree(f"{part!r} exists and is not a directory (a symbolic link?)")
    try:
        fd = os.open(part, _DIRECTORY_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise _UnsafeTree(f"{part!r} cannot be entered safely: {exc.strerror}") from None
    if created:
        os.fchmod(fd, DIRECTORY_MODE)
    return fd


def _write_file(model_fd: int, path: str, data: bytes) -> None:
    *directories, file_name = path.split("/")
    opened: list[int] = []
    try:
        parent_fd = model_fd
        for part in directories:
            parent_fd = _enter_directory(parent_fd, part)
            opened.append(parent_fd)
        try:
            fd = os.open(file_name, _FILE_FLAGS, FILE_MODE, dir_fd=parent_fd)
        except (FileExistsError, IsADirectoryError):
            raise _UnsafeTree(f"{path!r} exists before it was written") from None
        try:
            os.fchmod(fd, FILE_MODE)
            _write_all(fd, data)
        finally:
            os.close(fd)
    finally:
        for fd in reversed(opened):
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def remove_materialized(model_dir: str, temp_root: str) -> None:
    """Remove the fresh directory that ``materialize`` made for ``model_dir`` (its parent).
    Refuses (INTERNAL) anything that is not, once resolved, a ``load-*`` directory directly
    inside the resolved ``temp_root``, and a parent that is itself a symbolic link. Links
    inside the tree are removed, never followed (``shutil.rmtree`` works on descriptors on
    Linux: ``rmtree.avoids_symlink_attacks``). Already removed: nothing to do."""
    if not shutil.rmtree.avoids_symlink_attacks:
        raise internal("load override directories cannot be removed safely on this platform")
    root = os.path.realpath(temp_root)
    fresh = os.path.dirname(os.path.abspath(model_dir))
    fresh_real = os.path.realpath(fresh)
    inside = (os.path.dirname(fresh_real) == root
              and os.path.basename(fresh_real).startswith(FRESH_PREFIX))
    if not inside or os.path.islink(fresh):
        logger.error("refusing to remove %s: not a load override directory of %s",
                     model_dir, temp_root)
        raise internal("refusing to remove a directory that is not a load override directory "
                       "of this server")
    try:
        shutil.rmtree(fresh_real)
    except FileNotFoundError:
        return
