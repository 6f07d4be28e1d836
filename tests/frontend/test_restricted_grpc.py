"""The restricted-API gate over gRPC: every method the server registers (from the generated
service descriptor, plus the standard health check) has a category; against a real grpc.aio
server over a fake DataPlane, every method of a restricted category is refused with
PERMISSION_DENIED and Triton's text without its ``triton-grpc-protocol-<key>`` metadata (the
bidirectional stream before any request is read) and served with it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend.grpc.health import SERVICE_NAME as HEALTH_SERVICE
from shoal.frontend.grpc.restricted import (
    INFERENCE_SERVICE,
    method_gates,
    restricted_interceptors,
    served_methods,
)
from shoal.frontend.grpc.server import create_grpc_server
from shoal.frontend.restricted import (
    GRPC_CATEGORIES,
    GRPC_METHOD_CATEGORIES,
    ApiCategory,
    RestrictedApis,
    parse_restrictions,
)
from shoal.messages import TensorSpec
from shoal.settings import settings_from_flags
from tests.e2e.server import free_port
from tests.frontend.grpc.fakes import StreamingFakeDataPlane
from tests.frontend.http.fakes import make_model

# every gRPC category restricted, each by its own key
FLAGS = [f"{c.value}:key-{c.value}=value-{c.value}" for c in sorted(GRPC_CATEGORIES)]
RESTRICTIONS = parse_restrictions(FLAGS, flag="--grpc-restricted-protocol", grpc=True)

Test = Callable[[Any], Awaitable[None]]


def metadata_for(category: ApiCategory) -> tuple[tuple[str, str], ...]:
    return ((f"triton-grpc-protocol-key-{category.value}", f"value-{category.value}"),)


def refusal(category: ApiCategory) -> str:
    return ("This protocol is restricted, expecting header "
            f"'triton-grpc-protocol-key-{category.value}'")


def serve(test: Test, restrictions: list[tuple[str, str, str]]) -> None:
    port = free_port()
    settings = settings_from_flags(model_repositories=["/models"], grpc_address="127.0.0.1",
                                   grpc_port=port,
                                   grpc_restricted_protocols=restrictions).for_frontends()
    dataplane = StreamingFakeDataPlane(models=[
        make_model("identity", [TensorSpec("INPUT0", "FP32", [-1])])])

    async def main() -> None:
        server = create_grpc_server(dataplane, settings)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await test(channel)
        finally:
            await server.stop(None)

    asyncio.run(main())


def infer_request() -> Any:
    message = pb.ModelInferRequest(model_name="identity")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.array([1.0, 2.0], np.float32).tobytes())
    return message


def _unary_methods() -> list[tuple[str, Any, Any, ApiCategory]]:
    return [(f"/{INFERENCE_SERVICE.full_name}/{m.name}", getattr(pb, m.input_type.name),
             getattr(pb, m.output_type.name), GRPC_METHOD_CATEGORIES[m.name])
            for m in INFERENCE_SERVICE.methods
            if not (m.client_streaming or m.server_streaming)]


async def _call_unary(channel: Any, path: str, request_type: Any, response_type: Any,
                      metadata: tuple[tuple[str, str], ...] = ()) -> tuple[Any, str]:
    """(status code, details) of one call of ``path`` with a default (or small infer)
    request."""
    call = channel.unary_unary(path, request_serializer=request_type.SerializeToString,
                               response_deserializer=response_type.FromString)
    request = infer_request() if request_type is pb.ModelInferRequest else request_type()
    try:
        await call(request, metadata=metadata or None)
    except grpc.aio.AioRpcError as error:
        return error.code(), str(error.details())
    return grpc.StatusCode.OK, ""


DENIED = grpc.StatusCode.PERMISSION_DENIED


# ---------------------------------------------------------------- the table


def test_every_method_of_the_service_descriptor_has_a_category() -> None:
    methods = [m.name for m in INFERENCE_SERVICE.methods]
    assert methods and "ModelStreamInfer" in methods
    for name in methods:
        assert GRPC_METHOD_CATEGORIES.get(name) in GRPC_CATEGORIES, f"{name} has no category"
    assert GRPC_METHOD_CATEGORIES["Check"] is ApiCategory.HEALTH
    assert (f"/{HEALTH_SERVICE}/Check", "Check") in served_methods()


def test_methods_have_tritons_categories() -> None:
    expected = {
        ApiCategory.HEALTH: {"ServerLive", "ServerReady", "ModelReady", "Check"},
        ApiCategory.METADATA: {"ServerMetadata", "ModelMetadata"},
        ApiCategory.INFERENCE: {"ModelInfer", "ModelStreamInfer"},
        ApiCategory.MODEL_CONFIG: {"ModelConfig"},
        ApiCategory.STATISTICS: {"ModelStatistics"},
        ApiCategory.MODEL_REPOSITORY: {"RepositoryIndex", "RepositoryModelLoad",
                                       "RepositoryModelUnload"},
        ApiCategory.TRACE: {"TraceSetting"},
        ApiCategory.LOGGING: {"LogSettings"},
    }
    for category, names in expected.items():
        for name in names:
            assert GRPC_METHOD_CATEGORIES[name] is category, name
    shm = [m.name for m in INFERENCE_SERVICE.methods if "SharedMemory" in m.name]
    assert len(shm) == 6
    assert all(GRPC_METHOD_CATEGORIES[name] is ApiCategory.SHARED_MEMORY for name in shm)


def test_a_served_method_without_a_category_is_refused() -> None:
    # create_grpc_server builds its interceptors through method_gates over served_methods()
    with pytest.raises(TypeError, match=re.escape("gRPC method /x.Service/NewRpc has no API "
                                                  "category")):
        method_gates(RestrictedApis([]), [("/x.Service/NewRpc", "NewRpc")])


def test_no_interceptor_without_restrictions() -> None:
    assert restricted_interceptors(RestrictedApis([])) == []
    assert len(restricted_interceptors(RestrictedApis(RESTRICTIONS))) == 1


# ---------------------------------------------------------------- every method


def test_every_unary_method_is_refused_without_its_metadata_and_served_with_it() -> None:
    async def test(channel: Any) -> None:
        for path, request_type, response_type, category in _unary_methods():
            outcome = await _call_unary(channel, path, request_type, response_type)
            assert outcome == (DENIED, refusal(category)), path
            other = next(c for c in GRPC_CATEGORIES if c is not category)
            outcome = await _call_unary(channel, path, request_type, response_type,
                                        metadata_for(other))
            assert outcome == (DENIED, refusal(category)), path
            key, value = metadata_for(category)[0]
            outcome = await _call_unary(channel, path, request_type, response_type,
                                        ((key, value + "x"),))
            assert outcome == (DENIED, refusal(category)), path
            served, _ = await _call_unary(channel, path, request_type, response_type,
                                          metadata_for(category))
            assert served is not DENIED, path

    serve(test, RESTRICTIONS)


def test_model_infer_with_its_metadata_answers() -> None:
    async def test(channel: Any) -> None:
        call = channel.unary_unary(f"/{INFERENCE_SERVICE.full_name}/ModelInfer",
                                   request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        reply = await call(infer_request(), metadata=metadata_for(ApiCategory.INFERENCE))
        assert reply.model_name == "identity"

    serve(test, RESTRICTIONS)


def test_stream_infer_is_refused_before_reading_and_served_with_its_metadata() -> None:
    async def test(channel: Any) -> None:
        method = channel.stream_stream(
            f"/{INFERENCE_SERVICE.full_name}/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString)
        call = method()  # no request sent: refused at the stream's start
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details() == refusal(ApiCategory.INFERENCE)

        call = method(metadata=metadata_for(ApiCategory.INFERENCE))
        await call.write(infer_request())
        answer = await call.read()
        assert answer.error_message == ""
        assert answer.infer_response.model_name == "identity"
        await call.done_writing()

    serve(test, RESTRICTIONS)


def test_standard_health_check_is_health() -> None:
    async def test(channel: Any) -> None:
        check = channel.unary_unary(f"/{HEALTH_SERVICE}/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await check(b"")
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details() == refusal(ApiCategory.HEALTH)
        assert await check(b"", metadata=metadata_for(ApiCategory.HEALTH)) == b"\x08\x01"

    serve(test, RESTRICTIONS)


def test_only_restricted_categories_are_gated_and_unknown_methods_stay_unimplemented() -> None:
    restrictions = parse_restrictions(["model-repository:admin=x"],
                                      flag="--grpc-restricted-protocol", grpc=True)

    async def test(channel: Any) -> None:
        for path, request_type, response_type, category in _unary_methods():
            code, _ = await _call_unary(channel, path, request_type, response_type)
            assert (code is DENIED) == (category is ApiCategory.MODEL_REPOSITORY), path
        unknown = channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc",
                                      request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await unknown(b"")
        assert missing.value.code() is grpc.StatusCode.UNIMPLEMENTED

    serve(test, restrictions)


def test_unrestricted_server_refuses_nothing() -> None:
    async def test(channel: Any) -> None:
        for path, request_type, response_type, _ in _unary_methods():
            code, _ = await _call_unary(channel, path, request_type, response_type)
            assert code is not DENIED, path

    serve(test, [])
