"""uvicorn's httptools protocol with the limits uvicorn lacks: header and body read timeouts, a
connection cap that still answers health checks, and the body size limit from the headers.
When the app offers ``lean_infer`` (``fastpath.InferFastPath`` does), infer requests are served
by the protocol itself after these checks (``lean.py``); every other request by the ASGI app.

One ``GuardedHttpProtocol`` runs per connection, on the event loop (single-threaded). uvicorn
knows only the keep-alive idle timeout (``--http-idle-timeout-secs``, armed after a response);
the rest lives here:

- **Header timeout** (``--http-header-timeout-secs``): the request line and headers must be
  complete within N s of the connection being accepted, or, on a keep-alive connection, of the
  next request's first byte (the idle timeout covers the wait before that byte). A client that
  sent part of a request gets 408, a silent one is just closed.
- **Body timeout** (``--http-body-timeout-secs``): N s without a body byte ends the request:
  408 when nothing was answered yet, then close. Time spent with reading paused by us (flow
  control, a pipelined request waiting for the one before) does not count.
- **Body size** (``--http-max-input-size``): a Content-Length over the limit is answered 413
  before any body is read; a chunked body is answered 413 once it passes the limit. The app's
  own checks (``infer.read_body``, the fast path) stay as a backstop and are never reached.
- **Body pieces**: a body may reach the parser in at most ``FREE_BODY_PIECES`` pieces plus one
  per ``PIECE_BYTES`` of body (a piece: one chunk of a chunked body, or one read of a
  Content-Length body); past that it is refused 400 at once. Each piece costs a callback and a
  buffer, so a million one-byte chunks would otherwise take half a minute of the event loop.
  Clients that stream a body (a generator in ``requests``, 8 KiB reads) are far inside it.
- **Chunked with Content-Length**: served as Triton serves it, framed by the chunked coding
  alone (the Content-Length is ignored, never used to frame or size anything), and the
  connection is closed after the answer (RFC 9112 §6.1, against request smuggling). Such a
  request whose codings do not end with ``chunked`` is refused 400 (the parser would read it
  to the connection's end).
- **Connection cap** (``--http-max-connections``, per process and port): connections past it
  are over-cap. Each gets one request: a health check (``/v2/health/live``, ``/ready``) is
  served, anything else gets 503, then the connection closes. At most ``over_cap`` of them are
  open at once; beyond that a new connection is closed unread. A rate-limited warning says so.

Timers are lazy: one ``call_at`` per connection at most, re-armed when it fires early (a
deadline only ever moves later, except when a new request's header clock starts), so a busy
keep-alive connection costs a clock read and a few stores per request, not a timer.

After a refusal (413, 503) the connection is half-closed and its input discarded for
``LINGER_S`` before closing, so a client still sending a body reads the answer instead of a
reset. A refusal while an earlier response on the connection is still being written waits for
it (the connection then closes); a pipelined request refused mid-body closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from shoal.frontend.http.compression import size_limit_error
from shoal.frontend.http.connection import request_parser
from shoal.frontend.http.errors import error_body
from shoal.frontend.http.lean import LeanInfer, LeanInferCycle
from shoal.frontend.limits import RateLimitedWarning

logger = logging.getLogger(__name__)

HEALTH_PATHS: Final = frozenset({b"/v2/health/live", b"/v2/health/ready"})
OVER_CAP_HEADER_TIMEOUT_S: Final = 2.0  # an over-cap connection gets one quick request
LINGER_S: Final = 2.0  # after a refusal: input is read and dropped this long, then close
FD_ALARM_MARGIN: Final = 128  # warn when an accepted descriptor is this close to the limit
FREE_BODY_PIECES: Final = 4096  # pieces any body may come in ...
PIECE_BYTES: Final = 1024  # ... plus one per this many bytes of it


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_body_bytes: int
    max_connections: int
    over_cap: int  # over-cap connections answered at once; more are closed unread


# admission of a connection (plain ints: enum member access costs ~100 ns on the hot path)
CLOSED: Final = 0     # closed at accept (no slot at all), or already counted out
ADMITTED: Final = 1
OVER_CAP: Final = 2

# phase of a connection
WAITING: Final = 0    # accepted, no byte yet: the header clock runs from the accept
HEADERS: Final = 1    # a request's first byte arrived, its headers are not complete
BODY: Final = 2
IDLE: Final = 3       # between requests (uvicorn's idle timer) or a request being served
ENDED: Final = 4      # answered by us and closing: input is dropped


class ConnectionBudget:
    """The connections of one listening port in this process."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.admitted = 0
        self.over_cap = 0
        self.fd_alarm = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - FD_ALARM_MARGIN
        self.warn_cap = RateLimitedWarning(logger)
        self.warn_fds = RateLimitedWarning(logger)
        self.warn_slow = RateLimitedWarning(logger)


