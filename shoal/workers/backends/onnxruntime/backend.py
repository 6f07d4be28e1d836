"""The ``onnxruntime`` backend class (see the package docstring and ``shoal/workers/backends/
base.py`` for the contract).

Load: ``<version_dir>/<default_model_filename or model.onnx>`` (a file, or a directory holding
``model.onnx`` and its external data), one ``InferenceSession`` per instance with the options
and providers of ``session_setup``; the config is checked against the graph (``config_check``).

Execute: with ``max_batch_size > 0`` the requests of a batch run as one session run (each input
joined along dim 0, zero-copy when the slices are adjacent in shared memory) and every output is
split back by each request's batch size; with ``max_batch_size == 0`` each request runs alone.
Inputs are fed by name: config inputs (``reshape`` applied), sequence control inputs
(``sequence_batching.control_input``: START / END / READY / CORRID, made by the sequence batcher
with the config's data types; ``shoal.workers.backends.sequence_controls``), sequence state
inputs (``sequence_batching.state``; the worker feeds and writes back the state tensors, so a
state is just one more graph input and output), and ragged batching's generated inputs
(``shoal.workers.ragged``, as in Triton: ``batch_input`` targets by name, ragged inputs flat).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import config_to_wire
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.messages import Error
from shoal.workers.backends.base import (
    BackendRequest,
    BackendResponse,
    InstanceContext,
    OutputTensor,
)
from shoal.workers.backends.grouped_execute import execute_grouped
from shoal.workers.backends.onnxruntime.autocomplete import (
    DEFAULT_MODEL_FILENAME,
    ort_message,
    resolve_model_path,
)
from shoal.workers.backends.onnxruntime.config_check import (
    ConfigTensor,
    check_controls,
    check_inputs,
    check_outputs,
)
from shoal.workers.backends.onnxruntime.feeds import OrtRun, as_strings, join_rows
from shoal.workers.backends.onnxruntime.graph_io import graph_tensors
from shoal.workers.backends.onnxruntime.runtime import import_onnxruntime
from shoal.workers.backends.onnxruntime.session_setup import (
    execution_providers,
    run_options,
    session_options,
)
from shoal.workers.backends.sequence_controls import control_inputs
from shoal.workers.backends.torchscript_io import IoSpec, io_spec, reshape_output
from shoal.workers.batch_assembly import split_rows
from shoal.workers.ragged import RaggedConfig

logger = logging.getLogger(__name__)

Array = npt.NDArray[Any]


class OnnxruntimeBackend:
    def __init__(self) -> None:
        self._name = ""
        self._max_batch = 0
        self._inputs: list[IoSpec] = []
        self._outputs: list[IoSpec] = []
        self._controls: list[IoSpec] = []  # sequence control inputs (sequence_controls)
        self._state_inputs: list[tuple[str, str]] = []  # (graph input, wire type)
        self._state_outputs: list[tuple[str, str]] = []  # (graph output, wire type)
        self._ragged = RaggedConfig()
        self._runner: OrtRun | None = None
        self._bf16_inputs: frozenset[str] = frozenset()
        self._state_dims: dict[str, tuple[int, ...]] = {}  # output state -> dims (no batch)
        self._input_names: list[str] = []  # every input a request brings (execute_grouped)

    # ------------------------------------------------------------------ load

    def load(self, ctx: InstanceContext) -> None:
        ort = import_onnxruntime()
        config = ctx.config
        self._name = ctx.instance_name
        self._max_batch = int(config.max_batch_size)
        self._inputs = [io_spec(io) for io in config.input]
        self._outputs = [io_spec(io) for io in config.output]
        self._controls = control_inputs(config)
        self._ragged = RaggedConfig.from_model_config(config, ctx.model_name)
        states = config.sequence_batching.state if config.HasField("sequence_batching") else []
        self._state_inputs = [(s.input_name, config_to_wire(_type_name(s.data_type)))
                              for s in states]
        self._state_outputs = [(s.output_name, config_to_wire(_type_name(s.data_type)))
                               for s in states]
        self._state_dims = {s.output_name: tuple(int(d) for d in s.dims) for s in states}
        self._input_names = ([spec.name for spec in self._inputs + self._controls]
                             + [name for name, _ in self._state_inputs])
        filename = config.default_model_filename or DEFAULT_MODEL_FILENAME
        path = resolve_model_path(os.path.join(ctx.version_dir, filename))
        if path is None:
            raise invalid_arg(f"model '{ctx.model_name}' version {ctx.model_version}: model "
                              f"file '{filename}' not found")
        options = session_options(ort, config, ctx.backend_settings,
                                  ctx.default_intra_op_threads)
        providers = execution_providers(ort, config, ctx.kind, ctx.device, ctx.device_id)
        try:
            session = ort.InferenceSession(path, sess_options=options,
                                           providers=[name for name, _ in providers],
                                           provider_options=[opts for _, opts in providers])
        except Exception as exc:
            raise invalid_arg(f"model '{ctx.model_name}': cannot load ONNX model '{filename}': "
                              f"{ort_message(exc, path)}") from None
        graph_inputs = graph_tensors(session.get_inputs())
        graph_outputs = graph_tensors(session.get_outputs())
        self._check_config(ctx.model_name, session, graph_inputs, graph_outputs)
        fed = {t.name for t in graph_inputs} | {t.name for t in graph_outputs}
        types = {t.datatype for t in [*graph_inputs, *graph_outputs] if t.name in fed}
        if "BYTES" in types and "BF16" in types:
            raise ShoalError(ErrorCode.UNSUPPORTED,
                             f"model '{ctx.model_name}': a model with both BYTES and BF16 "
                             "tensors is not supported by the onnxruntime backend")
        self._bf16_inputs = frozenset(t.name for t in graph_inputs if t.datatype == "BF16")
        self._runner = OrtRun(ort, session, run_options(ort, config), strings="BYTES" in types,
                              lend=ctx.lend_output)
        logger.info("onnxruntime instance '%s': providers %s, %d intra-op thread(s)",
                    self._name, session.get_providers(), options.intra_op_num_threads)

    def _check_config(self, model: str, session: Any, graph_inputs: Any,
                      graph_outputs: Any) -> None:
        batching = self._max_batch > 0
        ragged = self._ragged.ragged_inputs
        config_inputs = [ConfigTensor(s.name, s.datatype, None if s.name in ragged
                                      else _model_dims(s)) for s in self._inputs]
        config_inputs += [ConfigTensor(name, datatype, None)
                          for name, datatype in self._state_inputs]
        optional = graph_tensors(session.get_overridable_initializers())
        check_controls(model, self._controls, graph_inputs, optional, batching)
        check_inputs(model, config_inputs, graph_inputs, optional, batching,
                     generated=[*self._ragged.extra_input_names,
                                *(s.name for s in self._controls)])
        config_outputs = [ConfigTensor(s.name, s.datatype,
                                       None if s.name in self._ragged.scatter_outputs
                                       else _model_dims(s)) for s in self._outputs]
        config_outputs += [ConfigTensor(name, datatype, None)
                           for name, datatype in self._state_outputs
                           if name not in {s.name for s in self._outputs}]
        check_outputs(model, config_outputs, graph_outputs, batching)

    # ------------------------------------------------------------------ execute

    def execute(self, requests: list[BackendRequest]) -> list[BackendResponse | Error | None]:
        assert self._runner is not None, "execute() before load()"
        self._runner.release()
        return execute_grouped(requests, batched=self._max_batch > 0,
                               input_names=self._input_names, run=self._run,
                               runtime="onnxruntime", instance=self._name, log=logger)

    def unload(self) -> None:
        self._runner = None

    def _run(self, batch: list[BackendRequest]) -> list[BackendResponse | Error]:
        assert self._runner is not None
        batched = self._max_batch > 0
        sizes = [request.batch_size for request in batch]
        total = sum(sizes)
        if batched and total > self._max_batch:
            raise ShoalError(ErrorCode.INTERNAL, f"batch size {total} for '{self._name}', max "
                                                 f"allowed is {self._max_batch}")
        feeds: dict[str, Array] = {}
        for spec in self._inputs + self._controls:  # a control: [rows, 1] (or [1])
            feeds[spec.name] = self._input_value(spec, [r.inputs[spec.name] for r in batch],
                                                 total)
        for name, _ in self._state_inputs:
            feeds[name] = join_rows([r.inputs[name] for r in batch])
        source_shapes: list[dict[str, tuple[int, ...]]] = []
        if self._ragged.active:
            source_shapes = [{name: tuple(a.shape) for name, a in r.inputs.items()}
                             for r in batch]
            for name, _, array in self._ragged.extra_inputs(source_shapes):
                feeds[name] = np.ascontiguousarray(array)
        specs = {spec.name: spec for spec in self._outputs}
        wanted = [spec.name for spec in self._outputs]
        wanted += [name for name, _ in self._state_outputs if name not in specs]
        types = {**{s.name: s.datatype for s in self._outputs}, **dict(self._state_outputs)}
        shapes = {name: self._known_shape(specs.get(name), name, types[name], total)
                  for name in wanted}
        known = {name: (types[name], shape) for name, shape in shapes.items()
                 if shape is not None}
        produced = self._runner.run(feeds, self._bf16_inputs, wanted, known)
        pieces: dict[str, list[Array]] = {}
        for name in wanted:
            pieces[name] = self._split(specs.get(name), name, produced[name], sizes,
                                       source_shapes)
        return [BackendResponse(outputs=[OutputTensor(name, types[name], pieces[name][k])
                                         for name in wanted])
                for k in range(len(batch))]

    def _input_value(self, spec: IoSpec, arrays: list[Array], total: int) -> Array:
        if spec.name in self._ragged.ragged_inputs:
            joined = np.concatenate([a.reshape(-1) for a in arrays])
        else:
            joined = join_rows(arrays)
            if spec.reshape is not None:
                prefix = (total,) if self._max_batch > 0 else ()
                joined = joined.reshape(prefix + spec.reshape)
        if spec.datatype == "BYTES":
            return as_strings(spec.name, joined)
        return joined

    def _known_shape(self, spec: IoSpec | None, name: str, datatype: str,
                     total: int) -> tuple[int, ...] | None:
        """The full shape of output ``name`` before the run when the config fixes it (then it
        is written into a lent arena buffer), else None. A BF16 output must have one."""
        scattered = name in self._ragged.scatter_outputs
        dims = _model_dims(spec) if spec else self._state_dims.get(name)
        if datatype == "BYTES" or scattered or dims is None or any(d < 0 for d in dims):
            if datatype == "BF16":
                raise ShoalError(ErrorCode.UNSUPPORTED,
                                 f"output '{name}' is BF16 with a variable shape: the "
                                 "onnxruntime backend needs the full shape of a BF16 output "
                                 "in the config")
            return None
        return ((total,) if self._max_batch > 0 else ()) + tuple(dims)

    def _split(self, spec: IoSpec | None, name: str, array: Array, sizes: list[int],
               source_shapes: list[dict[str, tuple[int, ...]]]) -> list[Array]:
        batched = self._max_batch > 0
        scatter = self._ragged.scatter_outputs.get(name)
        if scatter is not None and spec is not None:
            parts = self._ragged.split_output(
                scatter, array, [shapes[scatter.source] for shapes in source_shapes])
            return [reshape_output(spec, part, (size,) if batched else ())
                    for part, size in zip(parts, sizes, strict=True)]
        if not batched:
            return [reshape_output(spec, array, ()) if spec else array]
        if array.ndim == 0 or array.shape[0] != sum(sizes):
            raise ShoalError(ErrorCode.INTERNAL,
                             f"output '{name}' has shape {list(array.shape)}, expected batch "
                             f"dimension {sum(sizes)}")
        parts = split_rows(array, sizes)
        if spec is None:
            return parts
        return [reshape_output(spec, part, (size,))
                for part, size in zip(parts, sizes, strict=True)]


def _model_dims(spec: IoSpec) -> tuple[int, ...]:
    """The dims the model sees (without the batch dim): ``reshape`` when given, else ``dims``."""
    return spec.reshape if spec.reshape is not None else spec.dims


def _type_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    # ValueType: int at run time, the enum's NewType in the stub (typings/)
    return str(model_config_pb2.DataType.Name(model_config_pb2.DataType.ValueType(data_type)))

