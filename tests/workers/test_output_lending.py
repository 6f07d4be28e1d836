"""Lent output slots: an output a backend wrote into a slot the worker lent it is referenced in
place (no copy) and freed with the batch's lease; lent slots no answer references are freed when
lending closes; nothing is lent outside a batch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from shoal.messages import RequestedOutput
from shoal.shm.arena import Arena
from shoal.shm.client_regions import ClientRegions
from shoal.workers.backends.base import BackendResponse, OutputTensor
from shoal.workers.device_regions import DeviceRegions, LazyCudaIpc
from shoal.workers.output_lending import OutputLender
from shoal.workers.outputs import OutputWriter


@pytest.fixture
def parts(shm_prefix: str) -> Iterator[tuple[Arena, OutputLender, OutputWriter]]:
    arena = Arena(shm_prefix + "w-", 1 << 16, 1 << 20)
    lender = OutputLender(arena)
    writer = OutputWriter("w", arena, ClientRegions(), DeviceRegions(LazyCudaIpc()), lender)
    yield arena, lender, writer
    arena.close()


def lent_array(lender: OutputLender, shape: tuple[int, ...]) -> np.ndarray:
    view = lender.lend(int(np.prod(shape)) * 4)
    assert view is not None
    return np.frombuffer(view, dtype=np.float32).reshape(shape)


def test_outputs_in_a_lent_slot_are_referenced_in_place_and_freed_with_the_lease(
        parts: tuple[Arena, OutputLender, OutputWriter]) -> None:
    arena, lender, writer = parts
    lender.open()
    batch = lent_array(lender, (3, 4))
    batch[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    used_by_lent = arena.used_bytes
    responses = [BackendResponse([OutputTensor("Y", "FP32", batch[:1])]),
                 BackendResponse([OutputTensor("Y", "FP32", batch[1:])])]
    results, lease = writer.write_results([1, 2], [[RequestedOutput("Y")]] * 2, responses)
    lender.close()
    assert arena.used_bytes == used_by_lent, "the writer allocated (and copied into) a slot"
    first, second = (result.outputs[0] for result in results)
    assert second.offset == first.offset + 16 and second.region == first.region
    assert first.nbytes == 16 and second.nbytes == 32
    view = arena_view(arena, second.region, second.offset, second.nbytes)
    assert np.frombuffer(view, np.float32).tolist() == list(range(4, 12))
    assert lease is not None
    writer.release(lease.lease_id)
    assert arena.used_bytes == used_by_lent  # one response still holds it
    writer.release(lease.lease_id)
    assert arena.used_bytes == 0


def arena_view(arena: Arena, region: str, offset: int, nbytes: int) -> memoryview:
    import mmap
    import os

    fd = os.open(os.path.join("/dev/shm", region.lstrip("/")), os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return memoryview(mapped)[offset:offset + nbytes]


def test_mixed_answers_copy_only_what_is_not_in_a_lent_slot(
        parts: tuple[Arena, OutputLender, OutputWriter]) -> None:
    arena, lender, writer = parts
    lender.open()
    lent = lent_array(lender, (1, 4))
    lent[:] = 1
    own = np.full((1, 2), 7, np.float32)
    response = BackendResponse([OutputTensor("A", "FP32", lent), OutputTensor("B", "FP32", own)])
    results, lease = writer.write_results([1], [[]], [response])
    lender.close()
    refs = {ref.name: ref for ref in results[0].outputs}
    assert bytes(arena_view(arena, refs["B"].region, refs["B"].offset, 8)) == own.tobytes()
    assert lease is not None
    writer.release(lease.lease_id)
    assert arena.used_bytes == 0


def test_unreferenced_lent_slots_are_freed_when_lending_closes(
        parts: tuple[Arena, OutputLender, OutputWriter]) -> None:
    arena, lender, _ = parts
    lender.open()
    lent_array(lender, (2, 4))
    assert arena.used_bytes > 0
    lender.close()
    assert arena.used_bytes == 0
    assert lender.lend(64) is None  # closed: nothing is lent (warmup, decoupled models)
