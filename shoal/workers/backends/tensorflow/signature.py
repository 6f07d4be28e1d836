"""A SavedModel's serving signature as Triton's tensorflow backend sees it, read straight from
``saved_model.pb``'s protobuf wire format: the broker's auto-complete and the worker's config
check both use it, and neither needs TensorFlow for it (the broker never imports TensorFlow).

What Triton sees (``tensorflow_backend_tf.cc``): the meta graph tagged ``serve`` (or the
model's ``TF_GRAPH_TAG`` parameter); in it the signature ``serving_default`` (or
``TF_SIGNATURE_DEF``), else the first signature that is neither ``__saved_model_init_op`` nor
``__saved_model_train_op`` (Triton takes the first of a hash map; shoal the first by name).
A tensor's Triton name is its key in the signature (not the graph tensor it maps to); its
dims are the signature's, -1 for an unknown size; an unknown rank reads as rank 0 (no dims),
as in Triton. Tensors are listed by name (Triton's order is a hash map's).

Wire format: SavedModel.meta_graphs = 2; MetaGraphDef.meta_info_def = 1, signature_def = 5
(a map: entry key = 1, value = 2); MetaInfoDef.tags = 4; SignatureDef.inputs = 1, outputs = 2
(maps of TensorInfo); TensorInfo.dtype = 2, tensor_shape = 3; TensorShapeProto.dim = 2,
unknown_rank = 3; Dim.size = 1.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Final

from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.workers.backends import protowire

SAVED_MODEL_FILE: Final = "saved_model.pb"
SERVE_TAG: Final = "serve"
DEFAULT_SIGNATURE: Final = "serving_default"
_INTERNAL_SIGNATURES: Final = frozenset({"__saved_model_init_op", "__saved_model_train_op"})

# TensorFlow DataType enum -> wire data type (the types Triton's tensorflow backend carries)
WIRE_OF_TF_TYPE: Final = {
    1: "FP32", 2: "FP64", 3: "INT32", 4: "UINT8", 5: "INT16", 6: "INT8", 7: "BYTES",
    9: "INT64", 10: "BOOL", 17: "UINT16", 19: "FP16", 22: "UINT32", 23: "UINT64",
}
# the others by name, for the error that refuses them
_TF_TYPE_NAMES: Final = {
    0: "DT_INVALID", 8: "DT_COMPLEX64", 11: "DT_QINT8", 12: "DT_QUINT8", 13: "DT_QINT32",
    14: "DT_BFLOAT16", 15: "DT_QINT16", 16: "DT_QUINT16", 18: "DT_COMPLEX128",
    20: "DT_RESOURCE", 21: "DT_VARIANT",
}


@dataclass(frozen=True)
class SignatureTensor:
    name: str  # the key in the signature: the tensor's name in the model config
    datatype: str  # wire name ("FP32", "BYTES", ...)
    dims: tuple[int, ...]  # -1 for an unknown size; () for a scalar or an unknown rank


@dataclass(frozen=True)
class Signature:
    key: str  # which signature of the meta graph this is
    inputs: list[SignatureTensor]  # by name
    outputs: list[SignatureTensor]  # by name


def choose_signature(keys: list[str], wanted: str) -> str | None:
    """``wanted`` when the meta graph has it, else the first (by name) that is not an internal
    one, else None."""
    if wanted in keys:
        return wanted
    return next((key for key in sorted(keys) if key not in _INTERNAL_SIGNATURES), None)


def read_signature(model_path: str, model_name: str, tag: str = SERVE_TAG,
                   wanted: str = DEFAULT_SIGNATURE) -> Signature:
    """The signature Triton would serve from the SavedModel directory ``model_path`` (see the
    module docstring). INVALID_ARG naming the problem when the directory is not a SavedModel,
    the tag or a signature is missing, or a tensor's type has no Triton data type."""
    file_name = f"{os.path.basename(model_path)}/{SAVED_MODEL_FILE}"
    path = os.path.join(model_path, SAVED_MODEL_FILE)
    if not os.path.isfile(path):
        raise invalid_arg(f"unable to load model '{model_name}': no {file_name} (a SavedModel "
                          "directory holds saved_model.pb and variables/)")
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                raise invalid_arg(f"unable to load model '{model_name}': {file_name} is empty")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                outcome = _parse(memoryview(mapped), model_name, tag, wanted)
    except OSError as exc:
        raise invalid_arg(f"unable to load model '{model_name}': {file_name} cannot be read: "
                          f"{exc.strerror}") from None
    if isinstance(outcome, ShoalError):
        raise outcome
    if outcome is None:
        raise invalid_arg(f"unable to load model '{model_name}': {file_name} cannot be parsed: "
                          "not a SavedModel (protobuf parsing failed)")
    return outcome


