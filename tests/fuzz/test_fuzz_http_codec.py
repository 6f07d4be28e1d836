"""Fuzzing the HTTP infer body decoder (``http/codec.py``, ``jsonparse.py``, ``json_tensors.py``)
and what follows it short of the broker (``validation.py``, ``infer_common.prepare_request``, the
wire encoding): any body gives a request or a client error (``support.check_client_outcome``)."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal import dtypes
from shoal.errors import ErrorCode
from shoal.frontend.core.decoded import DecodedRequest
from shoal.frontend.http.codec import decode_infer_request, decode_request_parameters, split_body
from shoal.frontend.http.json_tensors import json_tensor_bytes
from shoal.frontend.http.jsonparse import parse_json, parse_json_object
from shoal.messages import ModelVersionInfo
from tests.fuzz.strategies import (
    infer_bodies,
    infer_documents,
    json_values,
    mutated_json,
    near_valid_bodies,
    tensor_data,
    to_json,
)
from tests.fuzz.support import (
    DATATYPES,
    MODEL_BY_NAME,
    MODELS,
    FuzzDataPlane,
    check_client_outcome,
    examples,
    forward,
    open_registry,
)

LIMIT = 1 << 20
model_names = st.sampled_from(sorted(MODEL_BY_NAME))


@pytest.fixture(scope="module")
def dataplane() -> Iterator[FuzzDataPlane]:
    with tempfile.TemporaryDirectory() as directory:
        registry = open_registry(directory)
        yield FuzzDataPlane(models=list(MODELS), shared_memory=registry)
        registry.close()


def decode_and_forward(dataplane: FuzzDataPlane, body: bytes, header_length: str | None,
                       model: ModelVersionInfo) -> None:
    def run() -> None:
        decoded = decode_infer_request(body, header_length, model, LIMIT)
        check_decoded(decoded, model)
        forward(dataplane, decoded, model)

    # UNSUPPORTED (501) is Triton 2.51's answer to a string sequence_id over 128 bytes
    check_client_outcome(run, also=frozenset({ErrorCode.UNSUPPORTED}))


def check_decoded(decoded: DecodedRequest, model: ModelVersionInfo) -> None:
    """What the rest of the frontend relies on after a successful decode."""
    assert isinstance(decoded.client_id, str)
    for tensor in decoded.inputs:
        assert tensor.data.format == "B" and tensor.data.ndim == 1
        assert tensor.element_count == math.prod(tensor.shape)
        assert dtypes.is_datatype(tensor.datatype)
    if decoded.raw:
        assert [t.name for t in decoded.inputs] == [model.inputs[0].name]


@examples(250)
@given(body=infer_bodies(), model_name=model_names)
def test_any_infer_body_gives_a_request_or_a_client_error(
        dataplane: FuzzDataPlane, body: tuple[bytes, str | None], model_name: str
) -> None:
    model = MODEL_BY_NAME[model_name]
    decode_and_forward(dataplane, body[0], body[1], model)


@examples(150)
@given(data=st.data(), model_name=model_names)
def test_mutated_json_documents(dataplane: FuzzDataPlane, data: st.DataObject,
                                model_name: str) -> None:
    model = MODEL_BY_NAME[model_name]
    document, _ = data.draw(infer_documents())
    body = data.draw(mutated_json(to_json(document)))
    decode_and_forward(dataplane, body, None, model)


@examples(150)
@given(body=st.binary(max_size=64), model_name=model_names)
def test_raw_binary_requests(dataplane: FuzzDataPlane, body: bytes,
                             model_name: str) -> None:
    model = MODEL_BY_NAME[model_name]
    decode_and_forward(dataplane, body, "0", model)


@examples(150)
@given(data=st.data(), model_name=model_names)
def test_binary_sizes_that_disagree_with_the_body(dataplane: FuzzDataPlane, data: st.DataObject,
                                                  model_name: str) -> None:
    model = MODEL_BY_NAME[model_name]
    """Every input binary; ``binary_data_size`` values near the chunk sizes (over, under,
    negative, past int64) and header lengths near the real one."""
    spec_names = [spec.name for spec in model.inputs]
    inputs, chunks = [], []
    for name in data.draw(st.lists(st.sampled_from(spec_names), min_size=1, max_size=3)):
        chunk = data.draw(st.binary(max_size=32))
        size = len(chunk) + data.draw(st.sampled_from((0, 0, 1, -1, 4, -4, 2**63, 2**64)))
        datatype = next(s.datatype for s in model.inputs if s.name == name)
        shape = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=3))
        inputs.append({"name": name, "datatype": datatype, "shape": shape,
                       "parameters": {"binary_data_size": size}})
        chunks.append(chunk)
    header = to_json({"inputs": inputs})
    body = header + b"".join(chunks)
    length = len(header) + data.draw(st.sampled_from((0, 0, 0, 1, -1, 7, -7, len(body))))
    decode_and_forward(dataplane, body, str(length), model)


@examples(300)
@given(datatype=st.sampled_from(DATATYPES), shape=st.lists(st.integers(0, 4), max_size=3),
       data=st.data())
def test_json_tensor_data_of_every_datatype(datatype: str, shape: list[int],
                                            data: st.DataObject) -> None:
    values = data.draw(tensor_data(datatype, shape))
    count = math.prod(shape)
    result = check_client_outcome(lambda: json_tensor_bytes(values, datatype, count, "x"))
    if isinstance(result, memoryview) and datatype != "BYTES":
        assert len(result) == count * dtypes.element_size(datatype)


@examples(200)
@given(text=st.one_of(st.binary(max_size=64), json_values.map(to_json),
                      json_values.map(to_json).flatmap(mutated_json)))
def test_parse_json_of_any_bytes(text: bytes) -> None:
    check_client_outcome(lambda: parse_json(text))
    check_client_outcome(lambda: parse_json_object(memoryview(text)))


@examples(200)
@given(parameters=json_values)
def test_request_parameters(parameters: Any) -> None:
    check_client_outcome(lambda: decode_request_parameters(parameters, DecodedRequest([])))


@examples(200)
@given(body=st.binary(max_size=16), length=st.one_of(st.none(), st.text(max_size=6),
                                                     st.integers().map(str)))
def test_split_body_of_any_header_length(body: bytes, length: str | None) -> None:
    parts = check_client_outcome(lambda: split_body(memoryview(body), length))
    if isinstance(parts, tuple):
        assert bytes(parts[0]) + bytes(parts[1]) == body



@examples(300)
@given(data=st.data(), model_name=model_names)
def test_near_valid_requests(dataplane: FuzzDataPlane, data: st.DataObject,
                             model_name: str) -> None:
    model = MODEL_BY_NAME[model_name]
    body, length = data.draw(near_valid_bodies(model))
    decode_and_forward(dataplane, body, length, model)
