"""BLS answers as the model sees them: numpy arrays that are views of the callee's output memory.

Ownership: an answer's outputs lie in the callee worker's arena, lent under the answer's
``Lease``. ``LeaseToken`` owns that lease and gives it back (``release``) exactly once, when it
is garbage: every fixed-size output array is made from a ``SharedOutput`` (``__array_interface__``
over the shared memory) that holds the token, so the array's ``base`` chain keeps the memory
lent while any view of it lives (``np.asarray``, slices, DLPack capsules, torch.from_numpy).
BYTES outputs are decoded into object arrays (a copy) and hold nothing. So is any output of at
least ``copy_bytes`` (``answer_from``; the BLS client passes half the callee's arena): a model
that keeps such an answer alive while it makes its next call (``r = call(big); r = call(small)``
keeps the first answer until the second returns) would leave the callee no room for the next
output, so the bytes are copied out and the lease is given back at once.

Threads: ``answer_from`` runs on the BLS link thread (it owns the region cache). Tokens die on
whatever thread drops the last array; ``release`` must be thread-safe and must not block (it
only queues).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal import dtypes
from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error, InferResponse, Lease, Params, TensorRef
from shoal.shm.regions import RegionCache
from shoal.shm.tensors import tensor_nbytes

Release = Callable[[Lease], None]
ViewOf = Callable[[TensorRef], memoryview]  # a writable view of the bytes a reference names


@dataclass(frozen=True, slots=True)
class BlsOutput:
    name: str
    datatype: str  # wire name (BF16: ``array`` holds uint16 bit patterns)
    array: npt.NDArray[Any]


@dataclass(frozen=True, slots=True)
class BlsAnswer:
    """One answer of a BLS call: outputs, or ``error``. ``final`` ends the call (a decoupled
    callee answers several times; its last answer may have no outputs)."""

    outputs: list[BlsOutput] = field(default_factory=list)
    parameters: Params = field(default_factory=dict)
    error: Error | None = None
    final: bool = True

    @staticmethod
    def failed(code: ErrorCode, message: str) -> BlsAnswer:
        return BlsAnswer(error=Error(code, message))


class LeaseToken:
    """Gives ``lease`` back through ``release`` once: when this object is garbage, or at
    ``release_now``. Not run at interpreter exit (the process is going away)."""

    __slots__ = ("__weakref__", "_finalizer")

    def __init__(self, lease: Lease, release: Release) -> None:
        self._finalizer = weakref.finalize(self, release, lease)
        self._finalizer.atexit = False

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def release_now(self) -> None:
        self._finalizer()


class SharedOutput:
    """The end of a BLS output array's ``base`` chain: the shared-memory view it reads and the
    token that keeps that memory lent. ``np.asarray(shared)`` is a zero-copy view."""

    __slots__ = ("_interface", "_token", "_view")

    def __init__(self, view: memoryview, dtype: np.dtype[Any], shape: list[int],
                 token: LeaseToken | None) -> None:
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        self._view = view
        self._token = token
        self._interface = {"shape": tuple(shape), "typestr": dtype.str,
                           "data": (address, view.readonly), "version": 3}

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return self._interface

    @property
    def token(self) -> LeaseToken | None:
        return self._token


def shared_array(view: memoryview, datatype: str, shape: list[int],
                 token: LeaseToken | None) -> npt.NDArray[Any]:
    """A zero-copy array of a fixed-size tensor in ``view`` that keeps ``token`` alive."""
    dtype = dtypes.numpy_dtype(datatype)
    if view.nbytes == 0:
        return np.empty(shape, dtype=dtype)  # nothing to hold
    return np.asarray(SharedOutput(view, dtype, shape, token))


def answer_from(response: InferResponse, view_of: ViewOf, release: Release,
                copy_bytes: int | None = None) -> BlsAnswer:
    """The broker's answer as arrays over shared memory. The lease is released at once when the
    answer failed or holds no fixed-size output left in shared memory (outputs of at least
    ``copy_bytes`` bytes are copied out), else when the last array is gone."""
    if response.error is not None:
        if response.lease is not None:
            release(response.lease)
        return BlsAnswer(error=response.error, final=response.final)
    token = LeaseToken(response.lease, release) if response.lease is not None else None
    try:
        outputs = [BlsOutput(ref.name, ref.datatype, _array(ref, view_of, token, copy_bytes))
                   for ref in response.outputs]
    except ShoalError as exc:
        if token is not None:
            token.release_now()
        return BlsAnswer(error=Error(exc.code, exc.message), final=response.final)
    if token is not None and not any(isinstance(o.array.base, SharedOutput) for o in outputs):
        token.release_now()
    return BlsAnswer(outputs, dict(response.parameters), None, response.final)


def _array(ref: TensorRef, view_of: ViewOf, token: LeaseToken | None,
           copy_bytes: int | None = None) -> npt.NDArray[Any]:
    if ref.cuda is not None or not dtypes.is_datatype(ref.datatype):
        raise ShoalError(ErrorCode.INTERNAL, f"output '{ref.name}' cannot be read")
    view = view_of(ref)
    if ref.datatype == "BYTES":
        return dtypes.bytes_to_object_array(view, list(ref.shape))  # a copy: holds nothing
    if view.nbytes != tensor_nbytes(ref.datatype, ref.shape):
        raise ShoalError(ErrorCode.INTERNAL, f"output '{ref.name}' has {view.nbytes} bytes, "
                                             f"its shape {list(ref.shape)} needs "
                                             f"{tensor_nbytes(ref.datatype, ref.shape)}")
    if copy_bytes is not None and view.nbytes >= copy_bytes:
        return np.array(shared_array(view, ref.datatype, list(ref.shape), None))  # a copy
    return shared_array(view, ref.datatype, list(ref.shape), token)


class CalleeMemory:
    """The callees' output segments as this worker maps them (link thread only).

    A tensor larger than a regular segment lies in a segment of its own, which its owner keeps
    for a later tensor of about its size or unlinks (``shm/arena.py``) when the slot is freed; a
    mapping kept in the cache after the unlink would pin that memory, so the mapping of such a
    segment is dropped when a lease that lent it is given back (views still alive keep their
    pages until they go; a later answer in the same segment, kept and reused, maps it again)."""

    def __init__(self, segment_prefix: str, segment_bytes: int,
                 copy_bytes: int | None = None) -> None:
        self.copy_bytes = copy_bytes  # outputs this large are copied out (``answer_from``)
        self._cache = RegionCache(segment_prefix)
        self._segment_bytes = segment_bytes
        self._dedicated: dict[tuple[str, int], set[str]] = {}

    def view(self, ref: TensorRef) -> memoryview:
        if ref.inline is not None:  # a small streamed answer: its bytes came in the message
            return memoryview(bytearray(ref.inline))
        return self._cache.view(ref.region, ref.offset, ref.nbytes, readonly=False)

    def lent(self, lease: Lease | None, refs: list[TensorRef]) -> None:
        """These outputs were viewed under ``lease``: note the dedicated segments."""
        if lease is None:
            return
        own = {ref.region for ref in refs
               if self._cache.mapped_size(ref.region) not in (None, self._segment_bytes)}
        if own:
            self._dedicated.setdefault((lease.instance, lease.lease_id), set()).update(own)

    def given_back(self, leases: list[Lease]) -> None:
        for lease in leases:
            for region in self._dedicated.pop((lease.instance, lease.lease_id), ()):
                self._cache.forget(region)

    def close(self) -> None:
        self._dedicated.clear()
        self._cache.close()
