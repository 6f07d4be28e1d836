"""A worker in process: the real ``WorkerProc`` (its backend, arena, control thread) on threads of
the test, connected to a stand-in broker: a ROUTER socket of the test at the worker endpoint,
which sends real ``Batch`` messages (inputs inline, no frontend arena needed) and reads the
worker's real answers, whose output bytes it reads from the worker's own segments.
"""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
import zmq
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.config.model_config import config_to_json
from shoal.dtypes import numpy_to_wire
from shoal.messages import (
    Batch,
    Message,
    RequestedOutput,
    TensorRef,
    WorkerReady,
    WorkerRequest,
    WorkerSpec,
    decode,
    encode,
)
from shoal.settings import settings_from_flags
from shoal.shm.regions import RegionCache
from shoal.shm.sweep import new_instance_id
from shoal.shm.tensors import array_from_buffer, array_to_bytes
from shoal.workers.proc import WorkerProc


def inline(name: str, array: npt.NDArray[Any]) -> TensorRef:
    wire = numpy_to_wire(array.dtype)
    data = array_to_bytes(array, wire)
    return TensorRef(name, wire, list(array.shape), "", 0, len(data), inline=data)


class WorkerHarness:
    def __init__(self, root: pathlib.Path, model_py: str, config_pbtxt: str) -> None:
        model_dir = root / "model"
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / "model.py").write_text(textwrap.dedent(model_py))
        config = text_format.Parse(textwrap.dedent(config_pbtxt), ModelConfig())
        runtime = root / "run"
        runtime.mkdir()
        self.settings = settings_from_flags(
            instance_id=new_instance_id(), runtime_dir=str(runtime),
            shm_segment_bytes=1 << 20, shm_arena_max_bytes=8 << 20).for_workers()
        endpoint = f"ipc://{runtime}/worker.sock"
        self.context: zmq.Context[Any] = zmq.Context()
        self.broker = self.context.socket(zmq.ROUTER)
        self.broker.setsockopt(zmq.LINGER, 0)
        self.broker.bind(endpoint)
        name = str(config.name)
        self.spec = WorkerSpec(
            identity=f"{name}:1:{name}_0:1", model_name=name, model_version=1,
            model_dir=str(model_dir), version_dir=str(model_dir / "1"),
            backend=str(config.backend), config_json=json.dumps(config_to_json(config)),
            instance_name=f"{name}_0", kind="CPU", device_id=0, broker_endpoint=endpoint,
            arena_prefix=self.settings.instance.segment_prefix + "w1-", settings=self.settings)
        self.proc = WorkerProc(self.spec, self.settings)
        self.proc.control_thread.start()
        argv = sys.argv
        try:
            self.proc.load()
        finally:
            sys.argv = argv  # the python backend gives the model Triton's stub's argv ['']
        self._thread = threading.Thread(target=self.proc.serve, name="worker", daemon=True)
        self._thread.start()
        self.outputs = RegionCache(self.spec.arena_prefix)
        self._next_batch = 1
        ready = self.receive(lambda m: isinstance(m, WorkerReady))
        assert ready.instance == self.spec.identity

    def send_batch(self, requests: list[tuple[int, list[TensorRef], list[str]]]) -> int:
        """(request id, inputs, requested outputs) per request; returns the batch id."""
        batch_id = self._next_batch
        self._next_batch += 1
        self.broker.send_multipart([self.spec.identity.encode(), *encode(Batch(batch_id, [
            WorkerRequest(request_id=i, inputs=inputs,
                          outputs=[RequestedOutput(o) for o in outputs])
            for i, inputs, outputs in requests]))])
        return batch_id

    def send_control(self, message: Message) -> None:
        self.broker.send_multipart([(self.spec.identity + "#c").encode(), *encode(message)])

    def receive(self, match: Any, timeout_ms: int = 10_000) -> Any:
        """The next message from the worker (any of its sockets) that ``match`` accepts."""
        while self.broker.poll(timeout_ms):
            frames = self.broker.recv_multipart()
            message = decode(frames[1:])
            if match(message):
                return message
        raise AssertionError("no matching message from the worker")

    def array(self, ref: TensorRef) -> npt.NDArray[Any]:
        view = (memoryview(ref.inline) if ref.inline is not None
                else self.outputs.view(ref.region, ref.offset, ref.nbytes))
        return np.array(array_from_buffer(view, ref.datatype, ref.shape))

    def close(self) -> None:
        self.proc.stopping = True
        self._thread.join(timeout=10)
        self.proc.close()
        self.outputs.close()
        self.broker.close()
        self.context.term()



