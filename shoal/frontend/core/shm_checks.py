"""Checks of the shared-memory extensions (used by ``shm_registry``): region names, keys of POSIX
shm objects, opening an object, its real size, and the framing of BYTES tensors in it.

Refusals are ``ShoalError`` (INVALID_ARG naming the region or the field at fault); none
echoes a key that names the server's own segments. Which objects may be served at all:
``shm/object_identity.py``.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
from collections.abc import Callable
from typing import Final, NoReturn

from shoal.errors import invalid_arg, unavailable
from shoal.frontend.core.validation import (
    short_length_indicator,
    short_string_data,
    too_many_strings,
    wrong_string_count,
)
from shoal.shm.object_identity import ObjectIdentity, refusal, server_segment_identities

logger = logging.getLogger(__name__)

INTERNAL_KEY_PREFIX: Final = "shoal-"  # every segment and lock of every shoal server
MAX_KEY_BYTES: Final = 255  # NAME_MAX: the part after the leading '/'
MAX_REGION_NAME_BYTES: Final = 1024
_OPEN_FLAGS: Final = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SCAN_CHUNK: Final = 1 << 20  # bytes read at a time when checking BYTES framing
_LENGTH = struct.Struct("<I")


def validated_key_body(name: str, key: str) -> str:
    """Triton's ValidateSharedMemoryKey, for shoal: the key without its leading '/'s, refused
    when empty ('/' alone), not a valid POSIX shm name, or naming a shoal segment (with or
    without the leading '/'). Refusals never echo the key (it may be an internal name)."""
    body = key.lstrip("/")
    where = f"cannot register shared memory region '{name}'"
    if not body:
        raise invalid_arg(f"{where}: 'key' must name a shared memory object, e.g. '/my_region'")
    if body.startswith(INTERNAL_KEY_PREFIX):
        logger.warning("refused to register region %r over a reserved key %r", name, key)
        raise invalid_arg(f"{where}: 'key' names shared memory reserved for the server itself")
    if "/" in body or "\x00" in body or body in (".", ".."):
        raise invalid_arg(f"{where}: 'key' must be '/' followed by a name without '/' or NUL")
    if len(body.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise invalid_arg(f"{where}: 'key' is longer than {MAX_KEY_BYTES} bytes")
    return body


def open_client_object(directory: str, name: str, key: str, body: str) -> int:
    """A descriptor of ``directory/body``, the object that region ``name`` registers with
    ``key`` (checked: ``validated_key_body``). Never blocks (O_NONBLOCK: a FIFO opens at once
    and is refused by ``object_size``), never follows a symbolic link."""
    try:
        return os.open(os.path.join(directory, body), _OPEN_FLAGS)
    except FileNotFoundError:
        reason = "no such shared memory object"
    except PermissionError:
        reason = "permission denied"
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise unavailable(f"cannot register shared memory region '{name}': too many "
                              "open files in the server") from None
        reason = "a symbolic link" if exc.errno == errno.ELOOP else os.strerror(exc.errno or 0)
    raise invalid_arg(f"Unable to open shared memory region: '{key}' for region '{name}' "
                      f"({reason})")


def check_region_name(name: str, kind: str = "system") -> None:
    """``kind``: "system" or "cuda", as Triton's message for a missing name says it."""
    if not name:
        raise invalid_arg(f"'region name' is necessary to register {kind} shared memory region")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_REGION_NAME_BYTES:
        raise invalid_arg(f"shared memory region name is longer than {MAX_REGION_NAME_BYTES} "
                          "bytes")


def object_size(fd: int, name: str, key: str) -> int:
    """The size now of the object open as ``fd`` (region ``name``); refuses anything but a
    regular file."""
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise invalid_arg(f"Invalid shared memory region: '{name}'") from exc
    if not stat.S_ISREG(info.st_mode):
        raise invalid_arg(f"shared memory key '{key}' of region '{name}' does not name a "
                          "shared memory object")
    return info.st_size


def registered_object(fd: int, name: str, key: str, directory: str, *,
                      allow_foreign_owner: bool, euid: int | None = None,
                      stat_of: Callable[[int], os.stat_result] = os.fstat) -> os.stat_result:
    """At registration: the fstat of ``fd`` (the object region ``name`` registers), refused
    unless ``object_identity.refusal`` allows it (a regular file with one link, none of the
    server's segments in ``directory``, owned by ``euid`` unless foreign owners are allowed).
    ``stat_of``: a parameter for tests (an fstat result of another owner)."""
    try:
        info = stat_of(fd)
    except OSError as exc:
        raise invalid_arg(f"Invalid shared memory region: '{name}'") from exc
    reason = refusal(info, None, allow_foreign_owner=allow_foreign_owner,
                     own=server_segment_identities(directory), euid=euid)
    if reason is not None:
        _refused(name, key, reason)
    return info


def current_object(path: str, fd: int, name: str, key: str, expected: ObjectIdentity, *,
                   allow_foreign_owner: bool, euid: int | None = None) -> os.stat_result:
    """At every use of region ``name``: the object its key names now (``path``, not followed
    if a link) must still be the registered one (``expected``, open as ``fd``) and pass
    ``object_identity.refusal``; its stat (the size now). So a key replaced by another object
    (e.g. a hard link to a server segment) fails the request naming the region, before any
    reference to it leaves the frontend."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        _refused(name, key, "was removed by its owner; register the region again")
    except OSError as exc:
        raise invalid_arg(f"Invalid shared memory region: '{name}'") from exc
    reason = refusal(info, expected, allow_foreign_owner=allow_foreign_owner, euid=euid)
    if reason is None and ObjectIdentity.of(os.fstat(fd)) != expected:
        reason = "is no longer the object that was registered"
    if reason is not None:
        _refused(name, key, reason)
    return info


def _refused(name: str, key: str, reason: str) -> NoReturn:
    logger.warning("refused shared memory region %r (key %r): it %s", name, key, reason)
    raise invalid_arg(f"shared memory region '{name}' {reason}")


def check_bytes_framing(fd: int, start: int, nbytes: int, count: int, tensor: str,
                        model_name: str) -> None:
    """The ``nbytes`` bytes at ``start`` of the object hold exactly ``count`` BYTES elements
    (4-byte little-endian length + data each) and nothing after them, with the texts of a
    request body's check (``validation.check_bytes_framing``: Triton's core ones are
    RequestCheckError, the caller adds the request's id). Reads with pread, a chunk at a time,
    only where length fields are: a truncated object gives short reads, not SIGBUS."""
    position = found = 0
    chunk = b""
    chunk_start = 0
    while position < nbytes:
        if nbytes - position < 4:
            raise short_length_indicator(tensor, model_name, nbytes - position)
        if position + 4 > chunk_start + len(chunk):
            chunk = os.pread(fd, min(_SCAN_CHUNK, nbytes - position), start + position)
            chunk_start = position
            if len(chunk) < 4:
                raise invalid_arg(f"shared memory of input '{tensor}' was truncated")
        (length,) = _LENGTH.unpack_from(chunk, position - chunk_start)
        position += 4
        if length > nbytes - position:
            raise short_string_data(tensor, length, nbytes - position)
        position += length
        found += 1
        if found > count:
            raise too_many_strings(tensor, model_name, found, count)
    if found != count:
        raise wrong_string_count(tensor, model_name, found, count)
