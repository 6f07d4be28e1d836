"""Client mistakes: each is a 4xx whose error names the field, and the server stays live with no
worker restarted."""

from __future__ import annotations

import json
import struct

import httpx
import pytest

from tests.e2e.server import ShoalServer

ADD_SUB = "/v2/models/add_sub/infer"


def _inputs(shape0: list[int] | None = None, data0: object = None, dtype0: str = "FP32") -> dict:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": shape0 if shape0 is not None else [4],
                "datatype": dtype0,
                "data": data0 if data0 is not None else [1, 2, 3, 4],
            },
            {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        ]
    }


def _binary_body(header: dict, payload: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + payload, {"Inference-Header-Content-Length": str(len(head))}


CASES: list[tuple[str, str, object, dict[str, str] | None, int, str]] = [
    ("malformed json", ADD_SUB, b'{"inputs": [', None, 400, ""),
    ("unknown model", "/v2/models/no_such_model/infer", _inputs(), None, 404, "no_such_model"),
    ("unknown version", "/v2/models/add_sub/versions/9/infer", _inputs(), None, 404, "add_sub"),
    ("wrong dtype", ADD_SUB, _inputs(dtype0="INT32"), None, 400, "INPUT0"),
    ("shape/data mismatch", ADD_SUB, _inputs(data0=[1, 2, 3]), None, 400, "INPUT0"),
    ("wrong shape", ADD_SUB, _inputs(shape0=[5], data0=[1, 2, 3, 4, 5]), None, 400, "INPUT0"),
    ("negative dim", ADD_SUB, _inputs(shape0=[-4]), None, 400, "INPUT0"),
    (
        "overflowing dims",
        "/v2/models/identity_batched/infer",
        {"inputs": [{"name": "INPUT0", "shape": [16, 2**60 + 2], "datatype": "FP32", "data": [1]}]},
        None,
        400,
        "INPUT0",
    ),
    (
        "batch over max_batch_size",
        "/v2/models/identity_batched/infer",
        {"inputs": [{"name": "INPUT0", "shape": [9, 4], "datatype": "FP32", "data": [0] * 36}]},
        None,
        400,
        "batch",
    ),
    ("missing input", ADD_SUB, {"inputs": _inputs()["inputs"][:1]}, None, 400, "INPUT1"),
    (
        "extra input",
        ADD_SUB,
        {
            "inputs": [
                *_inputs()["inputs"],
                {"name": "BOGUS", "shape": [1], "datatype": "FP32", "data": [1]},
            ]
        },
        None,
        400,
        "BOGUS",
    ),
    (
        "unknown requested output",
        ADD_SUB,
        {**_inputs(), "outputs": [{"name": "NOPE"}]},
        None,
        400,
        "NOPE",
    ),
    (
        "triton_ parameter",
        ADD_SUB,
        {**_inputs(), "parameters": {"triton_x": 1}},
        None,
        400,
        "triton_",
    ),
    ("bytes data for numeric", ADD_SUB, _inputs(data0=["a", "b", "c", "d"]), None, 400,
     "attempt to access JSON non-number as double"),  # Triton's text, which names no input
]


@pytest.mark.parametrize("name,path,body,headers,status,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_4xx_naming_the_field(
    server: ShoalServer,
    name: str,
    path: str,
    body: object,
    headers: dict[str, str] | None,
    status: int,
    needle: str,
) -> None:
    workers_before = sorted(server.worker_pids())
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.base + path, content=content, headers=headers or {})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and error
    assert needle in error, error
    assert "/dev/shm" not in error and "shoal-" not in error
    assert httpx.get(server.base + "/v2/health/live").status_code == 200
    assert sorted(server.worker_pids()) == workers_before


def test_binary_header_longer_than_body(server: ShoalServer) -> None:
    body, headers = _binary_body(_inputs(), b"")
    headers["Inference-Header-Content-Length"] = str(len(body) + 10)
    r = httpx.post(server.base + ADD_SUB, content=body, headers=headers)
    assert r.status_code == 400
    assert "header" in r.json()["error"].lower()
    assert httpx.get(server.base + "/v2/health/live").status_code == 200


def test_binary_data_shorter_than_declared(server: ShoalServer) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 16},
            },
            {
                "name": "INPUT1",
                "shape": [4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 16},
            },
        ]
    }
    body, headers = _binary_body(header, struct.pack("<4f", 1, 2, 3, 4) + b"\x00" * 8)
    r = httpx.post(server.base + ADD_SUB, content=body, headers=headers)
    assert r.status_code == 400
    assert "INPUT1" in r.json()["error"]


def test_binary_size_mismatch_with_shape(server: ShoalServer) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 12},
            },
            {
                "name": "INPUT1",
                "shape": [4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 16},
            },
        ]
    }
    body, headers = _binary_body(header, b"\x00" * 28)
    r = httpx.post(server.base + ADD_SUB, content=body, headers=headers)
    assert r.status_code == 400
    assert "INPUT0" in r.json()["error"]


def test_many_bad_requests_leave_server_healthy(server: ShoalServer) -> None:
    for _ in range(50):
        r = httpx.post(server.base + ADD_SUB, content=b"\xff\x00garbage")
        assert r.status_code == 400
    r = httpx.post(server.base + ADD_SUB, json=_inputs())
    assert r.status_code == 200
