"""What the cache holds per key: one response's outputs copied into one ``bytes`` blob, and the
loans that let the protocol layers read a hit's outputs as they read a worker's.

A hit's outputs are ``TensorRef``s whose ``region`` is ``loan_region(loan id)``: a name that is
never a shared-memory segment (no segment name starts with ``#``). ``CacheLoans.view`` resolves
them; the answer's ``Lease`` (instance ``CACHE_LEASE``) ends the loan when the DataPlane
releases it. The blob is immutable, so a loan stays readable even if the entry is evicted
meanwhile.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Final

from shoal.messages import Lease, Params, TensorRef

CACHE_LEASE: Final = "#response-cache"  # Lease.instance of an answer served from the cache
_LOAN_PREFIX: Final = "#response-cache/"
# What an entry costs beyond its output bytes (key, bookkeeping, per-output metadata): counted
# against the cache's size so that many tiny entries cannot exceed it by much.
ENTRY_OVERHEAD_BYTES: Final = 256
OUTPUT_OVERHEAD_BYTES: Final = 64


@dataclass(frozen=True, slots=True)
class CachedOutput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int  # into CachedResponse.blob
    nbytes: int


@dataclass(frozen=True, slots=True)
class CachedResponse:
    outputs: tuple[CachedOutput, ...]
    blob: bytes
    parameters: Params

    @property
    def cost(self) -> int:
        """Bytes counted against the cache's size."""
        return (len(self.blob) + ENTRY_OVERHEAD_BYTES
                + sum(OUTPUT_OVERHEAD_BYTES + len(o.name) for o in self.outputs))

    def data(self, output: CachedOutput) -> memoryview:
        return memoryview(self.blob)[output.offset:output.offset + output.nbytes]


def build_entry(outputs: list[tuple[TensorRef, bytes | memoryview]],
                parameters: Params) -> CachedResponse:
    """One entry from a response's outputs and their bytes (copied once, into one blob)."""
    parts: list[CachedOutput] = []
    offset = 0
    for ref, data in outputs:
        parts.append(CachedOutput(ref.name, ref.datatype, tuple(ref.shape), offset, len(data)))
        offset += len(data)
    blob = b"".join(data for _, data in outputs)
    return CachedResponse(tuple(parts), blob, dict(parameters))


def loan_region(loan_id: int) -> str:
    return f"{_LOAN_PREFIX}{loan_id}"


def is_loan_region(region: str) -> bool:
    return region.startswith(_LOAN_PREFIX)


class CacheLoans:
    """Entries lent to answers that are being serialized, by loan id. Event loop only."""

    def __init__(self) -> None:
        self._lent: dict[int, bytes] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._lent)

    def lend(self, entry: CachedResponse) -> tuple[str, Lease]:
        """The region name the answer's refs carry and the lease that ends the loan."""
        loan_id = next(self._ids)
        self._lent[loan_id] = entry.blob
        return loan_region(loan_id), Lease(CACHE_LEASE, loan_id)

    def view(self, ref: TensorRef) -> memoryview:
        blob = self._lent[int(ref.region[len(_LOAN_PREFIX):])]
        return memoryview(blob)[ref.offset:ref.offset + ref.nbytes]

    def give_back(self, lease: Lease) -> None:
        self._lent.pop(lease.lease_id, None)
