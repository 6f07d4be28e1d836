"""The datatype table and the BYTES framing."""

from __future__ import annotations

import numpy as np
import pytest

from shoal import dtypes
from shoal.errors import ErrorCode, ShoalError


@pytest.mark.parametrize("wire", dtypes.DATATYPES)
def test_config_and_wire_names_round_trip(wire: str) -> None:
    config = dtypes.wire_to_config(wire)
    assert config == ("TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}")
    assert dtypes.config_to_wire(config) == wire


@pytest.mark.parametrize("wire,size", [("BOOL", 1), ("UINT8", 1), ("INT16", 2), ("FP16", 2),
                                       ("BF16", 2), ("INT32", 4), ("FP32", 4), ("UINT64", 8),
                                       ("FP64", 8)])
def test_element_sizes(wire: str, size: int) -> None:
    assert dtypes.element_size(wire) == size


def test_bytes_has_no_element_size() -> None:
    with pytest.raises(KeyError):
        dtypes.element_size("BYTES")


@pytest.mark.parametrize("dtype,wire", [(np.float32, "FP32"), (np.int64, "INT64"),
                                        (np.bool_, "BOOL"), (np.uint16, "UINT16"),
                                        (np.object_, "BYTES"), ("S5", "BYTES"), ("<U3", "BYTES"),
                                        (">f4", "FP32")])
def test_numpy_to_wire(dtype: object, wire: str) -> None:
    assert dtypes.numpy_to_wire(dtype) == wire  # type: ignore[arg-type]


def test_unknown_names_are_invalid_arg() -> None:
    for call, arg in ((dtypes.config_to_wire, "TYPE_COMPLEX"), (dtypes.wire_to_config, "FP8")):
        with pytest.raises(ShoalError) as exc:
            call(arg)
        assert exc.value.code is ErrorCode.INVALID_ARG and arg in exc.value.message


def test_numpy_dtypes_are_little_endian() -> None:
    for wire in dtypes.DATATYPES:
        dt = dtypes.numpy_dtype(wire)
        assert dt.byteorder in ("<", "|", "=") and (dt.byteorder != "=" or dt.itemsize == 1
                                                    or np.little_endian)


def test_bytes_framing_round_trip() -> None:
    items = [b"", b"a", "ünï", b"\x00\x01", 42]
    buf = dtypes.serialize_bytes(items)
    assert buf[:4] == b"\x00\x00\x00\x00"
    assert dtypes.deserialize_bytes(buf) == [b"", b"a", "ünï".encode(), b"\x00\x01", b"42"]
    arr = dtypes.bytes_to_object_array(buf, [5])
    assert arr.dtype == np.object_ and arr[1] == b"a"


@pytest.mark.parametrize("buf,count,needle", [
    (b"\x01\x00", None, "incomplete string length"),
    (b"\x05\x00\x00\x00ab", None, "exceeds"),
    (dtypes.serialize_bytes([b"a", b"b"]), 3, "expected 3"),
    (dtypes.serialize_bytes([b"a", b"b"]), 1, "unexpected number"),
])
def test_bad_bytes_framing(buf: bytes, count: int | None, needle: str) -> None:
    with pytest.raises(ShoalError) as exc:
        dtypes.deserialize_bytes(buf, count)
    assert needle in exc.value.message


def test_torch_dtypes_cover_every_fixed_size_type() -> None:
    import torch

    for wire in dtypes.DATATYPES:
        if wire == "BYTES":
            continue
        tdt = dtypes.torch_dtype(wire)
        assert isinstance(tdt, torch.dtype)
        assert torch.empty(0, dtype=tdt).element_size() == dtypes.element_size(wire)


def test_bytes_elements_with_their_own_text_are_sent_as_it() -> None:
    from shoal.dtypes import deserialize_bytes, serialize_bytes

    class Named:
        def __str__(self) -> str:
            return "named"

    framed = serialize_bytes([b"raw", "text", 7, 2.5, True, np.int64(3), Named()])
    assert deserialize_bytes(framed) == [b"raw", b"text", b"7", b"2.5", b"True", b"3",
                                         b"named"]


def test_a_bytes_element_with_only_a_default_repr_is_refused() -> None:
    from shoal.dtypes import serialize_bytes
    from shoal.errors import ErrorCode, ShoalError

    with pytest.raises(ShoalError) as caught:
        serialize_bytes([b"ok", object()])
    assert caught.value.code is ErrorCode.INTERNAL
    assert "'object'" in caught.value.message and "0x" not in caught.value.message
