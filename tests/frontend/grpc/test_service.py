"""The gRPC service in-process: a real grpc.aio server over a fake DataPlane, spoken to with the
generated stub. Covers every RPC, the status mapping, stream ordering / multiplexing / in-band
errors / empty finals, and cancellation reaching the DataPlane. The CUDA shared-memory RPCs:
``test_cuda_shared_memory_grpc.py``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import pytest
from starlette.testclient import TestClient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from shoal.frontend.core import classification
from shoal.frontend.core.log_settings import ProcessLogSettings
from shoal.frontend.grpc.convert import EMPTY_FINAL_RESPONSE
from shoal.frontend.grpc.encode import FINAL_RESPONSE
from shoal.frontend.grpc.inference import DECOUPLED_UNARY_MESSAGE
from shoal.frontend.grpc.server import create_grpc_server
from shoal.frontend.http.app import create_app
from shoal.messages import TensorSpec
from shoal.settings import settings_from_flags
from tests.e2e.server import free_port
from tests.frontend.grpc.fakes import StreamingFakeDataPlane
from tests.frontend.http.fakes import make_model

Test = Callable[[Any, Any], Awaitable[None]]


def make_dataplane() -> StreamingFakeDataPlane:
    return StreamingFakeDataPlane(models=[
        make_model("identity", [TensorSpec("INPUT0", "FP32", [-1])]),
        make_model("batched", [TensorSpec("INPUT0", "INT32", [4])], max_batch_size=8),
        make_model("decoupled", [TensorSpec("INPUT0", "FP32", [-1])], decoupled=True),
    ], unloaded=["never_loaded"])


@pytest.fixture
def dataplane() -> StreamingFakeDataPlane:
    return make_dataplane()


def serve(dataplane: StreamingFakeDataPlane, test: Test,
          log_settings: ProcessLogSettings | None = None, allow_client_shm: bool = False) -> None:
    """Run ``test(stub, channel)`` against a server on a free port, then stop it."""
    port = free_port()
    settings = settings_from_flags(model_repositories=["/models"], grpc_address="127.0.0.1",
                                   grpc_port=port,
                                   allow_client_shm=allow_client_shm).for_frontends()

    async def main() -> None:
        server = create_grpc_server(dataplane, settings, log_settings)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await test(service_pb2_grpc.GRPCInferenceServiceStub(channel), channel)
        finally:
            await server.stop(None)

    asyncio.run(main())


def infer_request(model: str, values: list[float], request_id: str = "",
                  **params: Any) -> Any:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[len(values)])
    message.raw_input_contents.append(np.array(values, np.float32).tobytes())
    for key, value in params.items():
        if isinstance(value, bool):
            message.parameters[key].bool_param = value
        else:
            message.parameters[key].string_param = value
    return message


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def final_flag(message: Any) -> bool:
    return bool(message.infer_response.parameters[FINAL_RESPONSE].bool_param)


def values_of(message: Any) -> list[float]:
    raw = message.infer_response.raw_output_contents[0]
    return [float(v) for v in np.frombuffer(raw, np.float32)]


# ------------------------------------------------------------------------ ModelInfer


def test_model_infer_round_trip_frees_inputs_and_releases_outputs(
        dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        reply = await stub.ModelInfer(infer_request("identity", [1.0, 2.5], "r-1"))
        assert (reply.id, reply.model_name, reply.model_version) == ("r-1", "identity", "1")
        assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [
            ("OUTPUT0", "FP32", [2])]
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [1.0, 2.5]

    serve(dataplane, test)
    assert dataplane.live_slots == {}
    assert [lease.lease_id for lease in dataplane.released if lease] == [1]


def test_model_infer_errors_carry_tritons_status_and_the_http_text(
        dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        error = await rpc_error(stub.ModelInfer(infer_request("nope", [1.0])))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error.details() == "Request for unknown model: 'nope' is not found"
        error = await rpc_error(stub.ModelInfer(infer_request("decoupled", [1.0])))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert error.details() == DECOUPLED_UNARY_MESSAGE
        bad = pb.ModelInferRequest(model_name="batched")
        bad.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 3])
        bad.raw_input_contents.append(b"\0" * 12)
        error = await rpc_error(stub.ModelInfer(bad))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("[request id: <id_unknown>] unexpected shape for "
                                          "input 'INPUT0' for model 'batched'. Expected "
                                          "[-1,4], got [1,3].")
        error = await rpc_error(stub.ModelInfer(pb.ModelInferRequest(
            model_name="identity", model_version="7")))
        assert error.code() == grpc.StatusCode.NOT_FOUND

    serve(dataplane, test)


def test_an_unexpected_exception_is_internal_without_details(
        dataplane: StreamingFakeDataPlane, caplog: pytest.LogCaptureFixture) -> None:
    async def broken(*args: Any) -> Any:
        raise RuntimeError("secret /internal/path")

    dataplane.stats = broken  # type: ignore[method-assign,assignment]

    async def test(stub: Any, channel: Any) -> None:
        error = await rpc_error(stub.ModelStatistics(pb.ModelStatisticsRequest()))
        assert error.code() == grpc.StatusCode.INTERNAL
        assert error.details() == "internal error"

    serve(dataplane, test)
    assert "secret /internal/path" in caplog.text  # logged for the operator, not sent


def test_a_deadline_cancels_the_request_at_the_dataplane(
        dataplane: StreamingFakeDataPlane) -> None:
    dataplane.delays["slow"] = 5.0

    async def test(stub: Any, channel: Any) -> None:
        error = await rpc_error(stub.ModelInfer(infer_request("identity", [1.0], "slow"),
                                                timeout=0.2))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(50):
            if dataplane.abandoned:
                break
            await asyncio.sleep(0.02)

    serve(dataplane, test)
    assert dataplane.abandoned == ["slow"]
    assert dataplane.live_slots == {}


# ------------------------------------------------------------------------ ModelStreamInfer


async def collect(call: Any, count: int) -> list[Any]:
    messages = []
    for _ in range(count):
        messages.append(await call.read())
    return messages


def test_stream_answers_non_decoupled_requests_in_request_order(
        dataplane: StreamingFakeDataPlane) -> None:
    dataplane.delays["first"] = 0.3

    async def test(stub: Any, channel: Any) -> None:
        call = stub.ModelStreamInfer()
        await call.write(infer_request("identity", [1.0], "first"))
        await call.write(infer_request("identity", [2.0], "second"))
        await call.done_writing()
        messages = [m async for m in call]
        assert [m.infer_response.id for m in messages] == ["first", "second"]
        assert [values_of(m) for m in messages] == [[1.0], [2.0]]
        assert all(final_flag(m) and not m.error_message for m in messages)
        assert await call.code() == grpc.StatusCode.OK

    serve(dataplane, test)


def test_stream_multiplexes_decoupled_answers_with_others(
        dataplane: StreamingFakeDataPlane) -> None:
    dataplane.delays["many"] = 0.05

    async def test(stub: Any, channel: Any) -> None:
        call = stub.ModelStreamInfer()
        await call.write(infer_request("decoupled", [1.0, 2.0, 3.0], "many"))
        await call.write(infer_request("identity", [9.0], "one"))
        await call.done_writing()
        messages = [m async for m in call]
        by_id: dict[str, list[Any]] = {}
        for message in messages:
            by_id.setdefault(message.infer_response.id, []).append(message)
        assert [values_of(m) for m in by_id["many"]] == [[1.0], [2.0], [3.0]]
        assert [final_flag(m) for m in by_id["many"]] == [False, False, False]  # no empty final
        assert [(values_of(m), final_flag(m)) for m in by_id["one"]] == [([9.0], True)]
        assert messages[0].infer_response.id == "one"  # not held back by the decoupled one

    serve(dataplane, test)
    assert dataplane.live_slots == {}
    assert len([lease for lease in dataplane.released if lease]) == 4


def test_stream_sends_the_empty_final_response_only_when_asked(
        dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        call = stub.ModelStreamInfer()
        await call.write(infer_request("decoupled", [1.0], "asks",
                                       **{EMPTY_FINAL_RESPONSE: True}))
        await call.done_writing()
        messages = [m async for m in call]
        assert [(m.infer_response.id, final_flag(m)) for m in messages] == [
            ("asks", False), ("asks", True)]
        empty = messages[1].infer_response
        # Triton's: the model name and version as the request gave them (no version here)
        assert (empty.model_name, empty.model_version, len(empty.outputs)) == (
            "decoupled", "", 0)

    serve(dataplane, test)


def test_stream_errors_are_in_band_and_the_stream_stays_open(
        dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        call = stub.ModelStreamInfer()
        await call.write(infer_request("nope", [1.0], "unknown"))
        await call.write(infer_request("identity", [1.0], "bad", triton_x="1"))
        await call.write(infer_request("decoupled", [4.0, -1.0], "fails"))
        first = await collect(call, 2)
        # refused before they were issued: Triton sends the error and the id only (no
        # triton_final_response, no model name)
        assert [(m.infer_response.id, m.error_message, m.infer_response.model_name,
                 "triton_final_response" in m.infer_response.parameters) for m in first] == [
            ("unknown", "Request for unknown model: 'nope' is not found", "", False),
            ("bad", "parameter keys starting with 'triton_' are reserved for Triton usage. "
                    "Only the following keys starting with 'triton_' are allowed: "
                    "triton_enable_empty_final_response", "", False)]
        failing = await collect(call, 2)
        assert [(values_of(failing[0]), final_flag(failing[0]))] == [([4.0], False)]
        assert (failing[1].infer_response.id, failing[1].error_message,
                failing[1].infer_response.model_name, final_flag(failing[1])) == (
            "fails", "negative value", "decoupled", True)  # an error response of the model
        await call.write(infer_request("identity", [5.0], "after"))  # still open
        (after,) = await collect(call, 1)
        assert (after.infer_response.id, values_of(after)) == ("after", [5.0])
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK

    serve(dataplane, test)


def test_an_answer_that_cannot_be_encoded_ends_the_request_with_a_final_error(
        dataplane: StreamingFakeDataPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the request was issued, an error of its answer is the model's error response
    (marked final, so a client waiting for the flag stops), not a refusal."""
    monkeypatch.setattr(classification, "MAX_CLASSIFICATION_ELEMENTS", 0)

    async def test(stub: Any, channel: Any) -> None:
        call = stub.ModelStreamInfer()
        request = infer_request("decoupled", [1.0, 2.0], "top")
        request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 1
        await call.write(request)
        (error,) = await collect(call, 1)
        assert (error.infer_response.id, error.error_message, error.infer_response.model_name,
                final_flag(error)) == (
            "top", "classification output tensor too large", "decoupled", True)
        await call.write(infer_request("identity", [5.0], "after"))  # the stream goes on
        (after,) = await collect(call, 1)
        assert (after.infer_response.id, values_of(after)) == ("after", [5.0])
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK

    serve(dataplane, test)
    assert dataplane.abandoned == ["top"]  # the rest of its answers are not waited for
    assert dataplane.live_slots == {}


