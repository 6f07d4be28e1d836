"""What the worker side answers where it must answer as Triton 2.51 does (issue #24, measured
against the real tritonserver with numpy-only python models): zero-element tensors, ``reshape``
on python models, outputs a model did not produce, two models sharing an instance group name,
BLS calls naming the model with bytes, and client shared-memory regions registered again under
the same name and key after the object was replaced. One real server (client shm allowed),
tritonclient over HTTP (JSON and binary) and gRPC, real POSIX shm objects."""

from __future__ import annotations

import json
import pathlib
import secrets
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as triton_shm
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# ------------------------------------------------------------------------------- the models

IDENTITY = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.pairs = [(i["name"], o["name"]) for i, o in zip(config["input"], config["output"])]

    def execute(self, requests):
        responses = []
        for request in requests:
            tensors = []
            for source, target in self.pairs:
                tensor = pb_utils.get_input_tensor_by_name(request, source)
                if tensor is not None:
                    tensors.append(pb_utils.Tensor(target, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
"""

# doubles INPUT0 into OUTPUT0 and reports the shape execute saw, per batch row (SEEN)
SHAPE_SEEN = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.batching = json.loads(args["model_config"])["max_batch_size"] > 0

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            seen = np.array(x.shape, np.int64)
            if self.batching:
                seen = np.tile(seen, (x.shape[0], 1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x * 2), pb_utils.Tensor("SEEN", seen)]))
        return responses
"""

# produces OUTPUT0 only (and OUTPUT1, FP16, when the request parameter "fp16" is set)
PARTIAL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            tensors = [pb_utils.Tensor("OUTPUT0", x)]
            if json.loads(request.parameters() or "{}").get("fp16"):
                tensors.append(pb_utils.Tensor("OUTPUT1", x.astype(np.float16)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
"""

ADD_SUB = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""

# python_backend's examples/bls: the callee's name comes from a BYTES input, as numpy bytes
# (or as plain bytes when the request parameter "as_bytes" is set)
BLS_BY_NAME = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            if json.loads(request.parameters() or "{}").get("as_bytes"):
                name = bytes(name)
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            answer = pb_utils.InferenceRequest(
                model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=inputs).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT1")]))
        return responses
"""

ADD_SUB_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


# decoupled, but execute returns a list of responses (which it must not)
DECOUPLED_RETURNS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
"""


def _model(repo: pathlib.Path, name: str, config: str, code: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\n' + textwrap.dedent(config).lstrip())
    if code is not None:
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code).lstrip())


def build_repository(repo: pathlib.Path) -> pathlib.Path:
    identity_io = """
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }},
                {{ name: "IN_S" data_type: TYPE_STRING dims: [ -1 ] optional: true }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }},
                 {{ name: "OUT_S" data_type: TYPE_STRING dims: [ -1 ] }} ]
    """
    _model(repo, "ident_batch", 'backend: "python"\nmax_batch_size: 8\n'
           + identity_io.format(dims="[ -1 ]")
           + "dynamic_batching { max_queue_delay_microseconds: 2000 }\n", IDENTITY)
    _model(repo, "ident_plain", 'backend: "python"\nmax_batch_size: 0\n'
           + identity_io.format(dims="[ -1, -1 ]"), IDENTITY)
    pt_io = """
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: {dims} }} ]
    """
    _model(repo, "pt_batch", 'backend: "pytorch"\nmax_batch_size: 8\n'
           + pt_io.format(dims="[ -1 ]")
           + "dynamic_batching { max_queue_delay_microseconds: 2000 }\n")
    _model(repo, "pt_plain", 'backend: "pytorch"\nmax_batch_size: 0\n'
           + pt_io.format(dims="[ -1, -1 ]"))
    scripted: Any = torch.jit.script(Doubler())
    for name in ("pt_batch", "pt_plain"):
        scripted.save(str(repo / name / "1" / "model.pt"))
    reshaped = """
        backend: "python"
        max_batch_size: {batch}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims}
                  reshape: {{ shape: {reshape} }} }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims}
                   reshape: {{ shape: {reshape} }} }},
                 {{ name: "SEEN" data_type: TYPE_INT64 dims: [ -1 ] }} ]
    """
    for name, batch, dims, shape in (("reshape_batch", 8, "[ 4 ]", "[ 2, 2 ]"),
                                     ("reshape_plain", 0, "[ 4 ]", "[ 2, 2 ]"),
                                     ("reshape_variable", 8, "[ -1, 4 ]", "[ -1, 2, 2 ]"),
                                     ("reshape_scalar", 8, "[ 1 ]", "[ ]")):
        _model(repo, name, reshaped.format(batch=batch, dims=dims, reshape=shape), SHAPE_SEEN)
    _model(repo, "partial", """
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP16 dims: [ 2 ] },
                 { name: "OUTPUT2" data_type: TYPE_STRING dims: [ 1 ] } ]
    """, PARTIAL)
    # a config copied from add_sub: the same instance group name in both models
    for name in ("add_sub", "add_sub_copy"):
        _model(repo, name, 'backend: "python"\n' + ADD_SUB_IO
               + 'instance_group [ { name: "add_sub_0" kind: KIND_CPU count: 2 } ]\n', ADD_SUB)
    _model(repo, "bls_by_name", """
        backend: "python"
        input [ { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
                { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
        instance_group [ { name: "add_sub_0" kind: KIND_CPU count: 1 } ]
    """, BLS_BY_NAME)
    _model(repo, "decoupled_returns", """
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        model_transaction_policy { decoupled: true }
    """, DECOUPLED_RETURNS)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = build_repository(tmp_path_factory.mktemp("parity_worker"))
    with serving(ShoalServer([str(repo)], ["--allow-client-shm=true",
                                           "--model-control-mode=explicit", "--load-model=*"]),
                 timeout=120) as srv:
        yield srv


# ------------------------------------------------------------------------------- the clients

PROTOCOLS = ["json", "binary", "grpc"]


def _datatype(array: np.ndarray) -> str:
    return "BYTES" if array.dtype == np.object_ else "FP32"


def infer(server: ShoalServer, protocol: str, model: str, inputs: dict[str, np.ndarray],
          outputs: list[str] | None = None, parameters: dict[str, Any] | None = None
          ) -> dict[str, tuple[list[int], np.ndarray]]:
    """One inference through tritonclient; output name -> (shape as answered, values), in
    the answer's order."""
    if protocol == "grpc":
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        grpc_inputs = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), _datatype(array))
            tensor.set_data_from_numpy(array)
            grpc_inputs.append(tensor)
        wanted = None if outputs is None else [grpcclient.InferRequestedOutput(o)
                                               for o in outputs]
        result: Any = grpc_client.infer(model, grpc_inputs, outputs=wanted,
                                        parameters=parameters)
        answered = [(o.name, list(o.shape)) for o in result.get_response().outputs]
    else:
        binary = protocol == "binary"
        http_client = httpclient.InferenceServerClient(server.url)
        http_inputs = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), _datatype(array))
            tensor.set_data_from_numpy(array, binary_data=binary)
            http_inputs.append(tensor)
        wanted = None if outputs is None else [
            httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]
        result = http_client.infer(model, http_inputs, outputs=wanted, parameters=parameters)
        answered = [(o["name"], o["shape"]) for o in result.get_response()["outputs"]]
    return {name: (shape, result.as_numpy(name)) for name, shape in answered}


