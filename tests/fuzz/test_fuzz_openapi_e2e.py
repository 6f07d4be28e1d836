"""Fuzzing a real server against its own OpenAPI document (``GET /v2/openapi.json``) with
schemathesis: every operation of the document gets schema-valid (positive) and schema-breaking
(negative) requests, with random model names and with the repository's real models. Every
answer must be documented (its status among the operation's responses, its content type and
body matching them; no 5xx but the 501 / 503 an operation documents), and at the end the server
is live and ready, its frontends and workers are the processes it started with, and it stops
cleanly leaving no segment behind (``serving``).

Bounded: a fixed number of examples per operation and mode (``EXAMPLES``, derandomized, ``long``
profile: ``LONG_FACTOR`` times as many), so the whole test takes well under a minute on two
cores. The server runs with client shared memory allowed, so register requests reach the
registry instead of stopping at 501."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, CheckContext, GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from shoal.frontend.http.openapi import OPENAPI_PATH, OPERATIONS
from tests.e2e.conftest import serving
from tests.e2e.models import build_standard_repository
from tests.e2e.server import ShoalServer
from tests.fuzz.support import LONG_FACTOR, PROFILE

pytestmark = pytest.mark.e2e

EXAMPLES: Final = 5 * (LONG_FACTOR if PROFILE == "long" else 1)
# real models for the model routes: a plain one, one of every datatype, a decoupled one (the
# generate_stream route), each at version 1
REAL_MODELS: Final = ("identity_fp32", "identity_all", "repeat_decoupled")
REQUEST_SECONDS: Final = 30.0  # a request that takes longer is a hang, and fails the test


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = build_standard_repository(tmp_path_factory.mktemp("repo"))
    with serving(ShoalServer([str(repo)], ["--allow-client-shm=true"])) as srv:
        yield srv


def no_undocumented_server_error(ctx: CheckContext, response: Any, case: Case) -> None:
    """No 5xx unless the operation documents that status (501 / 503 only: none documents
    500)."""
    status = response.status_code
    documented = case.operation.definition.raw.get("responses", {})
    assert status < 500 or str(status) in documented, (
        f"{case.operation.label}: {status} {response.content[:300]!r}")


CHECKS: Final = [no_undocumented_server_error, status_code_conformance,
                 content_type_conformance, response_schema_conformance]


def _fixed_parameters(operation: schemathesis.APIOperation) -> list[dict[str, Any] | None]:
    """The path parameters each run of ``operation`` uses: all generated, then (for the model
    routes) each real model, at version 1 where the route has a version."""
    names = {p.name for p in operation.path_parameters}
    runs: list[dict[str, Any] | None] = [None]
    if "model" in names and not operation.path.startswith("/v1/"):
        for model in REAL_MODELS:
            runs.append({"model": model, **({"version": "1"} if "version" in names else {})})
    return runs


def _fuzz(operation: schemathesis.APIOperation, mode: GenerationMode,
          path_parameters: dict[str, Any] | None, base: str, session: requests.Session,
          failures: list[str]) -> None:
    try:
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)
    except schemathesis.errors.SchemathesisError:  # nothing to negate in this operation
        return

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(strategy)
        try:
            response = case.call(base_url=base, session=session, timeout=REQUEST_SECONDS)
            case.validate_response(response, checks=CHECKS)
        except (AssertionError, BaseExceptionGroup, requests.RequestException) as failure:
            failures.append(f"{operation.label} [{mode.value}] {case.path_parameters} "
                            f"{case.body!r:.200}: {failure}")

    try:
        run()
    except Unsatisfiable:  # negative mode, and nothing of the operation can be made invalid
        if mode is GenerationMode.POSITIVE:
            raise


def test_every_operation_answers_as_documented(fuzz_server: ShoalServer) -> None:
    base = fuzz_server.base
    workers, frontends = set(fuzz_server.worker_pids()), set(fuzz_server.frontend_pids())
    assert workers and frontends
    schema = schemathesis.openapi.from_url(base + OPENAPI_PATH)
    operations = [result.ok() for result in schema.get_all_operations()]
    # the whole table, not a partial document (schemathesis leaves out the document's own URL)
    served = {f"{m} {p.replace('{version:int}', '{version}')}" for m, p in OPERATIONS}
    assert {o.label for o in operations} == served - {f"GET {OPENAPI_PATH}"}
    failures: list[str] = []
    with requests.Session() as session:
        for operation in operations:
            for path_parameters in _fixed_parameters(operation):
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    _fuzz(operation, mode, path_parameters, base, session, failures)
    assert not failures, f"{len(failures)} undocumented answers:\n" + "\n".join(failures[:20])
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert httpx.get(base + path, timeout=10).status_code == 200
    assert set(fuzz_server.worker_pids()) == workers, "a worker died or was replaced"
    assert set(fuzz_server.frontend_pids()) == frontends, "a frontend died or was replaced"
