"""A non-decoupled python model answering through ``request.get_response_sender()`` as
Triton's stub lets it: after execute returned (from its own thread), before returning a
response of its own (the sent one stands), or sending twice (the first stands, the failure is
logged); and the model sees the stub's command line (``sys.argv == ['']``)."""

from __future__ import annotations

import pathlib
import time

import numpy as np

from shoal.messages import Error
from shoal.workers.backends.base import BackendResponse
from tests.workers.helpers import make_request
from tests.workers.test_python_backend import load

MODEL = '''
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def answer(value):
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("OUTPUT0", np.full(4, value, np.float32)),
        pb_utils.Tensor("OUTPUT1", np.zeros(4, np.float32))])


class TritonPythonModel:
    def initialize(self, args):
        self.argv = list(sys.argv)

    def execute(self, requests):
        returned = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if mode == 0:  # answer from a thread, after execute returned
                sender = request.get_response_sender()

                def later(sender=sender):
                    time.sleep(0.3)
                    sender.send(answer(10.0))
                    sender.send(flags=final)

                threading.Thread(target=later, daemon=True).start()
                returned.append(None)
            elif mode == 1:  # send and close, then return a response as well
                request.get_response_sender().send(answer(11.0), flags=final)
                returned.append(answer(99.0))
            elif mode == 2:  # send twice: the second raises
                sender = request.get_response_sender()
                sender.send(answer(12.0))
                sender.send(answer(98.0))
            elif mode == 3:  # nothing at all
                returned.append(None)
            else:  # the command line seen by the model
                returned.append(answer(float(self.argv == [""])))
        return returned
'''


def run(tmp_path: pathlib.Path, *modes: int) -> list[BackendResponse | Error | None]:
    backend = load(tmp_path, MODEL)
    try:
        return backend.execute([make_request(i, {
            "INPUT0": np.full(4, mode, np.float32), "INPUT1": np.zeros(4, np.float32)})
            for i, mode in enumerate(modes)])
    finally:
        backend.unload()


def value(result: BackendResponse | Error | None) -> float:
    assert isinstance(result, BackendResponse), result
    return float({o.name: o.array for o in result.outputs}["OUTPUT0"][0])


def test_a_response_sent_after_execute_returned_answers_the_request(
        tmp_path: pathlib.Path) -> None:
    start = time.monotonic()
    results = run(tmp_path, 0, 4)
    assert [value(r) for r in results] == [10.0, 1.0]
    assert time.monotonic() - start >= 0.3


def test_a_sent_response_stands_over_a_returned_one(tmp_path: pathlib.Path) -> None:
    assert [value(r) for r in run(tmp_path, 1, 4)] == [11.0, 1.0]


def test_the_first_response_stands_when_a_second_send_raises(tmp_path: pathlib.Path) -> None:
    first, other = run(tmp_path, 2, 4)
    assert value(first) == 12.0
    # the exception ended execute: the request without a response of its own gets it
    assert isinstance(other, Error) and "cannot send more than one response" in other.message


def test_none_without_a_sender_is_an_error(tmp_path: pathlib.Path) -> None:
    (result,) = run(tmp_path, 3)
    assert isinstance(result, Error)
    assert "without sending its response" in result.message


def test_the_model_sees_the_stub_command_line(tmp_path: pathlib.Path) -> None:
    (result,) = run(tmp_path, 4)
    assert value(result) == 1.0
