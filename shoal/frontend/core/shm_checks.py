"""Checks of the shared-memory extensions (used by ``shm_registry``): region names, keys of POSIX
shm objects, opening an object, its real size, and the framing of BYTES tensors in it.

Refusals are ``ShoalError`` (INVALID_ARG naming the field at fault); none echoes a key
that names the server's own segments.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
from typing import Final

from shoal.errors import invalid_arg, unavailable
from shoal.frontend.core.validation import (
    short_length_indicator,
    short_string_data,
    too_many_strings,
    wrong_string_count,
)

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
    """The object's size now; refuses anything but a regular shm object with a single name (a
    second hard link could alias a segment the client may not name)."""
    return object_size_and_inode(fd, name, key)[0]


def object_size_and_inode(fd: int, name: str, key: str) -> tuple[int, int]:
    """``object_size`` and the object's inode number, from one fstat."""
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise invalid_arg(f"Invalid shared memory region: '{name}'") from exc
    if not stat.S_ISREG(info.st_mode):
        raise invalid_arg(f"shared memory key '{key}' of region '{name}' does not name a "
                          "shared memory object")
    if info.st_nlink > 1:
        raise invalid_arg(f"shared memory key '{key}' of region '{name}' names an object with "
                          "more than one link; refused")
    return info.st_size, info.st_ino


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
