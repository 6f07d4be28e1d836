"""The ``pytorch`` backend (Triton platforms ``pytorch_libtorch`` and ``torch_aoti``): a
TorchScript file, a PyTorch 2 exported program or an AOTInductor package (``program.py``).

Load: ``<version_dir>/<default_model_filename>``; when that is the default ``model.pt`` and
absent, ``model.pt2``. The file's content picks the loader (``program.load_program``).
Inputs reach ``forward()`` by Triton's pytorch_backend rules: when every input name is a
``forward()`` argument name, by name; else when every name is ``<name>__<index>``, by index; else in
config order. A ``forward(self, inputs: Dict[str, Tensor])`` gets a dict keyed by input name.
Outputs are matched by ``<name>__<index>`` when every output name has that form, else by config
order (each checked and cut per request in ``outputs.py``). BYTES inputs are passed as
``List[str]``; ``List[str]`` outputs become BYTES. Sequence
models also get their control and implicit-state inputs and return their state outputs
(``sequence_io``: the tensors, their order and the naming rule). An exported program of a
batching model must have a dynamic dim 0 on every batched input (checked at load).

Batching: when ``max_batch_size > 0`` each input is concatenated along dim 0 across the requests of
a batch (zero-copy on CPU when the request slices are adjacent in shared memory and average at
least ``ZERO_COPY_MIN_BYTES``, else one copy into the workspace pool), the model runs once, and
every output is split back by each request's batch size. With ``max_batch_size == 0`` each request
runs on its own. On an accelerator the inputs are copied host->device into the workspace pool, so
the hot path allocates no device memory for inputs. Ownership: a CPU model that modifies its inputs
in place modifies the caller's shared memory (zero-copy); outputs that alias the inputs are copied,
outputs that alias the workspace are valid until the next ``execute`` (the worker copies them
before that). CUDA shared memory: device-tensor inputs on a CUDA instance and outputs kept on the
device, see ``torch_device``.

Ragged batching (``shoal.workers.ragged``, as Triton's pytorch_backend): an input with
``allow_ragged_batch`` reaches ``forward()`` as the 1-D concatenation of the requests' elements
(or padded, with a mask input, in shoal's padding mode); every ``batch_input`` target is one more
model input, after the config inputs in config order (Triton's index rule), then the padding
mask; a ``batch_output`` target is cut per request by the shape of its source input.

Settings: config parameters ``INTRA_OP_THREAD_COUNT`` / ``INTER_OP_THREAD_COUNT`` /
``INFERENCE_MODE`` / ``DISABLE_OPTIMIZED_EXECUTION`` (as in Triton), backend settings
``intra-op-thread-count``, ``inter-op-thread-count`` and ``workspace-bytes``. Without an
intra-op count a CPU instance gets the server's thread policy (``ctx.default_intra_op_threads``,
``shoal/broker/thread_policy.py``); a count of 0 keeps torch's own default (all cores).
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import torch_dtype
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.messages import Error
from shoal.workers.backends import torch_device
from shoal.workers.backends.base import (
    BackendRequest,
    BackendResponse,
    InstanceContext,
    OutputTensor,
)
from shoal.workers.backends.pytorch.outputs import output_array, request_pieces
from shoal.workers.backends.pytorch.program import (
    PT2_FILENAME,
    TORCHSCRIPT_FILENAME,
    LoadedProgram,
    file_format,
    load_program,
    static_batch_inputs,
)
from shoal.workers.backends.pytorch.sequence_io import sequence_tensors
from shoal.workers.backends.torch_threads import apply_intra_op_threads, non_negative_int
from shoal.workers.backends.torchscript_io import (
    IoSpec,
    flatten_outputs,
    input_positions,
    io_spec,
    output_positions,
)
from shoal.workers.batch_assembly import adjacent_view, copy_rows
from shoal.workers.device_regions import is_torch_tensor
from shoal.workers.ragged import RaggedConfig
from shoal.workers.ragged_tensors import pad_ragged, padded_shape
from shoal.workers.workspace import WorkspacePool, pytorch_workspace_bytes

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

Array = npt.NDArray[Any]

# Proving that a batch's request arrays lie back to back costs ~1.5-2.5 us per array (an address
# each and the checks); copying them costs ~0.1 us per KiB. Requests whose arrays average fewer
# bytes than this are joined by a copy into the workspace without trying the zero-copy view.
ZERO_COPY_MIN_BYTES = 16 * 1024


class PytorchBackend:
    def __init__(self) -> None:
        self._module: Any = None
        self._torch: Any = None
        self._name = ""
        self._max_batch = 0
        self._inputs: list[IoSpec] = []
        self._outputs: list[IoSpec] = []  # config outputs, then state outputs (sequence_io)
        self._sequence_inputs: list[IoSpec] = []  # control and state inputs (sequence_io)
        self._ragged = RaggedConfig()
        self._input_names: list[str] = []  # config inputs, then generated (ragged) inputs
        self._input_pos: dict[str, int] = {}
        self._output_pos: dict[str, int] = {}
        self._dict_input = False
        self._grad_mode: Any = None
        self._workspace: WorkspacePool | None = None
        self._torch_dtypes: dict[str, Any] = {}
        self._device: Any = None
        self._device_inputs: frozenset[str] = frozenset()
        self.zero_copy_min_bytes = ZERO_COPY_MIN_BYTES

    def load(self, ctx: InstanceContext) -> None:
        import torch

        self._torch = torch
        config = ctx.config
        self._name = ctx.instance_name
        self._max_batch = int(config.max_batch_size)
        self._inputs = [io_spec(io) for io in config.input]
        _check_supported(config, ctx.model_name)
        sequence = sequence_tensors(config)
        self._sequence_inputs = sequence.inputs
        self._outputs = [io_spec(io) for io in config.output] + sequence.state_outputs
        self._ragged = RaggedConfig.from_model_config(config, ctx.model_name)
        self._input_names = ([spec.name for spec in self._inputs + self._sequence_inputs]
                             + self._ragged.extra_input_names)
        params = {key: value.string_value for key, value in config.parameters.items()}
        threads = apply_intra_op_threads(torch, params, ctx.backend_settings,
                                         ctx.default_intra_op_threads)
        logger.info("pytorch instance '%s': %d intra-op thread(s)", ctx.instance_name, threads)
        _configure_torch(torch, params, ctx.backend_settings)
        filename = _model_filename(ctx.version_dir, config.default_model_filename)
        path = os.path.join(ctx.version_dir, filename)
        if not os.path.isfile(path):
            raise invalid_arg(f"model '{ctx.model_name}' version {ctx.model_version}: model "
                              f"file '{filename}' not found")
        self._device = torch.device(ctx.device)
        self._device_inputs = torch_device.device_input_names(
            self._device, [(s.name, s.datatype) for s in self._inputs], self._ragged.ragged_inputs)
        try:
            program = load_program(torch, path, self._device)
        except ShoalError as exc:
            raise invalid_arg(f"model '{ctx.model_name}': {exc.message}") from None
        except Exception as exc:
            raise invalid_arg(f"model '{ctx.model_name}': cannot load {file_format(path).value} "
                              f"'{filename}': {_last_line(exc)}") from None
        self._module = program.module
        self._map_inputs(ctx.model_name, (program.arg_names, program.dict_input))
        self._check_batch_dims(ctx.model_name, program)
        self._output_pos = output_positions([spec.name for spec in self._outputs])
        self._torch_dtypes = {spec.name: torch_dtype(spec.datatype) for spec in self._outputs
                              if spec.datatype != "BYTES"}
        inference_mode = params.get("INFERENCE_MODE", "true").lower() != "false"
        self._grad_mode = torch.inference_mode if inference_mode else torch.no_grad
        self._workspace = WorkspacePool(ctx.device, self._workspace_bytes(ctx))
        # Shared-memory input views may be read-only; torch only warns about it (the model must
        # not write its inputs, see the module docstring).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def execute(self, requests: list[BackendRequest]) -> list[BackendResponse | Error | None]:
        assert self._workspace is not None, "execute() before load()"
        self._workspace.reset()
        results: list[BackendResponse | Error | None] = [
            self._check_request(request) for request in requests]
        runnable = [index for index, problem in enumerate(results) if problem is None]
        groups = [runnable] if self._max_batch > 0 else [[i] for i in runnable]
        for group in groups:
            if group:
                outcome = self._run_group([requests[i] for i in group])
                for index, result in zip(group, outcome, strict=True):
                    results[index] = result
        return [result for result in results if result is not None]

    def takes_device_input(self, name: str) -> bool:
        """Backend option (see base.py): True for non-BYTES, non-ragged inputs on CUDA."""
        return name in self._device_inputs

    def unload(self) -> None:
        try:
            self._module = None
            self._workspace = None
            if self._torch is not None and self._torch.cuda.is_available():
                self._torch.cuda.empty_cache()
        except Exception:
            logger.exception("unloading pytorch model instance '%s' failed", self._name)

    def _map_inputs(self, model_name: str, forward: tuple[list[str], bool]) -> None:
        names, is_dict = forward
        self._dict_input = is_dict
        if is_dict:
            return
        if not names:  # an AOTInductor package records no argument names
            names = [f"arg{i}" for i in range(len(self._input_names))]
        if len(names) != len(self._input_names):
            raise invalid_arg(f"unable to load model '{model_name}', configuration expects "
                              f"{len(self._input_names)} inputs, model provides {len(names)}")
        self._input_pos = input_positions(self._input_names, names)
        if sorted(self._input_pos.values()) != list(range(len(names))):
            raise invalid_arg(f"model '{model_name}': input names {sorted(self._input_pos)} do "
                              f"not map one-to-one onto the {len(names)} forward() arguments")

    def _check_batch_dims(self, model_name: str, program: LoadedProgram) -> None:
        """A batching model's exported program must take any batch size: refuse one whose
        batched inputs were exported with a fixed dim 0 (no ``dynamic_shapes`` for it)."""
        if self._max_batch <= 0 or self._dict_input or program.batch_dims is None:
            return  # TorchScript and AOTInductor packages: dims not recorded
        arg_names = program.arg_names
        batched = [arg_names[self._input_pos[spec.name]]
                   for spec in self._inputs + self._sequence_inputs
                   if spec.name not in self._ragged.ragged_inputs]
        fixed = static_batch_inputs(program, batched)
        if fixed:
            raise invalid_arg(
                f"model '{model_name}': max_batch_size is {self._max_batch} but the exported "
                f"program fixes dim 0 of input(s) {fixed}; export it with dynamic_shapes "
                "marking dim 0 as a torch.export.Dim (or set max_batch_size: 0)")

    def _workspace_bytes(self, ctx: InstanceContext) -> int:
        return pytorch_workspace_bytes(ctx.config, ctx.backend_settings,
                                       on_cpu=self._device.type == "cpu")

    def _check_request(self, request: BackendRequest) -> Error | None:
        for spec in self._inputs:
            array = request.inputs.get(spec.name)
            if array is None:
                return Error(ErrorCode.INVALID_ARG, f"input '{spec.name}' is missing")
            if self._max_batch > 0 and (array.ndim == 0 or array.shape[0] != request.batch_size):
                return Error(ErrorCode.INVALID_ARG,
                             f"input '{spec.name}' has shape {list(array.shape)}, expected batch "
                             f"dimension {request.batch_size}")
        return None

    def _run_group(self, batch: list[BackendRequest]) -> list[BackendResponse | Error]:
        try:
            with self._grad_mode():
                return self._run(batch)
        except ShoalError as exc:
            return [Error(exc.code, exc.message)] * len(batch)
        except Exception as exc:
            logger.exception("pytorch model instance '%s' failed on %d request(s)",
                             self._name, len(batch))
            error = Error(ErrorCode.INTERNAL, f"PyTorch execute failure: {_last_line(exc)}")
            return [error] * len(batch)

    def _run(self, batch: list[BackendRequest]) -> list[BackendResponse | Error]:
        batched = self._max_batch > 0
        sizes = [request.batch_size for request in batch]
        total = sum(sizes)
        if batched and total > self._max_batch:
            raise ShoalError(ErrorCode.INTERNAL, f"batch size {total} for '{self._name}', max "
                                                 f"allowed is {self._max_batch}")
        shared: list[Array] = []  # zero-copy input views: the memory an output must not alias
        values = [self._input_value(spec, [r.inputs[spec.name] for r in batch], total, shared)
                  for spec in self._inputs + self._sequence_inputs]
        source_shapes: list[dict[str, tuple[int, ...]]] = []
        if self._ragged.active:
            source_shapes = [{name: tuple(a.shape) for name, a in r.inputs.items()}
                             for r in batch]
            values += [self._assemble([array], datatype) for _, datatype, array
                       in self._ragged.extra_inputs(source_shapes)]
        outputs = self._forward(values)
        on_device = torch_device.device_output_names(self._device, batch,
                                                     self._ragged.scatter_outputs)
        pieces: dict[str, list[Array]] = {}
        for spec in self._outputs:
            position = self._output_pos[spec.name]
            if position >= len(outputs):
                raise ShoalError(ErrorCode.INVALID_ARG,
                                 f"The output {spec.name} in the model configuration refers to "
                                 "an output index which doesn't exist. This model has "
                                 f"{len(outputs)} outputs")
            array = self._output_array(spec, outputs[position], shared, spec.name in on_device)
            pieces[spec.name] = request_pieces(spec, array, sizes, batched=batched,
                                               ragged=self._ragged, source_shapes=source_shapes)
        if len(self._outputs) == 1:  # the common model: one output, one list of pieces
            name, datatype = self._outputs[0].name, self._outputs[0].datatype
            return [BackendResponse([OutputTensor(name, datatype, part)])
                    for part in pieces[name]]
        return [BackendResponse(outputs=[OutputTensor(spec.name, spec.datatype,
                                                      pieces[spec.name][k])
                                         for spec in self._outputs])
                for k in range(len(batch))]

    def _input_value(self, spec: IoSpec, arrays: list[Array], total: int,
                     shared: list[Array]) -> Any:
        ragged = spec.name in self._ragged.ragged_inputs
        if ragged:
            arrays = self._ragged_arrays(arrays)
        if spec.datatype == "BYTES":
            flat = np.concatenate([a.reshape(-1) for a in arrays])
            return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                    for x in flat.tolist()]
        tensor = self._assemble(arrays, spec.datatype, shared)
        if spec.reshape is not None and not ragged:
            prefix = (total,) if self._max_batch > 0 else ()
            tensor = tensor.reshape(prefix + spec.reshape)
        return tensor

    def _ragged_arrays(self, arrays: list[Array]) -> list[Array]:
        """A ragged input's request arrays as ``_assemble`` joins them: flattened (Triton), or
        one array padded to the batch's largest dims (padding mode; in the workspace on CPU)."""
        if self._ragged.padding is None:
            return [array.reshape(-1) for array in arrays]
        out = None
        if self._device.type == "cpu" and not arrays[0].dtype.hasobject:
            assert self._workspace is not None
            shape = padded_shape([tuple(array.shape) for array in arrays])
            out = self._workspace.take_numpy(arrays[0].dtype, shape)
        return [pad_ragged(arrays, out=out)]

    def _assemble(self, arrays: list[Any], datatype: str, shared: list[Array] | None = None
                  ) -> Any:
        """One tensor on the instance's device holding the rows of ``arrays`` (numpy arrays
        and/or torch tensors) in order. A zero-copy view of the arrays' own (request) memory is
        appended to ``shared``; a copy (into the workspace or onto the device) is not."""
        torch = self._torch
        assert self._workspace is not None
        if self._device.type != "cpu" or any(
                type(a) is not np.ndarray and is_torch_tensor(a) for a in arrays):
            return torch_device.assemble_on_device(torch, arrays, datatype, self._device,
                                                   self._workspace)
        joined = None
        if len(arrays) == 1 or sum(a.nbytes for a in arrays) >= (
                len(arrays) * self.zero_copy_min_bytes):
            joined = adjacent_view(arrays)
        if joined is not None:
            if shared is not None:
                shared.append(joined)
        else:
            shape = (sum(int(a.shape[0]) for a in arrays), *arrays[0].shape[1:])
            joined = copy_rows(arrays, out=self._workspace.take_numpy(arrays[0].dtype, shape))
        tensor = torch.from_numpy(joined)
        return tensor.view(torch.bfloat16) if datatype == "BF16" else tensor

    def _forward(self, values: list[Any]) -> list[Any]:
        if self._dict_input:
            result = self._module(dict(zip(self._input_names, values, strict=True)))
        else:
            ordered: list[Any] = [None] * len(values)
            for name, value in zip(self._input_names, values, strict=True):
                ordered[self._input_pos[name]] = value
            result = self._module(*ordered)
        return flatten_outputs(self._torch, result)

    def _output_array(self, spec: IoSpec, value: Any, sources: list[Array],
                      on_device: bool = False) -> Array:
        """The checked output as a host array (a torch tensor when ``on_device``), by this
        instance's config (``outputs.output_array``)."""
        return output_array(self._torch, spec, value, sources,
                            expected_dtype=self._torch_dtypes.get(spec.name),
                            batched=self._max_batch > 0, on_device=on_device)


