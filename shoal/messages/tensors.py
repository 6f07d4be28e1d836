"""Tensor references and the small parts every message is built from (see ``shoal.messages``)."""

from __future__ import annotations

import msgspec

from shoal.errors import ErrorCode

# Request/tensor parameters: Triton allows str, int, bool and double.
ParamValue = str | int | float | bool
Params = dict[str, ParamValue]


class Error(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """``in_response``: the request executed and this error is what its response carries (a
    python model's ``InferenceResponse(error=...)``, or outputs that could not be delivered,
    e.g. into a client region too small), not a failure of the request. The client gets the
    error either way; the statistics count such a request as a success, as Triton does
    (``broker/batch_results.py``)."""

    code: ErrorCode
    message: str
    in_response: bool = False


class CudaHandle(msgspec.Struct, frozen=True, array_like=True):
    """A client's CUDA allocation as registered (CUDA shared-memory extension): the 64-byte
    ``cudaIpcMemHandle_t`` of the allocation, the server device ordinal to open it on, and the
    registered size. Workers open it themselves (``shoal.shm.cuda_ipc``), cache the mapping by
    ``(raw_handle, device_id)`` and check ``byte_size`` against the allocation's real size."""

    raw_handle: bytes
    device_id: int
    byte_size: int


class TensorRef(msgspec.Struct, frozen=True, array_like=True):
    """A tensor living in shared memory: ``nbytes`` bytes at ``offset`` of segment ``region``
    (a POSIX shm name such as ``/shoal-<id>-fe1234-0``). ``datatype`` is the wire name; BYTES
    tensors are stored in the 4-byte-length framing (``dtypes.serialize_bytes``).
    A region that does not start with the server's segment prefix is a client-registered object
    (system shared memory extension); readers re-check its real size before touching it.
    With ``cuda`` set the bytes are in a client's CUDA allocation instead: ``region`` is empty
    and ``offset`` counts from the allocation's start.
    With ``inline`` set the bytes travel in the message itself: a worker's streamed response of
    a few bytes (``workers/outputs.INLINE_MAX_BYTES``, e.g. one token of an LLM stream) or an
    output of no bytes needs no arena slot and no lease; ``region`` is then empty.
    ``object_id`` / ``object_dev``: for a client-registered object, the inode number and device
    of the object the frontend registered under that key (``shm/object_identity.py``); a worker
    reads only that object, never another one the key names later, and refuses a client
    reference without them (``shm/client_regions.py``)."""

    name: str
    datatype: str
    shape: list[int]
    region: str
    offset: int
    nbytes: int
    cuda: CudaHandle | None = None
    inline: bytes | None = None
    object_id: int = 0
    object_dev: int = 0


class OutputTarget(msgspec.Struct, frozen=True, array_like=True):
    """Where a worker writes an output instead of its own arena: ``nbytes`` bytes at ``offset`` of
    the client-registered POSIX shm object ``region`` (its key, e.g. ``/input_data``). The
    frontend checked the bounds against the registration; the worker re-checks the object's real
    size right before writing, and writes only into the registered object (``object_id`` /
    ``object_dev``, its inode number and device, as in ``TensorRef``)."""

    region: str
    offset: int
    nbytes: int
    cuda: CudaHandle | None = None  # set: a client CUDA allocation (``region`` is empty)
    object_id: int = 0
    object_dev: int = 0


class RequestedOutput(msgspec.Struct, frozen=True, array_like=True):
    name: str
    parameters: Params = {}
    target: OutputTarget | None = None


class Lease(msgspec.Struct, frozen=True, array_like=True):
    """Output memory that a worker lent to a response. The frontend returns it with
    ``ReleaseLeases`` once it has serialized the outputs; until then the worker must not
    reuse it."""

    instance: str
    lease_id: int


class InlineTensor(msgspec.Struct, frozen=True, array_like=True):
    """A tensor the broker generates itself and sends inline (sequence control values: a few
    bytes per row). Client data never travels this way."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes
