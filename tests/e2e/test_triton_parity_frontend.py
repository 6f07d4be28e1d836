"""What the frontend answers where it must answer as Triton 2.51 does (issue #24, each case
measured against the real tritonserver with numpy-only python models): unknown, never loaded,
unloaded and failed models (404 / NOT_FOUND, not 400 or 503), version strings, statistics texts,
generate's shape fitting, input texts and error responses (400, as an event stream for
generate_stream), the request id at the start of Triton's core messages, duplicated inputs and
outputs, the classification bound, and requests with both
``Transfer-Encoding: chunked`` and ``Content-Length``. One real server in explicit mode, HTTP
(httpx, requests, raw sockets) and gRPC (tritonclient)."""

from __future__ import annotations

import json
import pathlib
import socket
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# ------------------------------------------------------------------------------- the models

# answers TEXT = "<input>:<shape>;..." for the inputs it got (the shapes generate made)
SHAPES = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            seen = ";".join(f"{t.name()}:{list(t.as_numpy().shape)}" for t in r.inputs())
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TEXT", np.array([seen.encode()], dtype=object))]))
        return out
"""

# PROMPT "raise": execute raises; "error": an error response; anything else: echoed
ERRORS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            p = pb_utils.get_input_tensor_by_name(r, "PROMPT").as_numpy().reshape(-1)[0]
            if p == b"raise":
                raise RuntimeError("model raised")
            if p == b"error":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("model error")))
            else:
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("TEXT", np.array([p], dtype=object))]))
        return out
"""

# decoupled. PROMPT "error_first": an error as the only response; "error_mid": a response, an
# error, another response; anything else: one response
STREAM_ERRORS = """
import numpy as np
import triton_python_backend_utils as pb_utils

def text(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([value], dtype=object))])

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            p = pb_utils.get_input_tensor_by_name(r, "PROMPT").as_numpy().reshape(-1)[0]
            sender = r.get_response_sender()
            if p == b"error_first":
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("first")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            sender.send(text(b"one"))
            if p == b"error_mid":
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("mid")))
                sender.send(text(b"two"))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

FAILS = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("boom in initialize")

    def execute(self, requests):
        return []
"""


def _model(repo: pathlib.Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


LOADED = ("prompt", "prompt_batched", "matrix", "errors", "stream_errors", "identity")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("parity-frontend")
    _model(root, "prompt", """
        max_batch_size: 0
        input [{ name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] }]
        output [{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }]
    """, SHAPES)
    _model(root, "prompt_batched", """
        max_batch_size: 8
        input [{ name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },
               { name: "N" data_type: TYPE_INT32 dims: [ 1 ] optional: true }]
        output [{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }]
    """, SHAPES)
    _model(root, "matrix", """
        max_batch_size: 0
        input [{ name: "V" data_type: TYPE_FP32 dims: [ 2, 2 ] },
               { name: "B" data_type: TYPE_BOOL dims: [ 1 ] }]
        output [{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }]
    """, SHAPES)
    _model(root, "errors", """
        max_batch_size: 0
        input [{ name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] }]
        output [{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }]
    """, ERRORS)
    _model(root, "stream_errors", """
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [{ name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] }]
        output [{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }]
    """, STREAM_ERRORS)
    _model(root, "identity", """
        max_batch_size: 0
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
    """, IDENTITY)
    _model(root, "later", """
        max_batch_size: 0
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
    """, IDENTITY)
    _model(root, "never_loaded", """
        max_batch_size: 0
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
    """, IDENTITY)
    _model(root, "fails", """
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }]
    """, FAILS)
    return root


@pytest.fixture(scope="module")
def server(repo: pathlib.Path) -> Iterator[ShoalServer]:
    args = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in LOADED),
            "--exit-timeout-secs=10"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        yield srv


@pytest.fixture(scope="module")
def grpc_client(server: ShoalServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def get(server: ShoalServer, path: str) -> httpx.Response:
    return httpx.get(f"{server.base}{path}", timeout=30)


def post(server: ShoalServer, path: str, body: Any = None, content: bytes | None = None
         ) -> httpx.Response:
    if content is not None:
        return httpx.post(f"{server.base}{path}", content=content, timeout=60)
    return httpx.post(f"{server.base}{path}", json=body, timeout=60)


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]


