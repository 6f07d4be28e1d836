"""DeviceRegions over the fake CUDA IPC (tests/fakes/cuda_ipc.py: POSIX shm stands in for
device memory)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from shoal.dtypes import serialize_bytes
from shoal.errors import ErrorCode, ShoalError
from shoal.messages import CudaHandle, Error, OutputTarget, RequestedOutput, TensorRef
from shoal.shm.arena import Arena
from shoal.shm.client_regions import ClientRegions
from shoal.shm.cuda_ipc import CudaIpc, OpenedAllocation
from shoal.shm.tensors import float_to_bf16_bits
from shoal.workers.backends.base import BackendResponse, OutputTensor
from shoal.workers.device_regions import DeviceRegions, LazyCudaIpc
from shoal.workers.outputs import OutputWriter
from tests.fakes.cuda_ipc import FakeCudaIpc, fake_handle

SIZE = 4096


class CountingIpc:
    """FakeCudaIpc that records which shm names were opened and closed."""

    def __init__(self) -> None:
        self.fake = FakeCudaIpc()
        self.opens: list[bytes] = []
        self.closes: list[bytes] = []

    def open(self, raw_handle: bytes, device_id: int) -> OpenedAllocation:
        opened = self.fake.open(raw_handle, device_id)
        self.opens.append(raw_handle)
        inner = opened.close

        def close() -> None:
            self.closes.append(raw_handle)
            inner()

        return OpenedAllocation(opened.tensor, close)


Make = Callable[[str], CudaHandle]


@pytest.fixture
def prefix() -> str:
    """Client shm names (the fake refuses the server's own ``/shoal-`` names)."""
    return f"/cudatest-{secrets.token_hex(6)}-"


@pytest.fixture
def allocation(prefix: str) -> Iterator[Make]:
    """``make(suffix)``: a SIZE-byte zeroed shm object and its handle (byte_size SIZE); all
    unlinked after the test."""
    paths: list[str] = []

    def make(suffix: str) -> CudaHandle:
        name = prefix + suffix
        path = "/dev/shm" + name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, SIZE)
        finally:
            os.close(fd)
        paths.append(path)
        return CudaHandle(fake_handle(name), 0, SIZE)

    yield make
    for path in paths:
        os.unlink(path)


