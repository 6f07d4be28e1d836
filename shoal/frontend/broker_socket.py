"""The frontend's DEALER to the broker, driven straight from the event loop: no Future and no
task switch per message (zmq.asyncio creates a Future for every send and receive and wakes a
task for each received message; on the answer path that is most of the frontend's cost of a
hop, see bench/hops_link_bench.py).

- Receiving: the socket's file descriptor is registered with ``loop.add_reader``; each wake-up
  drains every message that is ready (at most ``DRAIN_BATCH`` before yielding to the loop) and
  hands each one's frames to ``on_frames``, in order.
- Sending: ``send`` writes at once (``NOBLOCK``). Below the high-water mark that always
  succeeds; past it (the broker stopped reading) messages wait in a backlog, in order, retried
  every ``RETRY_S``, and every later message queues behind them, so order is kept.
- ZeroMQ's descriptor is edge-triggered and a send may consume the edge that announced incoming
  messages, so every send schedules one more drain (ZeroMQ's documented rule for ZMQ_FD).

Threads: every method runs on the event loop that called ``start``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence
from typing import Final, cast

import zmq

logger = logging.getLogger(__name__)

DRAIN_BATCH: Final = 256  # messages handled per wake-up before other callbacks get a turn
RETRY_S: Final = 0.001
# plain ints: ``events & zmq.POLLIN`` goes through IntFlag's Python ``__and__`` (~0.6 µs a check)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)


class BrokerSocket:
    """A connected DEALER with ``identity``; high-water marks ``hwm`` both ways."""

    def __init__(self, endpoint: str, identity: bytes, hwm: int) -> None:
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, identity)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.RCVHWM, hwm)
        self._socket.connect(endpoint)
        self._fd = cast(int, self._socket.getsockopt(zmq.FD))
        self._backlog: collections.deque[Sequence[bytes]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_frames: Callable[[list[bytes]], None] | None = None
        self._drain_scheduled = False
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self, on_frames: Callable[[list[bytes]], None]) -> None:
        """Deliver every message received from now on to ``on_frames`` (on this loop)."""
        self._loop = asyncio.get_running_loop()
        self._on_frames = on_frames
        self._loop.add_reader(self._fd, self._drain)
        self._schedule_drain()  # messages may have arrived before the reader was added
        if self._backlog:  # sends refused before there was a loop to retry them on
            self._schedule_retry()

    def send(self, frames: Sequence[bytes]) -> None:
        if self._closed:
            return
        if self._backlog or not self._try_send(frames):
            self._backlog.append(frames)
            self._schedule_retry()
        self._schedule_drain()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        if self._backlog:
            logger.warning("%d messages to the broker dropped at close", len(self._backlog))
        self._socket.close(linger=0)

    # ---------------------------------------------------------------- internals

    def _try_send(self, frames: Sequence[bytes]) -> bool:
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def _schedule_retry(self) -> None:
        if self._retry is None and self._loop is not None:
            self._retry = self._loop.call_later(RETRY_S, self._send_backlog)

    def _send_backlog(self) -> None:
        self._retry = None
        if self._closed:
            return
        while self._backlog and self._try_send(self._backlog[0]):
            self._backlog.popleft()
        if self._backlog:
            self._schedule_retry()
        self._schedule_drain()

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled and self._loop is not None and not self._closed:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        if self._closed or self._on_frames is None:
            return
        socket, on_frames = self._socket, self._on_frames
        for _ in range(DRAIN_BATCH):
            if self._closed or not cast(int, socket.getsockopt(_EVENTS)) & _POLLIN:
                return
            try:
                frames = socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                on_frames(frames)
            except Exception as exc:  # one bad message must not stop the frontend's link
                logger.error("error handling a broker message", exc_info=exc)
        self._schedule_drain()  # more may be waiting: let other callbacks run first