def grpc_error_of(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value.status()), str(caught.value.message())


def identity_input(values: np.ndarray[Any, Any]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


INFER_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}


def assert_model_gone(server: ShoalServer, client: grpcclient.InferenceServerClient, name: str,
                      text: str) -> None:
    """Every model endpoint answers 404 / NOT_FOUND with ``text``; ready is 400."""
    for path in ("", "/config"):
        assert error_of(get(server, f"/v2/models/{name}{path}")) == (404, text)
    for route, body in (("infer", INFER_BODY), ("generate", {}), ("generate_stream", {})):
        r = post(server, f"/v2/models/{name}/{route}", body)
        assert error_of(r) == (404, text)
        assert r.headers["content-type"] == "application/json"
    for path in ("/ready", "/versions/1/ready"):
        assert error_of(get(server, f"/v2/models/{name}{path}")) == (400,
                                                                     "Model version not ready")
    assert error_of(get(server, f"/v2/models/{name}/stats")) == (
        400, f"requested model '{name}' is not available")
    for call, args in ((client.get_model_metadata, (name,)), (client.get_model_config, (name,)),
                       (client.infer, (name, identity_input(np.ones(1, np.float32))))):
        assert grpc_error_of(call, *args) == ("StatusCode.NOT_FOUND", text)
    assert not client.is_model_ready(name)
    assert grpc_error_of(client.get_inference_statistics, name) == (
        "StatusCode.INVALID_ARGUMENT", f"requested model '{name}' is not available")


# ------------------------------------------------------------------ unknown and gone models


def test_an_unknown_model_is_not_found(server: ShoalServer,
                                       grpc_client: grpcclient.InferenceServerClient) -> None:
    text = "Request for unknown model: 'ghost' is not found"
    assert_model_gone(server, grpc_client, "ghost", text)
    # with a version too, and the empty name over gRPC
    assert error_of(get(server, "/v2/models/ghost/versions/1")) == (404, text)
    assert error_of(post(server, "/v2/models/ghost/versions/1/infer", INFER_BODY)) == (404, text)
    assert grpc_error_of(grpc_client.get_model_metadata, "") == (
        "StatusCode.NOT_FOUND", "Request for unknown model: '' is not found")
    assert grpc_error_of(grpc_client.infer, "", identity_input(np.ones(1, np.float32))) == (
        "StatusCode.NOT_FOUND", "Request for unknown model: '' is not found")


def test_a_model_never_loaded_is_not_found(server: ShoalServer,
                                           grpc_client: grpcclient.InferenceServerClient) -> None:
    text = "Request for unknown model: 'never_loaded' is not found"
    assert_model_gone(server, grpc_client, "never_loaded", text)
    assert error_of(get(server, "/v2/models/never_loaded/versions/1")) == (404, text)


def _index_state(server: ShoalServer, name: str) -> str:
    index = post(server, "/v2/repository/index", {}).json()
    return next((e.get("state", "") for e in index if e["name"] == name), "")


def test_an_unloaded_model_is_not_found(server: ShoalServer,
                                        grpc_client: grpcclient.InferenceServerClient) -> None:
    assert post(server, "/v2/repository/models/later/load").status_code == 200
    assert post(server, "/v2/models/later/infer", INFER_BODY).status_code == 200
    assert post(server, "/v2/repository/models/later/unload").status_code == 200
    deadline = time.monotonic() + 30
    while _index_state(server, "later") != "UNAVAILABLE":
        assert time.monotonic() < deadline, "the unload did not finish"
        time.sleep(0.1)
    assert_model_gone(server, grpc_client, "later",
                      "Request for unknown model: 'later' has no available versions")
    # the version it had is there but not serving: 503 / UNAVAILABLE
    text = "Request for unknown model: 'later' version 1 is not at ready state"
    assert error_of(post(server, "/v2/models/later/versions/1/infer", INFER_BODY)) == (503, text)
    assert error_of(get(server, "/v2/models/later/versions/1")) == (503, text)
    assert grpc_error_of(grpc_client.get_model_metadata, "later", "1") == (
        "StatusCode.UNAVAILABLE", text)


