"""Restricted APIs end to end: a real ``shoal serve`` with every category restricted, HTTP
(``--http-restricted-api``, each category its own header) and gRPC
(``--grpc-restricted-protocol``), spoken to with plain HTTP, a raw gRPC channel and tritonclient.
Every route of the app's table (taken from the app itself, so new routes are covered), every
alias spelling, every gRPC method and the stream are refused without their header and answered
with it; the same requests to a server without restrictions answer as they did before."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from shoal.frontend.grpc.health import SERVICE_NAME as HEALTH_SERVICE
from shoal.frontend.grpc.restricted import INFERENCE_SERVICE
from shoal.frontend.http.app import create_app
from shoal.frontend.http.restricted import ApiRoute
from shoal.frontend.restricted import GRPC_CATEGORIES, GRPC_METHOD_CATEGORIES, ApiCategory
from shoal.settings import settings_from_flags
from tests.e2e.conftest import serving
from tests.e2e.models import copy_example
from tests.e2e.server import ShoalServer
from tests.frontend.http.fakes import FakeDataPlane

HTTP_KEYS = {c: (f"http-{c.value}", f"h-{c.value}") for c in ApiCategory}
GRPC_KEYS = {c: (f"triton-grpc-protocol-grpc-{c.value}", f"g-{c.value}")
             for c in sorted(GRPC_CATEGORIES)}
FLAGS = [
    *(f"--http-restricted-api={c.value}:{key}={value}" for c, (key, value) in HTTP_KEYS.items()),
    *(f"--grpc-restricted-protocol={c.value}:grpc-{c.value}={value}"
      for c, (_, value) in GRPC_KEYS.items()),
]
SAMPLES = {"model": "add_sub", "version": "1", "repository": "repo", "region": "r0"}
ADD_SUB_INFER = (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},'
                 b'{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[1,1,1,1]}]}')

# spellings that reach a route: percent-encoded segments, version forms, HEAD, wrong methods
ALIASES = [
    ("GET", "/v2/models/%61dd_sub", ApiCategory.METADATA),
    ("GET", "/v2/models/%61dd_sub/versions/1/config", ApiCategory.MODEL_CONFIG),
    ("GET", "/v2/health/%72eady", ApiCategory.HEALTH),
    ("POST", "/v2/models/%61dd_sub/infer", ApiCategory.INFERENCE),
    ("POST", "/v2/models/add_sub/versions/1/infer", ApiCategory.INFERENCE),
    ("POST", "/v2/models/add_sub/versions/01/infer", ApiCategory.INFERENCE),
    ("POST", "/v2/models/%61dd_sub/generate_stream", ApiCategory.INFERENCE),
    ("POST", "/v2/repository/models/%61dd_sub/unload", ApiCategory.MODEL_REPOSITORY),
    ("POST", "/v2/cudasharedmemory/region/%72/register", ApiCategory.SHARED_MEMORY),
    ("HEAD", "/v2/health/live", ApiCategory.HEALTH),
    ("HEAD", "/v2", ApiCategory.METADATA),
    ("HEAD", "/v2/models/add_sub/stats", ApiCategory.STATISTICS),
    ("GET", "/v2/models/add_sub/infer", ApiCategory.INFERENCE),
    ("PUT", "/v2/logging", ApiCategory.LOGGING),
]
NOWHERE = ["/v2/", "/v2/health/live/", "//v2/health/live", "/v2//health/live",
           "/v2/models/add_sub/infer/", "/v2//models/add_sub/infer", "/v2/models//add_sub",
           "/v2/models/add_sub/versions/x/ready", "/v2/nothing"]


def route_requests() -> list[tuple[str, str, ApiCategory]]:
    """(method, path, category) for every method of every route of the HTTP app's table."""
    settings = settings_from_flags(model_repositories=["/m"]).for_frontends()
    routes = create_app(FakeDataPlane(models=[]), settings).routes
    requests = []
    for route in routes:
        assert isinstance(route, ApiRoute)
        path = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: SAMPLES[m.group(1)], route.path)
        requests += [(method, path, route.category) for method in sorted(route.methods or ())]
    return requests


class RestrictedServer(ShoalServer):
    """Waits for readiness with the health header (health is restricted)."""

    ready_headers = dict([HTTP_KEYS[ApiCategory.HEALTH]])


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("restricted-repo")
    copy_example(repo, "add_sub")
    return repo


