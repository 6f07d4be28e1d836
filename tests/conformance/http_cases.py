"""HTTP cases of the differential tests: every request is sent, in this order, to the real
tritonserver and to shoal over the same repository (tests/conformance/repository.py).

A case is data: method, path, body (JSON, or raw bytes with headers) and an id that names it in
the deliberate-differences table (tests/conformance/deliberate.py). Cases run in order because
the statistics and metrics cases at the end compare the counts that the traffic before them
left on each server."""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterator
from typing import Any

from tests.conformance.repository import IDENTITY_DATATYPES, MODELS


@dataclasses.dataclass(frozen=True)
class HttpCase:
    id: str
    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()


def _json(case_id: str, path: str, body: Any, method: str = "POST") -> HttpCase:
    return HttpCase(case_id, method, path, json.dumps(body).encode(),
                    (("Content-Type", "application/json"),))


def _get(case_id: str, path: str) -> HttpCase:
    return HttpCase(case_id, "GET", path)


def _binary(case_id: str, path: str, header: dict[str, Any], tensors: list[bytes],
            header_length: int | None = None) -> HttpCase:
    """A request with the binary tensor extension: JSON header, then raw tensor bytes."""
    head = json.dumps(header).encode()
    length = len(head) if header_length is None else header_length
    return HttpCase(case_id, "POST", path, head + b"".join(tensors),
                    (("Inference-Header-Content-Length", str(length)),
                     ("Content-Type", "application/octet-stream")))


def _sample(datatype: str, count: int) -> list[Any]:
    if datatype == "BOOL":
        return [i % 2 == 0 for i in range(count)]
    if datatype == "BYTES":
        return [f"s{i}" for i in range(count)]
    if datatype.startswith("FP"):
        return [i + 0.5 for i in range(count)]
    if datatype.startswith("UINT"):
        return list(range(count))
    return [i - count // 2 for i in range(count)]


_STRUCT = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b",
           "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}


def _raw(datatype: str, values: list[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in values)
    return struct.pack(f"<{len(values)}{_STRUCT[datatype]}", *values)


def _tensor(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


ADD_SUB_INPUTS = [_tensor("INPUT0", "FP32", [4], [1, 2, 3, 4]),
                  _tensor("INPUT1", "FP32", [4], [1, 1, 1, 1])]


def metadata_cases() -> Iterator[HttpCase]:
    yield _get("health/live", "/v2/health/live")
    yield _get("health/ready", "/v2/health/ready")
    yield _get("server/metadata", "/v2")
    for model in MODELS:
        base = f"/v2/models/{model}"
        yield _get(f"metadata/{model}", base)
        yield _get(f"ready/{model}", f"{base}/ready")
        yield _get(f"config/{model}", f"{base}/config")
        yield _get(f"metadata/{model}/v1", f"{base}/versions/1")
        yield _get(f"ready/{model}/v1", f"{base}/versions/1/ready")
    for version in ("2", "3", "0", "-1", "abc", "1.0", "99999999999999999999"):
        yield _get(f"metadata/versioned/v{version}", f"/v2/models/versioned/versions/{version}")
        yield _get(f"ready/versioned/v{version}", f"/v2/models/versioned/versions/{version}/ready")
    for what in ("", "/ready", "/config", "/versions/1", "/versions/1/ready", "/stats"):
        yield _get(f"unknown-model{what or '/metadata'}", f"/v2/models/no_such_model{what}")
    yield _get("unknown-path/v2-foo", "/v2/foo")
    yield _get("unknown-path/v3", "/v3")
    yield _get("unknown-path/root", "/")
    yield HttpCase("method/post-live", "POST", "/v2/health/live")
    yield HttpCase("method/delete-model", "DELETE", "/v2/models/add_sub")
    yield _json("repository/index", "/v2/repository/index", {})
    yield _json("repository/index-ready", "/v2/repository/index", {"ready": True})
    yield _json("repository/load-none-mode", "/v2/repository/models/add_sub/load", {})
    yield _json("repository/unload-none-mode", "/v2/repository/models/add_sub/unload", {})
    yield _get("shm/system-status", "/v2/systemsharedmemory/status")
    yield _get("shm/system-status-unknown", "/v2/systemsharedmemory/region/nope/status")
    yield _json("shm/system-unregister-unknown", "/v2/systemsharedmemory/region/nope/unregister",
                {})
    yield _get("shm/cuda-status", "/v2/cudasharedmemory/status")
    yield _get("trace/setting", "/v2/trace/setting")
    yield _get("trace/model-setting", "/v2/models/add_sub/trace/setting")
    yield _get("logging/get", "/v2/logging")


def _identity_cases(datatype: str) -> Iterator[HttpCase]:
    model = f"identity_{datatype.lower()}"
    path = f"/v2/models/{model}/infer"
    values = _sample(datatype, 6)
    inputs = [_tensor("INPUT0", datatype, [2, 3], values)]
    if datatype != "FP16":
        yield _json(f"infer/{model}/json", path, {"inputs": inputs})
        yield _json(f"infer/{model}/json-nested", path,
                    {"inputs": [_tensor("INPUT0", datatype, [2, 3], [values[:3], values[3:]])]})
    else:
        yield _json(f"infer/{model}/json-fp16", path, {"inputs": inputs})
    header = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [2, 3],
                          "parameters": {"binary_data_size": len(_raw(datatype, values))}}]}
    yield _binary(f"infer/{model}/binary-in-json-out", path, header, [_raw(datatype, values)])
    binary_out = {**header, "outputs": [{"name": "OUTPUT0",
                                         "parameters": {"binary_data": True}}]}
    yield _binary(f"infer/{model}/binary-in-binary-out", path, binary_out,
                  [_raw(datatype, values)])
    yield _json(f"infer/{model}/zero-elements", path,
                {"inputs": [_tensor("INPUT0", datatype, [1, 0], [])]})
    wrong = "FP32" if datatype != "FP32" else "INT32"
    yield _json(f"infer/{model}/wrong-datatype", path,
                {"inputs": [_tensor("INPUT0", wrong, [2, 3], _sample(wrong, 6))]})
    yield _json(f"infer/{model}/count-mismatch", path,
                {"inputs": [_tensor("INPUT0", datatype, [2, 3], values[:5])]})
    yield _json(f"infer/{model}/over-max-batch", path,
                {"inputs": [_tensor("INPUT0", datatype, [9, 1], _sample(datatype, 9))]})
    yield _json(f"infer/{model}/no-batch-dim", path,
                {"inputs": [_tensor("INPUT0", datatype, [3], values[:3])]})


