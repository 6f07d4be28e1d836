"""Parsing request JSON with Triton's limits: nesting depth at most 100 (checked on the raw bytes
before any parser recurses), an object at the top level where one is expected, and the NaN /
Infinity literals that tritonclient's ``json.dumps`` writes (orjson refuses them; the standard
library parser is the fallback, so it only runs for bodies orjson rejected). Like orjson, the
fallback refuses strings with a lone UTF-16 surrogate escape (``"\\ud800"``): such a string has no
UTF-8 form, so it could not be sent to the broker, logged or echoed in a response.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, TypeVar

import numpy as np
import orjson

from shoal.errors import invalid_arg

MAX_JSON_DEPTH: Final = 100
_SCAN_CHUNK: Final = 1 << 20
_COUNT_BELOW: Final = 2048  # bytes: below, counting brackets beats finding them one by one
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_Pairs = TypeVar("_Pairs")


def json_depth_exceeds(text: bytes | memoryview, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when brackets outside strings nest deeper than ``limit``. O(n) in C (numpy)."""
    raw = bytes(text)
    if not _more_openings_than(raw, limit):
        return False
    if b"\\" in raw:
        raw = _STRING.sub(b'""', raw)
        in_string_possible = False
    else:
        in_string_possible = b'"' in raw
    depth = 0
    quotes = 0
    for start in range(0, len(raw), _SCAN_CHUNK):
        chunk = np.frombuffer(raw, np.uint8, min(_SCAN_CHUNK, len(raw) - start), start)
        step = ((chunk == _OPEN[0]) | (chunk == _OPEN[1])).astype(np.int32)
        step -= (chunk == _CLOSE[0]) | (chunk == _CLOSE[1])
        if in_string_possible:
            is_quote = (chunk == ord('"')).astype(np.int32)
            inside = (np.cumsum(is_quote) + quotes) & 1
            step[inside.astype(bool)] = 0
            quotes += int(is_quote.sum())
        levels = np.cumsum(step) + depth
        if levels.size and int(levels.max()) > limit:
            return True
        if levels.size:
            depth = int(levels[-1])
    return False


def _more_openings_than(raw: bytes, limit: int) -> bool:
    """More than ``limit`` opening brackets in ``raw`` (strings included): nesting deeper than
    ``limit`` needs that many. A long text (an infer request's JSON tensor data: thousands of
    bytes, a few brackets) is walked with ``bytes.find`` (memchr), stopping past ``limit``;
    ``bytes.count`` looks at every byte (about 1.5 ns each), cheaper only for a short text."""
    if len(raw) < _COUNT_BELOW:
        return raw.count(b"[") + raw.count(b"{") > limit
    found = 0
    for bracket in (b"[", b"{"):
        position = raw.find(bracket)
        while position != -1:
            found += 1
            if found > limit:
                return True
            position = raw.find(bracket, position + 1)
    return False


def parse_json(text: bytes | memoryview, what: str = "request JSON") -> Any:
    """Parse with the depth limit; INVALID_ARG naming ``what`` on any failure."""
    if json_depth_exceeds(text):
        raise invalid_arg(
            f"failed to parse the {what}: JSON nesting depth exceeds maximum allowed "
            f"limit ({MAX_JSON_DEPTH})"
        )
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as first:
        raw = bytes(text)
        try:
            document = json.loads(raw)  # accepts NaN / Infinity / -Infinity
        except (ValueError, RecursionError):
            raise invalid_arg(f"failed to parse the {what}: {first}") from None
        if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(document):
            raise invalid_arg(f"failed to parse the {what}: a string holds a lone UTF-16 "
                              "surrogate escape (\\ud800-\\udfff)") from None
        return document


def _has_lone_surrogate(document: Any) -> bool:
    """Any key or string value with a code point in U+D800..U+DFFF (a pair of escapes that
    forms a valid character decodes to one code point outside that range)."""
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_json_object(text: bytes | memoryview, what: str = "request JSON") -> dict[str, Any]:
    document = parse_json(text, what)
    if not isinstance(document, dict):
        raise invalid_arg(f"failed to parse the {what}: expected a JSON object")
    return document


def parse_json_pairs(text: bytes | memoryview, what: str, pairs_type: type[_Pairs]) -> _Pairs:
    """A text ``parse_json_object`` takes, parsed by the standard library parser with every
    object as ``pairs_type(its members in order)`` (``object_pairs_hook``: duplicated keys
    kept); anything else raises ``parse_json_object``'s error. One parse, unless that parse
    fails (or the text holds a surrogate escape): then ``parse_json_object`` first, for its
    texts."""
    raw = bytes(text)
    if not json_depth_exceeds(raw) and not _SURROGATE_ESCAPE.search(raw):
        try:
            document = json.loads(raw, object_pairs_hook=pairs_type)
        except (ValueError, RecursionError):
            document = None
        if isinstance(document, pairs_type):
            return document
    parse_json_object(raw, what)
    document = json.loads(raw, object_pairs_hook=pairs_type)
    assert isinstance(document, pairs_type)  # parse_json_object saw an object
    return document
