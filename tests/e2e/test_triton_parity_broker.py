"""Behaviour measured against the real tritonserver 2.51 (issue #24, the broker's findings), end
to end on one shoal server in explicit model-control mode over a numpy-only python repository:

- string and integer ``sequence_id`` against UINT64 and STRING CORRID controls (HTTP and gRPC);
- what the statistics and ``/metrics`` count for an error response, an ``execute`` that raises,
  decoupled models (``generate`` included) and an output region too small; the pinned-memory
  pool gauges;
- the repository index and ``/metrics`` after loads and unloads of names that are not models.

Each expectation is what Triton 2.51 answered to the same traffic (see each test).
"""

from __future__ import annotations

import pathlib
import queue
import re
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# ------------------------------------------------------------------------ the repository

SEQUENCE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  control_input [
    {{ name: "START" control [{{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }}] }},
    {{ name: "CORRID" control [{{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }}] }}
  ]
}}
input [{{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }}]
output [{{ name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }}]
"""

# answers the CORRID element it got ("uint64:5", "bytes:b'id'") and its correlation_id()
SEQUENCE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            corrid = pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().ravel()[0]
            value = (f"bytes:{corrid!r}" if isinstance(corrid, bytes)
                     else f"{corrid.dtype}:{int(corrid)}")
            seen = f"{value}|{r.correlation_id()!r}"
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SEEN", np.array([[seen.encode()]], dtype=np.object_))]))
        return out
'''

PLAIN_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: {decoupled} }}
input [{{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }}]
output [{{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }}]
"""

PLAIN_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def out(r):
    x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x.copy())])


