"""The ``openvino`` backend class (see the package docstring and ``shoal/workers/backends/
base.py`` for the contract).

Load: ``<version_dir>/<default_model_filename or model.xml>`` (an IR ``model.xml`` with its
``model.bin`` beside it, or any format OpenVINO reads, e.g. ``model.onnx``) is read by an
``ov.Core``, fitted to the config (``model_setup``), compiled for the CPU with the config's
properties (``parameters``) and given one infer request. Only KIND_CPU instances, as in Triton.
A sequence model's declared control inputs (``sequence_batching.control_input``; see
``sequence_controls``) are model inputs too: counted, checked (dims ``[1]`` exactly, after a
batch dim of -1 when batching, as Triton's onnxruntime backend checks them) and fed like config
inputs. Triton's openvino backend counts only the config's inputs, so it refuses such a model
("configuration expects 1 inputs, model provides 3") and fails every request of one whose model
lacks them; shoal serves the first and refuses the second at load.

Execute: with ``max_batch_size > 0`` the requests of a batch run as one inference (each input
joined along dim 0, zero-copy when the slices are adjacent in shared memory) and every output
is split back by each request's batch size; with ``max_batch_size == 0`` each request runs
alone. With ``SKIP_OV_DYNAMIC_BATCHSIZE`` the model takes exactly ``max_batch_size`` rows: a
smaller batch is padded with zero rows (``ENABLE_BATCH_PADDING: YES``; the padded rows' outputs
are dropped) or refused with Triton's message.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.messages import Error
from shoal.workers.backends.base import (
    BackendRequest,
    BackendResponse,
    InstanceContext,
    OutputTensor,
)
from shoal.workers.backends.grouped_execute import execute_grouped
from shoal.workers.backends.onnxruntime.feeds import join_rows
from shoal.workers.backends.openvino.infer import OvRun
from shoal.workers.backends.openvino.model_setup import prepare_model
from shoal.workers.backends.openvino.parameters import OpenvinoOptions, openvino_options
from shoal.workers.backends.openvino.runtime import import_openvino, openvino_message
from shoal.workers.backends.sequence_controls import control_inputs
from shoal.workers.backends.torchscript_io import IoSpec, io_spec, reshape_output
from shoal.workers.batch_assembly import split_rows

logger = logging.getLogger(__name__)

Array = npt.NDArray[Any]
DEFAULT_MODEL_FILENAME = "model.xml"


def supported_properties(core: Any, properties: dict[str, Any], model: str) -> dict[str, Any]:
    """The ``properties`` the installed CPU plugin supports; each other one is logged as
    ignored (OpenVINO 2025+'s CPU plugin dropped COMPILATION_NUM_THREADS, which Triton sets)."""
    supported = set(core.get_property("CPU", "SUPPORTED_PROPERTIES"))
    for key in sorted(set(properties) - supported):
        logger.warning("model '%s': this OpenVINO's CPU plugin does not support %s; ignored",
                       model, key)
    return {key: value for key, value in properties.items() if key in supported}


class OpenvinoBackend:
    def __init__(self) -> None:
        self._name = ""
        self._max_batch = 0
        self._inputs: list[IoSpec] = []  # config inputs, then sequence control inputs
        self._outputs: list[IoSpec] = []
        self._options = OpenvinoOptions()
        self._runner: OvRun | None = None
        # what OpenVINO compiled with (NUM_STREAMS, INFERENCE_NUM_THREADS, PERFORMANCE_HINT)
        self.compiled_properties: dict[str, str] = {}

    # ------------------------------------------------------------------ load

    def load(self, ctx: InstanceContext) -> None:
        ov = import_openvino()
        config = ctx.config
        if ctx.kind != "CPU":
            raise invalid_arg(f"unable to load model '{ctx.model_name}', the openvino backend "
                              "supports only CPU device (instance_group kind KIND_CPU)")
        self._name = ctx.instance_name
        self._max_batch = int(config.max_batch_size)
        controls = control_inputs(config)
        self._inputs = [io_spec(io) for io in config.input] + controls
        self._outputs = [io_spec(io) for io in config.output]
        self._options = openvino_options(config, ctx.default_intra_op_threads)
        filename = config.default_model_filename or DEFAULT_MODEL_FILENAME
        path = os.path.join(ctx.version_dir, filename)
        if not os.path.exists(path):
            raise ShoalError(ErrorCode.UNAVAILABLE,
                             f"unable to find '{os.path.join(str(ctx.model_version), filename)}'"
                             f" for model '{ctx.model_name}'")
        core = ov.Core()
        if self._options.cpu_extension_path:
            try:
                core.add_extension(self._options.cpu_extension_path)
            except Exception as exc:
                raise invalid_arg(f"model '{ctx.model_name}': cannot load CPU_EXTENSION_PATH: "
                                  f"{openvino_message(exc)}") from None
        try:
            model = core.read_model(path)
        except Exception as exc:
            raise invalid_arg(f"model '{ctx.model_name}': cannot read OpenVINO model "
                              f"'{filename}': {openvino_message(exc, path)}") from None
        model = prepare_model(ov, model, ctx.model_name, self._inputs, self._outputs,
                              self._max_batch, self._options,
                              controls={spec.name for spec in controls})
        try:  # on the core's CPU device, as Triton sets them
            core.set_property("CPU", supported_properties(core, self._options.compile_properties,
                                                          ctx.model_name))
        except Exception as exc:
            raise invalid_arg(f"model '{ctx.model_name}': invalid OpenVINO parameters: "
                              f"{openvino_message(exc)}") from None
        try:
            compiled = core.compile_model(model, "CPU")
        except Exception as exc:
            raise invalid_arg(f"model '{ctx.model_name}': cannot compile the model for the "
                              f"CPU: {openvino_message(exc, path)}") from None
        self._runner = OvRun(ov, compiled.create_infer_request(), lend=ctx.lend_output)
        self.compiled_properties = {key: str(compiled.get_property(key)) for key in
                                    ("NUM_STREAMS", "INFERENCE_NUM_THREADS", "PERFORMANCE_HINT")}
        logger.info("openvino instance '%s': %s", self._name, self.compiled_properties)

    # ------------------------------------------------------------------ execute

    def execute(self, requests: list[BackendRequest]) -> list[BackendResponse | Error | None]:
        assert self._runner is not None, "execute() before load()"
        self._runner.release()
        return execute_grouped(requests, batched=self._max_batch > 0,
                               input_names=[spec.name for spec in self._inputs], run=self._run,
                               runtime="openvino", instance=self._name, log=logger,
                               describe=openvino_message)

    def unload(self) -> None:
        self._runner = None

    def _run(self, batch: list[BackendRequest]) -> list[BackendResponse | Error]:
        assert self._runner is not None
        batched = self._max_batch > 0
        sizes = [request.batch_size for request in batch] if batched else [1]
        total = sum(sizes)
        if batched and total > self._max_batch:
            raise ShoalError(ErrorCode.INTERNAL, f"batch size {total} for '{self._name}', max "
                                                 f"allowed is {self._max_batch}")
        padding = self._padding(total) if batched else 0
        feeds = {spec.name: self._input_value(spec, [r.inputs[spec.name] for r in batch],
                                              total, padding)
                 for spec in self._inputs}
        known = {} if padding or self._options.skip_dynamic_batch_size else {
            spec.name: (spec.datatype, shape) for spec in self._outputs
            if (shape := self._known_shape(spec, total)) is not None}
        produced = self._runner.run(feeds, [spec.name for spec in self._outputs], known)
        pieces = {spec.name: self._split(spec, produced[spec.name], sizes, padding)
                  for spec in self._outputs}
        return [BackendResponse(outputs=[OutputTensor(spec.name, spec.datatype,
                                                      pieces[spec.name][k])
                                         for spec in self._outputs])
                for k in range(len(batch))]

    def _padding(self, total: int) -> int:
        """Zero rows to add so a static-batch model (SKIP_OV_DYNAMIC_BATCHSIZE) gets exactly
        ``max_batch_size`` rows; 0 for a dynamic batch."""
        if not self._options.skip_dynamic_batch_size or total == self._max_batch:
            return 0
        if not self._options.enable_batch_padding:
            raise ShoalError(ErrorCode.INTERNAL,
                             f"expected requests with batch size '{self._max_batch}', got "
                             f"'{total}'... this error can be avoided by setting "
                             "'ENABLE_BATCH_PADDING' parameter in model configuration to "
                             "'YES' at a performance cost.")
        return self._max_batch - total

    def _input_value(self, spec: IoSpec, arrays: list[Array], total: int,
                     padding: int) -> Array:
        joined = join_rows(arrays)
        if spec.reshape is not None:
            prefix = (total,) if self._max_batch > 0 else ()
            joined = joined.reshape(prefix + spec.reshape)
        if padding:
            padded = np.zeros((total + padding, *joined.shape[1:]), dtype=joined.dtype)
            padded[:total] = joined
            return padded
        return joined

    def _known_shape(self, spec: IoSpec, total: int) -> tuple[int, ...] | None:
        """The full shape of output ``spec`` before the run when the config fixes it (it is
        then written into a lent arena buffer), else None."""
        dims = spec.reshape if spec.reshape is not None else spec.dims
        if any(d < 0 for d in dims):
            return None
        return ((total,) if self._max_batch > 0 else ()) + tuple(dims)

    def _split(self, spec: IoSpec, array: Array, sizes: list[int], padding: int) -> list[Array]:
        if self._max_batch == 0:
            return [reshape_output(spec, array, ())]
        total = sum(sizes)
        if array.ndim == 0 or array.shape[0] != total + padding:
            raise ShoalError(ErrorCode.INTERNAL,
                             f"expected the batch size of openvino model output "
                             f"'{spec.name}' to be {total + padding}, got "
                             f"{list(array.shape)[:1] or 'a scalar'}")
        parts = split_rows(array[:total], sizes)
        return [reshape_output(spec, part, (size,))
                for part, size in zip(parts, sizes, strict=True)]
