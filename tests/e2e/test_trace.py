"""Tracing end to end (issue #13 part 4): real servers with --trace-config, the settings API over
HTTP and gRPC (tritonclient's trace calls), Triton's JSON trace files as the frontend, broker and
worker stamp them, and OpenTelemetry spans received by an OTLP/HTTP receiver in this process."""

from __future__ import annotations

import http.server
import json
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.models import identity_model, repeat_model
from tests.e2e.server import ShoalServer, free_port

HTTP_NAMES = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
              "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
              "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_NAMES = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *HTTP_NAMES[2:-2], "GRPC_SEND_START",
              "GRPC_SEND_END"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("trace-repo")
    identity_model(root, "identity", "FP32")
    identity_model(root, "other", "INT32")
    repeat_model(root)
    return root


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """One model: the servers that only need a request or two start faster."""
    root = tmp_path_factory.mktemp("trace-small-repo")
    identity_model(root, "identity", "FP32")
    return root


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def server(repo: pathlib.Path, trace_dir: pathlib.Path) -> Iterator[ShoalServer]:
    """Every request traced, each trace written at once to trace.json.<k> (log-frequency 1)."""
    args = [f"--trace-config=triton,file={trace_dir}/trace.json",
            "--trace-config=triton,log-frequency=1", "--trace-config=rate=1",
            "--trace-config=level=TIMESTAMPS"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        yield srv


def infer_http(srv: ShoalServer, data: np.ndarray, model: str = "identity") -> None:
    client = httpclient.InferenceServerClient(srv.url)
    tensor = httpclient.InferInput("INPUT0", list(data.shape),
                                   "FP32" if data.dtype == np.float32 else "INT32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor], request_id="req-1")
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)


def infer_grpc(srv: ShoalServer, data: np.ndarray) -> None:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("identity", [tensor])
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)


def indexed_files(trace_dir: pathlib.Path) -> list[pathlib.Path]:
    return sorted(trace_dir.glob("trace.json.*"), key=lambda p: int(p.suffix[1:]))