class TritonPythonModel:
    def initialize(self, args):
        if {fail_init}:
            raise RuntimeError("init boom")

    def execute(self, requests):
{body}
'''

BODIES = {
    "ident": "        return [out(r) for r in requests]",
    "err_resp": '        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("boom"))\n'
                "                for r in requests]",
    "raises": '        raise RuntimeError("kaboom")',
    "dec2": """        for r in requests:
            sender = r.get_response_sender()
            sender.send(out(r))
            sender.send(out(r))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None""",
    "dec_err": """        for r in requests:
            sender = r.get_response_sender()
            sender.send(out(r))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("late boom")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None""",
    "dec_raise": '        raise RuntimeError("dec kaboom")',
    "badinit": "        return [out(r) for r in requests]",
}
DECOUPLED = {"dec2", "dec_err", "dec_raise"}
LOADED = ["seq_u64", "seq_str", "ident", "err_resp", "raises", "dec2", "dec_err", "dec_raise",
          "slow"]

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 1
dynamic_batching { default_queue_policy { max_queue_size: 1 } }
input [{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }]
"""
SLOW_MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""
REPOSITORY = sorted([*LOADED, "badinit", "badcfg", "nodims"])


def _write_repository(root: pathlib.Path) -> None:
    for name, corrid in (("seq_u64", "TYPE_UINT64"), ("seq_str", "TYPE_STRING")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(SEQUENCE_CONFIG.format(name=name,
                                                                         corrid=corrid))
        (root / name / "1" / "model.py").write_text(SEQUENCE_MODEL)
    for name, body in BODIES.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(PLAIN_CONFIG.format(
            name=name, decoupled=str(name in DECOUPLED).lower()))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(PLAIN_MODEL).format(
            fail_init=name == "badinit", body=body))
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (root / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (root / "badcfg" / "1").mkdir(parents=True)  # a model directory whose config is not one
    (root / "badcfg" / "config.pbtxt").write_text('name: "badcfg" this is not a config')
    (root / "nodims" / "1").mkdir(parents=True)  # a config that parses but is not valid
    (root / "nodims" / "config.pbtxt").write_text(
        'name: "nodims"\nbackend: "python"\ninput [{ name: "X" data_type: TYPE_FP32 }]\n'
        'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    root = tmp_path_factory.mktemp("parity_broker")
    _write_repository(root)
    args = ["--model-control-mode=explicit", "--allow-client-shm=true",
            *(f"--load-model={name}" for name in LOADED)]
    with serving(ShoalServer([str(root)], args), timeout=120.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: ShoalServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


@pytest.fixture(scope="module")
def grpc_client(server: ShoalServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


# ------------------------------------------------------------------------ finding 6: sequence ids


def _seq_http(server: ShoalServer, model: str, sequence_id: int | str, start: bool = False,
              end: bool = False) -> httpx.Response:
    parameters: dict[str, Any] = {"sequence_id": sequence_id}
    if start:
        parameters["sequence_start"] = True
    if end:
        parameters["sequence_end"] = True
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [1]}],
            "parameters": parameters}
    return httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)


def _seen_http(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["outputs"][0]["data"][0])


def _seq_grpc(client: grpcclient.InferenceServerClient, model: str, sequence_id: int | str,
              start: bool = False, end: bool = False) -> str:
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start,
                          sequence_end=end)
    seen = result.as_numpy("SEEN")
    assert seen is not None
    return bytes(seen.ravel()[0]).decode()


@pytest.mark.parametrize(("sequence_id", "corrid"), [
    ("abcdefgh", 0x64636261_00000008),  # Triton 2.51: length 8 (LE u32), then "abcd"
    ("a", 0x61_00000001),  # Triton leaves the 3 bytes after "a" unwritten: zero here
])
def test_a_string_id_reaches_a_uint64_corrid_as_the_bytes_triton_writes(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient, sequence_id: str,
        corrid: int) -> None:
    expected = f"uint64:{corrid}|{sequence_id!r}"
    assert _seen_http(_seq_http(server, "seq_u64", sequence_id, start=True, end=True)) \
        == expected
    assert _seq_grpc(grpc_client, "seq_u64", sequence_id, start=True, end=True) == expected


def test_string_ids_are_routed_by_the_string_on_an_integer_corrid(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    """"abcdX" and "abcdY" give the CORRID the same value; they are still two sequences."""
    assert _seen_http(_seq_http(server, "seq_u64", "abcdX", start=True)).endswith("|'abcdX'")
    refused = _seq_http(server, "seq_u64", "abcdY")
    assert refused.status_code == 400
    assert refused.json()["error"] == (
        "inference request for sequence abcdY to model 'seq_u64' must specify the START flag on "
        "the first request of the sequence")
    with pytest.raises(InferenceServerException, match="must specify the START flag") as caught:
        _seq_grpc(grpc_client, "seq_u64", "abcdY")
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert _seq_grpc(grpc_client, "seq_u64", "abcdX", end=True).endswith("|'abcdX'")
    # an integer and a string with the same text are different sequences
    assert _seen_http(_seq_http(server, "seq_u64", 5, start=True)) == "uint64:5|5"
    assert _seq_http(server, "seq_u64", "5").status_code == 400
    assert _seen_http(_seq_http(server, "seq_u64", 5, end=True)) == "uint64:5|5"


def test_an_integer_id_for_a_string_corrid_is_refused(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    """Triton 2.51 fills the string control with the integer's raw bytes and the request fails
    with 400 (a malformed BYTES tensor); shoal refuses it before it runs, also 400."""
    refused = _seq_http(server, "seq_str", 7, start=True, end=True)
    assert refused.status_code == 400
    assert "CORRID" in refused.json()["error"]
    with pytest.raises(InferenceServerException, match="CORRID") as caught:
        _seq_grpc(grpc_client, "seq_str", 7, start=True, end=True)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_string_corrid_gets_the_string_id(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    """Deliberately not Triton 2.51, which refuses every string id under 128 bytes here."""
    assert _seen_http(_seq_http(server, "seq_str", "g-seq", start=True, end=True)) \
        == "bytes:b'g-seq'|'g-seq'"
    assert _seq_grpc(grpc_client, "seq_str", "x" * 128, start=True, end=True) \
        == f"bytes:b'{'x' * 128}'|'{'x' * 128}'"


@pytest.mark.parametrize("model", ["seq_u64", "ident"])
def test_a_string_id_over_128_bytes_is_unimplemented_for_any_model(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient, model: str) -> None:
    text = "string correlation ID cannot be longer than 128 characters"
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [1]}]
            if model == "seq_u64" else
            [{"name": "IN", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}],
            "parameters": {"sequence_id": "é" * 65, "sequence_start": True}}  # 130 bytes
    answer = httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)
    assert (answer.status_code, answer.json()) == (501, {"error": text})
    tensor = (grpcclient.InferInput("INPUT0", [1, 1], "INT32") if model == "seq_u64"
              else grpcclient.InferInput("IN", [4], "FP32"))
    tensor.set_data_from_numpy(np.ones([1, 1], np.int32) if model == "seq_u64"
                               else np.ones([4], np.float32))
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.infer(model, [tensor], sequence_id="x" * 129, sequence_start=True)
    assert (caught.value.status(), caught.value.message()) == ("StatusCode.UNIMPLEMENTED", text)


def _raw_grpc_sequence(server: ShoalServer, parameter: service_pb2.InferParameter
                       ) -> service_pb2.ModelInferResponse:
    request = service_pb2.ModelInferRequest(model_name="seq_u64")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32")
    tensor.shape.extend([1, 1])
    request.raw_input_contents.append(np.array([1], np.int32).tobytes())
    request.parameters["sequence_id"].CopyFrom(parameter)
    request.parameters["sequence_start"].bool_param = True
    request.parameters["sequence_end"].bool_param = True
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return stub.ModelInfer(request, timeout=30)  # type: ignore[no-any-return]


def test_grpc_sequence_ids_follow_triton_int64_and_string_only(server: ShoalServer) -> None:
    answer = _raw_grpc_sequence(server, service_pb2.InferParameter(int64_param=-1))
    assert answer.raw_output_contents[0][4:].decode() == (
        f"uint64:{2**64 - 1}|{2**64 - 1}")  # an int64 is taken as its uint64 bits
    for refused in (service_pb2.InferParameter(uint64_param=6),
                    service_pb2.InferParameter(bool_param=True)):
        with pytest.raises(grpc.RpcError) as caught:
            _raw_grpc_sequence(server, refused)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == ("invalid value type for 'sequence_id' parameter, "
                                          "expected int64_param or string_param.")


# ------------------------------------------------------------------------ finding 8: counting

X = np.arange(4, dtype=np.float32)


def _stats(server: ShoalServer, model: str) -> dict[str, int]:
    """The counts of /v2/models/<model>/stats, flat: inference/execution counts, each
    inference_stats entry's count, and batch_stats as batch<size>."""
    document = httpx.get(f"{server.base}/v2/models/{model}/stats", timeout=30).json()
    entry = document["model_stats"][0]
    flat = {"inference_count": entry["inference_count"],
            "execution_count": entry["execution_count"]}
    flat.update({key: value["count"] for key, value in entry["inference_stats"].items()})
    for batch in entry["batch_stats"]:
        flat[f"batch{batch['batch_size']}"] = batch["compute_infer"]["count"]
    return flat


def _metrics(server: ShoalServer, model: str) -> dict[str, float]:
    """The count series of /metrics for ``model`` (durations left out), keyed by family and
    the labels other than model and version."""
    found: dict[str, float] = {}
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("#") or f'model="{model}"' not in line:
            continue
        name, value = line.rsplit(" ", 1)
        family = name.split("{")[0]
        if family.endswith("_us") or not family.startswith("nv_inference"):
            continue
        reason = re.search(r'reason="(\w+)"', name)
        found[f"{family}[{reason.group(1)}]" if reason else family] = float(value)
    return found


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {key: after.get(key, 0) - before.get(key, 0) for key in sorted({*before, *after})
            if after.get(key, 0) != before.get(key, 0)}


class Counted:
    """The change of a model's statistics and metrics over a ``with`` block."""

    def __init__(self, server: ShoalServer, model: str) -> None:
        self.server, self.model = server, model
        self.stats: dict[str, Any] = {}
        self.metrics: dict[str, Any] = {}

    def __enter__(self) -> Counted:
        self._before = _stats(self.server, self.model), _metrics(self.server, self.model)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stats = _delta(self._before[0], _stats(self.server, self.model))
        self.metrics = _delta(self._before[1], _metrics(self.server, self.model))


def _infer_both(http: httpclient.InferenceServerClient,
                grpc_client: grpcclient.InferenceServerClient, model: str) -> list[str]:
    """One HTTP and one gRPC infer; the error text each got ("" for none)."""
    errors = []
    for client, module in ((http, httpclient), (grpc_client, grpcclient)):
        tensor = module.InferInput("IN", [4], "FP32")
        tensor.set_data_from_numpy(X)
        try:
            client.infer(model, [tensor])
            errors.append("")
        except InferenceServerException as exc:
            errors.append(str(exc.message()))
    return errors


def _stream(server: ShoalServer, model: str) -> list[str]:
    """One gRPC ModelStreamInfer request: what came back, in order, until the final response."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    tensor = grpcclient.InferInput("IN", [4], "FP32")
    tensor.set_data_from_numpy(X)
    client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
    got: list[str] = []
    try:
        while True:
            result, error = answers.get(timeout=30)
            if error is not None:  # an error response is the stream's last for the client
                got.append(f"error: {error.message()}")
                break
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            got.append(f"{len(response.outputs)} outputs{' final' if final else ''}")
            if final:
                break
    finally:
        client.stop_stream()
        client.close()
    return got


SUCCEEDED_TWICE = {"success": 2, "queue": 2, "compute_input": 2, "compute_infer": 2,
                   "compute_output": 2, "inference_count": 2, "execution_count": 2,
                   "batch1": 2}
SUCCEEDED_TWICE_METRICS = {"nv_inference_request_success": 2, "nv_inference_count": 2,
                           "nv_inference_exec_count": 2}


def test_an_error_response_counts_as_a_successful_request(
        server: ShoalServer, http: httpclient.InferenceServerClient,
        grpc_client: grpcclient.InferenceServerClient) -> None:
    """Triton 2.51: a python model's InferenceResponse(error=TritonError) is a success in the
    statistics; the client gets the error."""
    with Counted(server, "err_resp") as counted:
        assert _infer_both(http, grpc_client, "err_resp") == ["boom", "boom"]
    assert counted.stats == SUCCEEDED_TWICE
    assert counted.metrics == SUCCEEDED_TWICE_METRICS


def test_an_execute_that_raises_counts_a_failure_and_its_execution_only(
        server: ShoalServer, http: httpclient.InferenceServerClient,
        grpc_client: grpcclient.InferenceServerClient) -> None:
    """Triton 2.51: fail, execution_count and batch_stats move; success, queue, compute and
    inference_count do not; the failure's reason is BACKEND."""
    with Counted(server, "raises") as counted:
        errors = _infer_both(http, grpc_client, "raises")
    assert all("RuntimeError: kaboom" in error for error in errors), errors
    assert counted.stats == {"fail": 2, "execution_count": 2, "batch1": 2}
    assert counted.metrics == {"nv_inference_request_failure[BACKEND]": 2,
                               "nv_inference_exec_count": 2}


def test_an_output_region_too_small_counts_as_a_successful_request(
        server: ShoalServer, http: httpclient.InferenceServerClient,
        grpc_client: grpcclient.InferenceServerClient) -> None:
    """Triton 2.51: the model ran and answered; its output did not fit the client's region.
    The client gets the error, the statistics a success."""
    regions = []
    with Counted(server, "ident") as counted:
        for kind, client, module in (("http", http, httpclient),
                                     ("grpc", grpc_client, grpcclient)):
            key_in, key_out = f"/parity-in-{kind}-{server.http_port}", \
                f"/parity-out-{kind}-{server.http_port}"
            region_in = shm.create_shared_memory_region(f"in_{kind}", key_in, 16)
            region_out = shm.create_shared_memory_region(f"out_{kind}", key_out, 8)
            regions += [region_in, region_out]
            shm.set_shared_memory_region(region_in, [X])
            client.register_system_shared_memory(f"in_{kind}", key_in, 16)
            client.register_system_shared_memory(f"out_{kind}", key_out, 8)
            tensor = module.InferInput("IN", [4], "FP32")
            tensor.set_shared_memory(f"in_{kind}", 16)
            output = module.InferRequestedOutput("OUT")
            output.set_shared_memory(f"out_{kind}", 8)
            try:
                with pytest.raises(InferenceServerException, match="should be at least 16 "
                                                                   "bytes to hold the results"):
                    client.infer("ident", [tensor], outputs=[output])
            finally:
                client.unregister_system_shared_memory(f"in_{kind}")
                client.unregister_system_shared_memory(f"out_{kind}")
    for region in regions:
        shm.destroy_shared_memory_region(region)
    assert counted.stats == SUCCEEDED_TWICE
    assert counted.metrics == SUCCEEDED_TWICE_METRICS


def test_decoupled_requests_count_as_one_success_whatever_they_answered(
        server: ShoalServer) -> None:
    """Triton 2.51: generate on a model that sends two responses (refused: generate wants
    exactly one) and a gRPC stream are each one successful request of one row; so is a stream
    whose final response is an error."""
    with Counted(server, "dec2") as counted:
        answer = httpx.post(f"{server.base}/v2/models/dec2/generate",
                            json={"IN": X.tolist()}, timeout=30)
        assert "error" in answer.json()
        assert _stream(server, "dec2") == ["1 outputs", "1 outputs", "0 outputs final"]
    assert counted.stats == SUCCEEDED_TWICE
    assert counted.metrics == SUCCEEDED_TWICE_METRICS
    with Counted(server, "dec_err") as counted:
        assert _stream(server, "dec_err") == ["1 outputs", "error: late boom"]
        stream = httpx.post(f"{server.base}/v2/models/dec_err/generate_stream",
                            json={"IN": X.tolist()}, timeout=30)
        assert "late boom" in stream.text
    assert counted.stats == SUCCEEDED_TWICE
    assert counted.metrics == SUCCEEDED_TWICE_METRICS


def test_a_decoupled_execute_that_raises_counts_a_failure(server: ShoalServer) -> None:
    with Counted(server, "dec_raise") as counted:
        for path in ("generate", "generate_stream"):
            answer = httpx.post(f"{server.base}/v2/models/dec_raise/{path}",
                                json={"IN": X.tolist()}, timeout=30)
            assert "dec kaboom" in answer.text
    assert counted.stats == {"fail": 2, "execution_count": 2, "batch1": 2}
    assert counted.metrics == {"nv_inference_request_failure[BACKEND]": 2,
                               "nv_inference_exec_count": 2}


def test_sequence_requests_refused_on_arrival_count_nowhere(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    """Triton 2.51 counts no failure for a sequence request refused on arrival (no START for
    an unknown sequence, no correlation id)."""
    with Counted(server, "seq_u64") as counted:
        assert _seq_http(server, "seq_u64", "never-started").status_code == 400
        assert _seq_http(server, "seq_u64", 0, start=True).status_code == 400
        with pytest.raises(InferenceServerException, match="START"):
            _seq_grpc(grpc_client, "seq_u64", 424242)
    assert counted.stats == {}
    assert counted.metrics == {}


def test_a_request_refused_by_a_full_queue_counts_nowhere(server: ShoalServer) -> None:
    """Triton 2.51: "Exceeds maximum queue size" is no failure in the statistics or in
    nv_inference_request_failure (a queue timeout is a REJECTED one)."""
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}

    def infer() -> httpx.Response:
        return httpx.post(f"{server.base}/v2/models/slow/infer", json=body, timeout=60)

    with Counted(server, "slow") as counted, ThreadPoolExecutor(2) as pool:
        running = pool.submit(infer)  # executes for 3 s
        time.sleep(1.0)
        queued = pool.submit(infer)  # fills the queue (max_queue_size 1) until then
        time.sleep(0.5)
        refused = infer()
        assert (refused.status_code, refused.json()) == (
            503, {"error": "Exceeds maximum queue size"})
        assert running.result().status_code == queued.result().status_code == 200
    assert counted.stats == {"success": 2, "queue": 2, "compute_input": 2, "compute_infer": 2,
                             "compute_output": 2, "inference_count": 2, "execution_count": 2,
                             "batch1": 2}
    assert counted.metrics == SUCCEEDED_TWICE_METRICS


def test_the_pinned_memory_pool_gauges_say_there_is_none(server: ShoalServer) -> None:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).text
    for name, what in (("total", "total memory size"), ("used", "used memory size")):
        family = f"nv_pinned_memory_pool_{name}_bytes"
        assert f"# HELP {family} Pinned memory pool {what}, in bytes\n" in text
        assert f"# TYPE {family} gauge\n" in text
        assert re.search(rf"^{family} 0(\.0)?$", text, re.MULTILINE), text


# ------------------------------------------------------------------------ finding 9: the index


def _index_http(server: ShoalServer) -> list[dict[str, str]]:
    answer = httpx.post(f"{server.base}/v2/repository/index", json={}, timeout=30)
    assert answer.status_code == 200
    return list(answer.json())


def _index_grpc(client: grpcclient.InferenceServerClient) -> list[dict[str, str]]:
    return list(client.get_model_repository_index(as_json=True).get("models", []))


def _metric_model_names(server: ShoalServer) -> set[str]:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).text
    return set(re.findall(r'model="([^"]+)"', text))


def test_names_that_are_not_models_leave_no_trace_in_the_index_or_metrics(
        server: ShoalServer, grpc_client: grpcclient.InferenceServerClient) -> None:
    """Triton 2.51 in explicit mode: a load of a name the repository lacks is 500 "failed to
    poll", an unload of an unknown name succeeds, and neither name ever shows in the index or
    in /metrics. A model whose initialize raises, or whose config parses but is not valid, is
    listed with its version UNAVAILABLE and the reason; one whose config does not parse, and
    one never loaded, by name only."""
    for client_kind in ("http", "grpc"):
        if client_kind == "http":
            load = httpx.post(f"{server.base}/v2/repository/models/nosuch/load", json={},
                              timeout=60)
            assert (load.status_code, load.json()) == (500, {
                "error": "failed to load 'nosuch', failed to poll from model repository"})
            unload = httpx.post(f"{server.base}/v2/repository/models/unknown/unload", json={},
                                timeout=60)
            assert unload.status_code == 200
            failed = httpx.post(f"{server.base}/v2/repository/models/badinit/load", json={},
                                timeout=60)
            assert failed.status_code == 400 and "init boom" in failed.json()["error"]
        else:
            with pytest.raises(InferenceServerException) as caught:
                grpc_client.load_model("nosuch_grpc")
            assert caught.value.status() == "StatusCode.INTERNAL"
            assert caught.value.message() == ("failed to load 'nosuch_grpc', failed to poll "
                                              "from model repository")
            grpc_client.unload_model("unknown_grpc")
            with pytest.raises(InferenceServerException, match="init boom") as caught:
                grpc_client.load_model("badinit")
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException):
            grpc_client.load_model("badcfg")
        with pytest.raises(InferenceServerException, match="dims"):
            grpc_client.load_model("nodims")

    for index in (_index_http(server), _index_grpc(grpc_client)):
        assert [entry["name"] for entry in index] == REPOSITORY
        by_name = {entry["name"]: entry for entry in index}
        assert by_name["badcfg"] == {"name": "badcfg"}
        badinit = by_name["badinit"]
        assert (badinit["version"], badinit["state"]) == ("1", "UNAVAILABLE")
        assert "init boom" in badinit["reason"]
        nodims = by_name["nodims"]
        assert (nodims["version"], nodims["state"]) == ("1", "UNAVAILABLE")
        assert "'X'" in nodims["reason"] and "dims" in nodims["reason"]
        assert by_name["ident"] == {"name": "ident", "version": "1", "state": "READY"}

    names = _metric_model_names(server)
    assert not names & {"nosuch", "unknown", "nosuch_grpc", "unknown_grpc"}, names
    assert set(LOADED) <= names
    missing = httpx.get(f"{server.base}/v2/models/nosuch", timeout=30)
    assert missing.json() == {"error": "Request for unknown model: 'nosuch' is not found"}
    never = httpx.get(f"{server.base}/v2/models/badinit", timeout=30)
    assert never.json() == {
        "error": "Request for unknown model: 'badinit' has no available versions"}
