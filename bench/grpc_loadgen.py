"""Closed-loop gRPC load generator (KServe v2 ``ModelInfer``), the gRPC twin of
bench/loadgen.py: C concurrent calls, each sending one pre-serialized ModelInferRequest (the
bytes tritonclient.grpc sends: the tensor in ``raw_input_contents``) and waiting for its answer,
for a fixed duration. Bytes in, bytes out (no protobuf work in the timed loop), so it measures
the server, not itself. Shoal and MLServer both serve ``inference.GRPCInferenceService``.
"""

from __future__ import annotations

import asyncio
import math
import time

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

METHOD = "/inference.GRPCInferenceService/ModelInfer"
_CALLS_PER_CHANNEL = 64  # one HTTP/2 connection per 64 concurrent calls


def infer_request(model: str, input_name: str, x: np.ndarray) -> bytes:
    """A serialized ModelInferRequest of FP32 ``x`` as ``input_name``."""
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = input_name, "FP32"
    tensor.shape.extend(x.shape)
    request.raw_input_contents.append(np.ascontiguousarray(x, dtype=np.float32).tobytes())
    return bytes(request.SerializeToString())


async def _caller(call: grpc.aio.UnaryUnaryMultiCallable, request: bytes, stop_at: float,
                  latencies: list[float], errors: list[str]) -> None:
    while time.perf_counter() < stop_at:
        start = time.perf_counter()
        try:
            await call(request)
        except grpc.aio.AioRpcError as exc:
            errors.append(exc.code().name)
            continue
        latencies.append(time.perf_counter() - start)


async def run(port: int, request: bytes, concurrency: int, seconds: float,
              host: str = "127.0.0.1") -> dict[str, float]:
    """The same figures as bench/loadgen.run: req/s, p50/p90/p99 ms, errors."""
    channels = [grpc.aio.insecure_channel(f"{host}:{port}")
                for _ in range(math.ceil(concurrency / _CALLS_PER_CHANNEL))]
    calls = [c.unary_unary(METHOD) for c in channels]  # no (de)serializers: bytes as they are
    try:
        warm: list[float] = []
        await _caller(calls[0], request, time.perf_counter() + 0.5, warm, [])
        latencies: list[float] = []
        errors: list[str] = []
        start = time.perf_counter()
        stop_at = start + seconds
        await asyncio.gather(*(_caller(calls[i % len(calls)], request, stop_at, latencies,
                                       errors) for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        for channel in channels:
            await channel.close()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e3 if latencies else 0

    return {"concurrency": concurrency, "requests_per_s": len(latencies) / elapsed,
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
            "errors": len(errors)}