def _model_filename(version_dir: str, configured: str) -> str:
    """``default_model_filename``; when that is the TorchScript default (or unset) and absent,
    ``model.pt2`` if the version holds one (a PyTorch 2 program)."""
    filename = configured or TORCHSCRIPT_FILENAME
    absent = not os.path.exists(os.path.join(version_dir, filename))
    if filename == TORCHSCRIPT_FILENAME and absent \
            and os.path.isfile(os.path.join(version_dir, PT2_FILENAME)):
        return PT2_FILENAME
    return filename


def _check_supported(config: ModelConfig, model_name: str) -> None:
    if not config.input:
        raise invalid_arg(f"model '{model_name}': model configuration must contain at least one "
                          "input, none were specified.")
    if not config.output:
        raise invalid_arg(f"model '{model_name}': model configuration must contain at least one "
                          "output, none were specified.")


def _configure_torch(torch: Any, params: dict[str, str], settings: dict[str, str]) -> None:
    inter = params.get("INTER_OP_THREAD_COUNT") or settings.get("inter-op-thread-count")
    if inter and non_negative_int(inter, "inter-op-thread-count") > 0:
        try:
            torch.set_num_interop_threads(int(inter))
        except RuntimeError:
            logger.warning("inter-op thread count can only be set once per process; ignored")
    if params.get("DISABLE_OPTIMIZED_EXECUTION", "").lower() == "true":
        torch._C._set_graph_executor_optimize(False)


def _last_line(exc: BaseException) -> str:
    """The last non-empty line of an exception's text: TorchScript errors carry a multi-line
    TorchScript traceback (with source file names) before the actual message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