def post_json(server: ShoalServer, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)


# ------------------------------------------------------------------ zero-element tensors (#3)

F32 = np.float32
ZERO_CASES: list[tuple[str, dict[str, np.ndarray]]] = [
    ("ident_batch", {"INPUT0": np.zeros((1, 0), F32)}),
    ("ident_batch", {"INPUT0": np.zeros((2, 0), F32), "IN_S": np.zeros((2, 0), np.object_)}),
    ("ident_plain", {"INPUT0": np.zeros((0, 3), F32)}),
    ("ident_plain", {"INPUT0": np.zeros((0, 3), F32), "IN_S": np.zeros((0,), np.object_)}),
    ("pt_batch", {"INPUT__0": np.zeros((1, 0), F32)}),
    ("pt_batch", {"INPUT__0": np.zeros((3, 0), F32)}),
    ("pt_plain", {"INPUT__0": np.zeros((0, 3), F32)}),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("model", "inputs"), ZERO_CASES,
                         ids=[f"{m}-{'+'.join(f'{n}{list(a.shape)}' for n, a in i.items())}"
                              for m, i in ZERO_CASES])
def test_zero_element_tensors_are_answered_with_empty_outputs(
        server: ShoalServer, protocol: str, model: str, inputs: dict[str, np.ndarray]) -> None:
    """Triton: 200 with each output in the input's shape and no data (python identity and
    TorchScript doubler, batching or not, FP32 and BYTES)."""
    answered = infer(server, protocol, model, inputs)
    expected = {name.replace("INPUT", "OUTPUT").replace("IN_S", "OUT_S"): list(array.shape)
                for name, array in inputs.items()}
    assert {name: shape for name, (shape, _) in answered.items()} == expected
    for shape, values in answered.values():
        assert values.size == 0 and list(values.shape) == shape


