"""Request headers forwarded to the model as request parameters (tritonserver's
``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``).

A header (HTTP) or metadata entry (gRPC) whose name the pattern matches anywhere (a partial
match, as RE2's ``PartialMatch``) becomes a string parameter of the request, named as the
header and holding its value. Matching is case-insensitive unless the pattern turns that off,
as RE2 with tritonserver's options does: ``(?-i)MY_HEADER.*`` matches only upper-case names.
A parameter the request itself sets keeps the request's value. Names reserved for the server
(``triton_`` and ``shoal_`` prefixes, the sequence and priority keys) are never forwarded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shoal.messages import Params

# a leading RE2 flag group: (?i), (?-i), (?s-m)... (Python's re only takes flags turned on)
_LEADING_FLAGS = re.compile(r"^\(\?([imsU]*)(?:-([imsU]+))?\)")
_PYTHON_FLAG = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}
_NOT_FORWARDED_PREFIXES = ("triton_", "shoal_")
_NOT_FORWARDED = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority",
                            "timeout", "binary_data_output", "binary_data_size",
                            "shared_memory_region", "shared_memory_byte_size",
                            "shared_memory_offset", "classification", "binary_data"})


def compile_pattern(text: str) -> re.Pattern[str] | None:
    """The pattern of a ``--*-header-forward-pattern`` flag ("" : forward nothing).
    Raises ValueError naming the fault for a pattern that does not compile."""
    if not text:
        return None
    flags = re.IGNORECASE
    body = text
    leading = _LEADING_FLAGS.match(text)
    if leading is not None:
        for letter in leading.group(1):
            flags |= _PYTHON_FLAG.get(letter, 0)
        for letter in leading.group(2) or "":
            flags &= ~_PYTHON_FLAG.get(letter, 0)
        body = text[leading.end():]
    try:
        return re.compile(body, flags)
    except re.error as exc:
        raise ValueError(f"invalid header forward pattern '{text}': {exc}") from None


def forwarded_parameters(headers: Iterable[tuple[str, str | bytes]],
                         pattern: re.Pattern[str] | None) -> Params:
    """The parameters ``headers`` give under ``pattern`` (empty when it is None). A name sent
    twice keeps its first value."""
    if pattern is None:
        return {}
    forwarded: Params = {}
    for name, value in headers:
        lowered = name.lower()
        if (lowered in _NOT_FORWARDED or lowered.startswith(_NOT_FORWARDED_PREFIXES)
                or name in forwarded or pattern.search(name) is None):
            continue
        if isinstance(value, bytes):  # binary gRPC metadata (a "-bin" name)
            continue
        forwarded[name] = value
    return forwarded


def with_forwarded(parameters: Params, forwarded: Params) -> None:
    """Add ``forwarded`` to a request's ``parameters`` in place; the request's own win."""
    for name, value in forwarded.items():
        parameters.setdefault(name, value)
