"""The lean HTTP transport for the hot path: ``POST /v2/models/<m>[/versions/<v>]/infer`` served
by the connection's protocol itself, without an ASGI scope / receive / send cycle.

``GuardedHttpProtocol`` (``guard.py``) asks ``LeanInfer.begin`` once a request's headers are
in, after its own checks (connection cap, body size, timeouts). For an infer request it gets a
``LeanInferCycle``; any other request goes on to uvicorn's ASGI cycle and the Starlette app. The
cycle stands in for uvicorn's ``RequestResponseCycle`` where the protocol touches one
(``response_started``, ``response_complete``, ``disconnected``, ``keep_alive``,
``message_event.set()``, ``run_asgi``), so uvicorn's own pipelining queue, keep-alive timer,
graceful shutdown and disconnect handling drive it unchanged. Per request it then:

1. checks the restricted-API gate (a refusal is answered before the body is read) and samples
   the request for tracing (stamps HTTP_RECV_START / _END, HTTP_SEND_START / _END);
2. sends ``100 Continue`` if the client asked, and waits for the body, which the protocol feeds
   in as it is parsed (chunked or not): into a list of chunks, or, for a large binary request
   (``Content-Length`` ≥ ``BODY_SLOT_MIN_BYTES``, ``Inference-Header-Content-Length`` set, no
   ``Content-Encoding``), into one arena slot, padded so the binary part starts 64-byte
   aligned: its binary inputs are then referenced in place, with no further copy
   (``infer_common.BodySlot``). The body bytes that came with the headers are copied in; for the
   rest the transport reads straight into the slot (``body_reader.BodyReader``, an
   ``asyncio.BufferedProtocol`` that stands in for the connection's protocol until the body is
   in: no ``bytes`` object and no user-space copy per read);
3. runs ``InferHandler.answer`` (the same decode, validation and encoding as the Starlette
   route) as this task: if the client disconnects meanwhile, the task is cancelled, which
   cancels the request at the broker;
4. writes the answer with a pre-encoded header block (status line and uvicorn's default
   headers, rebuilt only when uvicorn's date header changes). A large answer to a request whose
   body came in a slot is written from the worker's output memory (``writelines``, no join); its
   lease is released once the transport's buffer has drained. The writing is the cycle's base
   class, ``answer_writer.AnswerWriter``.

What the cycle uses of its connection is ``connection.GuardedConnection``; the parser of every
connection is ``connection.request_parser``.

Errors are the route's: ShoalError → its status and ``{"error"}``, anything else → a logged 500.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import httptools

from shoal.errors import ShoalError
from shoal.frontend.core.prepare import IN_PLACE_ALIGNMENT, BodySlot
from shoal.frontend.http import compression
from shoal.frontend.http.answer_writer import AnswerWriter, head_block
from shoal.frontend.http.body_reader import BodyReader
from shoal.frontend.http.errors import internal_error_response
from shoal.frontend.http.infer import HEADER_LENGTH, INFER_PATH, InferHandler
from shoal.trace.record import HTTP_RECV_END, HTTP_RECV_START, HTTP_SEND_END, HTTP_SEND_START

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.frontend.http.connection import GuardedConnection
    from shoal.frontend.http.restricted import HttpGate
    from shoal.trace.record import RequestTrace
    from shoal.trace.sampling import Tracer

logger = logging.getLogger(__name__)

BODY_SLOT_MIN_BYTES: Final = 1 << 20  # smaller bodies are read into memory and copied once
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
ROUTE_CACHE_SIZE: Final = 256  # URLs whose ``infer_route`` a LeanInfer remembers



def infer_route(method: bytes, url: bytes) -> tuple[str, str | None] | None:
    """(model, version or None) when the request is an infer call, else None. Matches the
    percent-decoded path as the Starlette route would (query ignored)."""
    if method != b"POST" or b"/infer" not in url:
        return None
    try:
        raw_path = httptools.parse_url(url).path
        path = raw_path.decode("ascii")
    except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
        return None  # let the ASGI path answer it as before
    if "%" in path:
        path = urllib.parse.unquote(path)
    match = INFER_PATH.match(path)
    if match is None:
        return None
    return match.group(1), match.group(2)


class LeanInfer:
    """What a connection needs to serve the infer route itself; one per app. ``gate``: the
    infer route's restricted-API gate (None when ``inference`` is not restricted)."""

    def __init__(self, handler: InferHandler, dataplane: DataPlane, max_body: int,
                 gate: HttpGate | None, tracer: Tracer | None) -> None:
        self.handler = handler
        self.dataplane = dataplane
        self.max_body = max_body
        self.gate = gate
        self.tracer = tracer
        self._defaults: list[tuple[bytes, bytes]] | None = None
        self._ok_head = b""
        # ``infer_route`` of recent POST URLs (a few per model in practice); cleared when full
        self._routes: dict[bytes, tuple[str, str | None] | None] = {}

    def ok_head(self, defaults: list[tuple[bytes, bytes]]) -> bytes:
        """``HTTP/1.1 200 OK`` and uvicorn's default headers (date, server), pre-encoded; uvicorn
        replaces the list when the date changes, so it is rebuilt about once a second."""
        if defaults is not self._defaults:
            self._ok_head = head_block(200, defaults)
            self._defaults = defaults
        return self._ok_head

    def route(self, method: bytes, url: bytes) -> tuple[str, str | None] | None:
        """``infer_route``, remembered per URL: a repeated infer URL costs one dict lookup
        instead of a URL parse and a regex match."""
        if method != b"POST" or b"/infer" not in url:
            return None
        routes = self._routes
        try:
            return routes[url]
        except KeyError:
            pass
        route = infer_route(method, url)
        if len(routes) >= ROUTE_CACHE_SIZE:
            routes.clear()
        routes[url] = route
        return route

    def begin(self, protocol: GuardedConnection) -> LeanInferCycle | None:
        """Called from the protocol's ``on_headers_complete``: a started (or queued, when
        pipelined) cycle for an infer request; None for any other request."""
        route = self.route(protocol.parser.get_method(), protocol.url)
        if route is None:
            return None
        http_version = protocol.parser.get_http_version()
        cycle = LeanInferCycle(self, protocol, route[0], route[1], http_version,
                               http_version != "1.0" and protocol.parser.should_keep_alive())
        existing = protocol.cycle
        protocol.cycle = cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            protocol._start_asgi_task(cycle, None)  # type: ignore[arg-type]
        else:  # pipelined: uvicorn starts it when the answer before it is complete
            protocol.flow.pause_reading()
            protocol.pipeline.appendleft((cycle, None))  # type: ignore[arg-type]
        return cycle