def poke(handle: CudaHandle, offset: int, data: bytes) -> None:
    """Write into the "device memory" behind ``handle`` as a client would."""
    name = handle.raw_handle[16:].rstrip(b"\x00").decode()
    fd = os.open("/dev/shm/" + name, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def peek(handle: CudaHandle, offset: int, nbytes: int) -> bytes:
    name = handle.raw_handle[16:].rstrip(b"\x00").decode()
    fd = os.open("/dev/shm/" + name, os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def ref(handle: CudaHandle, datatype: str, shape: list[int], nbytes: int, offset: int = 0,
        name: str = "X") -> TensorRef:
    return TensorRef(name, datatype, shape, "", offset, nbytes, cuda=handle)


def invalid(call: Callable[[], object]) -> str:
    with pytest.raises(ShoalError) as info:
        call()
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "cudatest" not in info.value.message and "shoal-fake" not in info.value.message
    return info.value.message


# ---------------------------------------------------------------------------- the cache


def test_each_handle_is_opened_once(allocation: Make) -> None:
    ipc = CountingIpc()
    regions = DeviceRegions(ipc)
    handle = allocation("a")
    regions.allocation_slice(handle, 0, 16, "input 'X'")
    regions.allocation_slice(handle, 100, 8, "input 'Y'")
    # another registration of the same allocation (other name and size) shares the mapping
    regions.allocation_slice(CudaHandle(handle.raw_handle, 0, 64), 0, 8, "input 'Z'")
    assert ipc.opens == [handle.raw_handle] and len(regions) == 1
    regions.close()
    assert ipc.closes == [handle.raw_handle] and len(regions) == 0


def test_least_recently_used_mapping_is_closed_past_the_cap(allocation: Make) -> None:
    ipc = CountingIpc()
    regions = DeviceRegions(ipc, max_open=2)
    a, b, c = allocation("a"), allocation("b"), allocation("c")
    for handle in (a, b, a, c):
        regions.allocation_slice(handle, 0, 4, "input 'X'")
    assert ipc.closes == [b.raw_handle] and len(regions) == 2
    regions.allocation_slice(b, 0, 4, "input 'X'")  # reopened; a is now the oldest
    assert ipc.opens.count(b.raw_handle) == 2 and ipc.closes == [b.raw_handle, a.raw_handle]
    regions.close()


def test_views_of_the_running_batch_are_not_evicted(allocation: Make) -> None:
    ipc = CountingIpc()
    regions = DeviceRegions(ipc, max_open=1)
    a, b = allocation("a"), allocation("b")
    view = regions.input_tensor(ref(a, "INT32", [2], 8), "cpu")
    regions.input_array(ref(b, "INT32", [2], 8))
    assert ipc.closes == [] and len(regions) == 2  # a is pinned by the batch's view
    del view
    regions.between_batches()
    assert ipc.closes == [a.raw_handle] and len(regions) == 1
    regions.close()


def test_forget_closes_and_the_next_use_reopens(allocation: Make) -> None:
    ipc = CountingIpc()
    regions = DeviceRegions(ipc)
    a, b = allocation("a"), allocation("b")
    regions.allocation_slice(a, 0, 4, "input 'X'")
    regions.allocation_slice(b, 0, 4, "input 'X'")
    regions.forget([CudaHandle(a.raw_handle, 0, 1)])  # the key is (raw_handle, device_id)
    assert ipc.closes == [a.raw_handle] and len(regions) == 1
    regions.allocation_slice(a, 0, 4, "input 'X'")
    assert ipc.opens == [a.raw_handle, b.raw_handle, a.raw_handle]
    regions.close()


def test_queued_forgets_wait_for_the_end_of_the_batch(allocation: Make) -> None:
    ipc = CountingIpc()
    regions = DeviceRegions(ipc)
    a = allocation("a")
    regions.allocation_slice(a, 0, 4, "input 'X'")
    regions.queue_forget([a])
    assert ipc.closes == []
    regions.between_batches()
    assert ipc.closes == [a.raw_handle] and len(regions) == 0
    regions.between_batches()  # applied once
    assert ipc.closes == [a.raw_handle]


def test_cuda_ipc_is_created_at_the_first_open_only(allocation: Make) -> None:
    made: list[CudaIpc] = []

    def factory() -> CudaIpc:
        made.append(FakeCudaIpc())
        return made[-1]

    regions = DeviceRegions(LazyCudaIpc(factory))
    assert made == []
    handle = allocation("a")
    regions.allocation_slice(handle, 0, 4, "input 'X'")
    regions.forget([handle])
    regions.allocation_slice(handle, 0, 4, "input 'X'")
    assert len(made) == 1
    regions.close()


# ---------------------------------------------------------------------------- checks


def test_bounds_are_checked_before_any_access(allocation: Make) -> None:
    ipc = CountingIpc()
    regions = DeviceRegions(ipc)
    handle = allocation("a")
    small = CudaHandle(handle.raw_handle, 0, 100)  # registered smaller than the allocation
    for offset, nbytes in ((-1, 4), (0, -1), (97, 4), (101, 0), (2**64 - 1, 2),
                           (16, 2**64 - 8), (2**63, 2**63)):
        message = invalid(lambda o=offset, n=nbytes: regions.allocation_slice(  # type: ignore
            small, o, n, "input 'X'"))
        assert "input 'X'" in message
    assert ipc.opens == []  # none of these needed the allocation
    assert regions.allocation_slice(small, 96, 4, "input 'X'").numel() == 4
    assert regions.allocation_slice(small, 100, 0, "input 'X'").numel() == 0
    regions.close()


def test_a_registration_larger_than_the_allocation_is_refused(allocation: Make) -> None:
    regions = DeviceRegions(CountingIpc())
    handle = allocation("a")
    large = CudaHandle(handle.raw_handle, 0, 2 * SIZE)
    assert regions.allocation_slice(large, SIZE - 4, 4, "output 'Y'").numel() == 4
    message = invalid(lambda: regions.allocation_slice(large, SIZE - 4, 8, "output 'Y'"))
    assert "output 'Y'" in message and "smaller than registered" in message
    regions.close()


def test_a_handle_that_cannot_be_opened_fails_the_request(prefix: str,
                                                          allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    gone = CudaHandle(fake_handle(prefix + "missing"), 0, 16)
    message = invalid(lambda: regions.input_array(ref(gone, "UINT8", [16], 16)))
    assert message == ("CUDA shared memory region of input 'X' cannot be opened: "
                       "cuIpcOpenMemHandle failed: invalid argument")
    other_device = CudaHandle(allocation("a").raw_handle, 1, 16)
    message = invalid(lambda: regions.input_array(ref(other_device, "UINT8", [16], 16)))
    assert "input 'X' cannot be opened" in message and "invalid device ordinal" in message
    assert len(regions) == 0


# ---------------------------------------------------------------------------- inputs


def test_input_arrays_are_host_copies(allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    handle = allocation("a")
    floats = np.arange(6, dtype="<f4").reshape(2, 3)
    ints = np.array([-1, 2**40], dtype="<i8")
    bf16 = float_to_bf16_bits(np.array([1.5, -2.0], dtype=np.float32))
    poke(handle, 0, floats.tobytes())
    poke(handle, 64, ints.tobytes())
    poke(handle, 128, bf16.tobytes())
    poke(handle, 256, serialize_bytes([b"ab", b"", b"\x00z"]))
    got = regions.input_array(ref(handle, "FP32", [2, 3], 24))
    np.testing.assert_array_equal(got, floats)
    poke(handle, 0, b"\xff" * 24)
    np.testing.assert_array_equal(got, floats)  # a copy, not a view of the client's memory
    np.testing.assert_array_equal(regions.input_array(ref(handle, "INT64", [2], 16, 64)), ints)
    got_bf16 = regions.input_array(ref(handle, "BF16", [2], 4, 128))
    assert got_bf16.dtype == np.uint16 and got_bf16.tolist() == bf16.tolist()
    words = regions.input_array(ref(handle, "BYTES", [3], 4 * 3 + 4, 256))
    assert words.tolist() == [b"ab", b"", b"\x00z"]
    regions.close()


def test_bad_bytes_framing_names_the_input(allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    handle = allocation("a")
    poke(handle, 0, (100).to_bytes(4, "little") + b"abc")
    message = invalid(lambda: regions.input_array(ref(handle, "BYTES", [1], 7, name="TEXT")))
    assert message.startswith("input 'TEXT' in CUDA shared memory: ")
    message = invalid(lambda: regions.input_array(ref(handle, "FP32", [2], 12, name="F")))
    assert "input 'F'" in message
    regions.close()


def test_input_tensors_alias_the_allocation(allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    handle = allocation("a")
    tensor = regions.input_tensor(ref(handle, "FP32", [2, 2], 16, offset=64), "cpu")
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == (2, 2)
    poke(handle, 64, np.array([1, 2, 3, 4], dtype="<f4").tobytes())
    assert tensor.tolist() == [[1.0, 2.0], [3.0, 4.0]]  # written by the "client", seen here
    bf16 = regions.input_tensor(ref(handle, "BF16", [1], 2, offset=128), "cpu")
    poke(handle, 128, float_to_bf16_bits(np.array([3.5], dtype=np.float32)).tobytes())
    assert bf16.dtype == torch.bfloat16 and bf16.tolist() == [3.5]
    del tensor, bf16
    regions.between_batches()
    regions.close()


def test_unaligned_input_tensors_are_copies(allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    handle = allocation("a")
    poke(handle, 3, np.array([7, -8], dtype="<i4").tobytes())
    tensor = regions.input_tensor(ref(handle, "INT32", [2], 8, offset=3), "cpu")
    assert tensor.tolist() == [7, -8]
    poke(handle, 3, np.array([0, 0], dtype="<i4").tobytes())
    assert tensor.tolist() == [7, -8]
    message = invalid(lambda: regions.input_tensor(ref(handle, "INT32", [3], 8), "cpu"))
    assert "input 'X'" in message and "needs 12 bytes" in message
    regions.close()


class DeviceBackend:
    def takes_device_input(self, name: str) -> bool:
        return name == "ON_DEVICE"


def test_input_value_asks_the_backend(allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    handle = allocation("a")
    on_device = ref(handle, "UINT8", [4], 4, name="ON_DEVICE")
    host = ref(handle, "UINT8", [4], 4, name="HOST")
    assert isinstance(regions.input_value(on_device, DeviceBackend(), "cpu"), torch.Tensor)
    assert isinstance(regions.input_value(host, DeviceBackend(), "cpu"), np.ndarray)
    assert isinstance(regions.input_value(on_device, object(), "cpu"), np.ndarray)
    regions.between_batches()
    regions.close()


# ---------------------------------------------------------------------------- outputs


def target(handle: CudaHandle, offset: int, nbytes: int) -> OutputTarget:
    return OutputTarget("", offset, nbytes, cuda=handle)


def test_write_output_numpy_bytes_and_tensors(allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    handle = allocation("a")
    values = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    assert regions.write_output(target(handle, 8, 16), values, "FP32", "Y") == 16
    assert peek(handle, 8, 16) == values.tobytes()
    words = np.array([b"hi", b"there"], dtype=np.object_)
    assert regions.write_output(target(handle, 100, 64), words, "BYTES", "W") == 15
    assert peek(handle, 100, 15) == serialize_bytes([b"hi", b"there"])
    ints = torch.arange(3, dtype=torch.int64)
    assert regions.write_output(target(handle, 200, 24), ints, "INT64", "I") == 24
    assert peek(handle, 200, 24) == np.arange(3, dtype="<i8").tobytes()
    bf16 = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert regions.write_output(target(handle, 300, 4), bf16, "BF16", "B") == 4
    assert peek(handle, 300, 4) == float_to_bf16_bits(np.array([1.5, -2.0])).tobytes()
    flags = np.array([True, False, True])
    assert regions.write_output(target(handle, 400, 3), flags[::2], "BOOL", "F") == 2
    assert peek(handle, 400, 2) == b"\x01\x01"  # a non-contiguous source is serialized
    regions.synchronize()  # CPU "device": nothing to wait for
    regions.close()


def test_write_output_refuses_small_targets(allocation: Make) -> None:
    regions = DeviceRegions(FakeCudaIpc())
    handle = allocation("a")
    message = invalid(lambda: regions.write_output(
        target(handle, 0, 8), np.zeros(4, dtype=np.float32), "FP32", "Y"))
    assert "output 'Y'" in message and "16 bytes" in message
    past_end = OutputTarget("", SIZE - 8, 16, cuda=CudaHandle(handle.raw_handle, 0, SIZE + 64))
    message = invalid(lambda: regions.write_output(
        past_end, torch.zeros(4, dtype=torch.float32), "FP32", "Y"))
    assert "output 'Y'" in message
    regions.close()


@pytest.fixture
def writer(shm_prefix: str) -> Iterator[tuple[OutputWriter, DeviceRegions]]:
    arena = Arena(shm_prefix + "w-", 1 << 16, 1 << 16)
    regions = DeviceRegions(FakeCudaIpc())
    yield OutputWriter("w", arena, ClientRegions(), regions), regions
    regions.close()
    arena.close()


def test_output_writer_writes_into_cuda_targets(
        writer: tuple[OutputWriter, DeviceRegions], allocation: Make) -> None:
    out, _ = writer
    handle = allocation("a")
    device_values = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    arena_values = torch.tensor([0.5, 1.5], dtype=torch.bfloat16)
    response = BackendResponse([OutputTensor("Y", "INT32", device_values),  # type: ignore
                                OutputTensor("Z", "BF16", arena_values)])  # type: ignore
    requested = [RequestedOutput("Y", target=target(handle, 32, 16)), RequestedOutput("Z")]
    results, lease = out.write_results([7], [requested], [response])
    assert results[0].error is None and lease is not None
    y, z = results[0].outputs
    assert (y.region, y.offset, y.nbytes, y.cuda, y.shape) == ("", 32, 16, handle, [2, 2])
    assert peek(handle, 32, 16) == np.array([1, 2, 3, 4], dtype="<i4").tobytes()
    assert z.cuda is None and z.region.startswith("/shoal-test") and z.nbytes == 4
    out.release(lease.lease_id)


def test_output_writer_names_the_output_whose_cuda_target_is_too_small(
        writer: tuple[OutputWriter, DeviceRegions], allocation: Make) -> None:
    out, _ = writer
    handle = allocation("a")
    response = BackendResponse([OutputTensor("Y", "FP32", np.zeros(8, dtype=np.float32))])
    results, lease = out.write_results(
        [1], [[RequestedOutput("Y", target=target(handle, 0, 16))]], [response])
    assert lease is None and isinstance(results[0].error, Error)
    assert results[0].error.code == ErrorCode.INVALID_ARG
    assert "output 'Y'" in results[0].error.message and "32 bytes" in results[0].error.message
    beyond = CudaHandle(handle.raw_handle, 0, SIZE * 2)
    with pytest.raises(ShoalError) as info:
        out.write_one([RequestedOutput("Y", target=target(beyond, SIZE - 8, 32))], response)
    assert "output 'Y'" in info.value.message
