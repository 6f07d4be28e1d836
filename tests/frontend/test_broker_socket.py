"""``BrokerSocket`` against an in-test ROUTER: every message is delivered once and in order (also
those that arrived before ``start`` and those whose edge a send consumed), sends keep their order
past the high-water mark, and a failing handler does not stop the link."""

from __future__ import annotations

import asyncio
import pathlib

import zmq
import zmq.asyncio

from shoal.frontend.broker_socket import BrokerSocket


async def _router(endpoint: str) -> zmq.asyncio.Socket:
    router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    return router


async def _until(condition: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_messages_arrive_in_order_around_sends_and_before_start(tmp_path: pathlib.Path) -> None:
    endpoint = f"ipc://{tmp_path}/frontend.sock"

    async def main() -> list[list[bytes]]:
        router = await _router(endpoint)
        link = BrokerSocket(endpoint, b"fe-1", 1000)
        received: list[list[bytes]] = []
        try:
            link.send([b"hello"])
            identity, hello = await asyncio.wait_for(router.recv_multipart(), 5)
            assert (identity, hello) == (b"fe-1", b"hello")
            for n in range(3):  # before start: waiting in the socket
                await router.send_multipart([b"fe-1", b"early", str(n).encode()])
            await asyncio.sleep(0.05)
            link.start(received.append)
            for n in range(200):  # interleaved with sends, which may consume the edge
                await router.send_multipart([b"fe-1", b"late", str(n).encode()])
                link.send([b"ping", str(n).encode()])
            await _until(lambda: len(received) == 203)
            for n in range(200):
                assert await asyncio.wait_for(router.recv_multipart(), 5) == [
                    b"fe-1", b"ping", str(n).encode()]
            return received
        finally:
            link.close()
            router.close(linger=0)

    received = asyncio.run(main())
    assert received == ([[b"early", str(n).encode()] for n in range(3)]
                        + [[b"late", str(n).encode()] for n in range(200)])


def test_sends_past_the_high_water_mark_wait_and_keep_their_order(
        tmp_path: pathlib.Path) -> None:
    endpoint = f"ipc://{tmp_path}/frontend.sock"
    payload = b"x" * (1 << 20)  # 1 MiB each: the pipe and the kernel buffer fill quickly
    count = 40

    async def main() -> list[bytes]:
        router = await _router(endpoint)
        link = BrokerSocket(endpoint, b"fe-1", 1)
        try:
            link.start(lambda frames: None)
            for n in range(count):
                link.send([str(n).encode(), payload])
            assert link._backlog, "the high-water mark was never reached"
            order = []
            for _ in range(count):
                frames = await asyncio.wait_for(router.recv_multipart(), 10)
                order.append(frames[1])
            return order
        finally:
            link.close()
            router.close(linger=0)

    assert asyncio.run(main()) == [str(n).encode() for n in range(count)]


def test_a_failing_handler_does_not_stop_the_link(tmp_path: pathlib.Path) -> None:
    endpoint = f"ipc://{tmp_path}/frontend.sock"

    async def main() -> list[bytes]:
        router = await _router(endpoint)
        link = BrokerSocket(endpoint, b"fe-1", 1000)
        seen: list[bytes] = []

        def handle(frames: list[bytes]) -> None:
            seen.append(frames[0])
            if frames[0] == b"bad":
                raise ValueError("a bug")

        try:
            link.send([b"hello"])
            await asyncio.wait_for(router.recv_multipart(), 5)
            link.start(handle)
            for frame in (b"bad", b"good"):
                await router.send_multipart([b"fe-1", frame])
            await _until(lambda: len(seen) == 2)
            return seen
        finally:
            link.close()
            link.close()  # closing twice is harmless
            router.close(linger=0)

    assert asyncio.run(main()) == [b"bad", b"good"]
