"""``--cache-config`` and ``--response-cache-byte-size`` (tritonserver's flags) -> the byte size
of the response cache (0 = no cache).

Triton's forms: ``--cache-config local,size=N`` (also ``--cache-config=local,size=N``; the flag
may repeat, one key each: ``local,size=N``), and the deprecated ``--response-cache-byte-size N``,
which means ``local,size=N``. Only the ``local`` implementation exists here (an in-process LRU);
naming another (``redis``, a custom library) is refused, as are both flag styles together and
two implementations (Triton's "incompatible flags" / "multiple cache configurations").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

LOCAL: Final = "local"


class CacheConfigError(ValueError):
    """A bad cache flag; the message names the flag and what it expects."""


def parse_cache_setting(text: str) -> tuple[str, str, str]:
    """One ``--cache-config`` value: ``<cache>,<key>=<value>`` -> (cache, key, value)."""
    cache, sep, setting = text.partition(",")
    key, eq, value = setting.partition("=")
    if not sep or not eq or not cache.strip() or not key.strip():
        raise CacheConfigError(
            f"--cache-config expects <cache>,<key>=<value> (e.g. local,size=1048576), got "
            f"'{text}'")
    return cache.strip(), key.strip(), value.strip()


def cache_byte_size(settings: Sequence[tuple[str, str, str]], legacy_size: int | None) -> int:
    """The local cache's size in bytes from the parsed ``--cache-config`` settings and
    ``--response-cache-byte-size`` (None: not given); 0 when neither asks for a cache."""
    if settings and legacy_size is not None:
        raise CacheConfigError(
            "incompatible flags: --response-cache-byte-size and --cache-config cannot be used "
            "together; use --cache-config local,size=N")
    if legacy_size is not None:
        if legacy_size < 0:
            raise CacheConfigError(
                f"--response-cache-byte-size must be 0 or more, got {legacy_size}")
        return legacy_size
    caches = sorted({cache for cache, _, _ in settings})
    if len(caches) > 1:
        raise CacheConfigError(
            f"multiple cache configurations are not supported: --cache-config names "
            f"{', '.join(repr(c) for c in caches)}; give one")
    if not caches:
        return 0
    if caches[0] != LOCAL:
        raise CacheConfigError(
            f"--cache-config: cache implementation '{caches[0]}' is not available; this server "
            f"has the '{LOCAL}' cache only (--cache-config local,size=N)")
    size = 0
    for _, key, value in settings:
        if key != "size":
            raise CacheConfigError(
                f"--cache-config: unknown setting '{key}' of the local cache; it takes size=N "
                "(bytes)")
        if not value.isdigit():
            raise CacheConfigError(
                f"--cache-config: local,size expects a number of bytes, got '{value}'")
        size = int(value)
    return size
