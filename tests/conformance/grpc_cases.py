"""gRPC cases of the differential tests: ``inference.GRPCInferenceService`` requests, given as
protobuf JSON (``json_format.ParseDict``), sent in order to both servers. ``raw`` holds the
``raw_input_contents`` of an infer request (bytes have no protobuf-JSON form worth writing).

``grpc_answer`` reduces a unary call's outcome to the status code, its details and the reply as
protobuf JSON (normalised as HTTP bodies are); ``stream_answer`` does the same for every message
of a ``ModelStreamInfer`` call."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from tests.conformance.answers import normalise
from tests.conformance.repository import IDENTITY_DATATYPES, MODELS

_REQUEST_TYPES = {
    "ServerLive": service_pb2.ServerLiveRequest,
    "ServerReady": service_pb2.ServerReadyRequest,
    "ServerMetadata": service_pb2.ServerMetadataRequest,
    "ModelReady": service_pb2.ModelReadyRequest,
    "ModelMetadata": service_pb2.ModelMetadataRequest,
    "ModelConfig": service_pb2.ModelConfigRequest,
    "ModelInfer": service_pb2.ModelInferRequest,
    "ModelStatistics": service_pb2.ModelStatisticsRequest,
    "RepositoryIndex": service_pb2.RepositoryIndexRequest,
    "RepositoryModelLoad": service_pb2.RepositoryModelLoadRequest,
    "RepositoryModelUnload": service_pb2.RepositoryModelUnloadRequest,
    "SystemSharedMemoryStatus": service_pb2.SystemSharedMemoryStatusRequest,
    "SystemSharedMemoryUnregister": service_pb2.SystemSharedMemoryUnregisterRequest,
    "CudaSharedMemoryStatus": service_pb2.CudaSharedMemoryStatusRequest,
    "TraceSetting": service_pb2.TraceSettingRequest,
    "LogSettings": service_pb2.LogSettingsRequest,
}


@dataclasses.dataclass(frozen=True)
class GrpcCase:
    id: str
    rpc: str
    request: dict[str, Any]
    raw: tuple[bytes, ...] = ()
    stream: bool = False

    def message(self) -> Any:
        kind = service_pb2.ModelInferRequest if self.stream else _REQUEST_TYPES[self.rpc]
        msg = json_format.ParseDict(self.request, kind())
        if self.raw:
            msg.raw_input_contents.extend(self.raw)
        return msg


_STRUCT = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b",
           "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}


def _raw(datatype: str, count: int) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", 2) + f"s{i}".encode() for i in range(count))
    if datatype == "BOOL":
        return struct.pack(f"<{count}?", *(i % 2 == 0 for i in range(count)))
    return struct.pack(f"<{count}{_STRUCT[datatype]}", *range(count))


def _input(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


def _infer(case_id: str, model: str, inputs: list[dict[str, Any]], raw: tuple[bytes, ...],
           **extra: Any) -> GrpcCase:
    return GrpcCase(case_id, "ModelInfer", {"model_name": model, "inputs": inputs, **extra}, raw)


_FOUR = struct.pack("<4f", 1, 2, 3, 4)
_ONES = struct.pack("<4f", 1, 1, 1, 1)
_ADD_SUB = [_input("INPUT0", "FP32", [4]), _input("INPUT1", "FP32", [4])]


def metadata_cases() -> Iterator[GrpcCase]:
    yield GrpcCase("live", "ServerLive", {})
    yield GrpcCase("ready", "ServerReady", {})
    yield GrpcCase("server-metadata", "ServerMetadata", {})
    for model in MODELS:
        yield GrpcCase(f"model-ready/{model}", "ModelReady", {"name": model})
        yield GrpcCase(f"model-metadata/{model}", "ModelMetadata", {"name": model})
        yield GrpcCase(f"model-config/{model}", "ModelConfig", {"name": model})
    for version in ("1", "2", "3", "abc", "-1"):
        yield GrpcCase(f"model-metadata/versioned/v{version}", "ModelMetadata",
                       {"name": "versioned", "version": version})
        yield GrpcCase(f"model-ready/versioned/v{version}", "ModelReady",
                       {"name": "versioned", "version": version})
        yield GrpcCase(f"model-config/versioned/v{version}", "ModelConfig",
                       {"name": "versioned", "version": version})
    for rpc in ("ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"):
        yield GrpcCase(f"unknown-model/{rpc}", rpc, {"name": "no_such_model"})
    for rpc in ("ModelReady", "ModelMetadata", "ModelConfig"):
        yield GrpcCase(f"empty-name/{rpc}", rpc, {"name": ""})
    yield GrpcCase("repository-index", "RepositoryIndex", {})
    yield GrpcCase("repository-index-ready", "RepositoryIndex", {"ready": True})
    yield GrpcCase("repository-load-none-mode", "RepositoryModelLoad", {"model_name": "add_sub"})
    yield GrpcCase("repository-unload-none-mode", "RepositoryModelUnload",
                   {"model_name": "add_sub"})
    yield GrpcCase("shm-status", "SystemSharedMemoryStatus", {})
    yield GrpcCase("shm-status-unknown", "SystemSharedMemoryStatus", {"name": "nope"})
    yield GrpcCase("shm-unregister-unknown", "SystemSharedMemoryUnregister", {"name": "nope"})
    yield GrpcCase("cuda-shm-status", "CudaSharedMemoryStatus", {})
    yield GrpcCase("trace-setting", "TraceSetting", {})
    yield GrpcCase("log-settings", "LogSettings", {})


def infer_cases() -> Iterator[GrpcCase]:
    yield _infer("infer/add_sub", "add_sub", _ADD_SUB, (_FOUR, _ONES))
    yield _infer("infer/add_sub/id", "add_sub", _ADD_SUB, (_FOUR, _ONES), id="req-9")
    yield _infer("infer/add_sub/one-output", "add_sub", _ADD_SUB, (_FOUR, _ONES),
                 outputs=[{"name": "OUTPUT1"}])
    yield _infer("infer/add_sub/unknown-output", "add_sub", _ADD_SUB, (_FOUR, _ONES),
                 outputs=[{"name": "NOPE"}])
    yield _infer("infer/add_sub/duplicate-outputs", "add_sub", _ADD_SUB, (_FOUR, _ONES),
                 outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}])
    yield _infer("infer/add_sub/missing-input", "add_sub", _ADD_SUB[:1], (_FOUR,))
    yield _infer("infer/add_sub/raw-count-mismatch", "add_sub", _ADD_SUB, (_FOUR,))
    yield _infer("infer/add_sub/raw-short", "add_sub", _ADD_SUB, (_FOUR, _ONES[:8]))
    yield _infer("infer/add_sub/wrong-shape", "add_sub",
                 [_input("INPUT0", "FP32", [2]), _input("INPUT1", "FP32", [2])],
                 (_FOUR[:8], _ONES[:8]))
    yield _infer("infer/add_sub/contents", "add_sub",
                 [{**_input("INPUT0", "FP32", [4]), "contents": {"fp32_contents": [1, 2, 3, 4]}},
                  {**_input("INPUT1", "FP32", [4]), "contents": {"fp32_contents": [1, 1, 1, 1]}}],
                 ())
    yield _infer("infer/add_sub/contents-and-raw", "add_sub",
                 [{**_input("INPUT0", "FP32", [4]), "contents": {"fp32_contents": [1, 2, 3, 4]}},
                  _input("INPUT1", "FP32", [4])], (_ONES,))
    yield _infer("infer/add_sub/unknown-datatype", "add_sub",
                 [_input("INPUT0", "FP8", [4]), _input("INPUT1", "FP32", [4])], (_FOUR, _ONES))
    yield _infer("infer/add_sub/version-2", "add_sub", _ADD_SUB, (_FOUR, _ONES),
                 model_version="2")
    yield _infer("infer/add_sub/version-abc", "add_sub", _ADD_SUB, (_FOUR, _ONES),
                 model_version="abc")
    yield _infer("infer/unknown-model", "no_such_model", _ADD_SUB, (_FOUR, _ONES))
    yield _infer("infer/empty-name", "", _ADD_SUB, (_FOUR, _ONES))
    for datatype in IDENTITY_DATATYPES:
        model = f"identity_{datatype.lower()}"
        yield _infer(f"infer/{model}", model, [_input("INPUT0", datatype, [2, 3])],
                     (_raw(datatype, 6),))
        yield _infer(f"infer/{model}/zero-elements", model, [_input("INPUT0", datatype, [1, 0])],
                     (b"",))
    yield _infer("infer/nobatch_identity/0x3", "nobatch_identity",
                 [_input("INPUT0", "FP32", [0, 3])], (b"",))
    yield _infer("infer/reshaped", "reshaped", [_input("INPUT0", "FP32", [2, 4])],
                 (struct.pack("<8f", *range(8)),))
    yield _infer("infer/error_response", "error_response", [_input("INPUT0", "FP32", [1])],
                 (struct.pack("<f", 1),))
    yield _infer("infer/raises", "raises", [_input("INPUT0", "FP32", [1])],
                 (struct.pack("<f", 1),))
    yield _infer("infer/partial_outputs/all", "partial_outputs", [_input("INPUT0", "FP32", [1])],
                 (struct.pack("<f", 1),))
    yield _infer("infer/partial_outputs/ask-unproduced", "partial_outputs",
                 [_input("INPUT0", "FP32", [1])], (struct.pack("<f", 1),),
                 outputs=[{"name": "OUTPUT1"}])
    yield _infer("infer/classify/2", "classify", [_input("INPUT0", "FP32", [1, 5])],
                 (struct.pack("<5f", 0.5, 0.25, 1, 2, 0),),
                 outputs=[{"name": "OUTPUT0",
                           "parameters": {"classification": {"int64_param": "2"}}}])
    yield _infer("infer/pipeline", "pipeline",
                 [_input("A", "FP32", [4]), _input("B", "FP32", [4])], (_FOUR, _ONES))
    yield _infer("infer/countdown/decoupled-unary", "countdown", [_input("IN", "INT32", [1])],
                 (struct.pack("<i", 2),))
    seq = [_input("INPUT", "INT32", [1, 1])]
    for case_id, value, params in (
        ("sequence/int/start", 5, {"sequence_id": {"int64_param": "51"},
                                   "sequence_start": {"bool_param": True}}),
        ("sequence/int/end", 6, {"sequence_id": {"int64_param": "51"},
                                 "sequence_end": {"bool_param": True}}),
        ("sequence/uint64/start", 1, {"sequence_id": {"uint64_param": "52"},
                                      "sequence_start": {"bool_param": True}}),
        ("sequence/uint64/end", 2, {"sequence_id": {"uint64_param": "52"},
                                    "sequence_end": {"bool_param": True}}),
        ("sequence/string/start", 3, {"sequence_id": {"string_param": "g-seq"},
                                      "sequence_start": {"bool_param": True}}),
        ("sequence/string/end", 4, {"sequence_id": {"string_param": "g-seq"},
                                    "sequence_end": {"bool_param": True}}),
        ("sequence/no-id", 1, {}),
        ("sequence/double-id", 1, {"sequence_id": {"double_param": 1.5},
                                   "sequence_start": {"bool_param": True}}),
    ):
        yield _infer(case_id, "accumulator", seq, (struct.pack("<i", value),),
                     parameters=params)


def stream_cases() -> Iterator[GrpcCase]:
    def stream(case_id: str, model: str, inputs: list[dict[str, Any]],
               raw: tuple[bytes, ...]) -> GrpcCase:
        final = {"triton_enable_empty_final_response": {"bool_param": True}}
        return GrpcCase(case_id, "ModelStreamInfer",
                        {"model_name": model, "inputs": inputs, "parameters": final}, raw,
                        stream=True)

    count = [_input("IN", "INT32", [1])]
    yield stream("stream/countdown/3", "countdown", count, (struct.pack("<i", 3),))
    yield stream("stream/countdown/0", "countdown", count, (struct.pack("<i", 0),))
    yield stream("stream/countdown/error", "countdown", count, (struct.pack("<i", -1),))
    yield stream("stream/add_sub", "add_sub", _ADD_SUB, (_FOUR, _ONES))
    yield stream("stream/unknown-model", "no_such_model", _ADD_SUB, (_FOUR, _ONES))
    yield stream("stream/error_response", "error_response", [_input("INPUT0", "FP32", [1])],
                 (struct.pack("<f", 1),))


def statistics_cases() -> Iterator[GrpcCase]:
    for model in MODELS:
        yield GrpcCase(f"stats/{model}", "ModelStatistics", {"name": model})


def all_cases() -> list[GrpcCase]:
    cases = [*metadata_cases(), *infer_cases(), *stream_cases(), *statistics_cases()]
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "duplicate gRPC case ids"
    return cases


def _reply(message: Any) -> Any:
    reply = json_format.MessageToDict(message, preserving_proto_field_name=True)
    if "raw_output_contents" in reply:  # base64 in protobuf JSON: compare as hex
        reply["raw_output_contents"] = [bytes(b).hex() for b in message.raw_output_contents]
    return normalise(reply)


def grpc_answer(channel: grpc.Channel, case: GrpcCase, timeout: float = 30) -> dict[str, Any]:
    call = channel.unary_unary(
        f"/inference.GRPCInferenceService/{case.rpc}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=_RESPONSE_TYPES[case.rpc].FromString,
    )
    try:
        reply = call(case.message(), timeout=timeout)
    except grpc.RpcError as err:
        return {"code": err.code().name, "details": err.details()}
    return {"code": "OK", "reply": _reply(reply)}


def stream_answer(channel: grpc.Channel, case: GrpcCase, timeout: float = 5) -> dict[str, Any]:
    call = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )
    messages: list[Any] = []
    try:
        # the request asks for a final flag on every response: the stream's answer ends there
        # (an answer that never carries it runs into the deadline, and that is the answer)
        for response in call(iter([case.message()]), timeout=timeout):
            messages.append(_reply(response))
            params = response.infer_response.parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                break
    except grpc.RpcError as err:
        return {"code": err.code().name, "details": err.details(), "messages": messages}
    return {"code": "OK", "messages": messages}


_RESPONSE_TYPES = {
    "ServerLive": service_pb2.ServerLiveResponse,
    "ServerReady": service_pb2.ServerReadyResponse,
    "ServerMetadata": service_pb2.ServerMetadataResponse,
    "ModelReady": service_pb2.ModelReadyResponse,
    "ModelMetadata": service_pb2.ModelMetadataResponse,
    "ModelConfig": service_pb2.ModelConfigResponse,
    "ModelInfer": service_pb2.ModelInferResponse,
    "ModelStatistics": service_pb2.ModelStatisticsResponse,
    "RepositoryIndex": service_pb2.RepositoryIndexResponse,
    "RepositoryModelLoad": service_pb2.RepositoryModelLoadResponse,
    "RepositoryModelUnload": service_pb2.RepositoryModelUnloadResponse,
    "SystemSharedMemoryStatus": service_pb2.SystemSharedMemoryStatusResponse,
    "SystemSharedMemoryUnregister": service_pb2.SystemSharedMemoryUnregisterResponse,
    "CudaSharedMemoryStatus": service_pb2.CudaSharedMemoryStatusResponse,
    "TraceSetting": service_pb2.TraceSettingResponse,
    "LogSettings": service_pb2.LogSettingsResponse,
}
