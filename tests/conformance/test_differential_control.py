"""Differential tests of what has state: model control in explicit mode (loads, unloads, a load
that fails, names that do not exist, a config copied from another model) and client system
shared memory (register, infer through regions, unregister, a region name used again over new
bytes, an output region too small), HTTP and gRPC, then the statistics and metrics they left.

Each step runs against the real tritonserver first and then against shoal, and its two answers
are compared as in test_differential.py (listed differences aside). A step that reads an output
region reads it right after its own server answered, so both servers can share the regions."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from tests.conformance import grpc_cases
from tests.conformance.answers import http_answer
from tests.conformance.conftest import Pair, serving_pair
from tests.conformance.repository import ADD_SUB, FAILS_TO_LOAD, build_repository
from tests.conformance.test_differential import assert_same, metric_samples

_ADD_SUB_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ name: "add_sub_0" kind: KIND_CPU count: 1 }} ]
"""


def _control_repository(root: pathlib.Path) -> pathlib.Path:
    repo = build_repository(root)
    for name in ("add_sub_copy",):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_ADD_SUB_CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(ADD_SUB.lstrip())
    broken = repo / "fails_to_load"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text(
        'name: "fails_to_load"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    (broken / "1" / "model.py").write_text(FAILS_TO_LOAD.lstrip())
    return repo


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    repo = _control_repository(tmp_path_factory.mktemp("control") / "repo")
    with serving_pair(repo, ["--model-control-mode=explicit"],
                      ["--model-control-mode=explicit"]) as both:
        yield both


@dataclasses.dataclass(frozen=True)
class Target:
    base: str
    channel: grpc.Channel
    client: httpx.Client


Step = Callable[[Target], dict[str, Any]]


def http(method: str, path: str, body: Any = None) -> Step:
    def run(t: Target) -> dict[str, Any]:
        content = None if body is None else json.dumps(body).encode()
        return http_answer(t.client.request(method, t.base + path, content=content))
    return run


def rpc(name: str, request: dict[str, Any]) -> Step:
    case = grpc_cases.GrpcCase("step", name, request)
    return lambda t: grpc_cases.grpc_answer(t.channel, case)


_ADD_SUB_INPUTS = [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]


def infer(model: str) -> Step:
    return http("POST", f"/v2/models/{model}/infer", {"inputs": _ADD_SUB_INPUTS})


_INDEX = http("POST", "/v2/repository/index", {})


def _model_steps() -> Iterator[tuple[str, Step]]:
    yield "index/at-start", _INDEX
    yield "grpc/index/at-start", rpc("RepositoryIndex", {})
    for what, step in (("infer", infer("add_sub")),
                       ("metadata", http("GET", "/v2/models/add_sub")),
                       ("ready", http("GET", "/v2/models/add_sub/ready")),
                       ("grpc-metadata", rpc("ModelMetadata", {"name": "add_sub"}))):
        yield f"not-loaded/{what}", step
    yield "load/add_sub", http("POST", "/v2/repository/models/add_sub/load", {})
    yield "loaded/infer", infer("add_sub")
    yield "index/after-load", _INDEX
    yield "unload/add_sub", http("POST", "/v2/repository/models/add_sub/unload", {})
    for what, step in (("infer", infer("add_sub")),
                       ("metadata", http("GET", "/v2/models/add_sub")),
                       ("config", http("GET", "/v2/models/add_sub/config")),
                       ("ready", http("GET", "/v2/models/add_sub/ready")),
                       ("generate", http("POST", "/v2/models/add_sub/generate",
                                         {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})),
                       ("grpc-metadata", rpc("ModelMetadata", {"name": "add_sub"})),
                       ("grpc-ready", rpc("ModelReady", {"name": "add_sub"}))):
        yield f"unloaded/{what}", step
    yield "index/after-unload", _INDEX
    yield "load/fails_to_load", http("POST", "/v2/repository/models/fails_to_load/load", {})
    yield "failed/infer", infer("fails_to_load")
    yield "failed/metadata", http("GET", "/v2/models/fails_to_load")
    yield "failed/ready", http("GET", "/v2/models/fails_to_load/ready")
    yield "grpc/load/fails_to_load", rpc("RepositoryModelLoad", {"model_name": "fails_to_load"})
    yield "load/no_such_model", http("POST", "/v2/repository/models/no_such_model/load", {})
    yield "unload/no_such_model", http("POST", "/v2/repository/models/no_such_model/unload", {})
    yield "grpc/load/no_such_model", rpc("RepositoryModelLoad", {"model_name": "no_such_model"})
    yield "grpc/unload/no_such_model", rpc("RepositoryModelUnload",
                                           {"model_name": "no_such_model"})
    yield "index/after-failures", _INDEX
    yield "grpc/index/after-failures", rpc("RepositoryIndex", {})
    yield "load/add_sub-again", http("POST", "/v2/repository/models/add_sub/load", {})
    yield "load/add_sub_copy", http("POST", "/v2/repository/models/add_sub_copy/load", {})
    yield "copy/infer", infer("add_sub_copy")
    yield "copy/config", http("GET", "/v2/models/add_sub_copy/config")
    yield "load/identity_fp32", http("POST", "/v2/repository/models/identity_fp32/load", {})
    yield "index/at-end", _INDEX


@pytest.fixture(scope="module")
def targets(pair: Pair) -> Iterator[tuple[Target, Target]]:
    with httpx.Client(timeout=60) as client:
        triton_channel = grpc.insecure_channel(pair.triton.grpc_url)
        shoal_channel = grpc.insecure_channel(pair.shoal.grpc_url)
        yield (Target(pair.triton.base, triton_channel, client),
               Target(pair.shoal.base, shoal_channel, client))
        triton_channel.close()
        shoal_channel.close()


@pytest.mark.parametrize("step", list(_model_steps()), ids=lambda s: s[0])
def test_model_control(step: tuple[str, Step], targets: tuple[Target, Target]) -> None:
    case_id, run = step
    assert_same(f"control:{case_id}", run(targets[0]), run(targets[1]))


# --- client system shared memory -------------------------------------------------------------

_IN_KEY, _OUT_KEY, _SMALL_KEY = "/shoal_cmp_in", "/shoal_cmp_out", "/shoal_cmp_small"


@pytest.fixture(scope="module")
def regions(targets: tuple[Target, Target]) -> Iterator[dict[str, Any]]:
    handles = {
        "in": shm.create_shared_memory_region("cmp_in", _IN_KEY, 24),
        "out": shm.create_shared_memory_region("cmp_out", _OUT_KEY, 24),
        "small": shm.create_shared_memory_region("cmp_small", _SMALL_KEY, 8),
    }
    shm.set_shared_memory_region(handles["in"], [np.arange(6, dtype=np.float32).reshape(1, 6)])
    _REGIONS.update({"out": handles["out"], "small": handles["small"], "in-handle": handles["in"]})
    yield handles
    for target in targets:  # whatever a failed step left registered
        target.client.post(f"{target.base}/v2/systemsharedmemory/unregister")
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def _shm_infer(output_region: str, output_size: int) -> Step:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 6], "parameters": {
        "shared_memory_region": "in", "shared_memory_byte_size": 24}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": output_region, "shared_memory_byte_size": output_size}}]}
    step = http("POST", "/v2/models/identity_fp32/infer", body)

    def run(t: Target) -> dict[str, Any]:
        answer = step(t)
        handle = _REGIONS.get(output_region)
        if handle is not None and answer["status"] == 200:
            answer["region"] = shm.get_contents_as_numpy(handle, np.float32, [1, 6]).tolist()
        return answer
    return run


