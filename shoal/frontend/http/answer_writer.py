"""Writing the answer of a lean infer exchange (docs/architecture.md §3): ``AnswerWriter``, the
base of ``lean.LeanInferCycle`` that holds its writing half. A reply goes out with the
pre-encoded header block (``HeadCache.ok_head``, i.e. ``lean.LeanInfer.ok_head``), a Starlette
response (errors, refusals) with its status, headers and body as they are. One answer ends the
exchange (uvicorn's ``on_response_complete``); one that borrows the worker's output memory is
written with ``writelines`` of its views and waits until the transport's buffer has drained.
Runs on the event loop. Nothing here imports lean.py, which imports this module.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from shoal.frontend.http.errors import shoal_error_response
from shoal.frontend.http.infer import HEADER_LENGTH

if TYPE_CHECKING:
    from starlette.responses import Response

    from shoal.errors import ShoalError
    from shoal.frontend.http.connection import GuardedConnection
    from shoal.frontend.http.infer import InferReply

DRAIN_POLL_S: Final = 0.001
_HEADER_LENGTH_BYTES: Final = HEADER_LENGTH.encode()


def head_block(status: int, defaults: list[tuple[bytes, bytes]]) -> bytes:
    parts = [STATUS_LINE[status]]
    for name, value in defaults:
        parts += [name, b": ", value, b"\r\n"]
    return b"".join(parts)


class HeadCache(Protocol):
    """Where an ``AnswerWriter`` gets the pre-encoded ``200 OK`` head (``lean.LeanInfer``)."""

    def ok_head(self, defaults: list[tuple[bytes, bytes]]) -> bytes: ...


class AnswerWriter:
    """The writing half of ``lean.LeanInferCycle`` (its base class; the cycle sets these
    attributes)."""

    lean: HeadCache
    protocol: GuardedConnection
    http_version: str
    keep_alive: bool
    waiting_for_100_continue: bool
    response_started: bool
    response_complete: bool
    disconnected: bool

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
