"""The restricted-API gate over HTTP, in-process (starlette TestClient over a fake DataPlane):
every route of the app carries a category, every route (and method, and the infer fast path)
of a restricted category answers Triton's 403 without its header and serves with it, paths that
route nowhere answer exactly as without restrictions, and the metrics port's dashboard gate."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from shoal.frontend.http.app import create_app, create_asgi_app
from shoal.frontend.http.restricted import ApiRoute, restrict_metrics_app
from shoal.frontend.restricted import HTTP_CATEGORIES, ApiCategory, RestrictedApis
from shoal.messages import TensorSpec
from shoal.settings import FrontendSettings, settings_from_flags
from tests.frontend.http.fakes import FakeDataPlane, make_model

OPEN = settings_from_flags(model_repositories=["/models"]).for_frontends()
# every category restricted, each by its own header, so a wrong category's header is refused too
KEYS = {category: (f"key-{category.value}", f"value-{category.value}")
        for category in ApiCategory}
RESTRICTED = settings_from_flags(model_repositories=["/models"], http_restricted_apis=[
    (category.value, key, value) for category, (key, value) in KEYS.items()]).for_frontends()
SAMPLES = {"model": "simple", "version": "1", "repository": "repo", "region": "r0"}

# Triton's category for each route (http_server.cc: the check that opens each handler)
TRITON_CATEGORIES = {
    "/v2": ApiCategory.METADATA,
    "/v2/health/live": ApiCategory.HEALTH,
    "/v2/health/ready": ApiCategory.HEALTH,
    "/v2/models/{model}": ApiCategory.METADATA,
    "/v2/models/{model}/versions/{version:int}": ApiCategory.METADATA,
    "/v2/models/{model}/ready": ApiCategory.HEALTH,
    "/v2/models/{model}/versions/{version:int}/ready": ApiCategory.HEALTH,
    "/v2/models/{model}/config": ApiCategory.MODEL_CONFIG,
    "/v2/models/{model}/versions/{version:int}/config": ApiCategory.MODEL_CONFIG,
    "/v2/models/stats": ApiCategory.STATISTICS,
    "/v2/models/{model}/stats": ApiCategory.STATISTICS,
    "/v2/models/{model}/versions/{version:int}/stats": ApiCategory.STATISTICS,
    "/v2/models/{model}/infer": ApiCategory.INFERENCE,
    "/v2/models/{model}/versions/{version:int}/infer": ApiCategory.INFERENCE,
    "/v2/models/{model}/generate": ApiCategory.INFERENCE,
    "/v2/models/{model}/versions/{version:int}/generate": ApiCategory.INFERENCE,
    "/v2/models/{model}/generate_stream": ApiCategory.INFERENCE,
    "/v2/models/{model}/versions/{version:int}/generate_stream": ApiCategory.INFERENCE,
    "/v2/logging": ApiCategory.LOGGING,
    "/v2/repository/index": ApiCategory.MODEL_REPOSITORY,
    "/v2/repository/{repository}/index": ApiCategory.MODEL_REPOSITORY,
    "/v2/repository/models/{model}/load": ApiCategory.MODEL_REPOSITORY,
    "/v2/repository/{repository}/models/{model}/load": ApiCategory.MODEL_REPOSITORY,
    "/v2/repository/models/{model}/unload": ApiCategory.MODEL_REPOSITORY,
    "/v2/repository/{repository}/models/{model}/unload": ApiCategory.MODEL_REPOSITORY,
    **{f"/v2/{kind}sharedmemory{region}/{action}": ApiCategory.SHARED_MEMORY
       for kind in ("system", "cuda") for region in ("", "/region/{region}")
       for action in ("status", "register", "unregister")},
}


def make_dataplane() -> FakeDataPlane:
    return FakeDataPlane(models=[make_model("simple", [TensorSpec("INPUT0", "FP32", [-1])])])


def concrete(path: str) -> str:
    """A route template with sample values: ``/v2/models/{model}`` -> ``/v2/models/simple``."""
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: SAMPLES[m.group(1)], path)


def api_routes(settings: FrontendSettings) -> list[ApiRoute]:
    routes = create_app(make_dataplane(), settings).routes
    assert all(isinstance(route, ApiRoute) for route in routes)
    return [route for route in routes if isinstance(route, ApiRoute)]


def every_request() -> list[tuple[str, str, ApiCategory]]:
    """(method, concrete path, category) for every method of every route of the app."""
    return [(method, concrete(route.path), route.category)
            for route in api_routes(OPEN) for method in sorted(route.methods or ())]


@pytest.fixture
def restricted() -> Iterator[TestClient]:
    with TestClient(create_asgi_app(make_dataplane(), RESTRICTED),
                    raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def open_client() -> Iterator[TestClient]:
    with TestClient(create_asgi_app(make_dataplane(), OPEN),
                    raise_server_exceptions=False) as client:
        yield client


def at(path: str) -> str:
    """An absolute URL, so that a path starting with ``//`` stays a path (not a host)."""
    return "http://testserver" + path