# the regions' client handles by region name (and the input's as "in-handle"), set by the
# ``regions`` fixture
_REGIONS: dict[str, Any] = {}


def _register(name: str, key: str, size: int) -> Step:
    return http("POST", f"/v2/systemsharedmemory/region/{name}/register",
                {"key": key, "offset": 0, "byte_size": size})


def _refill(value: float) -> Step:
    """Not a request: new bytes in the input region (the same for both servers)."""
    def run(t: Target) -> dict[str, Any]:
        handle = _REGIONS["in-handle"]
        shm.set_shared_memory_region(handle, [np.full((1, 6), value, dtype=np.float32)])
        return {"refilled": value}
    return run


def _shm_steps() -> Iterator[tuple[str, Step]]:
    yield "register/in", _register("in", _IN_KEY, 24)
    yield "register/out", _register("out", _OUT_KEY, 24)
    yield "register/small", _register("small", _SMALL_KEY, 8)
    yield "register/in-again", _register("in", _IN_KEY, 24)
    yield "register/missing-key", _register("ghost", "/shoal_cmp_no_such_key", 24)
    yield "register/too-big", _register("huge", _IN_KEY, 1 << 20)
    yield "status", http("GET", "/v2/systemsharedmemory/status")
    yield "status/in", http("GET", "/v2/systemsharedmemory/region/in/status")
    yield "infer/in-out", _shm_infer("out", 24)
    yield "infer/output-region-too-small", _shm_infer("small", 8)
    yield "infer/unregistered-region", _shm_infer("nope", 24)
    yield "unregister/in", http("POST", "/v2/systemsharedmemory/region/in/unregister")
    yield "infer/after-unregister", _shm_infer("out", 24)
    yield "refill/in", _refill(7.0)
    yield "register/in-reused-name", _register("in", _IN_KEY, 24)
    yield "infer/reused-name-sees-new-bytes", _shm_infer("out", 24)
    yield "unregister/all", http("POST", "/v2/systemsharedmemory/unregister")
    yield "status/after-unregister-all", http("GET", "/v2/systemsharedmemory/status")
    yield "stats/identity_fp32", http("GET", "/v2/models/identity_fp32/stats")


@pytest.mark.parametrize("step", list(_shm_steps()), ids=lambda s: s[0])
def test_system_shared_memory(step: tuple[str, Step], targets: tuple[Target, Target],
                              regions: dict[str, Any]) -> None:
    case_id, run = step
    assert_same(f"shm:{case_id}", run(targets[0]), run(targets[1]))


def test_metric_counts_after_control_and_shm(pair: Pair) -> None:
    triton = metric_samples(httpx.get(pair.triton.metrics_url, timeout=10).text)
    shoal = metric_samples(
        httpx.get(f"http://127.0.0.1:{pair.shoal.metrics_port}/metrics", timeout=10).text)
    counters = {k: v for k, v in triton.items() if k[0].startswith("nv_inference_")
                and not k[0].endswith("_us")}
    never_loaded = {k for k in counters if ("model", "fails_to_load") in k[1]}
    assert_same("metrics:never-loaded",
                {"series": {str(k): counters[k] for k in never_loaded}},
                {"series": {str(k): shoal[k] for k in never_loaded if k in shoal}})
    differing = {f"{k[0]}{dict(sorted(k[1]))}": (v, shoal.get(k))
                 for k, v in counters.items() if shoal.get(k) != v and k not in never_loaded}
    extra = sorted({f"{n}{dict(sorted(lbl))}" for n, lbl in shoal
                    if n.startswith("nv_inference_") and not n.endswith("_us")
                    and (n, lbl) not in triton})
    assert not differing, f"counters differ (triton, shoal): {differing}"
    assert not extra, f"series shoal exports and Triton does not (names never loaded?): {extra}"

