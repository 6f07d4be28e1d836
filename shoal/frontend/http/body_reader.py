"""The rest of a large infer body read straight into its arena slot (docs/architecture.md §3):
``BodyReader`` is the transport's protocol from the read after the headers until the body is in,
so each read lands in the slot (no ``bytes`` object, no user-space copy), and never takes a byte
past the body. ``lean.LeanInferCycle`` installs it and takes it away (``_detach_reader``); it
names what it uses of that cycle in ``ReadingCycle`` (this module must not import lean.py, which
imports it). Runs on the event loop, one reader per body.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, Protocol

from shoal.frontend.http.connection import request_parser

if TYPE_CHECKING:
    from shoal.frontend.core.prepare import BodySlot
    from shoal.frontend.http.connection import GuardedConnection

SCRATCH_BYTES: Final = 1 << 16  # reads of a body dropped after its slot went (see BodyReader)


class ReadingCycle(Protocol):
    """What a ``BodyReader`` uses of its ``lean.LeanInferCycle``: the connection, the slot the
    body goes to (None once it went), the body bytes in so far, and the call that gives the
    transport back to the connection's protocol."""

    protocol: GuardedConnection
    _body_slot: BodySlot | None
    _size: int

    def _detach_reader(self) -> None: ...


class BodyReader(asyncio.BufferedProtocol):
    """Stands in for the connection's protocol while the rest of a slot-bound body is read: the
    transport reads into the slot itself (``get_buffer`` never offers more than the body bytes
    still ``owed``, so a read never takes a byte past the body). Each read counts as body
    progress for the guard's body timeout. Once the body is in, the connection's protocol is put
    back with a fresh parser (the old one still waits for the body it never saw) and told the
    message is complete, as its parser would have. If the slot goes first while the connection
    lives on (the request was answered early, e.g. refused by the restricted-API gate), the rest
    of the body is read into a scratch buffer and dropped, so the next request on the connection
    is framed right. Connection events go on to the connection's protocol."""

    def __init__(self, cycle: ReadingCycle, owed: int) -> None:
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