def header(category: ApiCategory) -> dict[str, str]:
    key, value = KEYS[category]
    return {key: value}


def refused(response: object, category: ApiCategory, method: str = "GET") -> bool:
    status = getattr(response, "status_code")  # noqa: B009
    if status != 403:
        return False
    if method == "HEAD":
        return True
    expected = {"error": f"This API is restricted, expecting header '{KEYS[category][0]}'"}
    return bool(getattr(response, "json")() == expected)  # noqa: B009


# ---------------------------------------------------------------- the table


def test_every_route_of_the_app_has_a_category() -> None:
    routes = create_app(make_dataplane(), OPEN).routes
    assert routes
    for route in routes:
        assert isinstance(route, ApiRoute), f"{route!r} has no API category"
        assert route.category in HTTP_CATEGORIES


def test_routes_have_tritons_categories() -> None:
    table = {route.path: route.category for route in api_routes(OPEN)}
    for path, category in TRITON_CATEGORIES.items():
        assert table.get(path) is category, path


# the OpenAI-compatible routes (not Triton's): listing is metadata, completions are inference
OPENAI_CATEGORIES = {
    "/v1/models": ApiCategory.METADATA,
    "/v1/models/{model}": ApiCategory.METADATA,
    "/v1/completions": ApiCategory.INFERENCE,
    "/v1/chat/completions": ApiCategory.INFERENCE,
}


def test_openai_routes_have_their_categories() -> None:
    table = {route.path: route.category for route in api_routes(OPEN)}
    for path, category in OPENAI_CATEGORIES.items():
        assert table.get(path) is category, path


def test_a_route_without_a_category_is_refused_at_construction() -> None:
    async def endpoint(request: Request) -> Response:
        return Response()

    with pytest.raises(TypeError, match="HTTP route /v2/trace/setting has no API category"):
        create_app(make_dataplane(), OPEN,
                   extra_routes=[Route("/v2/trace/setting", endpoint, methods=["GET"])])


# ---------------------------------------------------------------- every route, every method


@pytest.mark.parametrize("method,path,category", every_request())
def test_restricted_route_without_its_header_is_403(
        restricted: TestClient, method: str, path: str, category: ApiCategory) -> None:
    assert refused(restricted.request(method, path), category, method)
    other = next(c for c in ApiCategory if c is not category)
    assert refused(restricted.request(method, path, headers=header(other)), category, method)
    key, value = KEYS[category]
    assert refused(restricted.request(method, path, headers={key: value + "x"}), category,
                   method)


@pytest.mark.parametrize("method,path,category", every_request())
def test_restricted_route_with_its_header_is_served(
        restricted: TestClient, open_client: TestClient, method: str, path: str,
        category: ApiCategory) -> None:
    with_header = restricted.request(method, path, headers=header(category))
    without_restrictions = open_client.request(method, path)
    assert with_header.status_code != 403
    assert (with_header.status_code, with_header.content) == (
        without_restrictions.status_code, without_restrictions.content)


def test_unrestricted_server_answers_every_route_without_headers(open_client: TestClient) -> None:
    for method, path, _ in every_request():
        assert open_client.request(method, path).status_code != 403, (method, path)


def test_only_the_restricted_categories_are_gated() -> None:
    settings = settings_from_flags(
        model_repositories=["/models"],
        http_restricted_apis=[("model-repository", "admin", "x")]).for_frontends()
    with TestClient(create_asgi_app(make_dataplane(), settings),
                    raise_server_exceptions=False) as client:
        assert client.get("/v2/health/ready").status_code == 200
        assert client.get("/v2/models/simple/config").status_code == 200
        assert client.post("/v2/repository/index").status_code == 403
        assert client.post("/v2/repository/index", headers={"admin": "x"}).status_code == 200


# ---------------------------------------------------------------- aliases and spellings


@pytest.mark.parametrize("method,path,category", [
    ("GET", "/v2/models/%73imple", ApiCategory.METADATA),
    ("GET", "/v2/models/%73imple/versions/1/ready", ApiCategory.HEALTH),
    ("GET", "/v2/health/%6Cive", ApiCategory.HEALTH),
    ("POST", "/v2/models/%73imple/infer", ApiCategory.INFERENCE),
    ("POST", "/v2/models/simple/versions/01/infer", ApiCategory.INFERENCE),
    ("POST", "/v2/repository/models/%73imple/load", ApiCategory.MODEL_REPOSITORY),
    ("HEAD", "/v2/health/ready", ApiCategory.HEALTH),
    ("HEAD", "/v2", ApiCategory.METADATA),
    ("HEAD", "/v2/models/simple/config", ApiCategory.MODEL_CONFIG),
    # a wrong method on a restricted route: Triton checks the restriction first
    ("GET", "/v2/models/simple/infer", ApiCategory.INFERENCE),
    ("DELETE", "/v2/logging", ApiCategory.LOGGING),
    ("PUT", "/v2/cudasharedmemory/region/r0/register", ApiCategory.SHARED_MEMORY),
])
def test_every_spelling_that_routes_is_gated(
        restricted: TestClient, method: str, path: str, category: ApiCategory) -> None:
    assert refused(restricted.request(method, path), category, method)
    assert restricted.request(method, path, headers=header(category)).status_code != 403


