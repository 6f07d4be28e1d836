"""``BrokerClient.forget_cuda_handles`` against an in-test ROUTER: the forget reaches the broker
after every request the client queued before it (a worker must not unmap what a queued request
names before that request)."""

from __future__ import annotations

import asyncio
import pathlib

import zmq
import zmq.asyncio

from shoal.frontend.broker_client import BrokerClient
from shoal.messages import (
    CudaHandle,
    ForgetCudaHandles,
    Hello,
    InferRequest,
    Message,
    TensorRef,
    decode,
)


def test_forget_follows_the_requests_queued_before_it(tmp_path: pathlib.Path) -> None:
    endpoint = f"ipc://{tmp_path}/frontend.sock"
    handle = CudaHandle(b"\x07" * 64, 0, 256)
    request = InferRequest(1, "m", -1, [TensorRef("X", "FP32", [4], "", 0, 16, cuda=handle)])

    async def main() -> list[Message]:
        router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(endpoint)
        client = BrokerClient(endpoint, "fe-test", lambda snapshot: None)
        try:
            await client.start()
            client.submit(request)  # queued for this loop iteration's flush
            client.forget_cuda_handles([handle])
            received: list[Message] = []
            for _ in range(3):
                frames = await asyncio.wait_for(router.recv_multipart(), 5)
                received.append(decode(frames))
            return received
        finally:
            await client.close()
            router.close(linger=0)

    received = asyncio.run(main())
    assert received == [Hello("fe-test"), request, ForgetCudaHandles([handle])]
