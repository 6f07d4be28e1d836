"""Waits shorter than a millisecond, which zmq_poll cannot express (its timeout is in whole
milliseconds): the broker loop used to poll without blocking until such a deadline (a batcher's
queue delay running out) had passed, spinning for up to a millisecond per wait.

``wait_briefly`` sleeps instead in ``select`` (microsecond timeout) on the descriptors behind the
loop's poller: each ZeroMQ socket's ZMQ_FD, which becomes readable when the socket's state may
have changed, and the plain descriptors the poller also watches. ZMQ_FD only signals changes, so
the sockets' ZMQ_EVENTS is read first: a message already waiting means no sleep at all. Whatever
the wake-up, the caller then polls without blocking, as before; a spurious wake-up costs one
loop pass. Descriptors past select's FD_SETSIZE cannot be waited on this way: the caller keeps
its non-blocking poll then (``False``).
"""

from __future__ import annotations

import select
from collections.abc import Sequence

import zmq

_FD_SETSIZE = 1024
_POLLIN = int(zmq.POLLIN)  # a plain int: ``int & zmq.POLLIN`` builds a Flag (~0.7 us)


def wait_briefly(sockets: Sequence[zmq.Socket[bytes]], fds: Sequence[int],
                 timeout: float) -> bool:
    """Sleep up to ``timeout`` seconds (< 1 ms), or until a socket in ``sockets`` or a descriptor
    in ``fds`` may be readable. False: it did not wait (a descriptor select cannot take)."""
    watched = list(fds)
    for socket in sockets:
        events = socket.get(zmq.EVENTS)
        if isinstance(events, int) and events & _POLLIN:
            return True  # a message waits: no sleep
        fd = socket.get(zmq.FD)
        if not isinstance(fd, int):
            return False
        watched.append(fd)
    if max(watched, default=0) >= _FD_SETSIZE:
        return False
    select.select(watched, [], [], timeout)
    return True