def test_a_model_whose_load_failed_is_not_found(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    r = post(server, "/v2/repository/models/fails/load")
    assert r.status_code == 400 and "boom in initialize" in r.json()["error"]
    assert_model_gone(server, grpc_client, "fails",
                      "Request for unknown model: 'fails' has no available versions")
    assert error_of(post(server, "/v2/models/fails/versions/1/infer", INFER_BODY)) == (
        503, "Request for unknown model: 'fails' version 1 is not at ready state")


def test_a_version_the_model_lacks_is_not_found(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    text = "Request for unknown model: 'identity' version 7 is not found"
    assert error_of(post(server, "/v2/models/identity/versions/7/infer", INFER_BODY)) == (404,
                                                                                          text)
    assert grpc_error_of(grpc_client.get_model_config, "identity", "7") == (
        "StatusCode.NOT_FOUND", text)
    stats_text = "requested model version is not available for model 'identity'"
    assert error_of(get(server, "/v2/models/identity/versions/7/stats")) == (400, stats_text)
    assert grpc_error_of(grpc_client.get_inference_statistics, "identity", "7") == (
        "StatusCode.INVALID_ARGUMENT", stats_text)


# ------------------------------------------------------------------ version strings


def _unreadable(text: str) -> str:
    return (f"failed to get model version from specified version string '{text}' (details: "
            "stol), version should be an integral value > 0")


@pytest.mark.parametrize("version", ["abc", "99999999999999999999"])
def test_an_unreadable_version_string_is_invalid(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient, version: str) -> None:
    for call, args in ((grpc_client.get_model_metadata, ("identity", version)),
                       (grpc_client.get_model_config, ("identity", version)),
                       (grpc_client.is_model_ready, ("identity", version)),
                       (grpc_client.get_inference_statistics, ("identity", version)),
                       (grpc_client.get_model_metadata, ("ghost", version))):
        assert grpc_error_of(call, *args) == ("StatusCode.INVALID_ARGUMENT",
                                              _unreadable(version))
    assert grpc_error_of(grpc_client.infer, "identity", identity_input(np.ones(1, np.float32)),
                         model_version=version) == ("StatusCode.INVALID_ARGUMENT",
                                                    _unreadable(version))
    if version.isdigit():  # HTTP routes take digits only; an overflowing number is refused
        for path in ("", "/ready", "/config", "/stats"):
            assert error_of(get(server, f"/v2/models/identity/versions/{version}{path}")) == (
                400, _unreadable(version))
        assert error_of(post(server, f"/v2/models/identity/versions/{version}/infer",
                             INFER_BODY)) == (400, _unreadable(version))


def test_version_strings_read_as_triton_reads_them(
        grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_error_of(grpc_client.get_model_metadata, "identity", "-1") == (
        "StatusCode.INVALID_ARGUMENT",
        "invalid model version specified '-1' , version should be an integral value > 0")
    assert grpc_client.is_model_ready("identity", " 1")  # std::stol skips the space
    assert grpc_client.get_model_metadata("identity", "01").versions == ["1"]


# ------------------------------------------------------------------ generate: shapes and texts


def test_generate_fits_values_to_the_configured_dims(server: ShoalServer) -> None:
    for path, body, seen in (
            ("prompt", {"PROMPT": "hi"}, "PROMPT:[1, 1]"),
            ("prompt", {"PROMPT": ["hi"]}, "PROMPT:[1, 1]"),
            ("prompt", {"PROMPT": [["hi"]]}, "PROMPT:[1, 1]"),
            ("prompt_batched", {"PROMPT": "hi"}, "PROMPT:[1, 1, 1]"),
            ("prompt_batched", {"PROMPT": ["a", "b"]}, "PROMPT:[2, 1, 1]"),
            ("prompt_batched", {"PROMPT": "hi", "N": 3}, "PROMPT:[1, 1, 1];N:[1, 1]"),
            ("matrix", {"V": [1, 2, 3, 4], "B": True}, "V:[2, 2];B:[1]")):
        r = post(server, f"/v2/models/{path}/generate", body)
        assert r.status_code == 200, r.text
        assert r.json()["TEXT"] == seen
    r = post(server, "/v2/models/prompt/generate_stream", {"PROMPT": "hi"})
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert r.content == (b'data: {"TEXT":"PROMPT:[1, 1]","model_name":"prompt",'
                         b'"model_version":"1"}\n\n')  # Triton's order of the fields


@pytest.mark.parametrize("path,body,text", [
    ("prompt", {"PROMPT": ["a", "b"]},
     "The schema can not convert input 'PROMPT' to tensor with proper shape"),
    ("prompt", {"PROMPT": []},
     "The schema can not convert input 'PROMPT' to tensor with proper shape"),
    ("matrix", {"V": [1, 2], "B": True},
     "The schema can not convert input 'V' to tensor with proper shape"),
    ("matrix", {"V": [[1, 2], [3, 4]], "B": True},
     "The schema can not convert input 'V' to tensor with proper shape"),
    ("prompt", {"PROMPT": 123},
     "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ("prompt", {"PROMPT": {"USER": "hi"}},
     "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ("matrix", {"V": [1, 2, 3, 4], "B": "true"},
     "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ("matrix", {"V": [1, 2, 3, "x"], "B": True},
     "Unable to parse 'data': attempt to access JSON non-number as double"),
    ("prompt_batched", {"PROMPT": "hi", "N": 3.5},
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("prompt", {"PROMPT": "hi", "p": [1, 2]},
     "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ("prompt", {"PROMPT": "hi", "parameters": {"nested": {"twice": 1}}},
     "Converting keyword: 'parameters': parameter 'nested' has invalid type. It should be "
     "either 'int', 'bool', or 'string'."),
    ("prompt", {"PROMPT": "hi", "parameters": 1},
     "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as "
     "object"),
    ("matrix", {},
     "[request id: <id_unknown>] expected 2 inputs but got 0 inputs for model 'matrix'. Got "
     "input(s) [], but missing required input(s) ['V','B']. Please provide all required "
     "input(s)."),
    ("matrix", {"id": "42"},
     "[request id: 42] expected 2 inputs but got 0 inputs for model 'matrix'. Got input(s) [], "
     "but missing required input(s) ['V','B']. Please provide all required input(s)."),
])
def test_generate_input_errors_have_tritons_texts(server: ShoalServer, path: str,
                                                  body: dict[str, Any], text: str) -> None:
    for route in ("generate", "generate_stream"):
        r = post(server, f"/v2/models/{path}/{route}", body)
        assert error_of(r) == (400, text)  # Triton: 500 for the JSON type ones
        assert r.headers["content-type"] == "application/json"


@pytest.mark.parametrize("raw,name", [
    (b'{"PROMPT": "hello", "N": 1, "PROMPT": "duplicate"}', "PROMPT"),
    (b'{"PROMPT": "hello", "N": 1, "N": 2, "PROMPT": "duplicate"}', "N"),
])
def test_generate_refuses_an_input_given_twice(server: ShoalServer, raw: bytes,
                                               name: str) -> None:
    r = post(server, "/v2/models/prompt_batched/generate", content=raw)
    assert error_of(r) == (400, f"[request id: <id_unknown>] input '{name}' already exists in "
                                "request")
    r = post(server, "/v2/models/prompt_batched/generate",
             {"PROMPT": "a", "parameters": {"PROMPT": "b"}})
    assert error_of(r) == (400, "Converting keyword: 'parameters': [request id: <id_unknown>] "
                                "input 'PROMPT' already exists in request")


# ------------------------------------------------------------------ generate: model errors


def sse_events(response: httpx.Response) -> list[Any]:
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = response.content.split(b"\n\n")
    assert chunks[-1] == b"" and all(c.startswith(b"data: ") for c in chunks[:-1])
    return [json.loads(chunk[len(b"data: "):]) for chunk in chunks[:-1]]


RAISED = "Failed to process the request(s) for model 'errors_0', message: RuntimeError: " \
         "model raised"


def test_a_model_error_before_the_first_response_is_a_400_event_stream(
        server: ShoalServer) -> None:
    for model, prompt, text in (("stream_errors", "error_first", "first"),
                                ("errors", "error", "model error"),
                                ("errors", "raise", RAISED)):
        r = post(server, f"/v2/models/{model}/generate_stream", {"PROMPT": prompt})
        assert r.status_code == 400
        assert sse_events(r) == [{"error": text}]
        r = post(server, f"/v2/models/{model}/generate", {"PROMPT": prompt})
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        assert r.json() == {"error": text}


def test_a_model_error_mid_stream_is_an_event_and_the_stream_goes_on(
        server: ShoalServer) -> None:
    r = post(server, "/v2/models/stream_errors/generate_stream", {"PROMPT": "error_mid"})
    assert r.status_code == 200
    one = {"TEXT": "one", "model_name": "stream_errors", "model_version": "1"}
    assert sse_events(r) == [one, {"error": "mid"}, {**one, "TEXT": "two"}]
    r = post(server, "/v2/models/stream_errors/generate", {"PROMPT": "error_mid"})
    assert error_of(r) == (501, "generate expects model to produce exactly 1 response, use "
                                "generate stream for model that generates various number of "
                                "responses")


# ------------------------------------------------------------------ infer: outputs and inputs


def test_duplicated_inputs_and_outputs_are_refused_with_tritons_texts(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}
    r = post(server, "/v2/models/identity/infer", {"inputs": [tensor, tensor]})
    assert error_of(r) == (400, "[request id: <id_unknown>] input 'INPUT0' already exists in "
                                "request")
    r = post(server, "/v2/models/identity/infer", {"id": "7", "inputs": [tensor],
                                                   "outputs": [{"name": "OUTPUT0"},
                                                               {"name": "OUTPUT0"}]})
    assert error_of(r) == (400, "[request id: 7] output 'OUTPUT0' already exists in request")
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0") for _ in range(2)]
    assert grpc_error_of(grpc_client.infer, "identity", identity_input(np.ones(1, np.float32)),
                         outputs=outputs) == (
        "StatusCode.INVALID_ARGUMENT",
        "[request id: <id_unknown>] output 'OUTPUT0' already exists in request")


def test_infer_texts_are_tritons(server: ShoalServer) -> None:
    def infer(model: str, body: Any = None, content: bytes | None = None,
              headers: dict[str, str] | None = None) -> tuple[int, str]:
        if content is None:
            return error_of(post(server, f"/v2/models/{model}/infer", body))
        return error_of(httpx.post(f"{server.base}/v2/models/{model}/infer", content=content,
                                   headers=headers or {}, timeout=30))

    assert infer("identity", {"inputs": [{"name": "INPUT0", "datatype": "FP8", "shape": [1],
                                          "data": [1]}]}) == (
        400, "invalid datatype for input INPUT0")
    assert infer("identity", {"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                          "shape": [1]}]}) == (
        400, "Input must set only one of the following fields: 'data', 'binary_data_size' in "
             "'parameters', 'shared_memory_region' in 'parameters'. But no field is set")
    assert infer("identity", content=b"{}ab", headers={
        "Inference-Header-Content-Length": "10"}) == (
        400, "inference header size should be in range (0, 4), got: 10")
    bytes_input = {"name": "PROMPT", "datatype": "BYTES", "shape": [1, 1]}
    assert infer("prompt", {"id": "b", "inputs": [{**bytes_input, "data": []}]}) == (
        400, "[request id: b] expected 1 string elements for inference input 'PROMPT' for "
             "model 'prompt', got 0")
    assert infer("prompt", {"inputs": [{**bytes_input, "data": ["a", "b"]}]}) == (
        400, "[request id: <id_unknown>] unexpected number of string elements 2 for inference "
             "input 'PROMPT' for model 'prompt', expecting 1")
    assert infer("matrix", content=b"\0" * 16, headers={
        "Inference-Header-Content-Length": "0"}) == (
        400, "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
             "deduced but got 2 inputs in 'matrix' model configuration")


def test_classifying_more_than_a_million_elements_is_refused(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    text = "classification output tensor too large"
    for count, fine in ((1_000_000, True), (1_000_001, False)):
        values = np.zeros(count, np.float32)
        values[7] = 1.0
        header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count],
                                         "parameters": {"binary_data_size": values.nbytes}}],
                             "outputs": [{"name": "OUTPUT0",
                                          "parameters": {"classification": 1}}]}).encode()
        r = httpx.post(f"{server.base}/v2/models/identity/infer", content=header + values.tobytes(),
                       headers={"Inference-Header-Content-Length": str(len(header))}, timeout=60)
        if fine:
            assert r.status_code == 200
            assert r.json()["outputs"][0]["data"] == ["1.000000:7"]
        else:
            assert error_of(r) == (400, text)
            output = grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)
            assert grpc_error_of(grpc_client.infer, "identity", identity_input(values),
                                 outputs=[output]) == ("StatusCode.INVALID_ARGUMENT", text)


