"""The generate extension: JSON object -> tensors and parameters, output values, and both routes
through the app over a fake DataPlane (decoupled answers included)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient

from shoal import dtypes
from shoal.errors import ShoalError
from shoal.frontend.core.decoded import SEQUENCE_START
from shoal.frontend.http.app import create_app
from shoal.frontend.http.generate import (
    ONE_RESPONSE_ERROR,
    JsonMembers,
    decode_generate_request,
    fit_shape,
    output_value,
    parse_generate_body,
)
from shoal.frontend.http.jsonparse import parse_json_object
from shoal.messages import TensorRef, TensorSpec
from shoal.settings import settings_from_flags
from tests.frontend.grpc.fakes import StreamingFakeDataPlane
from tests.frontend.http.fakes import make_model

SETTINGS = settings_from_flags(model_repositories=["/models"]).for_frontends()
TEXT = make_model("text", [TensorSpec("PROMPT", "BYTES", [1]), TensorSpec("N", "INT32", [-1])])
BATCHED = make_model("batched", [TensorSpec("X", "FP32", [-1])], max_batch_size=4)


def test_inputs_come_from_top_level_keys_and_from_parameters() -> None:
    decoded = decode_generate_request(
        {"PROMPT": "hi", "id": "r1", "temperature": 0.5,
         "parameters": {"N": [1, 2, 3], "top_k": 4, "priority": 2, "sequence_id": 9,
                        "sequence_start": True}}, TEXT)
    inputs = {t.name: t for t in decoded.inputs}
    assert inputs["PROMPT"].shape == [1] and inputs["PROMPT"].datatype == "BYTES"
    assert bytes(inputs["PROMPT"].data) == dtypes.serialize_bytes([b"hi"])
    assert inputs["N"].shape == [3]
    assert bytes(inputs["N"].data) == np.array([1, 2, 3], np.int32).tobytes()
    assert decoded.client_id == "r1"
    assert decoded.parameters == {"temperature": 0.5, "top_k": 4}
    assert (decoded.priority, decoded.correlation_id, decoded.flags) == (2, 9, SEQUENCE_START)


def test_a_batching_model_gets_a_batch_dimension_of_one() -> None:
    (tensor,) = decode_generate_request({"X": [1.0, 2.0]}, BATCHED).inputs
    assert tensor.shape == [1, 2]


MATRIX = make_model("matrix", [TensorSpec("M", "FP32", [2, 2]), TensorSpec("P", "BYTES", [1, 1])])
BATCHED_PROMPT = make_model("bp", [TensorSpec("P", "BYTES", [1, 1])], max_batch_size=8)


@pytest.mark.parametrize("model,value,shape", [
    (MATRIX, "hi", [1, 1]), (MATRIX, ["hi"], [1, 1]), (MATRIX, [["hi"]], [1, 1]),
    (BATCHED_PROMPT, "hi", [1, 1, 1]), (BATCHED_PROMPT, ["a", "b"], [2, 1, 1]),
    (BATCHED_PROMPT, [], [0, 1, 1]), (TEXT, "hi", [1]),
])
def test_values_are_fitted_to_the_configured_dims(model: Any, value: Any,
                                                  shape: list[int]) -> None:
    (tensor,) = decode_generate_request({"P" if model is not TEXT else "PROMPT": value},
                                        model).inputs
    assert tensor.shape == shape


def test_a_flat_list_fills_fixed_dims() -> None:
    (tensor,) = decode_generate_request({"M": [1, 2, 3, 4]}, MATRIX).inputs
    assert tensor.shape == [2, 2]
    assert np.frombuffer(tensor.data, np.float32).tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("value", [[1, 2], [1] * 8, 1, [[1, 2], [3, 4]]])
def test_values_that_do_not_fit_the_dims_are_tritons_invalid_arg(value: Any) -> None:
    with pytest.raises(ShoalError) as caught:
        decode_generate_request({"M": value}, MATRIX)
    assert caught.value.message == ("The schema can not convert input 'M' to tensor with "
                                    "proper shape")


def test_the_fitting_rule() -> None:
    def fit(dims: list[int], count: int, batching: bool = False) -> list[int]:
        return fit_shape(TensorSpec("X", "FP32", dims), count, batching)

    assert fit([-1], 3) == [3]
    assert fit([2, -1], 6) == [2, 3]
    assert fit([-1, -1], 5) == [1, 5]
    assert fit([-1, 3], 6, batching=True) == [1, 2, 3]
    with pytest.raises(ShoalError):
        fit([0], 1)
    with pytest.raises(ShoalError):
        fit([3], 2)


@pytest.mark.parametrize("document,text", [
    ({"PROMPT": 5}, "Unable to parse JSON bytes array: attempt to access JSON non-string as "
                    "string"),
    ({"PROMPT": {"a": "b"}}, "Unable to parse JSON bytes array: attempt to access JSON "
                             "non-string as string"),
    ({"N": ["x"]}, "Unable to parse 'data': attempt to access JSON non-signed-integer as "
                   "signed-integer"),
    ({"N": True}, "Unable to parse 'data': attempt to access JSON non-signed-integer as "
                  "signed-integer"),
    ({"id": 5}, "Unable to parse 'id': attempt to access JSON non-string as string"),
    ({"parameters": [1]}, "Expected JSON object for keyword: 'parameters': attempt to access "
                          "JSON non-object as object"),
    ({"triton_x": 1}, "parameter keys starting with 'triton_' are reserved"),
    ({"nested": {"a": 1}}, "parameter 'nested' has invalid type"),
    ({"parameters": {"nested": {"a": 1}}}, "Converting keyword: 'parameters': parameter "
                                           "'nested' has invalid type"),
    ({"PROMPT": "a", "parameters": {"PROMPT": "b"}}, "Converting keyword: 'parameters': "
                                                     "[request id: <id_unknown>] input 'PROMPT' "
                                                     "already exists in request"),
])
def test_bad_generate_requests_are_refused(document: dict[str, Any], text: str) -> None:
    with pytest.raises(ShoalError) as caught:
        decode_generate_request(document, TEXT)
    assert caught.value.message.startswith(text)


@pytest.mark.parametrize("body,name", [
    (b'{"PROMPT": "a", "N": 1, "PROMPT": "b"}', "PROMPT"),
    (b'{"PROMPT": "a", "N": 1, "N": 2, "PROMPT": "b"}', "N"),
])
def test_an_input_given_twice_is_refused_in_member_order(body: bytes, name: str) -> None:
    with pytest.raises(ShoalError) as caught:
        decode_generate_request(parse_generate_body(body), TEXT)
    assert caught.value.message == (f"[request id: <id_unknown>] input '{name}' already exists "
                                    "in request")


def test_a_parameter_given_twice_is_fine() -> None:
    decoded = decode_generate_request(
        parse_generate_body(b'{"PROMPT": "a", "k": 1, "k": 2, "parameters": {"k": 3}}'), TEXT)
    assert decoded.parameters == {"k": 3}


@pytest.mark.parametrize("body", [
    b"[1]", b"1", b'"x"', b"{", b'{"a": 1,}', b"[" * 101 + b"]" * 101,
    b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", b'{"a": "\\ud800"}', b'{"a": "\xff"}',
    b'{"a": 1' + b"0" * 5000 + b"}",
])
def test_a_generate_body_is_refused_with_the_request_json_texts(body: bytes) -> None:
    with pytest.raises(ShoalError) as expected:
        parse_json_object(body, "generate request")
    with pytest.raises(ShoalError) as caught:
        parse_generate_body(body)
    assert (caught.value.code, caught.value.message) == (expected.value.code,
                                                         expected.value.message)


@pytest.mark.parametrize("body,members", [
    (b'{"a": NaN, "a": [Infinity]}', [("a", math.nan), ("a", [math.inf])]),
    (b'\xef\xbb\xbf {"b": {"c": 1, "c": 2}}', [("b", [("c", 1), ("c", 2)])]),
    ('{"\u00e9": "\U0001f600"}'.encode(), [("\u00e9", "\U0001f600")]),
    (b'{"s": "\\ud83d\\ude00"}', [("s", "\U0001f600")]),  # a pair of escapes is one character
])
def test_a_generate_body_keeps_every_member(body: bytes, members: list[Any]) -> None:
    def plain(value: Any) -> Any:
        if isinstance(value, JsonMembers):
            return [(key, plain(item)) for key, item in value]
        return [plain(item) for item in value] if isinstance(value, list) else value

    assert repr(plain(parse_generate_body(body))) == repr(members)  # (NaN != NaN)


def ref(datatype: str, shape: list[int]) -> TensorRef:
    return TensorRef("O", datatype, shape, "/x", 0, 0)


def test_output_values_unwrap_one_element() -> None:
    assert output_value(ref("INT32", [1]), memoryview(np.int32(7).tobytes())) == 7
    assert output_value(ref("BYTES", [1]), memoryview(dtypes.serialize_bytes([b"ok"]))) == "ok"
    listed = output_value(ref("FP32", [2]), memoryview(np.array([1, 2], np.float32).tobytes()))
    assert orjson.loads(orjson.dumps(listed, option=orjson.OPT_SERIALIZE_NUMPY)) == [1.0, 2.0]
    nan = output_value(ref("FP64", [1]), memoryview(np.float64(math.nan).tobytes()))
    assert orjson.dumps({"v": nan}) == b'{"v":"NaN"}'  # as infer writes it: valid JSON
    inf = output_value(ref("FP32", [1]), memoryview(np.float32(-math.inf).tobytes()))
    assert orjson.dumps({"v": inf}) == b'{"v":"-Infinity"}'
    listed_nan = output_value(ref("FP32", [2]),
                              memoryview(np.array([math.inf, 1], np.float32).tobytes()))
    assert orjson.dumps(listed_nan) == b'["Infinity",1.0]'
    with pytest.raises(ShoalError, match="FP16 data via JSON is not supported"):
        output_value(ref("FP16", [1]), memoryview(np.float16(1).tobytes()))


# ------------------------------------------------------------------------ through the app


@pytest.fixture
def dataplane() -> StreamingFakeDataPlane:
    return StreamingFakeDataPlane(models=[
        make_model("identity", [TensorSpec("INPUT0", "FP32", [-1])]),
        make_model("decoupled", [TensorSpec("INPUT0", "FP32", [-1])], decoupled=True),
    ])


@pytest.fixture
def client(dataplane: StreamingFakeDataPlane) -> Iterator[TestClient]:
    with TestClient(create_app(dataplane, SETTINGS), raise_server_exceptions=False) as c:
        yield c


def events(body: bytes) -> list[Any]:
    chunks = body.split(b"\n\n")
    assert chunks[-1] == b""
    assert all(chunk.startswith(b"data: ") for chunk in chunks[:-1])
    return [orjson.loads(chunk[len(b"data: "):]) for chunk in chunks[:-1]]


def test_generate_answers_one_json_object(client: TestClient,
                                          dataplane: StreamingFakeDataPlane) -> None:
    r = client.post("/v2/models/identity/generate", json={"INPUT0": [1.5, 2.0], "id": "g"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.content == (b'{"OUTPUT0":[1.5,2.0],"id":"g","model_name":"identity",'
                         b'"model_version":"1"}')  # Triton's order: names sorted
    r = client.post("/v2/models/identity/versions/1/generate", json={"INPUT0": 4.0})
    assert r.json()["OUTPUT0"] == 4.0
    assert dataplane.live_slots == {}
    assert len(dataplane.released) == 2


def test_generate_writes_non_ascii_names_in_byte_order(client: TestClient,
                                                       dataplane: StreamingFakeDataPlane) -> None:
    """Byte order of the UTF-8 names, as sorting the code points gives it (astral last)."""
    dataplane.response_parameters = {"\U00010000": 1, "\uffff": 2, "\u00e9": 3, "Z": 4,
                                      "model_name": "not this one"}
    expected = (b'{"OUTPUT0":4.0,"Z":4,"model_name":"identity","model_version":"1",'
                + '"\u00e9":3,"\uffff":2,"\U00010000":1}'.encode())
    r = client.post("/v2/models/identity/generate", json={"INPUT0": 4.0})
    assert r.content == expected
    r = client.post("/v2/models/identity/generate_stream", json={"INPUT0": 4.0})
    assert r.content == b"data: " + expected + b"\n\n"


def test_generate_needs_exactly_one_response_of_a_decoupled_model(client: TestClient) -> None:
    r = client.post("/v2/models/decoupled/generate", json={"INPUT0": [3.0]})
    assert r.status_code == 200 and r.json()["OUTPUT0"] == 3.0
    # Triton: the status is the first response's (an error response of the model: 400); the
    # body is that one response, else its "exactly 1 response" text (shoal: 501, not 200)
    for values, status, expected in (([1.0, 2.0], 501, ONE_RESPONSE_ERROR),
                                     ([], 501, ONE_RESPONSE_ERROR),
                                     ([1.0, -1.0], 501, ONE_RESPONSE_ERROR),
                                     ([-1.0], 400, "negative value")):
        r = client.post("/v2/models/decoupled/generate", json={"INPUT0": values})
        assert (r.status_code, r.json()["error"]) == (status, expected), values


def test_generate_stream_sends_one_event_per_response(client: TestClient,
                                                      dataplane: StreamingFakeDataPlane) -> None:
    r = client.post("/v2/models/decoupled/generate_stream", json={"INPUT0": [1.0, 2.0, 3.0]})
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert [e["OUTPUT0"] for e in events(r.content)] == [1.0, 2.0, 3.0]
    r = client.post("/v2/models/identity/generate_stream", json={"INPUT0": [5.0]})
    assert events(r.content) == [{"OUTPUT0": 5.0, "model_name": "identity",
                                  "model_version": "1"}]
    assert dataplane.live_slots == {} and dataplane.abandoned == []


def test_generate_stream_errors_before_and_after_the_first_event(client: TestClient) -> None:
    r = client.post("/v2/models/decoupled/generate_stream", json={"INPUT0": [1.0, -1.0]})
    assert r.status_code == 200
    assert events(r.content) == [
        {"model_name": "decoupled", "model_version": "1", "OUTPUT0": 1.0},
        {"error": "negative value"}]
    r = client.post("/v2/models/decoupled/generate_stream", json={"INPUT0": [-1.0]})
    assert r.status_code == 400  # Triton's status for a model's error as the first response
    assert events(r.content) == [{"error": "negative value"}]
    r = client.post("/v2/models/identity/generate_stream", json={"NOPE": 1})
    assert r.status_code == 400
    assert r.json()["error"].startswith("[request id: <id_unknown>] expected 1 inputs but got 0 "
                                        "inputs")