def guarded_protocol(limits: HttpLimits) -> type[GuardedHttpProtocol]:
    """A protocol class for one uvicorn server (``uvicorn.Config(http=...)``), with its own
    connection budget."""

    class BoundGuardedHttpProtocol(GuardedHttpProtocol):
        budget = ConnectionBudget(limits)

    return BoundGuardedHttpProtocol


class GuardedHttpProtocol(HttpToolsProtocol):
    budget: ClassVar[ConnectionBudget]

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.parser = request_parser(self)
        limits = self.budget.limits
        self.timeout_keep_alive = limits.idle_timeout_s  # type: ignore[assignment]
        self._body_timeout_s = limits.body_timeout_s
        self._max_body = limits.max_body_bytes
        self._header_timeout_s = limits.header_timeout_s
        self._admission = CLOSED
        self._phase = WAITING
        self._body_bytes = 0
        self._body_pieces = 0
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        # an app that offers ``lean_infer`` has its infer route served here (``lean.py``)
        self._lean: LeanInfer | None = getattr(config.app, "lean_infer", None)
        self._lean_cycle: LeanInferCycle | None = None  # the lean request whose body is read

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        budget = self.budget
        limits = budget.limits
        header_timeout = limits.header_timeout_s
        if budget.admitted < limits.max_connections:
            budget.admitted += 1
            self._admission = ADMITTED
        elif budget.over_cap < limits.over_cap:
            budget.over_cap += 1
            self._admission = OVER_CAP
            header_timeout = self._header_timeout_s = min(header_timeout,
                                                          OVER_CAP_HEADER_TIMEOUT_S)
            budget.warn_cap("HTTP connection cap reached (%d open): new connections get 503 "
                            "(health checks are still answered)", limits.max_connections)
        else:
            budget.warn_cap("HTTP connection cap reached (%d open) and %d over-cap connections "
                            "waiting for their answer: new connections are closed unread",
                            limits.max_connections, limits.over_cap)
            transport.close()
            return
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.fileno() >= budget.fd_alarm:
            budget.warn_fds("file descriptors nearly exhausted (descriptor %d accepted, limit "
                            "%d): at the limit new connections are reset without a log line "
                            "(EMFILE)", sock.fileno(), budget.fd_alarm + FD_ALARM_MARGIN)
        self._set_deadline(header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        admission, self._admission = self._admission, CLOSED
        if admission == CLOSED:
            return  # closed at accept: uvicorn never saw it
        if admission == ADMITTED:
            self.budget.admitted -= 1
        else:
            self.budget.over_cap -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == IDLE:  # the next request's first byte: its header clock starts
            self._phase = HEADERS
            self._set_deadline(self._header_timeout_s)
        elif phase == WAITING:  # the first request: the clock started at the accept
            self._phase = HEADERS
        elif phase == ENDED:
            return
        HttpToolsProtocol.data_received(self, data)

    # ------------------------------------------------------------------ parser callbacks

    def on_headers_complete(self) -> None:
        if self._phase == ENDED:
            return
        if self._admission == OVER_CAP and self.url.split(b"?", 1)[0] \
                not in HEALTH_PATHS:
            self._refuse_request(503, f"the server is at its limit of "
                                 f"{self.budget.limits.max_connections} open HTTP connections; "
                                 "retry later")
            return
        length: bytes | None = None
        codings: list[bytes] = []
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                codings += value.split(b",")
        close_after = False
        if codings and length is not None:
            # framed by Transfer-Encoding alone (``connection.request_parser``); RFC 9112 §6.1: such
            # a connection is closed after the answer. The parser reads a coding other than
            # chunked last to the connection's end: refused
            if codings[-1].strip().lower() != b"chunked":
                self._refuse_request(400, "a request with Content-Length and a "
                                     "Transfer-Encoding must end its codings with chunked")
                return
            close_after = True
        elif length is not None and length.isdigit() and int(length) > self._max_body:
            self._refuse_request(413, size_limit_error(int(length), self._max_body).message)
            return
        self._phase = BODY
        self._body_bytes = 0
        self._body_pieces = 0
        self._set_deadline(self._body_timeout_s)
        lean = self._lean
        lean_cycle = self._lean_cycle = None if lean is None else lean.begin(self)
        if lean_cycle is not None:
            if close_after:
                lean_cycle.keep_alive = False
            return
        HttpToolsProtocol.on_headers_complete(self)
        if (self._admission == OVER_CAP or close_after) and self.cycle is not None:
            self.cycle.keep_alive = False  # one health check per over-cap connection

    def on_body(self, body: bytes) -> None:
        if self._phase == ENDED:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body:
            self._refuse_body(413, size_limit_error(self._body_bytes, self._max_body).message,
                              linger=True)
            return
        self._body_pieces += 1
        if self._body_pieces > FREE_BODY_PIECES + self._body_bytes // PIECE_BYTES:
            self.budget.warn_slow("a request body came in too many small pieces: 400, closed")
            self._refuse_body(400, f"the request body came in more than {FREE_BODY_PIECES} "
                              f"pieces plus one per {PIECE_BYTES} bytes ({self._body_pieces} "
                              f"pieces for {self._body_bytes} bytes): send it in larger "
                              "chunks", linger=True)
            return
        self._deadline = self.loop.time() + self._body_timeout_s  # progress
        if self._lean_cycle is not None:
            self._lean_cycle.feed(body)
            return
        HttpToolsProtocol.on_body(self, body)

    def on_message_complete(self) -> None:
        if self._phase == ENDED:
            return
        self._phase = IDLE
        if self._lean_cycle is not None:
            self._lean_cycle.body_complete()
            return
        HttpToolsProtocol.on_message_complete(self)

    # ------------------------------------------------------------------ deadlines

    def _set_deadline(self, timeout_s: float) -> None:
        deadline = self.loop.time() + timeout_s
        self._deadline = deadline
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._on_timer)
        self._timer_at = when

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        phase = self._phase
        if phase in (IDLE, ENDED):
            return
        if self.loop.time() < self._deadline:
            self._arm(self._deadline)
        elif phase in (WAITING, HEADERS):
            self._headers_timed_out()
        elif self.flow.read_paused:  # we are not reading: not the client's delay
            self._set_deadline(self._body_timeout_s)
        else:
            self.budget.warn_slow("a request body made no progress for %gs: 408, closed",
                                  self._body_timeout_s)
            self._refuse_body(408, f"request body made no progress for "
                              f"{self._body_timeout_s:g}s", linger=False)

    def _headers_timed_out(self) -> None:
        timeout = self._header_timeout_s
        if self._phase == WAITING:  # silent connection: nothing is owed
            logger.debug("closed a connection that sent no request within %gs", timeout)
            self._phase = ENDED
            self.transport.close()
            return
        self.budget.warn_slow("request headers not complete within %gs: 408, closed", timeout)
        self._refuse_request(408, f"request headers not received within {timeout:g}s",
                             linger=False)

    # ------------------------------------------------------------------ refusals

    def _refuse_request(self, status: int, message: str, linger: bool = True) -> None:
        """Refuse the request whose headers are (being) read; it has no cycle yet."""
        self._phase = ENDED
        previous: RequestResponseCycle | None = self.cycle
        if previous is not None and not previous.response_complete:
            # an earlier request is still being answered (the last one queued, if pipelined):
            # answers go in order, so close after it instead
            previous.keep_alive = False
            self._cancel_timer()
            return
        self._answer_and_close(status, message, linger)

    def _refuse_body(self, status: int, message: str, linger: bool) -> None:
        """End the request whose body is being read (``self.cycle``)."""
        self._phase = ENDED
        cycle = self.cycle
        if self.pipeline or cycle.response_started:  # an answer is under way: just close
            self._cancel_timer()
            self.transport.close()
            return
        cycle.disconnected = True  # the app sees http.disconnect; its answer is dropped
        cycle.message_event.set()
        self._answer_and_close(status, message, linger)

    def _answer_and_close(self, status: int, message: str, linger: bool) -> None:
        self._cancel_timer()
        body = error_body(message)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ",
                 str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body]
        self.transport.write(b"".join(head))
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.flow.resume_reading()  # drain what the client still sends, then close
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
