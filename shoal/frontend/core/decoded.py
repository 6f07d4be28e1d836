"""A decoded inference request, protocol-neutral (HTTP's ``http/codec.py`` and gRPC's
``grpc/convert.py`` both decode into it), and the decoding rules the two share: correlation ids,
element counts, per-output custom parameters, Triton's dims text and request tag."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from shoal import correlation_ids
from shoal.errors import ShoalError, invalid_arg, unsupported
from shoal.frontend.core.shm_params import INT64_MAX, SharedMemorySlice
from shoal.messages import Params, ParamValue

SEQUENCE_START: Final = 1
SEQUENCE_END: Final = 2
NO_REQUEST_ID: Final = "<id_unknown>"  # a request without an id, in Triton's core messages
UINT64_MAX: Final = (1 << 64) - 1


@dataclass(slots=True)
class DecodedInput:
    name: str
    datatype: str
    shape: list[int]
    data: memoryview  # flat 'B' view, the exact shared-memory bytes (empty when ``shm`` is set)
    element_count: int
    shm: SharedMemorySlice | None = None  # the bytes live in a client region instead
    body_offset: int = -1  # a binary input: where ``data`` starts in the request body


@dataclass(slots=True)
class OutputRequest:
    """One entry of the request's ``outputs``. ``binary`` None means "request default";
    ``shm`` set: the output goes into that client region and the response carries no data."""

    name: str
    binary: bool | None = None
    classification: int = 0
    parameters: Params = field(default_factory=dict)
    shm: SharedMemorySlice | None = None


@dataclass(slots=True)
class DecodedRequest:
    inputs: list[DecodedInput]
    outputs: list[OutputRequest] = field(default_factory=list)
    client_id: str = ""
    binary_output_default: bool = False
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    parameters: Params = field(default_factory=dict)
    raw: bool = False


def request_tag(client_id: str) -> str:
    """The start of Triton's core messages about a request: ``[request id: <id>] ``."""
    return f"[request id: {client_id or NO_REQUEST_ID}] "


def string_correlation_id(value: str) -> str:
    """A string ``sequence_id`` as the request's correlation id, over HTTP and gRPC alike,
    within ``shoal.correlation_ids``' limit (else UNSUPPORTED, 501, for any model). The sequence
    batcher gives it to a CORRID control of any data type
    (``broker/schedulers/sequence/controls.py``)."""
    message = correlation_ids.too_long_message(value)
    if message is not None:
        raise unsupported(message)
    return value


def custom_parameter(key: str, value: Any) -> ParamValue:
    if isinstance(value, str | bool | float) or (
        type(value) is int and -(1 << 63) <= value <= UINT64_MAX
    ):
        return value  # type: ignore[no-any-return]
    raise invalid_arg(  # Triton's text (doubles are taken too, as Triton takes them)
        f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def checked_element_count(shape: list[int], name: str) -> int:
    """Elements of input ``name`` of this shape; INVALID_ARG past int64 (Triton's message)."""
    count = 1
    for dim in shape:
        count *= dim
    if count > INT64_MAX:
        raise invalid_arg(
            f"shape {format_dims(shape)} for input '{name}' causes total element count to "
            f"exceed maximum size of {INT64_MAX}"
        )
    return count


def format_dims(dims: list[int]) -> str:
    """Triton's DimsListToString: ``[1,16]``."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def add_output_parameter(output: OutputRequest, key: str, value: Any) -> None:
    """A per-output parameter that is not one of the protocol's own keys (HTTP and gRPC):
    ``triton_*`` is reserved, anything else passes through as a custom parameter."""
    if key.startswith("triton_"):
        raise invalid_arg(
            f"parameter keys starting with 'triton_' are reserved for Triton usage and "
            f"should not be specified (output '{output.name}')."
        )
    try:
        output.parameters[key] = custom_parameter(key, value)
    except ShoalError as exc:
        raise invalid_arg(f"{exc.message} (output '{output.name}')") from None