def test_zero_element_tensors_in_plain_json(server: ShoalServer) -> None:
    """The JSON bodies of Triton's answers: ``data`` is an empty list."""
    plain = post_json(server, "ident_plain", {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [0, 3], "data": []},
        {"name": "IN_S", "datatype": "BYTES", "shape": [0], "data": []}]})
    assert plain.status_code == 200, plain.text
    assert plain.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [0, 3], "data": []},
        {"name": "OUT_S", "datatype": "BYTES", "shape": [0], "data": []}]
    empty: list[list[Any]] = [[], [[]]]
    for data in empty:
        batched = post_json(server, "ident_batch", {"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 0], "data": data}]})
        assert batched.status_code == 200, batched.text
        assert batched.json()["outputs"] == [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 0], "data": []}]


@pytest.mark.parametrize(("model", "name"), [("ident_batch", "INPUT0"),
                                             ("pt_batch", "INPUT__0")])
def test_zero_element_requests_batch_with_others(server: ShoalServer, model: str,
                                                 name: str) -> None:
    """Requests of 0 columns and different row counts, sent together, meet in the dynamic
    batcher; each gets its own rows back."""
    client = httpclient.InferenceServerClient(server.url, concurrency=12)
    pending = []
    for k in range(12):
        array = np.zeros((1 + k % 3, 0), F32)
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=True)
        pending.append((array.shape, client.async_infer(model, [tensor])))
    for shape, call in pending:
        output = call.get_result().get_response()["outputs"][0]
        assert output["shape"] == list(shape)
    client.close()


# --------------------------------------------------------------------- reshape (#4)

RESHAPE_CASES = [
    # model, input, shape execute saw (per request), output shape answered
    ("reshape_batch", np.arange(8, dtype=F32).reshape(2, 4), [2, 2, 2], [2, 4]),
    ("reshape_batch", np.arange(4, dtype=F32).reshape(1, 4), [1, 2, 2], [1, 4]),
    ("reshape_plain", np.arange(4, dtype=F32), [2, 2], [4]),
    ("reshape_variable", np.arange(24, dtype=F32).reshape(2, 3, 4), [2, 3, 2, 2], [2, 3, 4]),
    ("reshape_variable", np.zeros((1, 0, 4), F32), [1, 0, 2, 2], [1, 0, 4]),
    ("reshape_scalar", np.arange(3, dtype=F32).reshape(3, 1), [3], [3, 1]),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("model", "array", "seen", "shape"), RESHAPE_CASES,
                         ids=[f"{c[0]}-{list(c[1].shape)}" for c in RESHAPE_CASES])
def test_python_model_sees_inputs_reshaped_and_answers_in_dims(
        server: ShoalServer, protocol: str, model: str, array: np.ndarray, seen: list[int],
        shape: list[int]) -> None:
    """Triton applies ``reshape`` before ``execute`` (the model sees the reshape shape) and
    the other way round for outputs (the client gets the dims shape)."""
    answered = infer(server, protocol, model, {"INPUT0": array})
    out_shape, out = answered["OUTPUT0"]
    assert out_shape == shape
    np.testing.assert_array_equal(out, (array * 2).reshape(shape))
    _, seen_rows = answered["SEEN"]
    rows = seen_rows.reshape(-1, len(seen)) if model != "reshape_plain" else seen_rows[None]
    assert all(list(row) == seen for row in rows)


# ---------------------------------------------------------- outputs not produced (#5)

@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("asked", "answered"), [
    (None, ["OUTPUT0"]),
    (["OUTPUT1"], []),
    (["OUTPUT2"], []),
    (["OUTPUT0", "OUTPUT1"], ["OUTPUT0"]),
    (["OUTPUT2", "OUTPUT0"], ["OUTPUT0"]),
])
def test_outputs_the_model_did_not_produce_are_left_out(
        server: ShoalServer, protocol: str, asked: list[str] | None,
        answered: list[str]) -> None:
    """Triton answers 200 with the outputs produced of those asked for (possibly none)."""
    x = np.array([1, 2], F32)
    outcome = infer(server, protocol, "partial", {"INPUT0": x}, asked)
    assert list(outcome) == answered
    if answered:
        np.testing.assert_array_equal(outcome["OUTPUT0"][1], x)


