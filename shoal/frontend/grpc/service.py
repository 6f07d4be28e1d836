"""``inference.GRPCInferenceService``: every RPC of Triton's service over one DataPlane.

Documents are built by the same code as the HTTP endpoint (``http/documents.py``) and turned into
the protobuf messages with ``json_format.ParseDict``, so both protocols report the same metadata,
statistics and repository index. Behaviour matches the HTTP endpoint: load/unload refused unless
``--model-control-mode=explicit``, the logging settings are the process's (shared with HTTP), as
the trace settings and sampling (``TraceSetting``: the HTTP trace extension's semantics, an empty
value list clears a setting), shared-memory RPCs (system and CUDA) go to the DataPlane's
registry with the HTTP endpoint's checks and texts.

Threads: grpc.aio runs every method on the frontend's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from shoal.config.model_config_json import config_from_json
from shoal.errors import ShoalError, invalid_arg, unavailable
from shoal.frontend.core import documents, model_lookup
from shoal.frontend.core.header_forward import compile_pattern
from shoal.frontend.core.model_control import ModelControl, require_model_control
from shoal.frontend.core.model_lookup import check_trace_model
from shoal.frontend.cuda_shm import CUDA_SHM_NO_DEVICE as CUDA_SHM_NO_DEVICE
from shoal.frontend.cuda_shm import register_cuda_region
from shoal.frontend.grpc.convert import parameter_value
from shoal.frontend.grpc.inference import GrpcInference
from shoal.frontend.grpc.status import INTERNAL_ERROR_MESSAGE, abort, guarded
from shoal.settings import FrontendSettings
from shoal.trace.config import TraceConfig
from shoal.trace.sampling import Tracer
from shoal.trace.values import parse_grpc_change

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.frontend.core.log_settings import ProcessLogSettings

SERVER_EXITING: Final = "Server exiting"

logger = logging.getLogger(__name__)


class InferenceServicer:
    """Registered with ``handlers.add_inference_service``. Method
    names are the RPC names."""

    def __init__(self, dataplane: DataPlane, settings: FrontendSettings,
                 log_settings: ProcessLogSettings, tracer: Tracer | None = None) -> None:
        self.dataplane = dataplane
        self.settings = settings
        self.log_settings = log_settings
        self.tracer = tracer or Tracer(TraceConfig.from_triples(settings.trace_config))
        self.inference = GrpcInference(dataplane, self.tracer,
                                       compile_pattern(settings.grpc.header_forward_pattern))
        self.model_control = dataplane if isinstance(dataplane, ModelControl) else None

    # ---------------------------------------------------------------- health and metadata

    @guarded
    async def ServerLive(self, request: Any, context: Any) -> Any:
        if self.dataplane.is_exiting():
            raise unavailable(SERVER_EXITING)
        return pb.ServerLiveResponse(live=self.dataplane.is_live())

    @guarded
    async def ServerReady(self, request: Any, context: Any) -> Any:
        if self.dataplane.is_exiting():
            raise unavailable(SERVER_EXITING)
        return pb.ServerReadyResponse(ready=self.dataplane.is_ready())

    @guarded
    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = self.dataplane.model_ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @guarded
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        document = documents.server_metadata(self.model_control is not None,
                                             self.settings.server_id)
        return json_format.ParseDict(document, pb.ServerMetadataResponse())

    @guarded
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        version = request.version or None
        model = self.dataplane.model(request.name, version)
        versions = [model.version] if version is not None else (
            self.dataplane.ready_versions(request.name) or [model.version])
        document = documents.model_metadata(model, versions)
        return json_format.ParseDict(document, pb.ModelMetadataResponse())

    @guarded
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        model = self.dataplane.model(request.name, request.version or None)
        return pb.ModelConfigResponse(config=config_from_json(model.config_json))

    # ---------------------------------------------------------------- inference

    @guarded
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self.inference.model_infer(request, context)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        """Errors of single requests go in-band; the stream itself never fails over them (a
        bug ends it as INTERNAL "internal error", logged)."""
        try:
            await self.inference.model_stream_infer(requests, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            logger.error("unexpected error in gRPC ModelStreamInfer", exc_info=exc)
            await abort(context, grpc.StatusCode.INTERNAL, INTERNAL_ERROR_MESSAGE)

    # ---------------------------------------------------------------- statistics and repository

    @guarded
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        version = model_lookup.stats_version(request.version)
        reply = await self.dataplane.stats(request.name, version)
        if reply.error is not None:
            raise ShoalError(reply.error.code, reply.error.message)
        document = documents.model_statistics(reply.models, extensions=False)
        return json_format.ParseDict(document, pb.ModelStatisticsResponse())

    @guarded
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        index = documents.repository_index(self.dataplane.snapshot, request.ready)
        return json_format.ParseDict({"models": index}, pb.RepositoryIndexResponse())

    def _control(self, repository_name: str) -> ModelControl:
        return require_model_control(self.settings, self.model_control, bool(repository_name))

    @guarded
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        control = self._control(request.repository_name)
        await control.load_model(request.model_name, _load_parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @guarded
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        control = self._control(request.repository_name)
        dependents = False
        param = request.parameters.get("unload_dependents")
        if param is not None:
            if param.WhichOneof("parameter_choice") != "bool_param":
                raise invalid_arg("Unable to parse 'unload_dependents': expected a boolean")
            dependents = param.bool_param
        await control.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # ---------------------------------------------------------------- shared memory

    @guarded
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        reply = pb.SystemSharedMemoryStatusResponse()
        for region in self.dataplane.shared_memory.status(request.name or None):
            status = reply.regions[region.name]
            status.name, status.key = region.name, region.key
            status.offset, status.byte_size = region.offset, region.byte_size
        return reply

    @guarded
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self.dataplane.shared_memory.register(request.name, request.key, request.offset,
                                              request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @guarded
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self.dataplane.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @guarded
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        reply = pb.CudaSharedMemoryStatusResponse()
        for region in self.dataplane.shared_memory.cuda_status(request.name or None):
            status = reply.regions[region.name]
            status.name, status.device_id = region.name, region.device_id
            status.byte_size = region.byte_size
        return reply

    @guarded
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await register_cuda_region(self.dataplane.shared_memory, self.settings, request.name,
                                   request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @guarded
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self.dataplane.shared_memory.cuda_unregister(request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---------------------------------------------------------------- trace and logging

    @guarded
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        check_trace_model(self.dataplane, request.model_name)
        if request.settings:
            change = parse_grpc_change({key: list(setting.value)
                                        for key, setting in request.settings.items()})
            document = self.tracer.update(request.model_name, change)
        else:
            document = self.tracer.settings(request.model_name)
        reply = pb.TraceSettingResponse()
        for key, value in document.items():
            reply.settings[key].value.extend(value if isinstance(value, list) else [value])
        return reply

    @guarded
    async def LogSettings(self, request: Any, context: Any) -> Any:
        # the HTTP endpoint's validation and messages: a value of the wrong kind is refused
        # there just as a JSON value of the wrong type is
        changes = {key: parameter_value(value) for key, value in request.settings.items()}
        current = self.log_settings.update(changes) if changes else self.log_settings.current
        reply = pb.LogSettingsResponse()
        for key, value in current.as_json().items():
            setting = reply.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return reply


def _load_parameters(parameters: Mapping[str, Any]) -> dict[str, str | bytes]:
    """RepositoryModelLoad parameters: ``config`` (string) and ``file:<path>`` (bytes), as the
    HTTP endpoint passes them to ModelControl."""
    loaded: dict[str, str | bytes] = {}
    for key, param in parameters.items():
        kind = param.WhichOneof("parameter_choice")
        if kind == "string_param":
            loaded[key] = param.string_param
        elif kind == "bytes_param" and key.startswith("file:"):
            loaded[key] = param.bytes_param
        else:
            raise invalid_arg(f"Unable to parse parameter '{key}': expected a string")
    return loaded
