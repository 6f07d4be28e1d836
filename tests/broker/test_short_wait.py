"""wait_briefly: the broker loop's sub-millisecond sleep (short_wait.py)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

import pytest
import zmq

from shoal.broker.router import bind_router
from shoal.broker.short_wait import wait_briefly


@pytest.fixture
def pair(tmp_path: object) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/r.sock"
    router = bind_router(context, endpoint)
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    yield router, dealer
    dealer.close(linger=0)
    router.close(linger=0)
    context.term()


def test_a_waiting_message_or_a_readable_descriptor_ends_the_wait(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    router, dealer = pair
    read_end, write_end = os.pipe()
    try:
        assert wait_briefly([router], [read_end], 0.0005)  # nothing: sleeps, then returns
        dealer.send(b"x")
        deadline = time.monotonic() + 10
        while not router.poll(0) and time.monotonic() < deadline:
            wait_briefly([router], [read_end], 0.0005)
        assert router.poll(0), "the message arrived"
        assert wait_briefly([router], [read_end], 0.0005)
        os.write(write_end, b"!")
        assert wait_briefly([], [read_end], 0.0005)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_descriptor_select_cannot_take_leaves_the_wait_to_the_caller(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    router, _ = pair
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip("cannot open a descriptor past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    read_end, write_end = os.pipe()
    high = os.dup2(read_end, 1050)
    try:
        assert not wait_briefly([router], [high], 0.0005)
    finally:
        for fd in (high, read_end, write_end):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
