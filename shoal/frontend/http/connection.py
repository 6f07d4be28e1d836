"""The connection as the lean infer path (``lean.py``, docs/architecture.md §3) sees it:
``GuardedConnection``, what that path uses of the connection's protocol, and ``request_parser``,
the parser every connection of ours reads its requests with (the guard's, and the fresh one a
connection gets back after ``body_reader.BodyReader`` read a body itself; the leniencies are
those of docs/architecture.md §8). Nothing here imports guard.py, which imports this module.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import httptools


class GuardedConnection(Protocol):
    """What the lean path uses of its connection's protocol, ``guard.GuardedHttpProtocol``
    (uvicorn's ``HttpToolsProtocol`` with the guard's body accounting): named here so the lean
    path needs no import of guard.py, which imports it. uvicorn's own types are ``Any``."""

    parser: httptools.HttpRequestParser
    url: bytes
    cycle: Any
    flow: Any
    pipeline: Any
    loop: asyncio.AbstractEventLoop
    transport: Any
    server_state: Any
    headers: list[tuple[bytes, bytes]]
    expect_100_continue: bool
    access_log: bool
    access_logger: logging.Logger
    client: Any
    _body_bytes: int
    _deadline: float
    _body_timeout_s: float

    def _start_asgi_task(self, cycle: Any, app: Any) -> None: ...
    def _unset_keepalive_if_required(self) -> None: ...
    def on_message_complete(self) -> None: ...
    def on_response_complete(self) -> None: ...
    def eof_received(self) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


def request_parser(protocol: object) -> httptools.HttpRequestParser:
    """A parser for the requests of one connection, with the leniencies every parser of ours
    has: uvicorn's ``data_after_close`` (answer the first of pipelined requests after a
    ``Connection: close``), and ``chunked_length``: a request with both ``Transfer-Encoding:
    chunked`` and ``Content-Length`` is framed by the chunked coding alone, the Content-Length
    ignored (RFC 9112 §6.3), as Triton takes such requests. The guard checks the coding of
    such a request and closes its connection after the answer (``guard.py``)."""
    parser = httptools.HttpRequestParser(protocol)
    parser.set_dangerous_leniencies(lenient_data_after_close=True, lenient_chunked_length=True)
    return parser