def test_fp16_as_json_is_refused_only_when_the_model_produces_it(server: ShoalServer) -> None:
    """Triton refuses FP16 in a JSON answer with 400, but only for an output that is there:
    asked for (or all asked for) and not produced, the answer is 200."""
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]
    for outputs in (None, [{"name": "OUTPUT1"}], [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]):
        body: dict[str, Any] = {"inputs": inputs}
        if outputs is not None:
            body["outputs"] = outputs
        answer = post_json(server, "partial", body)
        assert answer.status_code == 200, answer.text
        names = [o["name"] for o in answer.json()["outputs"]]
        assert names == ([] if outputs == [{"name": "OUTPUT1"}] else ["OUTPUT0"])
        produced = post_json(server, "partial", {**body, "parameters": {"fp16": True}})
        assert produced.status_code == 400
        assert "sending FP16 data via JSON is not supported" in produced.json()["error"]


# ----------------------------------------------------- one instance group name, two models (#10)

def test_two_models_with_the_same_instance_group_name_both_serve(server: ShoalServer) -> None:
    """Triton loads both (its instance names ``add_sub_0_0`` / ``add_sub_0_1`` repeat across
    models); each model's instances are its own processes."""
    a, b = np.arange(4, dtype=F32), np.ones(4, F32)
    for model in ("add_sub", "add_sub_copy"):
        for protocol in PROTOCOLS:
            out = infer(server, protocol, model, {"INPUT0": a, "INPUT1": b})
            np.testing.assert_array_equal(out["OUTPUT0"][1], a + b)
            np.testing.assert_array_equal(out["OUTPUT1"][1], a - b)
    assert len(server.worker_pids("add_sub")) == 2
    assert len(server.worker_pids("add_sub_copy")) == 2
    assert not set(server.worker_pids("add_sub")) & set(server.worker_pids("add_sub_copy"))