def test_cancelling_a_stream_cancels_its_requests(dataplane: StreamingFakeDataPlane) -> None:
    dataplane.delays["long"] = 0.2
    dataplane.delays["slow"] = 5.0

    async def test(stub: Any, channel: Any) -> None:
        call = stub.ModelStreamInfer()
        await call.write(infer_request("decoupled", [1.0, 2.0, 3.0, 4.0], "long"))
        await call.write(infer_request("identity", [1.0], "slow"))
        (first,) = await collect(call, 1)
        assert first.infer_response.id == "long"
        call.cancel()
        for _ in range(50):
            if len(dataplane.abandoned) == 2:
                break
            await asyncio.sleep(0.02)

    serve(dataplane, test)
    assert sorted(dataplane.abandoned) == ["long", "slow"]
    assert dataplane.live_slots == {}


# ------------------------------------------------------------------------ other RPCs


def test_health_and_readiness(dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert await check(b"") == b"\x08\x01"
        assert (await stub.ServerLive(pb.ServerLiveRequest())).live
        assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
        assert (await stub.ModelReady(pb.ModelReadyRequest(name="identity"))).ready
        assert not (await stub.ModelReady(pb.ModelReadyRequest(name="identity",
                                                               version="2"))).ready
        dataplane.ready = False
        assert await check(b"\x0a\x01x") == b"\x08\x02"
        assert not (await stub.ServerReady(pb.ServerReadyRequest())).ready
        dataplane.exiting = True
        error = await rpc_error(stub.ServerLive(pb.ServerLiveRequest()))
        assert (error.code(), error.details()) == (grpc.StatusCode.UNAVAILABLE,
                                                   "Server exiting")

    serve(dataplane, test)


def test_metadata_config_statistics_and_index(dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        server = await stub.ServerMetadata(pb.ServerMetadataRequest())
        assert server.name == "triton" and "statistics" in server.extensions
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="batched"))
        assert (meta.name, list(meta.versions), meta.platform) == ("batched", ["1"], "python")
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
            ("INPUT0", "INT32", [-1, 4])]
        config = (await stub.ModelConfig(pb.ModelConfigRequest(name="batched"))).config
        assert (config.name, config.max_batch_size, config.backend) == ("batched", 8, "python")
        stats = await stub.ModelStatistics(pb.ModelStatisticsRequest(name="identity"))
        assert [(s.name, s.version) for s in stats.model_stats] == [("identity", "1")]
        error = await rpc_error(stub.ModelStatistics(pb.ModelStatisticsRequest(name="nope")))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
        assert [(m.name, m.version, m.state) for m in index.models] == [
            ("batched", "1", "READY"), ("decoupled", "1", "READY"), ("identity", "1", "READY"),
            ("never_loaded", "", "")]
        ready = await stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
        assert [m.name for m in ready.models] == ["batched", "decoupled", "identity"]

    serve(dataplane, test)


