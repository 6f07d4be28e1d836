"""``BrokerClient``'s lease releases against an in-test ROUTER: releases queued in the same loop
iteration as requests ride on their InferRequestBatch (one message, not two); releases with no
request to ride on still go at once as a ReleaseLeases."""

from __future__ import annotations

import asyncio
import pathlib

import zmq
import zmq.asyncio

from shoal.frontend.broker_client import BrokerClient
from shoal.messages import (
    Hello,
    InferRequest,
    InferRequestBatch,
    Lease,
    Message,
    ReleaseLeases,
    TensorRef,
    decode,
)


def _request(request_id: int) -> InferRequest:
    return InferRequest(request_id, "m", -1, [TensorRef("X", "FP32", [4], "r", 0, 16)])


def test_releases_ride_on_requests_and_go_alone_without_them(tmp_path: pathlib.Path) -> None:
    endpoint = f"ipc://{tmp_path}/frontend.sock"
    first, second = Lease("w1", 1), Lease("w2", 2)

    async def main() -> list[Message]:
        router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(endpoint)
        client = BrokerClient(endpoint, "fe-test", lambda snapshot: None)
        try:
            await client.start()
            client.release(first)  # one iteration: a release and a request
            client.submit(_request(1))
            await asyncio.sleep(0.05)
            client.release(second)  # the next: a release alone
            await asyncio.sleep(0.05)
            client.submit(_request(2))  # and a request alone
            received: list[Message] = []
            for _ in range(4):
                frames = await asyncio.wait_for(router.recv_multipart(), 5)
                received.append(decode(frames))
            return received
        finally:
            await client.close()
            router.close(linger=0)

    received = asyncio.run(main())
    assert received == [Hello("fe-test"), InferRequestBatch([_request(1)], [first]),
                        ReleaseLeases([second]), _request(2)]
