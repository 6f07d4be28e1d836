"""What a server answered, in a form two servers' answers can be compared in.

``http_answer`` reduces an HTTP response to its status, media type and body; the body is parsed
(JSON; the binary tensor extension's JSON header and each tensor's bytes; server-sent events as a
list of parsed events) and normalised where the protocol leaves a value free: durations and
timestamps (``ns``, ``last_inference``) are zeroed, and the lists whose order is free (repository
index, statistics' models, shared-memory regions) are sorted. Nothing else is changed: every
other difference between the two answers is a difference."""

from __future__ import annotations

import json
from typing import Any

import httpx

# keys whose values are measured durations or clock readings: the counts beside them are kept
_TIMING_KEYS = frozenset({"ns", "last_inference", "execution_time_ns", "queue_time_ns"})
_UNORDERED_LISTS = frozenset({"model_stats", "regions"})


def normalise(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        if "count" in value and "ns" not in value:
            # a statistics duration whose time is 0: proto3 JSON leaves the field out, and
            # a duration is zeroed anyway (a step dispatched at once may measure 0 ns)
            value = {**value, "ns": 0}
        return {k: (0 if k in _TIMING_KEYS and _is_count(v) else normalise(v, k))
                for k, v in value.items()}
    if isinstance(value, list):
        items = [normalise(v) for v in value]
        if key in _UNORDERED_LISTS or _is_index(items):
            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return items
    return value


def _is_count(value: Any) -> bool:
    """An integer, or one as protobuf JSON writes 64-bit integers (a string of digits)."""
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


def _is_index(items: list[Any]) -> bool:
    """A repository index: a list of objects each naming a model."""
    return bool(items) and all(isinstance(i, dict) and "name" in i and "state" in i
                               for i in items)


def _media_type(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").split(";")[0].strip().lower()


def _body(response: httpx.Response) -> Any:
    media = _media_type(response)
    content = response.content
    header_length = response.headers.get("inference-header-content-length")
    if header_length is not None:
        split = int(header_length)
        header = json.loads(content[:split])
        return {"header": normalise(header), "binary": content[split:].hex()}
    if media == "text/event-stream":
        events = []
        for block in content.decode(errors="replace").split("\n\n"):
            lines = [ln[5:].strip() for ln in block.splitlines() if ln.startswith("data:")]
            if lines:
                events.append(_parse("\n".join(lines)))
        return {"events": events}
    if not content:
        return None
    return _parse(content.decode(errors="replace"))


def _parse(text: str) -> Any:
    try:
        return normalise(json.loads(text))
    except ValueError:
        return {"text": text}


def http_answer(response: httpx.Response) -> dict[str, Any]:
    return {"status": response.status_code, "media_type": _media_type(response),
            "body": _body(response)}
