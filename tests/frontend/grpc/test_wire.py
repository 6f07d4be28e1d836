"""ModelInfer's wire handling (``grpc/wire.py``): large raw inputs are split out of the received
bytes as views, everything else parses as protobuf parses it, and serialized answers read back
as protobuf messages."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend.grpc.wire import (
    SPLIT_BYTES,
    encode_varint,
    parse_infer_request,
    serialize_infer_response,
    serialize_message,
)


def request(*raw: bytes) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version="2", id="r-1")
    message.parameters["priority"].int64_param = 3
    for index, contents in enumerate(raw):
        tensor = message.inputs.add(name=f"IN{index}", datatype="UINT8", shape=[len(contents)])
        tensor.parameters["k"].string_param = "v"
        message.raw_input_contents.append(contents)
    message.outputs.add(name="OUT")
    return message


def without_raw(message: pb.ModelInferRequest) -> pb.ModelInferRequest:
    rest = pb.ModelInferRequest()
    rest.CopyFrom(message)
    del rest.raw_input_contents[:]
    return rest


def test_a_large_request_keeps_its_raw_inputs_as_views_of_the_received_bytes() -> None:
    big = np.arange(SPLIT_BYTES, dtype=np.uint8).tobytes()
    message = request(big, b"small", b"")
    data = message.SerializeToString()
    wire = parse_infer_request(data)
    assert [bytes(raw) for raw in wire.raw] == [big, b"small", b""]
    assert all(raw.obj is data for raw in wire.raw)  # no copy
    assert wire.message == without_raw(message)


def test_a_small_request_parses_whole() -> None:
    message = request(b"abc", b"de")
    wire = parse_infer_request(message.SerializeToString())
    assert [bytes(raw) for raw in wire.raw] == [b"abc", b"de"]
    assert wire.message == message


def test_unknown_fields_of_every_wire_type_are_kept() -> None:
    big = b"x" * SPLIT_BYTES
    unknown = (encode_varint(20 << 3 | 0) + encode_varint(300)  # varint
               + encode_varint(21 << 3 | 1) + b"\x01" * 8  # fixed64
               + encode_varint(22 << 3 | 5) + b"\x02" * 4)  # fixed32
    data = request(big).SerializeToString() + unknown
    assert bytes(parse_infer_request(data).raw[0]) == big
    assert parse_infer_request(data).message == pb.ModelInferRequest.FromString(
        without_raw(request(big)).SerializeToString() + unknown)


@pytest.mark.parametrize("cut", [1, 7, SPLIT_BYTES // 2])
def test_a_truncated_large_request_fails_as_protobuf_fails(cut: int) -> None:
    data = request(b"y" * SPLIT_BYTES).SerializeToString()[:-cut]
    with pytest.raises(DecodeError):
        parse_infer_request(data)


def test_a_serialized_answer_reads_back_with_its_raw_outputs_in_order() -> None:
    head = pb.ModelInferResponse(model_name="m", model_version="1", id="a")
    head.outputs.add(name="A", datatype="UINT8", shape=[3])
    head.outputs.add(name="B", datatype="UINT8", shape=[0])
    big = np.arange(200_000, dtype=np.uint32).view(np.uint8)
    data = serialize_infer_response(head, [memoryview(big.tobytes()), b""])
    answer = pb.ModelInferResponse.FromString(data)
    assert answer.raw_output_contents == [big.tobytes(), b""]
    assert [o.name for o in answer.outputs] == ["A", "B"]
    stream = pb.ModelStreamInferResponse.FromString(
        serialize_infer_response(head, [b"abc"], stream=True))
    assert stream.infer_response.raw_output_contents == [b"abc"]
    assert stream.infer_response.id == "a"


def test_the_response_serializer_passes_bytes_and_serializes_messages() -> None:
    assert serialize_message(b"\x0a\x01m") == b"\x0a\x01m"
    error = pb.ModelStreamInferResponse(error_message="bad")
    assert serialize_message(error) == error.SerializeToString()
