"""The non-infer routes of the HTTP app, through starlette's TestClient over a fake DataPlane."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from starlette.responses import Response
from starlette.testclient import TestClient

from shoal.errors import ErrorCode
from shoal.frontend.http.app import create_app
from shoal.frontend.http.restricted import ApiRoute
from shoal.frontend.restricted import ApiCategory
from shoal.messages import Duration, Error, ModelStats, ModelVersionState, TensorSpec
from shoal.settings import ModelControlMode, settings_from_flags
from tests.frontend.http.fakes import FakeDataPlane, make_model

SETTINGS = settings_from_flags(model_repositories=["/models"]).for_frontends()


def make_dataplane() -> FakeDataPlane:
    return FakeDataPlane(
        models=[
            make_model("simple", [TensorSpec("INPUT0", "INT32", [16])], max_batch_size=8),
            make_model("multi", version=1),
            make_model("multi", version=2),
            make_model("multi", version=3, state=ModelVersionState.UNAVAILABLE,
                       reason="load failed"),
        ],
        unloaded=["never_loaded"],
    )


@pytest.fixture
def dataplane() -> FakeDataPlane:
    return make_dataplane()


@pytest.fixture
def client(dataplane: FakeDataPlane) -> Iterator[TestClient]:
    with TestClient(create_app(dataplane, SETTINGS), raise_server_exceptions=False) as c:
        yield c


# ---------------------------------------------------------------- routing


@pytest.mark.parametrize("path", ["/", "/v2/", "/v2/nothing", "/v2/models/simple/versions/x",
                                  "/v2/models/simple/generate/more", "/v2/models/simple/infer/more",
                                  "/v2/models/simple/versions/-1/ready"])
def test_unknown_path_is_404_not_found(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert response.json() == {"error": "Not Found"}


@pytest.mark.parametrize("method,path", [
    ("POST", "/v2"), ("POST", "/v2/health/live"), ("DELETE", "/v2/health/ready"),
    ("POST", "/v2/models/simple"), ("GET", "/v2/models/simple/infer"),
    ("PUT", "/v2/models/simple/versions/1/config"), ("GET", "/v2/repository/index"),
    ("GET", "/v2/repository/models/simple/load"), ("DELETE", "/v2/logging"),
    ("POST", "/v2/models/stats"),
])
def test_wrong_method_is_405(client: TestClient, method: str, path: str) -> None:
    response = client.request(method, path)
    assert response.status_code == 405
    assert response.json() == {"error": "Method Not Allowed"}


# ---------------------------------------------------------------- health


def test_live_and_ready_are_200_with_empty_body(client: TestClient) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        response = client.get(path)
        assert (response.status_code, response.content) == (200, b"")


def test_not_ready_is_400_with_empty_body(client: TestClient, dataplane: FakeDataPlane) -> None:
    dataplane.ready = False
    response = client.get("/v2/health/ready")
    assert (response.status_code, response.content) == (400, b"")
    assert client.get("/v2/health/live").status_code == 200


def test_not_live_is_400(client: TestClient, dataplane: FakeDataPlane) -> None:
    dataplane.live = False
    assert client.get("/v2/health/live").status_code == 400


def test_health_while_exiting_is_503_server_exiting(client: TestClient,
                                                    dataplane: FakeDataPlane) -> None:
    dataplane.exiting = True
    for path in ("/v2/health/live", "/v2/health/ready"):
        response = client.get(path)
        assert response.status_code == 503
        assert response.json() == {"error": "Server exiting"}


def test_model_ready(client: TestClient) -> None:
    assert client.get("/v2/models/simple/ready").status_code == 200
    assert client.get("/v2/models/multi/versions/2/ready").status_code == 200
    for path in ("/v2/models/multi/versions/3/ready", "/v2/models/multi/versions/9/ready",
                 "/v2/models/nope/ready"):
        response = client.get(path)
        assert response.status_code == 400
        assert response.json() == {"error": "Model version not ready"}


# ---------------------------------------------------------------- metadata


def test_server_metadata(client: TestClient) -> None:
    document = client.get("/v2").json()
    assert document["name"] == "triton" and document["version"] == "2.73.0"
    extensions = document["extensions"]
    assert extensions[:3] == ["classification", "sequence", "model_repository"]
    assert "binary_tensor_data" in extensions and "statistics" in extensions
    assert extensions[-2:] == ["trace", "logging"]  # Triton's order
    # Triton's order: model_configuration, system_shared_memory, cuda_shared_memory, binary...
    position = extensions.index("model_configuration")
    assert extensions[position + 1:position + 4] == [
        "system_shared_memory", "cuda_shared_memory", "binary_tensor_data"]


def test_model_metadata_with_batch_dimension(client: TestClient) -> None:
    assert client.get("/v2/models/simple").json() == {
        "name": "simple", "versions": ["1"], "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]}]}


def test_model_metadata_lists_ready_versions(client: TestClient) -> None:
    assert client.get("/v2/models/multi").json()["versions"] == ["1", "2"]
    assert client.get("/v2/models/multi/versions/1").json()["versions"] == ["1"]


@pytest.mark.parametrize("path,status,message", [
    ("/v2/models/nope", 404, "Request for unknown model: 'nope' is not found"),
    ("/v2/models/multi/versions/7", 404, "Request for unknown model: 'multi' version 7 is "
                                         "not found"),
    ("/v2/models/multi/versions/3", 503, "Request for unknown model: 'multi' version 3 is "
                                         "not at ready state"),
    ("/v2/models/nope/config", 404, "Request for unknown model: 'nope' is not found"),
    ("/v2/models/nope/stats", 400, "requested model 'nope' is not available"),
    ("/v2/models/multi/versions/7/stats", 400, "requested model version is not available for "
                                               "model 'multi'"),
    ("/v2/models/multi/versions/99999999999999999999", 400,
     "failed to get model version from specified version string '99999999999999999999' "
     "(details: stol), version should be an integral value > 0"),
])
def test_model_not_found_texts(client: TestClient, path: str, status: int,
                               message: str) -> None:
    response = client.get(path)
    assert response.status_code == status
    assert response.json() == {"error": message}


def test_model_config_is_served_as_is(client: TestClient, dataplane: FakeDataPlane) -> None:
    response = client.get("/v2/models/simple/versions/1/config")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.content == dataplane.models[0].config_json


# ---------------------------------------------------------------- statistics


def test_statistics_document(client: TestClient, dataplane: FakeDataPlane) -> None:
    one = Duration(2, 3000)
    dataplane.stats_models = [ModelStats("simple", 1, 1700, 5, 2, one, Duration(1, 10), one,
                                         one, one, one, [], pending=0)]
    stats = client.get("/v2/models/simple/stats").json()["model_stats"]
    assert stats[0]["name"] == "simple" and stats[0]["version"] == "1"
    assert stats[0]["inference_count"] == 5 and stats[0]["execution_count"] == 2
    assert stats[0]["inference_stats"]["fail"] == {"count": 1, "ns": 10}
    assert stats[0]["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}


def test_all_statistics(client: TestClient) -> None:
    names = [(s["name"], s["version"]) for s in client.get("/v2/models/stats").json()
             ["model_stats"]]
    assert ("simple", "1") in names and ("multi", "2") in names


def test_statistics_error_from_the_broker(client: TestClient, dataplane: FakeDataPlane) -> None:
    dataplane.stats_error = Error(ErrorCode.UNAVAILABLE, "broker unreachable")
    response = client.get("/v2/models/stats")
    assert response.status_code == 503 and response.json() == {"error": "broker unreachable"}


# ---------------------------------------------------------------- repository


def test_repository_index(client: TestClient) -> None:
    assert client.post("/v2/repository/index").json() == [
        {"name": "multi", "version": "1", "state": "READY"},
        {"name": "multi", "version": "2", "state": "READY"},
        {"name": "multi", "version": "3", "state": "UNAVAILABLE", "reason": "load failed"},
        {"name": "never_loaded"},
        {"name": "simple", "version": "1", "state": "READY"},
    ]


def test_repository_index_ready_only(client: TestClient) -> None:
    index = client.post("/v2/repository/index", json={"ready": True}).json()
    assert [(e["name"], e["version"]) for e in index] == [("multi", "1"), ("multi", "2"),
                                                           ("simple", "1")]


@pytest.mark.parametrize("body,needle", [
    (b'{"ready": "yes"}', "'ready'"),
    (b"{", "failed to parse the repository index request"),
    (b"[" * 250_000 + b"]" * 250_000, "JSON nesting depth exceeds maximum allowed limit (100)"),
])
def test_repository_index_bad_bodies(client: TestClient, body: bytes, needle: str) -> None:
    response = client.post("/v2/repository/index", content=body)
    assert response.status_code == 400 and needle in response.json()["error"]
    assert client.get("/v2/health/live").status_code == 200


@pytest.mark.parametrize("action", ["load", "unload"])
def test_load_and_unload_in_mode_none_say_what_triton_says(client: TestClient,
                                                           action: str) -> None:
    response = client.post(f"/v2/repository/models/simple/{action}")
    assert response.status_code == 503
    assert response.json() == {
        "error": "explicit model load / unload is not allowed if polling is enabled"}


def test_repository_name_is_unsupported(client: TestClient) -> None:
    response = client.post("/v2/repository/myrepo/models/simple/load")
    assert response.status_code == 501
    assert response.json() == {"error": "'repository_name' specification is not supported"}


@dataclass
class ControllingDataPlane(FakeDataPlane):
    calls: list[tuple[str, str, object]] = field(default_factory=list)

    async def load_model(self, name: str, parameters: object) -> None:
        self.calls.append(("load", name, parameters))

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        self.calls.append(("unload", name, unload_dependents))


def test_explicit_mode_forwards_load_and_unload() -> None:
    dataplane = ControllingDataPlane(models=[make_model("simple")])
    settings = settings_from_flags(model_repositories=["/m"],
                                   model_control_mode=ModelControlMode.EXPLICIT).for_frontends()
    with TestClient(create_app(dataplane, settings)) as client:
        assert "model_repository(unload_dependents)" in client.get("/v2").json()["extensions"]
        load = client.post("/v2/repository/models/new/load", json={
            "parameters": {"config": "{}", "file:1/model.py": "cHJpbnQoKQ=="}})
        unload = client.post("/v2/repository/models/new/unload",
                             json={"parameters": {"unload_dependents": True}})
        bad = client.post("/v2/repository/models/new/load",
                          json={"parameters": {"file:1/x": "%%%"}})
    assert (load.status_code, load.content, unload.status_code) == (200, b"", 200)
    assert dataplane.calls == [("load", "new", {"config": "{}", "file:1/model.py": b"print()"}),
                               ("unload", "new", True)]
    assert bad.status_code == 400 and "'file:1/x'" in bad.json()["error"]


def test_explicit_mode_without_model_control_is_unsupported(dataplane: FakeDataPlane) -> None:
    settings = settings_from_flags(model_repositories=["/m"],
                                   model_control_mode=ModelControlMode.EXPLICIT).for_frontends()
    with TestClient(create_app(dataplane, settings)) as client:
        assert client.post("/v2/repository/models/simple/load").status_code == 501


# ---------------------------------------------------------------- logging


@pytest.fixture
def root_level() -> Iterator[None]:
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


def test_logging_settings_get(client: TestClient) -> None:
    assert client.get("/v2/logging").json() == {
        "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": "default"}


def test_logging_update_applies_to_the_process(client: TestClient, root_level: None) -> None:
    response = client.post("/v2/logging", json={"log_verbose_level": 1, "log_format": "ISO8601"})
    assert response.status_code == 200
    assert response.json()["log_verbose_level"] == 1
    assert response.json()["log_format"] == "ISO8601"
    assert logging.getLogger().level == logging.DEBUG
    client.post("/v2/logging", json={"log_verbose_level": 0, "log_info": False})
    assert logging.getLogger().level == logging.WARNING
    assert client.get("/v2/logging").json()["log_info"] is False


def test_log_file_cannot_be_set(client: TestClient, root_level: None) -> None:
    response = client.post("/v2/logging", json={"log_file": "/tmp/x.log", "log_verbose_level": 1})
    assert response.status_code == 501 and "'log_file'" in response.json()["error"]
    assert client.get("/v2/logging").json()["log_verbose_level"] == 0  # nothing applied


def test_log_file_null_is_ignored(client: TestClient, root_level: None) -> None:
    assert client.post("/v2/logging", json={"log_file": None}).status_code == 200


@pytest.mark.parametrize("body,needle", [
    ({"log_info": "yes"}, "'log_info'"), ({"log_verbose_level": -1}, "'log_verbose_level'"),
    ({"log_verbose_level": True}, "'log_verbose_level'"), ({"log_format": "xml"}, "xml"),
])
def test_bad_logging_values_are_400(client: TestClient, body: dict[str, object],
                                    needle: str) -> None:
    response = client.post("/v2/logging", json=body)
    assert response.status_code == 400 and needle in response.json()["error"]


# ---------------------------------------------------------------- unexpected failures


def test_unexpected_exception_is_500_without_details(client: TestClient,
                                                     dataplane: FakeDataPlane,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def broken(name: str, version: str | None) -> None:
        raise RuntimeError("secret /dev/shm/shoal-xyz detail")

    dataplane.model = broken  # type: ignore[assignment,method-assign]
    with caplog.at_level(logging.ERROR):
        response = client.get("/v2/models/simple/config")
    assert response.status_code == 500
    assert response.json() == {"error": "internal error"}
    assert "secret" in caplog.text  # logged here, not shown to the client


def test_extra_routes_are_served_first(dataplane: FakeDataPlane) -> None:
    async def region_status(request: object) -> Response:
        return Response(b"[]", media_type="application/json")

    app = create_app(dataplane, SETTINGS, extra_routes=[
        ApiRoute("/v2/systemsharedmemory/status", region_status, methods=["GET"],
                 category=ApiCategory.SHARED_MEMORY)])
    with TestClient(app) as client:
        assert client.get("/v2/systemsharedmemory/status").json() == []
        assert client.get("/v2/health/live").status_code == 200
