"""Output slots lent to a backend before it runs, so a runtime can write its outputs straight
into the worker's output arena (zero copy; the onnxruntime backend binds them with IO binding).

Contract: lending is open only while the worker runs one batch of a non-decoupled model
(``open`` ... ``close``; warmup and decoupled models get None from ``lend`` and fall back to
returning their own arrays). ``lend(nbytes)`` allocates an arena slot and returns a writable
view of it. When the worker writes that batch's answers, an output array that lies wholly
inside a lent slot (C-contiguous, numeric) is referenced where it is instead of being copied
(``locate``), and the slots so referenced join the batch's lease (``claim``): they are freed
when every response holding the lease has released it. ``close`` frees every lent slot no answer
references. Callers hold the worker's output lock (the arena is not thread-safe).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.shm.arena import Arena, Slot


@dataclass
class _Lent:
    slot: Slot
    address: int  # of the slot's first byte
    claimed: bool = False


class OutputLender:
    def __init__(self, arena: Arena) -> None:
        self._arena = arena
        self._lent: list[_Lent] = []
        self._open = False
        self.lent_count = 0  # slots lent since start (for tests and statistics)

    def open(self) -> None:
        self.close()  # defensive: nothing from an earlier batch stays lent
        self._open = True

    def lend(self, nbytes: int) -> memoryview | None:
        """A writable view of ``nbytes`` of a fresh arena slot, or None when lending is closed."""
        if not self._open or nbytes <= 0:
            return None
        slot = self._arena.allocate(nbytes)
        view = slot.view[:nbytes]
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        self._lent.append(_Lent(slot, address))
        self.lent_count += 1
        return view

    @property
    def has_lent(self) -> bool:
        """Some slot is lent now (else ``locate`` finds nothing: callers may skip it)."""
        return bool(self._lent)

    def locate(self, array: Any, nbytes: int) -> tuple[Slot, int] | None:
        """The lent slot holding all ``nbytes`` of ``array`` and the array's offset in it."""
        if not self._lent or not isinstance(array, np.ndarray) or array.dtype.hasobject \
                or not array.flags.c_contiguous or array.nbytes != nbytes:
            return None
        start = int(array.__array_interface__["data"][0])
        for lent in self._lent:
            offset = start - lent.address
            if offset >= 0 and offset + nbytes <= lent.slot.nbytes:
                return lent.slot, offset
        return None

    def claim(self, slot: Slot) -> None:
        """``slot`` is referenced by an answer: the batch's lease frees it, ``close`` does not."""
        for lent in self._lent:
            if lent.slot is slot:
                lent.claimed = True

    def close(self) -> None:
        self._open = False
        for lent in self._lent:
            if not lent.claimed:
                self._arena.free(lent.slot)
        self._lent = []
