"""Building blocks for backend tests: a model directory, its InstanceContext, requests."""

from __future__ import annotations

import json
import pathlib
import textwrap
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.config.model_config import config_to_json
from shoal.dtypes import numpy_to_wire
from shoal.workers.backends.base import BackendRequest, InstanceContext


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def make_context(model_dir: pathlib.Path, pbtxt: str, *, version: int = 1,
                 settings: dict[str, str] | None = None, kind: str = "CPU",
                 device: str = "cpu") -> InstanceContext:
    config = text_format.Parse(textwrap.dedent(pbtxt), ModelConfig())
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    return InstanceContext(
        model_name=config.name, model_version=version, model_dir=str(model_dir),
        version_dir=str(model_dir / str(version)), config=config,
        config_json=json.dumps(config_to_json(config)), instance_name=f"{config.name}_0_0",
        kind=kind, device=device, device_id=0, backend_settings=settings or {})


def make_request(request_id: int, inputs: dict[str, npt.NDArray[Any]], *,
                 outputs: tuple[str, ...] = (), batch_size: int = 1,
                 datatypes: dict[str, str] | None = None,
                 parameters: dict[str, Any] | None = None) -> BackendRequest:
    types = {name: numpy_to_wire(array.dtype) for name, array in inputs.items()}
    types.update(datatypes or {})
    return BackendRequest(request_id=request_id, inputs=inputs, input_datatypes=types,
                          requested_outputs=list(outputs), parameters=parameters or {},
                          client_request_id=f"req-{request_id}", batch_size=batch_size)


def bytes_array(items: list[bytes], shape: tuple[int, ...]) -> npt.NDArray[np.object_]:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(shape)
