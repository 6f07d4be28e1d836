"""``GET /v2/openapi.json`` (``shoal/frontend/http/openapi.py``): the document lists exactly the
operations the HTTP app's route table serves (the lean infer path and the fast path serve the
table's infer route, the guard's over-cap health answers the table's health routes), each with
its own entry, is an OpenAPI document schemathesis loads, documents no 500, and is gated as
``metadata``."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from starlette.routing import Route
from starlette.testclient import TestClient

from shoal.frontend.http.app import create_app
from shoal.frontend.http.openapi import (
    ERROR,
    OPENAI_ERROR,
    OPENAPI_PATH,
    OPERATIONS,
    build_document,
    route_operations,
)
from shoal.settings import FrontendSettings, settings_from_flags
from tests.frontend.http.fakes import FakeDataPlane, make_model

SETTINGS = settings_from_flags(model_repositories=["/models"]).for_frontends()
METHODS = ("get", "post", "put", "delete", "patch")


def _app(settings: FrontendSettings = SETTINGS) -> Any:
    return create_app(FakeDataPlane(models=[make_model("simple")]), settings)


def _document(settings: FrontendSettings = SETTINGS) -> dict[str, Any]:
    with TestClient(_app(settings)) as client:
        response = client.get(OPENAPI_PATH)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document: dict[str, Any] = response.json()
    return document


def _served() -> set[tuple[str, str]]:
    """(METHOD, OpenAPI path) of every route the app serves."""
    routes = _app().router.routes
    assert all(isinstance(r, Route) for r in routes)
    return {(m, p.replace("{version:int}", "{version}")) for m, p in route_operations(routes)}


def _documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items()
            for method in item if method in METHODS}


def test_the_document_lists_every_served_operation_and_nothing_else() -> None:
    document = _document()
    assert document["openapi"] == "3.1.0"
    served = _served()
    assert ("POST", "/v2/models/{model}/versions/{version}/infer") in served
    assert ("GET", OPENAPI_PATH) in served
    assert _documented(document) == served


def test_every_route_has_its_own_entry_and_every_entry_a_route() -> None:
    served = set(route_operations(_app().router.routes))
    assert served - set(OPERATIONS) == set(), "routes without an OPERATIONS entry"
    assert set(OPERATIONS) - served == set(), "OPERATIONS entries that no route serves"


def test_a_route_added_later_appears_undocumented_not_missing() -> None:
    routes = [*_app().router.routes, Route("/v2/extra", lambda r: None, methods=["GET"])]
    document = build_document(routes)
    assert document["paths"]["/v2/extra"]["get"]["summary"] == "undocumented route"


def test_schemathesis_loads_every_operation() -> None:
    schema = schemathesis.openapi.from_dict(_document())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(_served())


def test_errors_have_the_error_shape_and_no_operation_documents_500() -> None:
    for path, item in _document()["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "500" not in responses, (method, path)
            assert "403" in responses, (method, path)  # any route can be restricted
            shape = OPENAI_ERROR if path.startswith("/v1/") else ERROR
            for status, response in responses.items():
                content = response.get("content", {})
                if int(status) >= 400 and "application/json" in content:
                    assert content["application/json"]["schema"] == shape, (method, path)


def test_path_parameters_follow_the_route_regexes() -> None:
    item = _document()["paths"]["/v2/models/{model}/versions/{version}/ready"]["get"]
    by_name = {p["name"]: p["schema"] for p in item["parameters"]}
    assert by_name["version"]["pattern"] == "^[0-9]+$"
    assert by_name["model"]["pattern"] == "^[^/]+$"


@pytest.mark.parametrize("header,status", [(None, 403), ("wrong", 403), ("s3cret", 200)])
def test_the_document_is_gated_as_metadata(header: str | None, status: int) -> None:
    settings = settings_from_flags(
        model_repositories=["/models"],
        http_restricted_apis=[("metadata", "api-key", "s3cret")]).for_frontends()
    with TestClient(_app(settings)) as client:
        headers = {} if header is None else {"api-key": header}
        response = client.get(OPENAPI_PATH, headers=headers)
        assert response.status_code == status
        assert client.get("/v2/health/live").status_code == 200  # health stays open


def test_findings_of_the_fuzzer_are_documented() -> None:
    """What the first fuzz runs found undocumented: infer of a decoupled model answers 501
    (Triton's UNSUPPORTED), and an event stream's events are objects with a ``data`` string."""
    paths = _document()["paths"]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        assert "501" in paths[prefix + "/infer"]["post"]["responses"]
        stream = paths[prefix + "/generate_stream"]["post"]["responses"]
        for status in ("200", "400"):
            event = stream[status]["content"]["text/event-stream"]["schema"]
            assert event["type"] == "object" and "data" in event["required"]
