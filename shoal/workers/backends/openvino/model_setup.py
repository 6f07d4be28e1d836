"""Fitting a read OpenVINO model to its config at load, as Triton's openvino backend does
(``ValidateInputs`` / ``ValidateOutputs``), with its messages:

- the config has exactly as many inputs as the model; every config input and output names a
  model tensor (any of its names);
- the config's data type is the one the server feeds and reads: when it differs from the
  model's element type, OpenVINO converts (a pre/post-processing step, as in Triton);
- shapes: the config's dims (``reshape`` when given) must fit the model's, a model dim of -1
  taking any size; ``RESHAPE_IO_LAYERS: YES`` instead reshapes the model's inputs to the config's
  dims (-1 = any size). A sequence control input must have dims ``[1]`` exactly (after a batch
  dim of -1 when batching; ``sequence_controls.check_control``), its data type converted as a
  config input's;
- batching (``max_batch_size > 0``): every input's first dim is the batch dim. It becomes a
  dynamic dim bounded by ``max_batch_size``, so any batch up to it runs as it is;
  ``SKIP_OV_DYNAMIC_BATCHSIZE: YES`` (for topologies that cannot take a dynamic batch) fixes it
  at ``max_batch_size`` instead, and the backend pads smaller batches when
  ``ENABLE_BATCH_PADDING: YES`` (else refuses them, as Triton does).

Pure functions over an ``openvino`` module and an ``ov.Model``; raise ShoalError.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from shoal.dtypes import wire_to_config
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.workers.backends.openvino.element_types import element_of_wire, wire_of_element
from shoal.workers.backends.openvino.parameters import OpenvinoOptions
from shoal.workers.backends.openvino.runtime import openvino_message
from shoal.workers.backends.sequence_controls import CONTROL_DIMS, ModelInput, check_control
from shoal.workers.backends.torchscript_io import IoSpec


@dataclass(frozen=True)
class PortInfo:
    """One model input or output as the config sees it: its names, wire data type ("" when
    Triton has none) and dims, -1 for a dynamic dim (None for a tensor of dynamic rank)."""

    names: tuple[str, ...]
    datatype: str
    dims: tuple[int, ...] | None

    @property
    def name(self) -> str:
        return self.names[0]


def port_info(port: Any) -> PortInfo:
    """A model port (``ov.Output``) as a PortInfo; names sorted, the first is its any-name."""
    names = (port.get_any_name(), *sorted(set(port.get_names()) - {port.get_any_name()}))
    shape = port.get_partial_shape()
    dims = None if shape.rank.is_dynamic else tuple(
        d.get_length() if d.is_static else -1 for d in shape)
    return PortInfo(names, wire_of_element(port.get_element_type().get_type_name()), dims)


def prepare_model(ov: Any, model: Any, name: str, inputs: Sequence[IoSpec],
                  outputs: Sequence[IoSpec], max_batch_size: int,
                  options: OpenvinoOptions, controls: Collection[str] = ()) -> Any:
    """The model checked against and fitted to the config (see the module docstring).
    ``controls`` names the ``inputs`` that are sequence control inputs."""
    model_inputs = [port_info(p) for p in model.inputs]
    model_outputs = [port_info(p) for p in model.outputs]
    if len(model_inputs) != len(inputs):
        raise invalid_arg(f"unable to load model '{name}', configuration expects {len(inputs)} "
                          f"inputs, model provides {len(model_inputs)}")
    batching = max_batch_size > 0
    shapes: dict[str, Any] = {}
    for spec in inputs:
        if spec.name in controls:  # fed [rows, 1] (or [1]): checked as Triton's backends do
            found = next((p for p in model_inputs if spec.name in p.names), None)
            check_control(name, spec, None if found is None else ModelInput(found.dims, None),
                          batching, "onnxruntime")
        port = _find(model_inputs, spec.name, "input")
        dims = _config_dims(spec)
        if spec.name in controls:
            rest = list(CONTROL_DIMS)
        elif options.reshape_io_layers:
            if any(d != -1 and d <= 0 for d in dims):
                raise invalid_arg("openvino backend does not support dimensions values other "
                                  "than `-1` or positive integers")
            rest = list(dims)
        else:
            _check_dims(name, spec.name, port.dims, dims, batching, exact=False)
            rest = list(port.dims[1:] if batching and port.dims else port.dims or ())
        if batching:
            batch = (ov.Dimension(max_batch_size) if options.skip_dynamic_batch_size
                     else ov.Dimension(1, max_batch_size))
            shapes[port.name] = ov.PartialShape([batch, *[_dim(ov, d) for d in rest]])
        elif options.reshape_io_layers:
            shapes[port.name] = ov.PartialShape([_dim(ov, d) for d in rest])
    if shapes:
        try:
            model.reshape(shapes)
        except Exception as exc:
            raise invalid_arg(f"model '{name}': cannot give the model the configured input "
                              f"shapes: {openvino_message(exc)}") from None
        model_outputs = [port_info(p) for p in model.outputs]
    ppp = ov.preprocess.PrePostProcessor(model)
    for spec in inputs:
        ppp.input(spec.name).tensor().set_element_type(_element(ov, name, spec, "input"))
    for spec in outputs:
        port = _find(model_outputs, spec.name, "output")
        _check_dims(name, spec.name, port.dims, _config_dims(spec), batching, exact=True)
        ppp.output(spec.name).tensor().set_element_type(_element(ov, name, spec, "output"))
    try:
        return ppp.build()
    except Exception as exc:
        raise invalid_arg(f"model '{name}': cannot convert the model's tensors to the "
                          f"configured data types: {openvino_message(exc)}") from None


def _config_dims(spec: IoSpec) -> tuple[int, ...]:
    return spec.reshape if spec.reshape is not None else spec.dims


def _find(ports: Sequence[PortInfo], name: str, role: str) -> PortInfo:
    for port in ports:
        if name in port.names:
            return port
    allowed = ", ".join(sorted(port.name for port in ports))
    raise invalid_arg(f"unexpected inference {role} '{name}', allowed {role}s are: {allowed}")


def _element(ov: Any, model: str, spec: IoSpec, role: str) -> Any:
    element = element_of_wire(spec.datatype)
    if not element:
        raise ShoalError(ErrorCode.UNSUPPORTED,
                         f"unsupported datatype {wire_to_config(spec.datatype)} for {role} "
                         f"'{spec.name}' for model '{model}'")
    return getattr(ov.Type, element)


def _check_dims(model: str, tensor: str, model_dims: tuple[int, ...] | None,
                config_dims: tuple[int, ...], batching: bool, exact: bool) -> None:
    """Config dims against the model's (batch dim excluded when batching). A model dim of -1
    takes any config dim; a config dim of -1 matches a fixed model dim only for outputs
    (``exact``: the model may produce any size there)."""
    if model_dims is None:
        return  # dynamic rank: anything goes, as OpenVINO will check at run time
    shown = list(model_dims)
    if batching:
        if not model_dims:
            raise invalid_arg(f"model '{model}', tensor '{tensor}': for the model to support "
                              "batching the shape should have at least 1 dimension; but shape "
                              f"expected by the model is {shown}")
        model_dims = model_dims[1:]
    fits = len(model_dims) == len(config_dims) and all(
        m == -1 or m == c or (exact and c == -1)
        for m, c in zip(model_dims, config_dims, strict=True))
    if not fits:
        raise invalid_arg(f"model '{model}', tensor '{tensor}': the model expects "
                          f"{len(model_dims)} dimensions (shape {shown}) but the model "
                          f"configuration specifies {len(config_dims)} dimensions (shape "
                          f"{list(config_dims)})")


def _dim(ov: Any, size: int) -> Any:
    return ov.Dimension() if size == -1 else ov.Dimension(size)