def test_a_config_copied_from_another_model_loads_through_the_repository_api(
        server: ShoalServer) -> None:
    """The config as get_model_config answers it for add_sub, renamed, loaded as the config
    of add_sub_copy (its instance group is still called add_sub_0): ready and serving."""
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("add_sub")
    assert config["instance_group"][0]["name"] == "add_sub_0"
    client.load_model("add_sub_copy", config=json.dumps({**config, "name": "add_sub_copy"}))
    assert client.is_model_ready("add_sub_copy")
    a = np.arange(4, dtype=F32)
    out = infer(server, "binary", "add_sub_copy", {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(out["OUTPUT0"][1], a + a)
    client.close()


# --------------------------------------------------------- BLS, model name as bytes (#13)

@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("as_bytes", [False, True], ids=["numpy-bytes", "bytes"])
def test_bls_model_name_given_as_bytes(server: ShoalServer, protocol: str,
                                       as_bytes: bool) -> None:
    """python_backend's examples/bls passes the name it read from a BYTES input (np.bytes_);
    Triton takes bytes as the UTF-8 name."""
    a, b = np.arange(4, dtype=F32), np.full(4, 2, F32)
    out = infer(server, protocol, "bls_by_name",
                {"MODEL_NAME": np.array([b"add_sub"], np.object_), "INPUT0": a, "INPUT1": b},
                parameters={"as_bytes": True} if as_bytes else None)
    np.testing.assert_array_equal(out["OUTPUT0"][1], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"][1], a - b)


def test_bls_unknown_model_named_by_bytes_is_named_as_text(server: ShoalServer) -> None:
    with pytest.raises(InferenceServerException) as info:
        infer(server, "binary", "bls_by_name",
              {"MODEL_NAME": np.array([b"nope"], np.object_), "INPUT0": np.ones(4, F32),
               "INPUT1": np.ones(4, F32)})
    assert "Model 'nope' is not ready" in str(info.value)
    assert "b'nope'" not in str(info.value)


# ------------------------------------- client shm: a region registered again (#11)

def _client(server: ShoalServer, protocol: str) -> Any:
    if protocol == "grpc":
        return grpcclient.InferenceServerClient(server.grpc_url)
    return httpclient.InferenceServerClient(server.url)


def _shm_round(server: ShoalServer, protocol: str, keys: tuple[str, str], value: float
               ) -> tuple[np.ndarray, np.ndarray]:
    """Create objects ``keys`` (input holding ``value``, output zeros), register them as
    regions in_r / out_r, infer once with the output into out_r and once with it in the
    answer; unregister and remove both. What out_r held, and what the answer held."""
    module: Any = grpcclient if protocol == "grpc" else httpclient
    client = _client(server, protocol)
    data = np.full((2, 3), value, F32)
    handles = [triton_shm.create_shared_memory_region(name, key, data.nbytes)
               for name, key in zip(("in_r", "out_r"), keys, strict=True)]
    try:
        triton_shm.set_shared_memory_region(handles[0], [data])
        triton_shm.set_shared_memory_region(handles[1], [np.zeros_like(data)])
        client.register_system_shared_memory("in_r", keys[0], data.nbytes)
        client.register_system_shared_memory("out_r", keys[1], data.nbytes)
        tensor = module.InferInput("INPUT0", [2, 3], "FP32")
        tensor.set_shared_memory("in_r", data.nbytes)
        into_region = module.InferRequestedOutput("OUTPUT0")
        into_region.set_shared_memory("out_r", data.nbytes)
        client.infer("ident_plain", [tensor], outputs=[into_region])
        written = triton_shm.get_contents_as_numpy(handles[1], np.float32, [2, 3]).copy()
        answered = client.infer("ident_plain", [tensor]).as_numpy("OUTPUT0")
        return written, answered
    finally:
        client.unregister_system_shared_memory("in_r")
        client.unregister_system_shared_memory("out_r")
        for handle in handles:
            triton_shm.destroy_shared_memory_region(handle)
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_region_registered_again_over_a_new_object_is_read_and_written_anew(
        server: ShoalServer, protocol: str) -> None:
    """The same region names on the same keys, each time over new objects (what every run
    of tritonclient's simple_*_shm_client does): each round reads its own input object and
    writes its own output object, as on Triton (shoal used to serve the first round's
    mappings: the old input bytes, outputs written into a removed object)."""
    keys = (f"/shmtest-{secrets.token_hex(6)}", f"/shmtest-{secrets.token_hex(6)}")
    for value in (1.0, 2.0, 3.0):
        written, answered = _shm_round(server, protocol, keys, value)
        np.testing.assert_array_equal(written, np.full((2, 3), value, F32))
        np.testing.assert_array_equal(answered, np.full((2, 3), value, F32))


def _mapped_by_workers(server: ShoalServer, key: str) -> list[int]:
    """Workers that map the shm object ``key`` (or a removed object that had that key)."""
    found = []
    for pid in server.worker_pids():
        try:
            with open(f"/proc/{pid}/maps") as maps:
                if any(f"/dev/shm{key}" in line for line in maps):
                    found.append(pid)
        except OSError:
            continue
    return found


def test_workers_unmap_a_client_object_once_it_is_removed(server: ShoalServer) -> None:
    """Unregistering and removing an object leaves no mapping of it in any worker: the
    worker closes mappings of objects that lost their name, between batches, about a second
    later at most."""
    keys = (f"/shmtest-{secrets.token_hex(6)}", f"/shmtest-{secrets.token_hex(6)}")
    client = httpclient.InferenceServerClient(server.url)
    data = np.full((2, 3), 5, F32)
    handle = triton_shm.create_shared_memory_region("mapped_r", keys[0], data.nbytes)
    removed = False
    try:
        triton_shm.set_shared_memory_region(handle, [data])
        client.register_system_shared_memory("mapped_r", keys[0], data.nbytes)
        tensor = httpclient.InferInput("INPUT0", [2, 3], "FP32")
        tensor.set_shared_memory("mapped_r", data.nbytes)
        np.testing.assert_array_equal(
            client.infer("ident_plain", [tensor]).as_numpy("OUTPUT0"), data)
        assert _mapped_by_workers(server, keys[0])
        client.unregister_system_shared_memory("mapped_r")
        triton_shm.destroy_shared_memory_region(handle)
        removed = True
        deadline = time.monotonic() + 5
        while _mapped_by_workers(server, keys[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _mapped_by_workers(server, keys[0])
    finally:
        if not removed:
            client.unregister_system_shared_memory("mapped_r")
            triton_shm.destroy_shared_memory_region(handle)
        client.close()


def test_a_decoupled_model_returning_responses_answers_an_error_not_silence(
        server: ShoalServer) -> None:
    """Triton's python backend refuses what a decoupled execute returns: every request gets
    the error (its stream does not wait for ever, nothing stays in flight)."""
    import queue

    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        client.async_stream_infer("decoupled_returns", [tensor])
        answer = results.get(timeout=20)
    finally:
        client.stop_stream()
        client.close()
    assert isinstance(answer, InferenceServerException)
    assert ("Python model 'decoupled_returns_0' is using the decoupled mode and the execute "
            "function must return None.") in str(answer)
    stats = httpx.get(f"{server.base}/v2/models/decoupled_returns/stats").json()
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == 1
