"""The worker's half of implicit state: input states mapped as inputs, output states checked,
copied into their buffer and hidden from the client's response."""

from __future__ import annotations

import numpy as np

from shoal.messages import Error, RequestedOutput, StateBinding, WorkerRequest
from shoal.workers.backends.base import BackendResponse, OutputTensor
from shoal.workers.sequence_state import (
    requested_with_states,
    state_inputs,
    write_output_states,
)

MEMORY = bytearray(256)


def view_of(region: str, offset: int, nbytes: int) -> memoryview:
    assert region == "/shoal-x-st0-0"
    return memoryview(MEMORY)[offset:offset + nbytes]


def _request(dims: list[int], capacity: int = 64) -> WorkerRequest:
    binding = StateBinding("S_IN", "S_OUT", "INT32", dims, [1, 2], "/shoal-x-st0-0", 0, 8,
                           "/shoal-x-st0-0", 64, capacity)
    return WorkerRequest(1, [], [RequestedOutput("Y")], states=[binding])


def _response(state: np.ndarray, datatype: str = "INT32") -> BackendResponse:
    return BackendResponse(outputs=[OutputTensor("Y", "INT32", np.array([[1]], np.int32)),
                                    OutputTensor("S_OUT", datatype, state)])


def test_input_state_is_a_view_of_the_state_buffer() -> None:
    MEMORY[0:8] = np.array([4, 5], np.int32).tobytes()
    (name, array), = state_inputs(_request([1, 2]), view_of).items()
    assert name == "S_IN" and array.tolist() == [[4, 5]]


def test_output_state_is_requested_alongside_the_clients_outputs() -> None:
    assert requested_with_states(_request([1, 2])) == ["Y", "S_OUT"]
    assert requested_with_states(WorkerRequest(1, [], [], states=_request([1, 2]).states)) == []


def test_output_state_is_written_and_removed_from_the_response() -> None:
    outcome = write_output_states(_request([1, -1]), _response(
        np.array([[7, 8, 9]], np.int32)), view_of)
    assert not isinstance(outcome, Error)
    response, written = outcome
    assert [t.name for t in response.outputs] == ["Y"]
    assert [(w.output_name, w.shape, w.nbytes) for w in written] == [("S_OUT", [1, 3], 12)]
    assert np.frombuffer(bytes(MEMORY[64:76]), np.int32).tolist() == [7, 8, 9]


def test_bad_output_states_fail_the_request_without_writing() -> None:
    MEMORY[64:72] = bytes(8)
    cases = [
        (_request([1, 2]), _response(np.array([[1, 2]], np.int64), "INT64"), "data type INT64"),
        (_request([1, 2]), _response(np.array([[1, 2, 3]], np.int32)), "declared [1, 2]"),
        (_request([1, -1], capacity=8), _response(np.array([[1, 2, 3]], np.int32)),
         "needs 12 bytes, more than its state buffer of 8 bytes"),
    ]
    for request, response, message in cases:
        outcome = write_output_states(request, response, view_of)
        assert isinstance(outcome, Error) and message in outcome.message, outcome
    assert bytes(MEMORY[64:72]) == bytes(8)


def test_a_state_the_model_did_not_produce_is_not_written() -> None:
    response = BackendResponse(outputs=[OutputTensor("Y", "INT32", np.array([[1]], np.int32))])
    outcome = write_output_states(_request([1, 2]), response, view_of)
    assert outcome == (response, [])
