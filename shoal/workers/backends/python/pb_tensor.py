"""``pb_utils.Tensor`` and the Triton datatype numbering (TRITONSERVER_DataType).

A Tensor wraps a numpy array (CPU) or, when built ``from_dlpack`` of a device tensor, a torch
tensor. BF16 has no numpy dtype: it is held as ``uint16`` bit patterns, ``as_numpy`` refuses it
(as Triton does) and ``to_dlpack`` exports it as bfloat16 through torch. torch is imported only
on those paths, so auto-complete and plain numpy models never load it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

# TRITONSERVER_DataType values, as pb_utils.Tensor.triton_dtype() returns them.
WIRE_TO_TRITON: dict[str, int] = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
TRITON_TO_WIRE: dict[int, str] = {v: k for k, v in WIRE_TO_TRITON.items()}
TYPE_BYTES = 13
TYPE_BF16 = 14

_NUMPY_BY_TRITON: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8,
    7: np.int16, 8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64,
    13: np.object_,
}

_DLPACK_CPU_DEVICES = (1, 3)  # kDLCPU, kDLCUDAHost


class TritonModelException(Exception):
    """Raised by pb_utils (and by models) to fail initialize / execute / finalize."""

    def message(self) -> str:
        return str(self)


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMPY_BY_TRITON.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("O", "S", "U"):
        return TYPE_BYTES
    for number, candidate in _NUMPY_BY_TRITON.items():
        if number != TYPE_BYTES and dtype == np.dtype(candidate):
            return number
    return None


class Tensor:
    """``pb_utils.Tensor(name, numpy_array)``."""

    def __init__(self, name: str, numpy_array: Any) -> None:
        # argument types first, as Triton's bindings check them (TypeError), then the values
        if not isinstance(name, str):
            raise TypeError(f"Tensor(): name must be a str, not {type(name).__name__}")
        if numpy_array is None:
            raise TypeError("Tensor(): numpy_array must be a numpy array, not None")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = np.asarray(numpy_array)
        if array.dtype.kind in ("U", "S"):
            array = array.astype(np.object_)
        dtype = numpy_to_triton_type(array.dtype)
        if dtype is None:
            raise TritonModelException(
                f"tensor '{name}': numpy dtype {array.dtype} is not supported by the "
                "Python backend")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array: npt.NDArray[Any] | None = array
        self._dtype = dtype
        self._device_tensor: Any = None  # torch tensor when the data is not host memory

    @classmethod
    def _wrap(cls, name: str, array: npt.NDArray[Any], datatype: str) -> Tensor:
        """Backend-internal: wrap a request array of wire type ``datatype`` without checks."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._dtype = WIRE_TO_TRITON[datatype]
        tensor._device_tensor = None
        return tensor

    def name(self) -> str:
        return self._name

    def triton_dtype(self) -> int:
        return self._dtype

    def shape(self) -> list[int]:
        source = self._array if self._array is not None else self._device_tensor
        return [int(d) for d in source.shape]

    def is_cpu(self) -> bool:
        return self._device_tensor is None

    def as_numpy(self) -> npt.NDArray[Any]:
        if self._array is None:
            raise TritonModelException(
                "Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._dtype == TYPE_BF16:
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and "
                "from_dlpack() instead.")
        return self._array

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_kwargs: Any) -> Any:
        if self._dtype == TYPE_BYTES:
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._device_tensor is not None:
            return self._device_tensor.__dlpack__(stream=stream)
        assert self._array is not None
        if self._dtype == TYPE_BF16:
            import torch

            return torch.from_numpy(self._array.view(np.int16)).view(torch.bfloat16).__dlpack__()
        array = self._array if self._array.flags.writeable else self._array.copy()
        return array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._device_tensor is not None:
            device: tuple[int, int] = self._device_tensor.__dlpack_device__()
            return device
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """A Tensor over a DLPack capsule or an object with ``__dlpack__`` (C-contiguous only)."""
        if not isinstance(name, str):
            raise TypeError(f"from_dlpack(): name must be a str, not {type(name).__name__}")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        if type(tensor).__name__ == "PyCapsule":
            tensor = _CapsuleHolder(tensor)
        if not hasattr(tensor, "__dlpack__"):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes")
        device = tensor.__dlpack_device__() if hasattr(tensor, "__dlpack_device__") else (1, 0)
        if int(device[0]) in _DLPACK_CPU_DEVICES:
            try:
                return _from_host_array(name, np.from_dlpack(tensor))
            except (TypeError, BufferError, RuntimeError, ValueError):
                pass  # e.g. bfloat16, which numpy cannot hold: go through torch
        return _from_torch(name, tensor)


class _CapsuleHolder:
    """Presents a bare DLPack capsule through the ``__dlpack__`` protocol (CPU capsules)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def _from_host_array(name: str, array: npt.NDArray[Any]) -> Tensor:
    if not array.flags.c_contiguous:
        raise TritonModelException(
            "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored "
            "in C-Order are supported.")
    return Tensor(name, array)


def _from_torch(name: str, source: Any) -> Tensor:
    import torch
    import torch.utils.dlpack

    from shoal.dtypes import numpy_to_wire

    device_tensor = torch.utils.dlpack.from_dlpack(source)
    if not device_tensor.is_contiguous():
        raise TritonModelException(
            "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored "
            "in C-Order are supported.")
    tensor = Tensor.__new__(Tensor)
    tensor._name = name
    tensor._device_tensor = None
    if device_tensor.dtype == torch.bfloat16:
        tensor._dtype = TYPE_BF16
    else:
        sample = torch.empty(0, dtype=device_tensor.dtype).numpy()
        tensor._dtype = WIRE_TO_TRITON[numpy_to_wire(sample.dtype)]
    if device_tensor.device.type == "cpu":
        host = device_tensor.view(torch.int16) if tensor._dtype == TYPE_BF16 else device_tensor
        array = host.numpy()
        tensor._array = array.view(np.uint16) if tensor._dtype == TYPE_BF16 else array
    else:
        tensor._array = None
        tensor._device_tensor = device_tensor
    return tensor


def host_array(tensor: Tensor) -> npt.NDArray[Any]:
    """The tensor's data as a host numpy array (BF16 as uint16), copying device data to CPU."""
    if tensor._array is not None:
        return tensor._array
    import torch

    cpu = tensor._device_tensor.detach().cpu()
    if cpu.dtype == torch.bfloat16:
        result: npt.NDArray[Any] = cpu.view(torch.int16).numpy().view(np.uint16)
        return result
    converted: npt.NDArray[Any] = cpu.numpy()
    return converted