@pytest.fixture(scope="module")
def restricted(repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(RestrictedServer([str(repo)], FLAGS)) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain(repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


_CONNECTIONS: dict[str, httpx.Client] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    for connection in _CONNECTIONS.values():
        connection.close()
    _CONNECTIONS.clear()


def send(server: ShoalServer, method: str, path: str,
         headers: dict[str, str] | None = None) -> httpx.Response:
    """One request on a kept-alive connection to ``server`` (``path`` sent as written)."""
    connection = _CONNECTIONS.setdefault(server.base, httpx.Client(timeout=10))
    body = ADD_SUB_INFER if path.endswith("/infer") and method == "POST" else None
    return connection.request(method, server.base + path, content=body, headers=headers)


def is_refusal(response: httpx.Response, category: ApiCategory, method: str) -> bool:
    if response.status_code != 403:
        return False
    key = HTTP_KEYS[category][0]
    return method == "HEAD" or response.json() == {
        "error": f"This API is restricted, expecting header '{key}'"}


# ---------------------------------------------------------------- HTTP


def test_every_route_and_alias_is_refused_without_its_header_and_served_with_it(
        restricted: ShoalServer, plain: ShoalServer) -> None:
    requests = route_requests() + ALIASES
    assert len(requests) > 40
    for method, path, category in requests:
        assert is_refusal(send(restricted, method, path), category, method), (method, path)
        other = next(c for c in ApiCategory if c is not category)
        key, value = HTTP_KEYS[other]
        assert is_refusal(send(restricted, method, path, {key: value}), category, method), \
            (method, path)
        key, value = HTTP_KEYS[category]
        served = send(restricted, method, path, {key: value})
        before = send(plain, method, path)
        assert served.status_code != 403, (method, path, served.text)
        assert before.status_code != 403, (method, path)
        assert served.status_code == before.status_code, (method, path, served.text)


def test_infer_through_the_fast_path_with_the_header(restricted: ShoalServer) -> None:
    key, value = HTTP_KEYS[ApiCategory.INFERENCE]
    response = send(restricted, "POST", "/v2/models/add_sub/infer", {key: value})
    assert response.status_code == 200
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}


def test_paths_that_route_nowhere_answer_as_without_restrictions(
        restricted: ShoalServer, plain: ShoalServer) -> None:
    for path in NOWHERE:
        for method in ("GET", "POST"):
            gated, before = send(restricted, method, path), send(plain, method, path)
            assert gated.status_code == 404, (method, path)
            assert (gated.status_code, gated.content) == (before.status_code, before.content)


def test_tritonclient_http_with_headers(restricted: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(restricted.url)
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        client.get_model_config("add_sub")
    key, value = HTTP_KEYS[ApiCategory.MODEL_CONFIG]
    assert client.get_model_config("add_sub", headers={key: value})["name"] == "add_sub"
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"),
              httpclient.InferInput("INPUT1", [4], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(4, np.float32))
    key, value = HTTP_KEYS[ApiCategory.INFERENCE]
    result = client.infer("add_sub", inputs, headers={key: value})
    assert result.as_numpy("OUTPUT0").tolist() == [2.0] * 4


def test_dashboard_on_the_metrics_port_is_restricted_and_metrics_are_not(
        restricted: ShoalServer) -> None:
    base = f"http://127.0.0.1:{restricted.metrics_port}"
    assert httpx.get(base + "/metrics").status_code == 200
    key, value = HTTP_KEYS[ApiCategory.DASHBOARD]
    for path in ("/dashboard", "/dashboard/", "/dashboard/api/anything", "/%64ashboard"):
        refused = httpx.get(base + path)
        assert refused.status_code == 403, path
        assert refused.json() == {"error": f"This API is restricted, expecting header '{key}'"}
        assert httpx.get(base + path, headers={key: value}).status_code != 403, path


# ---------------------------------------------------------------- gRPC


def _unary_methods() -> list[tuple[str, Any, Any, ApiCategory]]:
    return [(f"/{INFERENCE_SERVICE.full_name}/{m.name}", getattr(pb, m.input_type.name),
             getattr(pb, m.output_type.name), GRPC_METHOD_CATEGORIES[m.name])
            for m in INFERENCE_SERVICE.methods if not (m.client_streaming or m.server_streaming)]


def _metadata(category: ApiCategory) -> tuple[tuple[str, str], ...]:
    return (GRPC_KEYS[category],)


def _refusal(category: ApiCategory) -> str:
    return f"This protocol is restricted, expecting header '{GRPC_KEYS[category][0]}'"


async def _grpc_outcomes(url: str, metadata_of: Any) -> list[tuple[str, Any, str]]:
    """(method path, status code, details) of every unary RPC and the health check."""
    outcomes = []
    async with grpc.aio.insecure_channel(url) as channel:
        calls = [(path, request_type, response_type, category)
                 for path, request_type, response_type, category in _unary_methods()]
        calls.append((f"/{HEALTH_SERVICE}/Check", None, None, ApiCategory.HEALTH))
        for path, request_type, response_type, category in calls:
            if request_type is None:
                call = channel.unary_unary(path, request_serializer=lambda b: b,
                                           response_deserializer=lambda b: b)
                request: Any = b""
            else:
                call = channel.unary_unary(
                    path, request_serializer=request_type.SerializeToString,
                    response_deserializer=response_type.FromString)
                request = request_type()
            try:
                await call(request, metadata=metadata_of(category), timeout=10)
                outcomes.append((path, grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as error:
                outcomes.append((path, error.code(), str(error.details())))
    return outcomes


def test_every_grpc_method_is_refused_without_its_metadata_and_served_with_it(
        restricted: ShoalServer, plain: ShoalServer) -> None:
    categories = {path: category for path, _, _, category in _unary_methods()}
    categories[f"/{HEALTH_SERVICE}/Check"] = ApiCategory.HEALTH
    refused = asyncio.run(_grpc_outcomes(restricted.grpc_url, lambda c: None))
    for path, code, details in refused:
        assert (code, details) == (grpc.StatusCode.PERMISSION_DENIED,
                                   _refusal(categories[path])), path
    served = asyncio.run(_grpc_outcomes(restricted.grpc_url, _metadata))
    before = asyncio.run(_grpc_outcomes(plain.grpc_url, lambda c: None))
    assert len(served) == len(before) == len(categories)
    for (path, code, _), (_, code_before, _) in zip(served, before, strict=True):
        assert code is not grpc.StatusCode.PERMISSION_DENIED, path
        assert code == code_before, path


def _collect(answers: list[Any], result: Any, error: Any) -> None:
    answers.append((result, error))


def test_tritonclient_grpc_unary_and_stream_with_headers(restricted: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    with pytest.raises(InferenceServerException, match="PERMISSION_DENIED") as caught:
        client.is_server_live()
    assert _refusal(ApiCategory.HEALTH) in str(caught.value)
    key, value = GRPC_KEYS[ApiCategory.HEALTH]
    assert client.is_server_live(headers={key: value})

    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"),
              grpcclient.InferInput("INPUT1", [4], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(4, np.float32))
    key, value = GRPC_KEYS[ApiCategory.INFERENCE]
    assert client.infer("add_sub", inputs, headers={key: value}).as_numpy(
        "OUTPUT0").tolist() == [2.0] * 4

    for headers, expect_refusal in ((None, True), ({key: value}, False)):
        answers: list[Any] = []
        client.start_stream(functools.partial(_collect, answers), headers=headers)
        # a refused stream may end (error to the callback) before this request is queued
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("add_sub", inputs)
        deadline = time.monotonic() + 10
        while not answers and time.monotonic() < deadline:
            time.sleep(0.05)
        client.stop_stream()
        assert answers, headers
        result, error = answers[0]
        if expect_refusal:
            assert error is not None and _refusal(ApiCategory.INFERENCE) in str(error)
        else:
            assert error is None and result.as_numpy("OUTPUT0").tolist() == [2.0] * 4
    client.close()


# ---------------------------------------------------------------- start-up


@pytest.mark.parametrize("flags,message", [
    (["--http-restricted-api=model-reposit,health:k1=v1"],
     "unknown restricted api 'model-reposit'"),
    (["--http-restricted-api=model-repository,health:k1=v1",
      "--http-restricted-api=metadata,health:k2=v2"],
     "restricted api 'health' can not be specified in multiple config groups"),
    (["--grpc-restricted-protocol=health:k1"], "--grpc-restricted-protocol option format is"),
])
def test_bad_restriction_flags_stop_serve_with_exit_2(
        repo: pathlib.Path, flags: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "shoal", "serve", f"--model-repository={repo}",
                           *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