class _Wakeup:
    """The ``message_event`` uvicorn sets on a disconnect: here a call into the cycle."""

    __slots__ = ("set",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.set = callback


class LeanInferCycle(AnswerWriter):
    """One infer request on one connection (see the module doc). Runs on the event loop."""

    lean: LeanInfer

    def __init__(self, lean: LeanInfer, protocol: GuardedConnection, model: str,
                 version: str | None, http_version: str, keep_alive: bool) -> None:
        self.lean = lean
        self.protocol = protocol
        self.model = model
        self.version = version
        self.http_version = http_version
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.message_event = _Wakeup(self._wake)
        self.headers: dict[str, str] = {}
        for name, value in protocol.headers:
            self.headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        self._chunks: list[bytes] = []
        self._size = 0
        self._body_done = False
        self._body_waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._answering = False  # the request is with the DataPlane: a disconnect cancels it
        self._body_slot: BodySlot | None = self._body_slot_for(protocol)
        self._reader: BodyReader | None = None
        if self._body_slot is not None:
            # from the next read on (the parser is still taking this one apart)
            owed = self._body_slot.slot.nbytes - self._body_slot.start
            self._reader = BodyReader(self, owed)
            protocol.transport.set_protocol(self._reader)

    def _detach_reader(self) -> None:
        """Give the transport back to the connection's protocol (idempotent)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            self.protocol.transport.set_protocol(self.protocol)

    # ------------------------------------------------------------------ body (protocol side)

    def _body_slot_for(self, protocol: GuardedConnection) -> BodySlot | None:
        headers = self.headers
        length = headers.get("content-length", "")
        if not length.isdigit() or int(length) < BODY_SLOT_MIN_BYTES:
            return None
        if headers.get("content-encoding", "identity").strip().lower() != "identity" \
                or "transfer-encoding" in headers:
            return None
        header_length = headers.get(HEADER_LENGTH, "").strip()
        total = int(length)
        if not header_length.isdigit() or not 0 < int(header_length) <= total \
                or total > self.lean.max_body:
            return None
        start = -int(header_length) % IN_PLACE_ALIGNMENT
        try:
            slot = self.lean.dataplane.allocate(start + total)
        except ShoalError:
            return None  # arena full: read into memory; the request gets the usual error
        return BodySlot(slot, start)

    def feed(self, body: bytes) -> None:
        """A piece of the body, as parsed (never past Content-Length: the parser frames it)."""
        reader = self._reader
        if reader is not None:  # the bytes that came with the headers' read
            reader.owed -= len(body)
        if self.response_complete or self.disconnected:
            return
        slot = self._body_slot
        if slot is not None and slot.start + self._size + len(body) > slot.slot.nbytes:
            # more than Content-Length said (the parser frames by it, so never expected)
            self._chunks.append(bytes(slot.slot.view[slot.start:slot.start + self._size]))
            self._free_body_slot()
            slot = None
        if slot is not None:
            start = slot.start + self._size
            slot.slot.view[start:start + len(body)] = body
        else:
            self._chunks.append(body)
        self._size += len(body)

    def body_complete(self) -> None:
        self._detach_reader()  # the whole body came with the headers' read
        self._body_done = True
        waiter = self._body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake(self) -> None:
        """uvicorn (connection lost) or the guard (body refused) set ``disconnected``."""
        if not self.disconnected:
            return
        self._detach_reader()
        waiter = self._body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._answering and self._task is not None:
            self._task.cancel()

    # ------------------------------------------------------------------ the exchange (task)

    async def run_asgi(self, app: object) -> None:
        """The name uvicorn's protocol starts a cycle by; ``app`` is unused."""
        self._task = asyncio.current_task()
        trace: RequestTrace | None = None
        try:
            lean = self.lean
            if lean.gate is not None:
                refused = lean.gate.refusal({"headers": self.protocol.headers})
                if refused is not None:
                    await self._send_response(refused)
                    return
            if lean.tracer is not None:
                trace = lean.tracer.sample(self.model)
                if trace is not None:
                    trace.stamp(HTTP_RECV_START)
            await self._serve(trace)
        except Exception as exc:
            if self.response_started:
                self.protocol.transport.close()
            elif not self.disconnected:
                await self._send_response(internal_error_response(exc, "POST infer"))
        finally:
            self._free_body_slot()
            if trace is not None:
                assert self.lean.tracer is not None
                self.lean.tracer.finish(trace)

    async def _serve(self, trace: RequestTrace | None) -> None:
        if not await self._read_body():
            return  # the client left, or the guard answered
        if self._size > self.lean.max_body:  # backstop: the guard refuses these first
            await self._send_error(compression.size_limit_error(self._size, self.lean.max_body))
            return
        if trace is not None:
            trace.stamp(HTTP_RECV_END)
        handler = self.lean.handler
        self._answering = True
        try:
            model = handler.resolve(self.model, self.version)
            encoding = compression.request_encoding(self.headers.get("content-encoding"))
            slot, self._body_slot = self._body_slot, None  # the handler's from here on
            if slot is not None:
                body: bytes | memoryview = slot.slot.view[slot.start:slot.start + self._size]
            else:
                chunks = self._chunks
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
            reply = await handler.answer(model, body, encoding, self.headers, trace, slot)
        except ShoalError as error:
            logger.debug("POST %s infer -> %s: %s", self.model, error.code.name, error.message)
            await self._send_error(error)
            return
        except asyncio.CancelledError:
            if not self.disconnected or self._task is None:
                raise
            self._task.uncancel()  # ours, for the disconnect: the task itself ends normally
            return  # the client left: the request was cancelled at the broker
        finally:
            self._answering = False
        if trace is not None:
            trace.stamp(HTTP_SEND_START)
        try:
            await self._send_reply(reply)
        finally:
            reply.release()
        if trace is not None:
            trace.stamp(HTTP_SEND_END)

    async def _read_body(self) -> bool:
        """Wait until the whole body is in; False when the client left first."""
        protocol = self.protocol
        if self.waiting_for_100_continue and not protocol.transport.is_closing():
            protocol.transport.write(CONTINUE)
            self.waiting_for_100_continue = False
        if not self._body_done and not self.disconnected:
            protocol.flow.resume_reading()  # paused while it waited behind a pipelined answer
            self._body_waiter = protocol.loop.create_future()
            await self._body_waiter
        return self._body_done and not self.disconnected

    def _free_body_slot(self) -> None:
        reader = self._reader
        if reader is not None:
            if reader.owed > 0 and not self.disconnected \
                    and not self.protocol.transport.is_closing():
                reader.drop_the_rest()  # the connection lives on: keep its framing
            else:
                self._detach_reader()
        slot, self._body_slot = self._body_slot, None
        if slot is not None:
            self.lean.dataplane.free(slot.slot)
