"""Fuzzing the whole HTTP path in-process (the ASGI app the frontend serves, fast path included,
through httpx's ASGITransport): any infer body, shared-memory register body or model load body
is answered below 500, and every error body is ``{"error": "..."}``. The DataPlane is the echo
fake with a real client shm registry; its load_model does what the real one does before the
broker (check the overrides, build the message) plus the broker's reading of the config."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.config.load_overrides import check_model_name
from shoal.frontend.http.app import create_asgi_app
from shoal.settings import ModelControlMode, settings_from_flags
from tests.fuzz.strategies import (
    any_text,
    infer_bodies,
    json_values,
    mutated_json,
    near_valid_bodies,
    to_json,
)
from tests.fuzz.support import (
    EXAMPLE_SECONDS,
    MODEL_BY_NAME,
    MODELS,
    FuzzDataPlane,
    examples,
    open_registry,
    time_bound,
)
from tests.fuzz.test_fuzz_load_overrides import config_texts, load, paths

LIMIT: Final = 1 << 16
SETTINGS: Final = settings_from_flags(model_repositories=["/m"], http_max_input_size=LIMIT,
                                      allow_client_shm=True,
                                      model_control_mode=ModelControlMode.EXPLICIT).for_frontends()
model_names = st.sampled_from(sorted(MODEL_BY_NAME))


@dataclass
class ControlledDataPlane(FuzzDataPlane):
    """FuzzDataPlane with model control: a load runs ``test_fuzz_load_overrides.load`` (the
    frontend's checks, the wire message, the broker's reading of the config)."""

    def __repr__(self) -> str:
        return "ControlledDataPlane()"

    async def load_model(self, name: str, parameters: Mapping[str, str | bytes]) -> None:
        load(name, dict(parameters))

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        check_model_name(name)


class AppClient:
    """One event loop and one httpx client over the app for the module's examples."""

    def __init__(self, directory: str) -> None:
        self.registry = open_registry(directory)
        dataplane = ControlledDataPlane(models=list(MODELS), shared_memory=self.registry,
                                        shm_directory=directory)
        transport = httpx.ASGITransport(app=create_asgi_app(dataplane, SETTINGS))
        self.client = httpx.AsyncClient(transport=transport, base_url="http://fuzz")
        self.loop = asyncio.new_event_loop()

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None
             ) -> httpx.Response:
        call = asyncio.wait_for(self.client.post(path, content=body, headers=headers),
                                EXAMPLE_SECONDS)
        with time_bound():
            return self.loop.run_until_complete(call)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()
        self.registry.close()


@pytest.fixture(scope="module")
def app() -> Iterator[AppClient]:
    with tempfile.TemporaryDirectory() as directory:
        client = AppClient(directory)
        yield client
        client.close()


# the one 5xx Triton 2.51 gives a client's request: a string sequence_id over 128 bytes
_TRITON_UNSUPPORTED = "string correlation ID cannot be longer than"


def check_answer(response: httpx.Response) -> None:
    if response.status_code == 501 and _TRITON_UNSUPPORTED in response.text:
        return
    assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error, str) and error


def encoded(body: bytes, encoding: str) -> tuple[bytes, dict[str, str]]:
    if encoding == "gzip":
        return gzip.compress(body), {"Content-Encoding": "gzip"}
    if encoding == "deflate":
        return zlib.compress(body), {"Content-Encoding": "deflate"}
    return body, {}


ENCODINGS: Final = st.sampled_from(("identity", "identity", "gzip", "deflate"))


def post_infer(app: AppClient, model: str, body: bytes, length: str | None,
               encoding: str) -> None:
    content, headers = encoded(body, encoding)
    if length is not None:
        try:  # header values travel as latin-1 bytes
            headers["Inference-Header-Content-Length"] = length.encode("latin-1")  # type: ignore[assignment]
        except UnicodeEncodeError:
            return
    headers["Accept-Encoding"] = "identity"
    check_answer(app.post(f"/v2/models/{model}/infer", content, headers))


@examples(100)
@given(body=infer_bodies(), model=model_names, encoding=ENCODINGS)
def test_any_infer_body(app: AppClient, body: tuple[bytes, str | None], model: str,
                        encoding: str) -> None:
    if any(ch in body[1] for ch in "\x00\r\n") if body[1] else False:
        return  # not a header value HTTP can carry
    post_infer(app, model, body[0], body[1], encoding)


@examples(150)
@given(data=st.data(), model=model_names, encoding=ENCODINGS)
def test_near_valid_infer_requests(app: AppClient, data: st.DataObject, model: str,
                                   encoding: str) -> None:
    body, length = data.draw(near_valid_bodies(MODEL_BY_NAME[model]))
    post_infer(app, model, body, length, encoding)


@examples(80)
@given(document=json_values, mutate=st.booleans(), data=st.data())
def test_any_shm_register_body(app: AppClient, document: Any, mutate: bool,
                               data: st.DataObject) -> None:
    fields = data.draw(st.fixed_dictionaries({}, optional={
        "key": st.one_of(st.sampled_from(("/region", "/shoal-x", "/", "/missing")), any_text),
        "offset": st.one_of(st.integers(-2, 300), json_values),
        "byte_size": st.one_of(st.integers(-2, 300), json_values)}))
    body = to_json(fields if isinstance(document, dict) or not document else document)
    if mutate:
        body = data.draw(mutated_json(body))
    region = data.draw(st.sampled_from(("new", "r", "%2F", "x" * 300)))
    check_answer(app.post(f"/v2/systemsharedmemory/region/{region}/register", body))
    app.post(f"/v2/systemsharedmemory/region/{region}/unregister", b"")


@examples(80)
@given(data=st.data(), model=st.sampled_from(("m", "a%20b", "..", "%2E", "x" * 300)))
def test_any_model_load_body(app: AppClient, data: st.DataObject, model: str) -> None:
    parameters: dict[str, Any] = {}
    if data.draw(st.booleans()):
        parameters["config"] = data.draw(config_texts())
    for path in data.draw(st.lists(paths, max_size=2)):
        raw = data.draw(st.binary(max_size=6))
        parameters["file:" + path] = data.draw(st.sampled_from(
            (base64.b64encode(raw).decode(), "not base64!", "")))
    document: Any = {"parameters": parameters}
    if data.draw(st.integers(0, 4)) == 0:
        document = data.draw(json_values)
    body = json.dumps(document).encode()
    if data.draw(st.integers(0, 3)) == 0:
        body = data.draw(mutated_json(body))
    response = app.post(f"/v2/repository/models/{model}/load", body)
    check_answer(response)