# ------------------------------------------------------------------ chunked with Content-Length


def _chunked_request(path: str, body: bytes, length: int) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    half = len(body) // 2
    return head + b"".join(b"%x\r\n%s\r\n" % (len(part), part)
                           for part in (body[:half], body[half:])) + b"0\r\n\r\n"


def test_a_chunked_body_with_a_content_length_is_served(server: ShoalServer) -> None:
    body = json.dumps(INFER_BODY).encode()
    generate = b'{"INPUT0": [1.0]}'
    for path, payload in (("/v2/models/identity/infer", body),  # the lean transport
                          ("/v2/models/identity/generate", generate)):  # the ASGI app
        answer = _exchange(server, _chunked_request(path, payload, len(payload)))
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:300]
        assert b"\r\nconnection: close\r\n" in answer.lower()  # RFC 9112: closed after it
        assert answer.count(b"HTTP/1.1 ") == 1
    # the Content-Length is ignored, not used (Triton sizes the JSON by it: 400 / 500 there)
    for length in (3, len(body) + 100):
        answer = _exchange(server, _chunked_request("/v2/models/identity/infer", body, length))
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"data":[1.0]' in answer


def test_requests_with_a_generator_and_a_content_length_is_refused_as_by_triton(
        server: ShoalServer) -> None:
    """``requests`` sends both headers for a generator body given a Content-Length, but the
    body unframed: not a chunked body, so neither server can read it (Triton closes the
    connection without an answer)."""
    payload = json.dumps(INFER_BODY).encode()
    r = requests.post(f"{server.base}/v2/models/identity/infer", timeout=30,
                      data=iter([payload[:5], payload[5:]]),
                      headers={"Content-Length": str(len(payload))})
    assert r.status_code == 400
    assert post(server, "/v2/models/identity/infer", INFER_BODY).status_code == 200


def _exchange(server: ShoalServer, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(raw)
        received = b""
        while True:
            data = sock.recv(65536)
            if not data:
                return received
            received += data


def test_the_content_length_of_a_chunked_body_cannot_smuggle_a_request(
        server: ShoalServer) -> None:
    body = json.dumps(INFER_BODY).encode()
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    for length in (0, len(smuggled), len(body) + len(smuggled)):
        raw = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
               b"chunked\r\nContent-Length: %d\r\n\r\n" % length) + chunked + smuggled
        answer = _exchange(server, raw)  # the server closes the connection after one answer
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
        assert answer.count(b"HTTP/1.1 ") == 1, "a second request was read from the body"
        assert b'"data":[1.0]' in answer
    # a coding other than chunked last, with a Content-Length: refused
    raw = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    answer = _exchange(server, raw)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and answer.count(b"HTTP/1.1 ") == 1