def wait_for_files(trace_dir: pathlib.Path, count: int, timeout: float = 10.0
                   ) -> list[pathlib.Path]:
    """The indexed files once there are ``count`` of them, each complete JSON (the writer
    thread writes each in one go, but may be in the middle of it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = indexed_files(trace_dir)
        if len(files) >= count and all(_complete(f) for f in files):
            return files
        time.sleep(0.05)
    return indexed_files(trace_dir)


def _complete(path: pathlib.Path) -> bool:
    try:
        json.loads(path.read_text())
    except ValueError:
        return False
    return True


def traces_in(path: pathlib.Path) -> dict[int, dict[str, Any]]:
    """trace id -> {"header": ..., "stamps": [(name, ns)], "tensors": [...]} of a trace file."""
    traces: dict[int, dict[str, Any]] = {}
    for record in json.loads(path.read_text()):
        trace = traces.setdefault(record["id"], {"stamps": [], "tensors": []})
        if "model_name" in record:
            trace["header"] = record
        elif "timestamps" in record:
            trace["stamps"] += [(t["name"], t["ns"]) for t in record["timestamps"]]
        else:
            trace["tensors"].append(record)
    return traces


def only_trace(path: pathlib.Path) -> dict[str, Any]:
    traces = traces_in(path)
    assert len(traces) == 1, traces
    return next(iter(traces.values()))


def test_settings_round_trip_over_http_and_grpc(server: ShoalServer,
                                                trace_dir: pathlib.Path) -> None:
    http_client = httpclient.InferenceServerClient(server.url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    initial = {"trace_file": f"{trace_dir}/trace.json", "trace_level": ["TIMESTAMPS"],
               "trace_rate": "1", "trace_count": "-1", "log_frequency": "1",
               "trace_mode": "triton"}
    assert http_client.get_trace_settings() == initial
    assert http_client.get_trace_settings(model_name="identity") == initial
    assert "trace" in http_client.get_server_metadata()["extensions"]
    try:
        # a model's own fields; the others follow the global settings
        assert http_client.update_trace_settings(
            model_name="identity", settings={"trace_rate": "12", "log_frequency": "34"}) == {
            **initial, "trace_rate": "12", "log_frequency": "34"}
        http_client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"],
                                                    "trace_count": "50"})
        grpc_model = grpc_client.get_trace_settings(model_name="identity", as_json=True)
        assert {k: v["value"] for k, v in grpc_model["settings"].items()} == {
            **{k: [v] if isinstance(v, str) else v for k, v in initial.items()},
            "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["12"],
            "trace_count": ["50"], "log_frequency": ["34"]}
        # null (HTTP) / an empty list (gRPC) clears back to the global / start-up value
        assert http_client.update_trace_settings(
            model_name="identity", settings={"trace_rate": None}) == {
            **initial, "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_count": "50",
            "log_frequency": "34"}
        cleared = grpc_client.update_trace_settings(
            settings={"trace_level": None, "trace_count": None}, as_json=True)
        assert cleared["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
        assert cleared["settings"]["trace_count"]["value"] == ["-1"]
        assert http_client.get_trace_settings(model_name="other") == initial
    finally:
        for model in ("identity", ""):
            http_client.update_trace_settings(model_name=model or None, settings={
                "trace_level": None, "trace_rate": None, "trace_count": None,
                "log_frequency": None})
    assert http_client.get_trace_settings(model_name="identity") == initial


@pytest.mark.parametrize("body, field", [
    ({"trace_rate": "ten"}, "trace_rate"), ({"trace_rate": 5}, "trace_rate"),
    ({"trace_count": "-2"}, "trace_count"), ({"log_frequency": "-1"}, "log_frequency"),
    ({"trace_level": ["LOUD"]}, "trace_level"), ({"trace_level": "TIMESTAMPS"}, "trace_level"),
    ({"trace_file": "/etc/cron.d/x"}, "trace_file"), ({"trace_file": None}, "trace_file"),
])
def test_bad_settings_are_refused_naming_the_field(server: ShoalServer, body: dict[str, Any],
                                                   field: str) -> None:
    before = httpx.get(f"{server.base}/v2/trace/setting").json()
    response = httpx.post(f"{server.base}/v2/trace/setting", json=body)
    assert response.status_code == 400 and field in response.json()["error"]
    assert httpx.get(f"{server.base}/v2/trace/setting").json() == before


def test_grpc_refuses_trace_file_and_unknown_models(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
    assert caught.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert "trace_file" in str(caught.value.message())
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        client.get_trace_settings(model_name="nope")
    response = httpx.get(f"{server.base}/v2/models/nope/trace/setting")
    assert response.status_code == 400
    assert response.json() == {"error": "Request for unknown model : nope"}


def test_trace_records_in_order_with_one_clock(server: ShoalServer,
                                               trace_dir: pathlib.Path) -> None:
    before = len(indexed_files(trace_dir))
    infer_http(server, np.arange(4, dtype=np.float32))
    infer_grpc(server, np.arange(3, dtype=np.float32))
    files = wait_for_files(trace_dir, before + 2)
    assert len(files) == before + 2
    http_trace, grpc_trace = only_trace(files[before]), only_trace(files[before + 1])
    assert http_trace["header"]["model_name"] == "identity"
    assert http_trace["header"]["model_version"] == 1
    assert http_trace["header"]["request_id"] == "req-1"
    for trace, names in ((http_trace, HTTP_NAMES), (grpc_trace, GRPC_NAMES)):
        assert [name for name, _ in trace["stamps"]] == names
        stamps = [ns for _, ns in trace["stamps"]]
        # frontend, broker and worker stamps on one clock: never backwards
        assert stamps == sorted(stamps), trace["stamps"]
        assert stamps[-1] - stamps[0] < 10 * 10**9
    assert http_trace["header"]["id"] != grpc_trace["header"]["id"]


def test_grpc_stream_requests_are_traced(server: ShoalServer, trace_dir: pathlib.Path) -> None:
    """A stream's messages each get a trace: a plain model's like ModelInfer's; a decoupled
    model's ends with its final response (its compute phases are there only if execute() had
    returned by then: README)."""
    answers: list[Any] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.append(error or result))
    try:
        plain = grpcclient.InferInput("INPUT0", [2], "FP32")
        plain.set_data_from_numpy(np.ones(2, dtype=np.float32))
        before = len(indexed_files(trace_dir))
        client.async_stream_infer("identity", [plain])
        files = wait_for_files(trace_dir, before + 1)
        count, delay = grpcclient.InferInput("IN", [1], "INT32"), grpcclient.InferInput(
            "DELAY", [1], "FP32")
        count.set_data_from_numpy(np.array([2], np.int32))
        delay.set_data_from_numpy(np.array([0.0], np.float32))
        client.async_stream_infer("repeat_decoupled", [count, delay],
                                  enable_empty_final_response=True)
        files = wait_for_files(trace_dir, before + 2)
    finally:
        client.stop_stream()
    assert not [a for a in answers if isinstance(a, Exception)]
    plain_trace, decoupled = only_trace(files[before]), only_trace(files[before + 1])
    assert [n for n, _ in plain_trace["stamps"]] == GRPC_NAMES
    assert decoupled["header"]["model_name"] == "repeat_decoupled"
    names = [n for n, _ in decoupled["stamps"]]
    assert [n for n in GRPC_NAMES if n in names] == names  # in order, a subsequence
    assert {"REQUEST_START", "QUEUE_START", "COMPUTE_START", "REQUEST_END",
            "GRPC_SEND_END"} <= set(names)
    stamps = [ns for _, ns in decoupled["stamps"]]
    assert stamps == sorted(stamps)


def test_rate_and_count_are_honoured(server: ShoalServer, trace_dir: pathlib.Path) -> None:
    client = httpclient.InferenceServerClient(server.url)
    client.update_trace_settings(model_name="other", settings={"trace_rate": "3",
                                                                "trace_count": "2"})
    try:
        before = len(indexed_files(trace_dir))
        for i in range(9):
            infer_http(server, np.full(2, i, dtype=np.int32), model="other")
        assert client.get_trace_settings(model_name="other")["trace_count"] == "0"
        files = wait_for_files(trace_dir, before + 2)
        time.sleep(0.3)
        assert len(indexed_files(trace_dir)) == before + 2  # the 3rd and the 6th only
        assert [only_trace(f)["header"]["model_name"] for f in files[before:]] == ["other"] * 2
    finally:
        client.update_trace_settings(model_name="other",
                                     settings={"trace_rate": None, "trace_count": None})


def test_tensors_level_records_the_data(server: ShoalServer, trace_dir: pathlib.Path) -> None:
    client = httpclient.InferenceServerClient(server.url)
    client.update_trace_settings(model_name="identity",
                                 settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
    try:
        before = len(indexed_files(trace_dir))
        data = np.array([0.5, -2.0, 3.25], dtype=np.float32)
        infer_http(server, data)
        trace = only_trace(wait_for_files(trace_dir, before + 1)[before])
    finally:
        client.update_trace_settings(model_name="identity", settings={"trace_level": None})
    tensors = {t["activity"]: t["tensor"] for t in trace["tensors"]}
    expected = {"name": "INPUT0", "data": "0.5,-2,3.25", "shape": "3", "dtype": "FP32"}
    assert tensors["TENSOR_QUEUE_INPUT"] == expected
    assert tensors["TENSOR_BACKEND_OUTPUT"] == {**expected, "name": "OUTPUT0"}


def test_log_frequency_zero_writes_one_file_at_exit(small_repo: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    path = tmp_path / "all.json"
    args = [f"--trace-config=triton,file={path}", "--trace-config=rate=2",
            "--trace-config=level=TIMESTAMPS"]
    with serving(ShoalServer([str(small_repo)], args)) as srv:
        for i in range(6):
            infer_http(srv, np.full(2, i, dtype=np.float32))
        assert not path.exists()  # log-frequency 0: written when the server stops
    traces = traces_in(path)
    assert len(traces) == 3 and not list(tmp_path.glob("all.json.*"))
    assert all([n for n, _ in t["stamps"]] == HTTP_NAMES for t in traces.values())


class _Receiver(http.server.BaseHTTPRequestHandler):
    spans: list[Any] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    _Receiver.spans.append((resource_spans.resource, span))
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_opentelemetry_spans_reach_a_collector(small_repo: pathlib.Path) -> None:
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Receiver)
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    args = ["--trace-config=mode=opentelemetry", f"--trace-config=opentelemetry,url={url}",
            "--trace-config=opentelemetry,resource=service.name=shoal-e2e",
            "--trace-config=opentelemetry,bsp_schedule_delay=100", "--trace-config=rate=1",
            "--trace-config=level=TIMESTAMPS"]
    try:
        with serving(ShoalServer([str(small_repo)], args)) as srv:
            settings = httpclient.InferenceServerClient(srv.url).get_trace_settings()
            assert settings["trace_mode"] == "opentelemetry" and settings["url"] == url
            infer_http(srv, np.arange(4, dtype=np.float32))
            deadline = time.monotonic() + 10
            while len(_Receiver.spans) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        receiver.shutdown()
        receiver.server_close()
    spans = {span.name: (resource, span) for resource, span in _Receiver.spans}
    assert set(spans) == {"InferRequest", "identity", "compute"}
    resource, root = spans["InferRequest"]
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == \
        "shoal-e2e"
    model, compute = spans["identity"][1], spans["compute"][1]
    assert [e.name for e in root.events] == ["HTTP_RECV_START", "HTTP_RECV_END",
                                             "HTTP_SEND_START", "HTTP_SEND_END"]
    assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert [e.name for e in compute.events] == HTTP_NAMES[4:8]
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert len({s.trace_id for _, s in _Receiver.spans}) == 1
    attributes = {a.key: a.value for a in model.attributes}
    assert attributes["triton.model_name"].string_value == "identity"
    assert attributes["triton.model_version"].int_value == 1
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= \
        compute.start_time_unix_nano <= compute.end_time_unix_nano <= model.end_time_unix_nano
