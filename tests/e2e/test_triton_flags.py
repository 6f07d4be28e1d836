"""A tritonserver command line starts shoal unchanged (``shoal/frontend/triton_flags.py``): the
flags shoal serves do what they do in Triton (``--id``, ``--log-*``, ``--metrics-address``,
``--allow-cpu-metrics``, ``--model-config-name``, the old ``--trace-*`` forms, gRPC TLS and
response compression), the ones with no effect here are accepted and named in the log, and a
feature shoal does not serve, turned on, stops the start with the reason. Real servers, real
clients (tritonclient over HTTP and TLS gRPC, plain HTTP for /metrics and /v2/logging); the
certificates are made here with the openssl command."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.models import identity_model
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

NO_EFFECT_FLAGS = ["--pinned-memory-pool-byte-size=268435456",
                   "--cuda-memory-pool-byte-size=0:67108864", "--model-load-thread-count=4",
                   "--buffer-manager-thread-count=2", "--reuse-http-port=true"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """A CA, a server certificate for localhost and a client certificate, both CA-signed."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=shoal test CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                 "-keyout", str(d / f"{who}.key"), "-out", str(d / f"{who}.csr"))
        (d / f"{who}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        _openssl("x509", "-req", "-in", str(d / f"{who}.csr"), "-CA", str(d / "ca.pem"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-extfile", str(d / f"{who}.ext"), "-out", str(d / f"{who}.pem"))
    return {name: d / name for name in ("ca.pem", "server.pem", "server.key", "client.pem",
                                        "client.key")}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("triton_flags")
    identity_model(repo, "identity_fp32", "FP32", max_batch_size=8)
    # the same model under --model-config-name=small: a smaller max_batch_size
    alt = (repo / "identity_fp32" / "config.pbtxt").read_text().replace(
        "max_batch_size: 8", "max_batch_size: 2")
    (repo / "identity_fp32" / "configs").mkdir()
    (repo / "identity_fp32" / "configs" / "small.pbtxt").write_text(alt)
    return repo


@pytest.fixture(scope="module")
def triton_style(repo: pathlib.Path, certificates: dict[str, pathlib.Path],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ShoalServer,
                                                                             pathlib.Path]]:
    logs = tmp_path_factory.mktemp("triton_flags_logs")
    log_file = logs / "server.log"
    args = ["--id=edge-7", f"--log-file={log_file}", "--log-info=false",
            "--log-format=ISO8601", "--metrics-address=127.0.0.1", "--allow-cpu-metrics=false",
            "--model-config-name=small", f"--trace-file={logs / 'trace.json'}",
            "--trace-level=TIMESTAMPS", "--trace-rate=5",
            "--grpc-use-ssl-mutual=true", f"--grpc-server-cert={certificates['server.pem']}",
            f"--grpc-server-key={certificates['server.key']}",
            f"--grpc-root-cert={certificates['ca.pem']}",
            "--grpc-infer-response-compression-level=high", *NO_EFFECT_FLAGS]
    with serving(ShoalServer([str(repo)], args)) as srv:
        yield srv, log_file


def test_the_server_metadata_carries_the_id_over_http_and_tls_grpc(
        triton_style: tuple[ShoalServer, pathlib.Path],
        certificates: dict[str, pathlib.Path]) -> None:
    srv, _ = triton_style
    assert httpx.get(f"{srv.base}/v2", timeout=10).json()["name"] == "edge-7"
    client = grpcclient.InferenceServerClient(
        f"localhost:{srv.ports[2]}", ssl=True, root_certificates=str(certificates["ca.pem"]),
        private_key=str(certificates["client.key"]),
        certificate_chain=str(certificates["client.pem"]))
    assert client.get_server_metadata().name == "edge-7"
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("identity_fp32", [tensor], compression_algorithm="gzip")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    client.close()


def test_tls_grpc_refuses_a_client_without_a_certificate(
        triton_style: tuple[ShoalServer, pathlib.Path],
        certificates: dict[str, pathlib.Path]) -> None:
    srv, _ = triton_style
    client = grpcclient.InferenceServerClient(
        f"localhost:{srv.ports[2]}", ssl=True, root_certificates=str(certificates["ca.pem"]))
    with pytest.raises(Exception, match=r"(?i)unavailable|handshake|ssl|certificate"):
        client.get_server_metadata(client_timeout=10)
    client.close()
    plain = grpcclient.InferenceServerClient(f"localhost:{srv.ports[2]}")
    with pytest.raises(Exception, match=r"(?i)unavailable|deadline|handshake"):
        plain.get_server_metadata(client_timeout=5)
    plain.close()


def test_the_log_goes_to_the_log_file_with_the_flags_settings(
        triton_style: tuple[ShoalServer, pathlib.Path]) -> None:
    srv, log_file = triton_style
    text = log_file.read_text()
    for flag in ("--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size",
                 "--model-load-thread-count", "--buffer-manager-thread-count",
                 "--reuse-http-port"):
        assert f"shoal: {flag} has no effect in shoal: " in text
    assert " INFO " not in text  # --log-info=false
    logging = httpx.get(f"{srv.base}/v2/logging", timeout=10).json()
    assert logging == {"log_file": str(log_file), "log_info": False, "log_warning": True,
                       "log_error": True, "log_verbose_level": 0, "log_format": "ISO8601"}


def test_metrics_are_served_on_the_metrics_address_without_cpu_gauges(
        triton_style: tuple[ShoalServer, pathlib.Path]) -> None:
    srv, _ = triton_style
    text = httpx.get(f"http://127.0.0.1:{srv.ports[1]}/metrics", timeout=10).text
    assert "nv_inference_request_success" in text
    assert "nv_cpu_utilization" not in text and "nv_cpu_memory_total_bytes" not in text


def test_the_named_config_is_the_one_served(
        triton_style: tuple[ShoalServer, pathlib.Path]) -> None:
    srv, _ = triton_style
    client = httpclient.InferenceServerClient(srv.url)
    assert client.get_model_config("identity_fp32")["max_batch_size"] == 2


def test_the_old_trace_flags_set_the_trace_settings(
        triton_style: tuple[ShoalServer, pathlib.Path]) -> None:
    srv, log_file = triton_style
    setting = httpx.get(f"{srv.base}/v2/trace/setting", timeout=10).json()
    assert setting["trace_level"] == ["TIMESTAMPS"]
    assert setting["trace_rate"] == "5"
    assert setting["trace_file"] == str(log_file.parent / "trace.json")


@pytest.mark.parametrize("flag,message", [
    ("--allow-sagemaker=true", "--allow-sagemaker=true is not supported: shoal does not serve "
                               "the SageMaker endpoint"),
    ("--allow-http=false", "--allow-http=false is not supported: shoal always serves HTTP"),
    ("--model-namespacing=true", "--model-namespacing=true is not supported"),
    ("--grpc-use-ssl=true", "--grpc-use-ssl needs --grpc-server-cert"),
])
def test_a_feature_shoal_does_not_serve_stops_the_start_saying_so(
        repo: pathlib.Path, flag: str, message: str) -> None:
    srv = ShoalServer([str(repo)], [flag])
    try:
        with pytest.raises(RuntimeError, match="shoal exited with 2"):
            srv.start(timeout=20)
        deadline = time.monotonic() + 5
        while message not in srv.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert message in srv.log()
    finally:
        srv.stop()