def test_wrong_method_with_the_header_is_405(restricted: TestClient) -> None:
    response = restricted.get("/v2/models/simple/infer", headers=header(ApiCategory.INFERENCE))
    assert (response.status_code, response.json()) == (405, {"error": "Method Not Allowed"})


@pytest.mark.parametrize("method,path", [
    ("GET", "/v2/"), ("GET", "/v2/health/live/"), ("GET", "//v2/health/live"),
    ("GET", "/v2//health/live"), ("POST", "/v2/models/simple/infer/"),
    ("POST", "/v2//models/simple/infer"), ("GET", "/v2/models/simple/versions/x/ready"),
    ("POST", "/v2/models/simple/versions/1/trace/setting"), ("GET", "/v2/nothing"),
    ("POST", "/v2/systemsharedmemory/region/a/b/register"), ("GET", "/metrics"),
])
def test_a_path_that_routes_nowhere_answers_as_without_restrictions(
        restricted: TestClient, open_client: TestClient, method: str, path: str) -> None:
    gated, plain = restricted.request(method, at(path)), open_client.request(method, at(path))
    assert gated.status_code == 404
    assert (gated.status_code, gated.content, gated.headers.get("content-type")) == (
        plain.status_code, plain.content, plain.headers.get("content-type"))


def test_header_name_is_case_insensitive_and_the_first_one_counts(
        restricted: TestClient) -> None:
    key, value = KEYS[ApiCategory.HEALTH]
    assert restricted.get("/v2/health/live", headers={key.upper(): value}).status_code == 200
    two_wrong_first = [(key, "nope"), (key, value)]
    assert restricted.get("/v2/health/live", headers=two_wrong_first).status_code == 403
    two_right_first = [(key, value), (key, "nope")]
    assert restricted.get("/v2/health/live", headers=two_right_first).status_code == 200


def test_header_value_is_case_sensitive(restricted: TestClient) -> None:
    key, value = KEYS[ApiCategory.HEALTH]
    assert restricted.get("/v2/health/live", headers={key: value.upper()}).status_code == 403


def test_fast_path_refuses_before_reading_the_body() -> None:
    dataplane = make_dataplane()
    with TestClient(create_asgi_app(dataplane, RESTRICTED),
                    raise_server_exceptions=False) as client:
        response = client.post("/v2/models/simple/infer", content=b"x" * (1 << 20))
        assert refused(response, ApiCategory.INFERENCE, "POST")
        assert dataplane.requests == [] and dataplane.allocations == 0
        body = (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],'
                b'"data":[1.5]}]}')
        served = client.post("/v2/models/simple/infer", content=body,
                             headers=header(ApiCategory.INFERENCE))
        assert served.status_code == 200
        assert served.json()["outputs"][0]["data"] == [1.5]


# ---------------------------------------------------------------- the metrics port


def metrics_like_app() -> Starlette:
    async def text(request: Request) -> Response:
        return PlainTextResponse(request.url.path)

    return Starlette(routes=[Route("/metrics", text), Route("/dashboard", text),
                             Route("/dashboard/{rest:path}", text)])


def test_dashboard_gate_covers_every_path_under_dashboard_and_only_those() -> None:
    apis = RestrictedApis([("dashboard", "ops-key", "ops")])
    with TestClient(restrict_metrics_app(metrics_like_app(), apis)) as client:
        for path in ("/dashboard", "/dashboard/", "/dashboard/api/models", "//dashboard",
                     "/%64ashboard/x"):
            response = client.get(at(path))
            assert response.status_code == 403, path
            assert response.json() == {
                "error": "This API is restricted, expecting header 'ops-key'"}
            assert client.get(at(path), headers={"Ops-Key": "ops"}).status_code != 403, path
        assert client.get("/metrics").status_code == 200
        assert client.get("/dashboards").status_code != 403


def test_open_dashboard_leaves_the_metrics_app_untouched() -> None:
    app = metrics_like_app()
    assert restrict_metrics_app(app, RestrictedApis([])) is app
    assert restrict_metrics_app(app, RestrictedApis([("health", "k", "v")])) is app
