"""A decoupled python model with ``async def execute`` (as Triton's stub runs it): the coroutine
is not waited for, so one instance overlaps several executes while they await; one that raises
is logged with its traceback and its still-open requests get the error, and the instance keeps
serving."""

from __future__ import annotations

import pathlib
import queue
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

MODEL = textwrap.dedent('''
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            senders, waits = [], []
            for request in requests:
                wait = float(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0])
                if wait < 0:
                    raise ValueError("the wait must not be negative")
                senders.append(request.get_response_sender())
                waits.append(wait)
            await asyncio.gather(*(asyncio.sleep(w) for w in waits))
            for sender, wait in zip(senders, waits):
                out = pb_utils.Tensor("WAITED", np.array([wait], np.float32))
                sender.send(pb_utils.InferenceResponse([out]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
''')

CONFIG = textwrap.dedent('''
    backend: "python"
    max_batch_size: 0
    input [ { name: "WAIT" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "WAITED" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
    model_transaction_policy { decoupled: true }
''')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = pathlib.Path(tmp_path_factory.mktemp("async_decoupled"))
    (repo / "sleeper" / "1").mkdir(parents=True)
    (repo / "sleeper" / "1" / "model.py").write_text(MODEL)
    (repo / "sleeper" / "config.pbtxt").write_text(CONFIG)
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


def _stream(server: ShoalServer, waits: list[float], timeout: float = 30
            ) -> list[tuple[float, Any, Any]]:
    """Sends one request per wait on one stream; (seconds after the first send, result, error)
    of each response, in arrival order."""
    answers: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    start = time.monotonic()
    client.start_stream(lambda result, error: answers.put(
        (time.monotonic() - start, result, error)))
    try:
        for wait in waits:
            tensor = grpcclient.InferInput("WAIT", [1], "FP32")
            tensor.set_data_from_numpy(np.array([wait], np.float32))
            client.async_stream_infer("sleeper", [tensor])
        return [answers.get(timeout=timeout) for _ in waits]
    finally:
        client.stop_stream()
        client.close()


def test_one_instance_overlaps_awaiting_executes(server: ShoalServer) -> None:
    got = _stream(server, [2.0, 2.0, 2.0, 0.2])
    assert all(error is None for _, _, error in got), got
    # run one after the other they would take 6.2 s; the short one, sent last, ends first
    assert got[0][1].as_numpy("WAITED")[0] == pytest.approx(0.2)
    assert max(at for at, _, _ in got) < 4.5, [at for at, _, _ in got]


def test_a_raising_execute_answers_an_error_and_is_logged(server: ShoalServer) -> None:
    (_, result, error), = _stream(server, [-1.0])
    assert result is None and error is not None
    assert "the wait must not be negative" in str(error)
    deadline = time.monotonic() + 5
    while "ValueError: the wait must not be negative" not in pathlib.Path(
            server.log_path).read_text(errors="replace"):
        assert time.monotonic() < deadline, "the traceback is not in the log"
        time.sleep(0.1)
    (_, result, error), = _stream(server, [0.1])  # the instance still serves
    assert error is None and result.as_numpy("WAITED")[0] == pytest.approx(0.1)