def _parse(data: memoryview, model_name: str, tag: str,
           wanted: str) -> Signature | ShoalError | None:
    """The signature, the error to raise, or None when the bytes are not a SavedModel. Raises
    nothing: an exception's traceback would keep views of the mapping alive past its close."""
    try:
        return _signature(data, model_name, tag, wanted)
    except ShoalError as exc:
        return ShoalError(exc.code, exc.message)
    except (protowire.Malformed, IndexError, ValueError, UnicodeDecodeError):
        return None


def _signature(data: memoryview, model_name: str, tag: str, wanted: str) -> Signature:
    meta_graphs = protowire.messages(data, 2)
    if not meta_graphs:
        raise protowire.Malformed
    tagged = [graph for graph in meta_graphs if tag in _tags(graph)]
    if not tagged:
        found = sorted({t for graph in meta_graphs for t in _tags(graph)})
        raise invalid_arg(f"unable to load model '{model_name}', expected '{tag}' tag "
                          f"(the SavedModel has tags {found})")
    signatures = _map_entries(tagged[0], 5)
    key = choose_signature(list(signatures), wanted)
    if key is None:
        raise invalid_arg(f"unable to load model '{model_name}', expected '{wanted}' signature")
    definition = signatures[key]
    return Signature(key, _tensors(definition, 1, "input", model_name),
                     _tensors(definition, 2, "output", model_name))


def _tags(meta_graph: memoryview) -> list[str]:
    infos = protowire.messages(meta_graph, 1)
    if not infos:
        return []
    return [bytes(tag).decode("utf-8") for tag in protowire.messages(infos[-1], 4)]


def _map_entries(message: memoryview, field: int) -> dict[str, memoryview]:
    """A map<string, message> field: key -> value (the last entry of a key wins)."""
    entries: dict[str, memoryview] = {}
    for entry in protowire.messages(message, field):
        entries[protowire.text(protowire.messages(entry, 1))] = \
            (protowire.messages(entry, 2) or [memoryview(b"")])[-1]
    return entries


def _tensors(definition: memoryview, field: int, kind: str,
             model_name: str) -> list[SignatureTensor]:
    tensors = []
    for name, info in sorted(_map_entries(definition, field).items()):
        dtypes = protowire.ints(info, 2)
        dtype = dtypes[-1] if dtypes else 0
        datatype = WIRE_OF_TF_TYPE.get(dtype)
        if datatype is None:
            type_name = _TF_TYPE_NAMES.get(dtype, f"DataType {dtype}")
            raise ShoalError(ErrorCode.INVALID_ARG,
                             f"unable to process {kind} '{name}' for '{model_name}', "
                             f"unsupported datatype '{type_name}'")
        shapes = protowire.messages(info, 3)
        tensors.append(SignatureTensor(name, datatype, _dims(shapes[-1]) if shapes else ()))
    return tensors


def _dims(shape: memoryview) -> tuple[int, ...]:
    if any(protowire.ints(shape, 3)):  # unknown_rank
        return ()
    dims = []
    for dim in protowire.messages(shape, 2):
        sizes = protowire.ints(dim, 1)
        size = sizes[-1] if sizes else 0
        dims.append(size if size >= 0 else -1)
    return tuple(dims)