def test_load_unload_are_refused_and_trace_answers(
        dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        error = await rpc_error(stub.RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name="identity")))
        assert (error.code(), error.details()) == (
            grpc.StatusCode.UNAVAILABLE,
            "explicit model load / unload is not allowed if polling is enabled")
        error = await rpc_error(stub.RepositoryModelUnload(
            pb.RepositoryModelUnloadRequest(repository_name="r", model_name="identity")))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        trace = await stub.TraceSetting(pb.TraceSettingRequest())  # no --trace-config: off
        assert list(trace.settings["trace_level"].value) == ["OFF"]

    serve(dataplane, test)


def test_system_shared_memory_goes_through_the_registry(
        dataplane: StreamingFakeDataPlane) -> None:
    async def test(stub: Any, channel: Any) -> None:
        await stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(
            name="r", key="/k", offset=8, byte_size=64))
        status = await stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
        region = status.regions["r"]
        assert (region.name, region.key, region.offset, region.byte_size) == ("r", "/k", 8, 64)
        message = infer_request("identity", [], "shm")
        del message.raw_input_contents[:]
        params = message.inputs[0].parameters
        params["shared_memory_region"].string_param = "r"
        params["shared_memory_byte_size"].int64_param = 4
        message.inputs[0].shape[:] = [1]
        output = message.outputs.add(name="OUTPUT0")
        output.parameters["shared_memory_region"].string_param = "r"
        output.parameters["shared_memory_byte_size"].int64_param = 4
        error = await rpc_error(stub.ModelInfer(message))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "used by input 'INPUT0'" in error.details()
        await stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())

    serve(dataplane, test)
    kinds = [call[0] for call in dataplane.registry.calls]
    assert kinds == ["register", "resolve_input", "release_request", "unregister"]
    assert dataplane.registry.calls[1] == ("resolve_input", "r", 0, 4, "INPUT0")
    assert dataplane.registry.calls[-1] == ("unregister", None)
    assert dataplane.live_slots == {}


