"""Where shoal answers differently from the real tritonserver 2.51 on purpose.

This table is the only place a difference found by the differential tests may be accepted.
Each entry names the cases it covers (``fnmatch`` patterns over ``http:<case id>`` and
``grpc:<case id>``), what Triton answers and what shoal answers there (predicates the test
asserts on the two answers), and why shoal differs. An entry may also ``mask`` the aspect it is
about (e.g. the media type) so the rest of the two answers is still compared.

docs/triton-differences.md renders this table for people; a test checks that every entry's
``key`` appears there. An entry whose cases answer the same on both servers fails the test: a
difference that went away must leave the table."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

Answer = dict[str, Any]
Check = Callable[[Answer], bool]


def status(*codes: int) -> Check:
    return lambda a: a.get("status") in codes


def grpc_code(*codes: str) -> Check:
    return lambda a: a.get("code") in codes


def error_text(a: Answer) -> str:
    body = a.get("body")
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return str(a.get("details", ""))


def error_contains(text: str) -> Check:
    return lambda a: text in error_text(a)


def both(*checks: Check) -> Check:
    return lambda a: all(c(a) for c in checks)


def _without_media_type(a: Answer) -> Answer:
    return {k: v for k, v in a.items() if k != "media_type"}


def _without_error_text(a: Answer) -> Answer:
    masked = dict(a)
    if isinstance(masked.get("body"), dict) and "error" in masked["body"]:
        masked["body"] = {**masked["body"], "error": "<text>"}
    if "details" in masked:
        masked["details"] = "<text>"
    return masked


def _without_status_and_text(a: Answer) -> Answer:
    masked = _without_error_text(_without_media_type(a))
    masked.pop("status", None)
    masked.pop("code", None)
    return masked


@dataclasses.dataclass(frozen=True)
class Difference:
    key: str
    summary: str
    why: str
    cases: tuple[str, ...]
    triton: Check
    shoal: Check
    mask: Callable[[Answer], Answer] = _without_status_and_text


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        key="media-type",
        summary="Error bodies are labelled `application/json` (Triton labels some of them, and "
                "empty 200 bodies, `text/plain`); empty bodies carry no content type",
        why="the body is JSON; clients parse it either way, and tritonclient ignores the label",
        cases=("http:*",),
        triton=lambda a: a.get("media_type") == "text/plain",
        shoal=lambda a: a.get("media_type") in ("application/json", ""),
        mask=_without_media_type,
    ),
    Difference(
        key="server-version",
        summary="`version` in server metadata is the Triton release whose protocol shoal "
                "follows (its tritonclient), not 2.51.0",
        why="shoal is not a build of Triton; the extensions list, which clients check, is "
            "the same",
        cases=("http:server/metadata", "grpc:server-metadata"),
        triton=lambda a: True,
        shoal=lambda a: True,
        mask=lambda a: _strip_version(a),
    ),
    Difference(
        key="client-mistake-400",
        summary="A malformed request (not JSON, wrong JSON types, negative shape, `data` that "
                "does not fit `shape`, a non-string BYTES element, a bad `sequence_id` type) "
                "gets 400 with a message naming the input; Triton 2.51 answers 500 with its "
                "JSON parser's text",
        why="the mistake is the client's: 5xx makes retry policies resend a request that can "
            "never succeed, and alerts page the server's owner",
        cases=("http:infer/*", "http:generate*", "http:sequence/*"),
        triton=both(status(500), lambda a: "nable to parse" in error_text(a)
                    or "failed to parse" in error_text(a)
                    or "attempt to" in error_text(a)),
        shoal=status(400),
    ),
    Difference(
        key="no-traceback",
        summary="An exception raised in a python model's `execute` is reported without the "
                "traceback's file paths (`At: /path/model.py(3): execute`)",
        why="the client must not learn the server's file layout; the traceback is in the "
            "server's log",
        cases=("http:infer/raises/*", "grpc:infer/raises"),
        triton=error_contains("\n\nAt:\n"),
        shoal=lambda a: "\n\nAt:\n" not in error_text(a)
        and "execute blew up" in error_text(a),
        mask=lambda a: _without_error_text(_without_media_type(a)),
    ),
)


def _strip_version(a: Answer) -> Answer:
    masked = _without_media_type(a)
    body = masked.get("body") or masked.get("reply")
    if isinstance(body, dict) and "version" in body:
        key = "body" if "body" in masked else "reply"
        masked[key] = {k: v for k, v in body.items() if k != "version"}
    return masked
