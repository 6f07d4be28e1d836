"""Answers -> ModelInferResponse / ModelStreamInferResponse, the error mapping, and the hand-coded
health messages."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from shoal.errors import ErrorCode, invalid_arg
from shoal.frontend.core.shm_params import SharedMemorySlice
from shoal.frontend.core.validation import InferPlan, OutputPlan
from shoal.frontend.grpc.encode import (
    FINAL_RESPONSE,
    encode_infer_response,
    set_parameter,
    stream_error,
    stream_reply,
)
from shoal.frontend.grpc.health import (
    NOT_SERVING,
    SERVING,
    parse_check_request,
    serialize_check_response,
)
from shoal.frontend.grpc.status import GRPC_STATUS, status_for
from shoal.messages import InferResponse, TensorRef

OUTPUTS: dict[str, np.ndarray[Any, Any]] = {
    "F": np.array([[0.5, 2.0, 1.0], [3.0, 0.0, 1.0]], np.float32),
    "H": np.array([1.5, -2.0], np.float16),
}


def refs() -> list[TensorRef]:
    return [TensorRef(name, "FP32" if name == "F" else "FP16", list(a.shape), "/x", i, a.nbytes)
            for i, (name, a) in enumerate(OUTPUTS.items())]


def view(ref: TensorRef) -> memoryview:
    return memoryview(OUTPUTS[ref.name].tobytes())


def encode(plan: InferPlan) -> Any:
    """The encoded answer, parsed back as the client parses it."""
    response = InferResponse(7, 3, refs(), {"p": 1, "q": "s"})
    return pb.ModelInferResponse.FromString(encode_infer_response(
        response, model_name="m", model_version=3, client_id="id-1", plan=plan, batching=True,
        output_view=view))


def test_every_output_is_raw_with_its_metadata() -> None:
    message = encode(InferPlan(2, [], False, True))
    assert (message.id, message.model_name, message.model_version) == ("id-1", "m", "3")
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("F", "FP32", [2, 3]), ("H", "FP16", [2])]
    assert message.raw_output_contents == [a.tobytes() for a in OUTPUTS.values()]
    assert message.parameters["p"].int64_param == 1
    assert message.parameters["q"].string_param == "s"


def test_explicit_outputs_and_classification() -> None:
    plan = InferPlan(2, [OutputPlan("F", "FP32", True, classification=2)], True, True)
    message = encode(plan)
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("F", "BYTES", [2, 2])]
    raw = message.raw_output_contents[0]
    assert b"2.000000:1" in raw and b"3.000000:0" in raw


def test_shared_memory_outputs_carry_no_bytes() -> None:
    plan = InferPlan(2, [OutputPlan("F", "FP32", True),
                         OutputPlan("H", "FP16", True, shm=SharedMemorySlice("r", 0, 4))],
                     True, True)
    message = encode(plan)
    assert message.raw_output_contents == [OUTPUTS["F"].tobytes(), b""]
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("F", "FP32", [2, 3]), ("H", "FP16", [2])]


@pytest.mark.parametrize("value,member", [(True, "bool_param"), (-5, "int64_param"),
                                          (2**64 - 1, "uint64_param"), (0.25, "double_param"),
                                          ("x", "string_param")])
def test_parameter_values_pick_their_oneof_member(value: object, member: str) -> None:
    param = pb.InferParameter()
    set_parameter(param, value)  # type: ignore[arg-type]
    assert param.WhichOneof("parameter_choice") == member
    assert getattr(param, member) == value


def test_stream_messages_carry_the_final_flag_and_the_request_id() -> None:
    error = stream_error("bad", client_id="r1", model_name="m", model_version="", final=True)
    assert error.error_message == "bad"
    assert error.infer_response.id == "r1"
    assert error.infer_response.parameters[FINAL_RESPONSE].bool_param is True
    reply = stream_reply(pb.ModelInferResponse(id="r2"), final=False)
    assert reply.error_message == ""
    assert reply.infer_response.id == "r2"
    assert reply.infer_response.parameters[FINAL_RESPONSE].bool_param is False


@pytest.mark.parametrize("final", [True, False])
def test_a_stream_answer_wraps_the_response_and_carries_the_final_flag(final: bool) -> None:
    response = InferResponse(7, 3, refs(), {"p": 1})
    encoded = encode_infer_response(response, model_name="m", model_version=3, client_id="s-1",
                                    plan=InferPlan(2, [], False, True), batching=True,
                                    output_view=view, final=final)
    reply = pb.ModelStreamInferResponse.FromString(encoded)
    assert reply.error_message == ""
    answer = reply.infer_response
    assert answer.id == "s-1"
    assert answer.parameters[FINAL_RESPONSE].bool_param is final
    assert answer.parameters["p"].int64_param == 1
    assert answer.raw_output_contents == [a.tobytes() for a in OUTPUTS.values()]


def test_status_mapping_is_tritons() -> None:
    assert set(GRPC_STATUS) == set(ErrorCode)
    assert status_for(ErrorCode.UNSUPPORTED) == grpc.StatusCode.UNIMPLEMENTED
    assert status_for(ErrorCode.INVALID_ARG) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(invalid_arg("x").code) == grpc.StatusCode.INVALID_ARGUMENT


def test_health_messages() -> None:
    assert parse_check_request(b"") == ""
    assert parse_check_request(b"\x0a\x03abc") == "abc"
    # an unknown varint field (2) and an unknown length-delimited field (3) are skipped
    assert parse_check_request(b"\x10\x96\x01\x1a\x02zz\x0a\x01s") == "s"
    assert serialize_check_response(SERVING) == b"\x08\x01"
    assert serialize_check_response(NOT_SERVING) == b"\x08\x02"
    for malformed in (b"\x0a\x05ab", b"\x0a", b"\x0f"):
        with pytest.raises(Exception, match="malformed HealthCheckRequest"):
            parse_check_request(malformed)