def test_log_settings_are_shared_with_the_http_endpoint(
        dataplane: StreamingFakeDataPlane) -> None:
    shared = ProcessLogSettings()
    root_level = logging.getLogger().level

    async def test(stub: Any, channel: Any) -> None:
        update = pb.LogSettingsRequest()
        update.settings["log_verbose_level"].uint32_param = 1
        update.settings["log_format"].string_param = "ISO8601"
        reply = await stub.LogSettings(update)
        assert reply.settings["log_verbose_level"].uint32_param == 1
        assert reply.settings["log_info"].bool_param is True
        wrong = pb.LogSettingsRequest()
        wrong.settings["log_info"].uint32_param = 1
        error = await rpc_error(stub.LogSettings(wrong))
        assert (error.code(), error.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, "Unable to parse 'log_info': expected a boolean")
        log_file = pb.LogSettingsRequest()
        log_file.settings["log_file"].string_param = "/tmp/x"
        error = await rpc_error(stub.LogSettings(log_file))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED

    try:
        serve(dataplane, test, shared)
        settings = settings_from_flags(model_repositories=["/m"]).for_frontends()
        with TestClient(create_app(dataplane, settings, log_settings=shared)) as client:
            document = client.get("/v2/logging").json()
        assert (document["log_verbose_level"], document["log_format"]) == (1, "ISO8601")
    finally:
        logging.getLogger().setLevel(root_level)
