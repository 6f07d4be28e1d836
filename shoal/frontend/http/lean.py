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
   rest the transport reads straight into the slot (``_BodyReader``, an
   ``asyncio.BufferedProtocol`` that stands in for the connection's protocol until the body is
   in: no ``bytes`` object and no user-space copy per read);
3. runs ``InferHandler.answer`` (the same decode, validation and encoding as the Starlette
   route) as this task: if the client disconnects meanwhile, the task is cancelled, which
   cancels the request at the broker;
4. writes the answer with a pre-encoded header block (status line and uvicorn's default
   headers, rebuilt only when uvicorn's date header changes). A large answer to a request whose
   body came in a slot is written from the worker's output memory (``writelines``, no join); its
   lease is released once the transport's buffer has drained.

Errors are the route's: ShoalError → its status and ``{"error"}``, anything else → a logged 500.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import httptools
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from shoal.errors import ShoalError
from shoal.frontend.core.prepare import IN_PLACE_ALIGNMENT, BodySlot
from shoal.frontend.http import compression
from shoal.frontend.http.errors import internal_error_response, shoal_error_response
from shoal.frontend.http.infer import HEADER_LENGTH, INFER_PATH, InferHandler, InferReply
from shoal.trace.record import HTTP_RECV_END, HTTP_RECV_START, HTTP_SEND_END, HTTP_SEND_START

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.frontend.http.restricted import HttpGate
    from shoal.trace.record import RequestTrace
    from shoal.trace.sampling import Tracer

logger = logging.getLogger(__name__)

BODY_SLOT_MIN_BYTES: Final = 1 << 20  # smaller bodies are read into memory and copied once
SCRATCH_BYTES: Final = 1 << 16  # reads of a body dropped after its slot went (see _BodyReader)
DRAIN_POLL_S: Final = 0.001
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEADER_LENGTH_BYTES: Final = HEADER_LENGTH.encode()
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


class GuardedConnection(Protocol):
    """What the lean path uses of its connection's protocol, ``guard.GuardedHttpProtocol``
    (uvicorn's ``HttpToolsProtocol`` with the guard's body accounting): named here so this
    module needs no import of guard.py, which imports it. uvicorn's own types are ``Any``."""

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


def head_block(status: int, defaults: list[tuple[bytes, bytes]]) -> bytes:
    parts = [STATUS_LINE[status]]
    for name, value in defaults:
        parts += [name, b": ", value, b"\r\n"]
    return b"".join(parts)


class _Wakeup:
    """The ``message_event`` uvicorn sets on a disconnect: here a call into the cycle."""

    __slots__ = ("set",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.set = callback


class _BodyReader(asyncio.BufferedProtocol):
    """Stands in for the connection's protocol while the rest of a slot-bound body is read: the
    transport reads into the slot itself (``get_buffer`` never offers more than the body bytes
    still ``owed``, so a read never takes a byte past the body). Each read counts as body
    progress for the guard's body timeout. Once the body is in, the connection's protocol is put
    back with a fresh parser (the old one still waits for the body it never saw) and told the
    message is complete, as its parser would have. If the slot goes first while the connection
    lives on (the request was answered early, e.g. refused by the restricted-API gate), the rest
    of the body is read into a scratch buffer and dropped, so the next request on the connection
    is framed right. Connection events go on to the connection's protocol."""

    def __init__(self, cycle: LeanInferCycle, owed: int) -> None:
        self.cycle = cycle
        self.protocol = cycle.protocol
        self.owed = owed  # body bytes not yet read (by the parser, then by this reader)
        self.scratch: memoryview | None = None  # set once the rest is dropped

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.scratch is not None:
            return self.scratch[:self.owed]
        cycle = self.cycle
        slot = cycle._body_slot
        assert slot is not None  # the reader drops the rest once the slot is gone
        start = slot.start + cycle._size
        return slot.slot.view[start:start + self.owed]

    def drop_the_rest(self) -> None:
        self.scratch = memoryview(bytearray(min(self.owed, SCRATCH_BYTES)))

    def buffer_updated(self, nbytes: int) -> None:
        protocol = self.protocol
        self.owed -= nbytes
        if self.scratch is None:
            self.cycle._size += nbytes
        protocol._body_bytes += nbytes
        protocol._deadline = protocol.loop.time() + protocol._body_timeout_s  # progress
        # as the protocol's own reads do: bytes still coming after an early answer are not
        # an idle keep-alive connection
        protocol._unset_keepalive_if_required()
        if self.owed <= 0:
            self.cycle._detach_reader()
            protocol.parser = request_parser(protocol)
            protocol.on_message_complete()

    def eof_received(self) -> None:
        self.protocol.eof_received()  # None: the transport closes (a body cut short)

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()


class LeanInferCycle:
    """One infer request on one connection (see the module doc). Runs on the event loop."""

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
        self._reader: _BodyReader | None = None
        if self._body_slot is not None:
            # from the next read on (the parser is still taking this one apart)
            owed = self._body_slot.slot.nbytes - self._body_slot.start
            self._reader = _BodyReader(self, owed)
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

    # ------------------------------------------------------------------ writing

    async def _send_reply(self, reply: InferReply) -> None:
        headers = reply.headers
        length = sum(len(part) for part in reply.parts)
        head = [self.lean.ok_head(self.protocol.server_state.default_headers),
                b"content-type: ", headers["Content-Type"].encode(), b"\r\n"]
        header_length = headers.get("Inference-Header-Content-Length")
        if header_length is not None:
            head += [_HEADER_LENGTH_BYTES, b": ", header_length.encode(), b"\r\n"]
        content_encoding = headers.get("Content-Encoding")
        if content_encoding is not None:
            head += [b"content-encoding: ", content_encoding.encode(), b"\r\n"]
        head += [b"content-length: ", str(length).encode(), b"\r\n"]
        await self._write(200, head, reply.parts, reply.holds_output_memory)

    async def _send_error(self, error: ShoalError) -> None:
        await self._send_response(shoal_error_response(error))

    async def _send_response(self, response: Response) -> None:
        """A Starlette response (errors, refusals): its status, headers and body as they are."""
        head = [head_block(response.status_code, self.protocol.server_state.default_headers)]
        for name, value in response.raw_headers:
            head += [name, b": ", value, b"\r\n"]
        await self._write(response.status_code, head, [bytes(response.body)], False)

    async def _write(self, status: int, head: list[bytes], parts: list[bytes | memoryview],
                     borrowed: bool) -> None:
        """Write one answer and end the exchange. ``borrowed``: ``parts`` are views of memory
        that must outlive the write, so this waits for the transport's buffer to drain."""
        protocol = self.protocol
        flow = protocol.flow
        if flow.write_paused and not self.disconnected:
            await flow.drain()
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if protocol.access_log:
            protocol.access_logger.info('%s - "%s %s HTTP/%s" %d', _client(protocol), "POST",
                                        protocol.url.decode("latin-1"), self.http_version,
                                        status)
        transport = protocol.transport
        if len(parts) == 1 and len(parts[0]) < 65536:
            transport.write(b"".join([*head, parts[0]]))
        else:
            transport.writelines([b"".join(head), *parts])
        if borrowed and transport.get_write_buffer_size() > 0:
            transport.set_write_buffer_limits(high=0, low=0)  # resume only once empty
            try:
                while transport.get_write_buffer_size() > 0 and not self.disconnected:
                    if flow.write_paused:
                        await flow.drain()
                    else:  # a transport that did not pause: look again shortly
                        await asyncio.sleep(DRAIN_POLL_S)
            finally:
                if not transport.is_closing():
                    transport.set_write_buffer_limits()
        self.response_complete = True
        if not self.keep_alive:
            transport.close()
        protocol.on_response_complete()


def _client(protocol: GuardedConnection) -> str:
    client = protocol.client
    return f"{client[0]}:{client[1]}" if client else "-"