def infer_cases() -> Iterator[HttpCase]:
    add_sub = "/v2/models/add_sub/infer"
    yield _json("infer/add_sub/json", add_sub, {"inputs": ADD_SUB_INPUTS})
    yield _json("infer/add_sub/id", add_sub, {"id": "req-7", "inputs": ADD_SUB_INPUTS})
    yield _json("infer/add_sub/one-output", add_sub,
                {"inputs": ADD_SUB_INPUTS, "outputs": [{"name": "OUTPUT1"}]})
    yield _json("infer/add_sub/binary-output-param", add_sub,
                {"inputs": ADD_SUB_INPUTS, "parameters": {"binary_data_output": True}})
    yield _json("infer/add_sub/unknown-output", add_sub,
                {"inputs": ADD_SUB_INPUTS, "outputs": [{"name": "NOPE"}]})
    yield _json("infer/add_sub/duplicate-outputs", add_sub,
                {"inputs": ADD_SUB_INPUTS, "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]})
    yield _json("infer/add_sub/missing-input", add_sub, {"inputs": ADD_SUB_INPUTS[:1]})
    yield _json("infer/add_sub/extra-input", add_sub,
                {"inputs": [*ADD_SUB_INPUTS, _tensor("INPUT9", "FP32", [4], [0, 0, 0, 0])]})
    yield _json("infer/add_sub/duplicate-input", add_sub,
                {"inputs": [*ADD_SUB_INPUTS, ADD_SUB_INPUTS[0]]})
    yield _json("infer/add_sub/wrong-shape", add_sub,
                {"inputs": [_tensor("INPUT0", "FP32", [3], [1, 2, 3]), ADD_SUB_INPUTS[1]]})
    yield _json("infer/add_sub/batch-dim-on-unbatched", add_sub,
                {"inputs": [_tensor("INPUT0", "FP32", [1, 4], [1, 2, 3, 4]),
                            _tensor("INPUT1", "FP32", [1, 4], [1, 1, 1, 1])]})
    yield _json("infer/add_sub/unknown-datatype", add_sub,
                {"inputs": [_tensor("INPUT0", "FP8", [4], [1, 2, 3, 4]), ADD_SUB_INPUTS[1]]})
    yield _json("infer/add_sub/negative-shape", add_sub,
                {"inputs": [_tensor("INPUT0", "FP32", [-4], [1, 2, 3, 4]), ADD_SUB_INPUTS[1]]})
    yield _json("infer/add_sub/string-data", add_sub,
                {"inputs": [_tensor("INPUT0", "FP32", [4], ["a", "b", "c", "d"]),
                            ADD_SUB_INPUTS[1]]})
    yield _json("infer/add_sub/no-inputs", add_sub, {"inputs": []})
    yield _json("infer/add_sub/inputs-not-list", add_sub, {"inputs": {"name": "INPUT0"}})
    yield _json("infer/add_sub/missing-datatype", add_sub,
                {"inputs": [{"name": "INPUT0", "shape": [4], "data": [1, 2, 3, 4]},
                            ADD_SUB_INPUTS[1]]})
    yield _json("infer/add_sub/missing-shape", add_sub,
                {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1, 2, 3, 4]},
                            ADD_SUB_INPUTS[1]]})
    yield _json("infer/add_sub/missing-data", add_sub,
                {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]},
                            ADD_SUB_INPUTS[1]]})
    yield _json("infer/add_sub/parameters", add_sub,
                {"inputs": ADD_SUB_INPUTS, "parameters": {"custom": "x", "n": 3, "flag": True}})
    yield _json("infer/add_sub/classification-on-unbatched", add_sub,
                {"inputs": ADD_SUB_INPUTS,
                 "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]})
    yield HttpCase("infer/add_sub/not-json", "POST", add_sub, b"{not json",
                   (("Content-Type", "application/json"),))
    yield HttpCase("infer/add_sub/empty-body", "POST", add_sub, b"")
    yield _json("infer/add_sub/json-array", add_sub, [1, 2, 3])
    yield _json("infer/add_sub/versions-1", "/v2/models/add_sub/versions/1/infer",
                {"inputs": ADD_SUB_INPUTS})
    yield _json("infer/add_sub/versions-2", "/v2/models/add_sub/versions/2/infer",
                {"inputs": ADD_SUB_INPUTS})
    yield _json("infer/add_sub/versions-abc", "/v2/models/add_sub/versions/abc/infer",
                {"inputs": ADD_SUB_INPUTS})
    yield _json("infer/unknown-model", "/v2/models/no_such_model/infer",
                {"inputs": ADD_SUB_INPUTS})
    # binary framing mistakes
    raw = _raw("FP32", [1, 2, 3, 4])
    header = {"inputs": [{"name": n, "datatype": "FP32", "shape": [4],
                          "parameters": {"binary_data_size": 16}} for n in ("INPUT0", "INPUT1")]}
    yield _binary("infer/add_sub/binary", add_sub, header, [raw, raw])
    yield _binary("infer/add_sub/binary-short-body", add_sub, header, [raw])
    yield _binary("infer/add_sub/binary-long-body", add_sub, header, [raw, raw, raw])
    yield _binary("infer/add_sub/binary-header-length-too-big", add_sub, header, [raw, raw],
                  header_length=10_000)
    yield _binary("infer/add_sub/binary-header-length-not-json", add_sub, header, [raw, raw],
                  header_length=5)
    for datatype in IDENTITY_DATATYPES:
        yield from _identity_cases(datatype)
    nobatch = "/v2/models/nobatch_identity/infer"
    for shape in ([2, 3], [0, 3], [2, 4], [6]):
        count = shape[0] * (shape[1] if len(shape) > 1 else 1)
        values = [float(i) for i in range(count)]
        yield _json(f"infer/nobatch_identity/shape-{'x'.join(map(str, shape))}", nobatch,
                    {"inputs": [_tensor("INPUT0", "FP32", shape, values)]})
    bytes_path = "/v2/models/identity_bytes/infer"
    yield _json("infer/identity_bytes/empty-tensor", bytes_path,
                {"inputs": [_tensor("INPUT0", "BYTES", [0], [])]})
    yield _json("infer/identity_bytes/unicode", bytes_path,
                {"inputs": [_tensor("INPUT0", "BYTES", [1, 2], ["héllo", "日本"])]})
    yield _json("infer/identity_bytes/number-as-string", bytes_path,
                {"inputs": [_tensor("INPUT0", "BYTES", [1, 2], [1, 2])]})
    yield _binary("infer/identity_bytes/binary-bad-length", bytes_path,
                  {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1],
                               "parameters": {"binary_data_size": 6}}]},
                  [struct.pack("<I", 100) + b"ab"])
    optional = "/v2/models/optional_input/infer"
    yield _json("infer/optional_input/both", optional, {"inputs": ADD_SUB_INPUTS})
    yield _json("infer/optional_input/without-optional", optional,
                {"inputs": ADD_SUB_INPUTS[:1]})
    yield _json("infer/optional_input/without-required", optional,
                {"inputs": ADD_SUB_INPUTS[1:]})
    reshaped = "/v2/models/reshaped/infer"
    for rows in (1, 3):
        yield _json(f"infer/reshaped/rows-{rows}", reshaped,
                    {"inputs": [_tensor("INPUT0", "FP32", [rows, 4],
                                        [float(i) for i in range(4 * rows)])]})
    yield _json("infer/reshaped/wrong-shape", reshaped,
                {"inputs": [_tensor("INPUT0", "FP32", [1, 2, 2], [1, 2, 3, 4])]})
    yield _json("infer/error_response/json", "/v2/models/error_response/infer",
                {"inputs": [_tensor("INPUT0", "FP32", [2], [1, 2])]})
    yield _json("infer/raises/json", "/v2/models/raises/infer",
                {"inputs": [_tensor("INPUT0", "FP32", [2], [1, 2])]})
    partial = "/v2/models/partial_outputs/infer"
    part_in = [_tensor("INPUT0", "FP32", [2], [1, 2])]
    yield _json("infer/partial_outputs/all", partial, {"inputs": part_in})
    yield _json("infer/partial_outputs/ask-produced", partial,
                {"inputs": part_in, "outputs": [{"name": "OUTPUT0"}]})
    yield _json("infer/partial_outputs/ask-unproduced", partial,
                {"inputs": part_in, "outputs": [{"name": "OUTPUT1"}]})
    yield _json("infer/partial_outputs/ask-unproduced-binary", partial,
                {"inputs": part_in,
                 "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}]})
    classify = "/v2/models/classify/infer"
    cls_in = [_tensor("INPUT0", "FP32", [2, 5], [0.1, 0.9, 0.3, 0.7, 0.5, 5, 4, 3, 2, 1])]
    for count in (1, 3, 5, 6, 0):
        yield _json(f"infer/classify/class-count-{count}", classify,
                    {"inputs": cls_in,
                     "outputs": [{"name": "OUTPUT0", "parameters": {"classification": count}}]})
    yield _json("infer/classify/class-count-binary", classify,
                {"inputs": cls_in, "outputs": [{"name": "OUTPUT0", "parameters": {
                    "classification": 2, "binary_data": True}}]})
    versioned_in = {"inputs": [_tensor("INPUT0", "FP32", [2], [1, 2])]}
    for version in ("", "/versions/1", "/versions/2", "/versions/3"):
        yield _json(f"infer/versioned{version or '/latest'}",
                    f"/v2/models/versioned{version}/infer", versioned_in)
    yield _json("infer/pipeline/json", "/v2/models/pipeline/infer",
                {"inputs": [_tensor("A", "FP32", [4], [1, 2, 3, 4]),
                            _tensor("B", "FP32", [4], [4, 3, 2, 1])]})
    yield _json("infer/pipeline/missing-input", "/v2/models/pipeline/infer",
                {"inputs": [_tensor("A", "FP32", [4], [1, 2, 3, 4])]})
    yield _json("infer/countdown/decoupled-infer", "/v2/models/countdown/infer",
                {"inputs": [_tensor("IN", "INT32", [1], [2])]})


def sequence_cases() -> Iterator[HttpCase]:
    path = "/v2/models/accumulator/infer"

    def step(case_id: str, value: int, **params: Any) -> HttpCase:
        return _json(case_id, path, {"inputs": [_tensor("INPUT", "INT32", [1, 1], [value])],
                                     "parameters": params})

    yield step("sequence/int/start", 5, sequence_id=41, sequence_start=True)
    yield step("sequence/int/step", 6, sequence_id=41)
    yield step("sequence/int/end", 7, sequence_id=41, sequence_end=True)
    yield step("sequence/int/after-end", 1, sequence_id=41)
    yield step("sequence/string/start", 2, sequence_id="seq-a", sequence_start=True)
    yield step("sequence/string/end", 3, sequence_id="seq-a", sequence_end=True)
    yield step("sequence/no-id", 1)
    yield step("sequence/id-zero-start", 1, sequence_id=0, sequence_start=True)
    yield step("sequence/unknown-id", 1, sequence_id=9999)
    yield step("sequence/start-and-end", 4, sequence_id=42, sequence_start=True,
               sequence_end=True)
    yield step("sequence/negative-id", 1, sequence_id=-3, sequence_start=True)
    yield step("sequence/float-id", 1, sequence_id=1.5, sequence_start=True)
    yield step("sequence/start-not-bool", 1, sequence_id=43, sequence_start="yes")


def generate_cases() -> Iterator[HttpCase]:
    add_sub = "/v2/models/add_sub/generate"
    yield _json("generate/add_sub/ok", add_sub, {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})
    yield _json("generate/add_sub/missing-input", add_sub, {"INPUT0": [1, 2, 3, 4]})
    yield _json("generate/add_sub/wrong-type", add_sub,
                {"INPUT0": ["a", "b", "c", "d"], "INPUT1": [1, 1, 1, 1]})
    yield _json("generate/add_sub/wrong-count", add_sub, {"INPUT0": [1, 2], "INPUT1": [1, 1]})
    yield _json("generate/add_sub/parameters", add_sub,
                {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "parameters": {"x": 1}})
    yield _json("generate/add_sub/not-object", add_sub, [1, 2])
    yield _json("generate/unknown-model", "/v2/models/no_such_model/generate", {"INPUT0": 1})
    yield _json("generate/bytes/scalar", "/v2/models/identity_bytes/generate", {"INPUT0": "hi"})
    yield _json("generate/bytes/list", "/v2/models/identity_bytes/generate",
                {"INPUT0": ["a", "b"]})
    yield _json("generate/countdown/decoupled", "/v2/models/countdown/generate", {"IN": 2})
    yield _json("generate/countdown/zero", "/v2/models/countdown/generate", {"IN": 0})
    yield _json("generate/error_response", "/v2/models/error_response/generate",
                {"INPUT0": [1.0]})
    yield _json("generate_stream/countdown/ok", "/v2/models/countdown/generate_stream",
                {"IN": 3})
    yield _json("generate_stream/countdown/model-error", "/v2/models/countdown/generate_stream",
                {"IN": -1})
    yield _json("generate_stream/add_sub/ok", "/v2/models/add_sub/generate_stream",
                {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})
    yield _json("generate_stream/error_response", "/v2/models/error_response/generate_stream",
                {"INPUT0": [1.0]})
    yield _json("generate_stream/unknown-model", "/v2/models/no_such_model/generate_stream",
                {"INPUT0": 1})


def statistics_cases() -> Iterator[HttpCase]:
    """Last: the counts the traffic above left (timings are not compared)."""
    for model in MODELS:
        yield _get(f"stats/{model}", f"/v2/models/{model}/stats")
    yield _get("stats/all", "/v2/models/stats")


def all_cases() -> list[HttpCase]:
    cases = [*metadata_cases(), *infer_cases(), *sequence_cases(), *generate_cases(),
             *statistics_cases()]
    ids = [c.id for c in cases]
    duplicates = {i for i in ids if ids.count(i) > 1}
    assert not duplicates, f"duplicate case ids: {duplicates}"
    return cases
