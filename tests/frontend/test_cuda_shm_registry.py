"""The registry's CUDA regions: registration checks, one name space with system regions,
kind-aware status / unregister, references into CUDA allocations, and the ``on_cuda_forget``
callback (exactly once, after the last user). No GPU needed: the registry never opens a handle."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from shoal.errors import ErrorCode
from shoal.frontend.shm_contract import CudaRegionStatus, RegionStatus
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.messages import CudaHandle, OutputTarget, TensorRef
from shoal.settings import settings_from_flags
from tests.conftest import MakeObject
from tests.frontend.test_shm_registry import error_of, open_fds_on

ENABLED = settings_from_flags(model_repositories=["/m"], allow_client_shm=True).for_frontends()


class Forgets:
    """Records every on_cuda_forget call."""

    def __init__(self) -> None:
        self.calls: list[list[CudaHandle]] = []

    def __call__(self, handles: list[CudaHandle]) -> None:
        self.calls.append(list(handles))


@pytest.fixture
def forgets() -> Forgets:
    return Forgets()


@pytest.fixture
def registry(forgets: Forgets) -> Iterator[ClientSharedMemoryRegistry]:
    reg = ClientSharedMemoryRegistry(ENABLED, on_cuda_forget=forgets)
    yield reg
    reg.close()


def handle() -> bytes:
    return secrets.token_bytes(64)


# ---------------------------------------------------------------- register / status / unregister


def test_register_status_and_unregister(registry: ClientSharedMemoryRegistry,
                                        forgets: Forgets) -> None:
    raw_a, raw_b = handle(), handle()
    registry.register_cuda("b", raw_b, 1, 100, device_count=2)
    registry.register_cuda("a", raw_a, 0, 4096, device_count=2)
    assert registry.cuda_status(None) == [CudaRegionStatus("a", 0, 4096),
                                          CudaRegionStatus("b", 1, 100)]
    assert registry.cuda_status("b") == [CudaRegionStatus("b", 1, 100)]
    assert registry.status(None) == []  # system status sees system regions only
    registry.cuda_unregister("a")
    assert forgets.calls == [[CudaHandle(raw_a, 0, 4096)]]
    assert registry.cuda_status(None) == [CudaRegionStatus("b", 1, 100)]
    registry.cuda_unregister("never-registered")  # Triton: not an error
    registry.cuda_unregister(None)
    assert forgets.calls[1:] == [[CudaHandle(raw_b, 1, 100)]]
    assert registry.cuda_status(None) == []


def test_status_of_an_unknown_cuda_region_is_not_found(
        registry: ClientSharedMemoryRegistry) -> None:
    error = error_of(lambda: registry.cuda_status("nope"))
    assert error.code is ErrorCode.NOT_FOUND
    assert error.message == "Unable to find cuda shared memory region: 'nope'"


def test_status_and_unregister_see_one_kind_each(registry: ClientSharedMemoryRegistry,
                                                 forgets: Forgets,
                                                 make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("sys", key, 0, 64)
    registry.register_cuda("gpu", handle(), 0, 64, device_count=1)
    error = error_of(lambda: registry.status("gpu"))
    assert error.code is ErrorCode.NOT_FOUND
    assert "registered as CUDA shared memory, not system shared memory" in error.message
    error = error_of(lambda: registry.cuda_status("sys"))
    assert error.code is ErrorCode.NOT_FOUND
    assert "registered as system shared memory, not CUDA shared memory" in error.message
    registry.unregister("gpu")  # a CUDA name: the system unregister does nothing
    registry.cuda_unregister("sys")
    assert [r.name for r in registry.cuda_status(None)] == ["gpu"]
    assert registry.status(None) == [RegionStatus("sys", key, 0, 64)]
    registry.unregister(None)  # every system region, no CUDA one
    assert [r.name for r in registry.cuda_status(None)] == ["gpu"] and forgets.calls == []
    assert open_fds_on(key) == 0
    registry.register("sys", key, 0, 64)
    registry.cuda_unregister(None)  # every CUDA region, no system one
    assert registry.cuda_status(None) == [] and len(forgets.calls) == 1
    assert registry.status(None) == [RegionStatus("sys", key, 0, 64)]


def test_names_are_shared_with_system_regions(registry: ClientSharedMemoryRegistry,
                                              make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("sys", key, 0, 64)
    error = error_of(lambda: registry.register_cuda("sys", handle(), 0, 64, 1))
    assert error.code is ErrorCode.ALREADY_EXISTS and "'sys'" in error.message
    registry.register_cuda("gpu", handle(), 0, 64, 1)
    error = error_of(lambda: registry.register("gpu", key, 0, 64))
    assert error.code is ErrorCode.ALREADY_EXISTS and "'gpu'" in error.message
    assert open_fds_on(key) == 1  # only "sys" holds the object
    assert registry.status("sys") == [RegionStatus("sys", key, 0, 64)]
    assert registry.cuda_status("gpu") == [CudaRegionStatus("gpu", 0, 64)]


@pytest.mark.parametrize("raw_handle", [b"", b"\x01" * 63, b"\x01" * 65])
def test_the_handle_must_be_64_bytes(registry: ClientSharedMemoryRegistry,
                                     raw_handle: bytes) -> None:
    error = error_of(lambda: registry.register_cuda("g", raw_handle, 0, 64, 1))
    assert error.code is ErrorCode.INVALID_ARG
    assert "'raw_handle'" in error.message and "'g'" in error.message
    assert registry.cuda_status(None) == []


@pytest.mark.parametrize("device_id,byte_size,field", [
    (-1, 64, "'device_id'"), (2, 64, "'device_id'"), (3, 64, "'device_id'"),
    (0, 0, "'byte_size'"), (1, -64, "'byte_size'"),
])
def test_device_and_size_are_checked(registry: ClientSharedMemoryRegistry, device_id: int,
                                     byte_size: int, field: str) -> None:
    error = error_of(lambda: registry.register_cuda("g", handle(), device_id, byte_size, 2))
    assert error.code is ErrorCode.INVALID_ARG and field in error.message
    assert registry.cuda_status(None) == []


def test_handle_bytes_never_appear_in_errors(registry: ClientSharedMemoryRegistry) -> None:
    raw = b"secret-handle-bytes".ljust(65, b"x")
    error = error_of(lambda: registry.register_cuda("g", raw, 0, 64, 1))
    assert "secret" not in error.message


def test_region_name_is_required(registry: ClientSharedMemoryRegistry) -> None:
    error = error_of(lambda: registry.register_cuda("", handle(), 0, 64, 1))
    assert error.message == "'region name' is necessary to register cuda shared memory region"


def test_disabled_registry_refuses_cuda_but_status(forgets: Forgets) -> None:
    registry = ClientSharedMemoryRegistry(settings_from_flags(model_repositories=["/m"])
                                          .for_frontends(),
                                          on_cuda_forget=forgets)
    for call in (lambda: registry.register_cuda("g", handle(), 0, 64, 1),
                 lambda: registry.cuda_unregister("g"), lambda: registry.cuda_unregister(None)):
        error = error_of(call)
        assert error.code is ErrorCode.UNSUPPORTED and "--allow-client-shm" in error.message
    assert registry.cuda_status(None) == []
    several = ClientSharedMemoryRegistry(settings_from_flags(model_repositories=["/m"],
                                                             allow_client_shm=True,
                                                             http_workers=2).for_frontends())
    error = error_of(lambda: several.register_cuda("g", handle(), 0, 64, 1))
    assert error.code is ErrorCode.UNSUPPORTED and "--http-workers=1" in error.message


def test_the_region_cap_counts_cuda_regions_and_not_their_bytes(
        forgets: Forgets, make_object: MakeObject) -> None:
    settings = settings_from_flags(model_repositories=["/m"], allow_client_shm=True,
                                   client_shm_max_regions=2,
                                   client_shm_max_bytes=100).for_frontends()
    registry = ClientSharedMemoryRegistry(settings, on_cuda_forget=forgets)
    key = make_object(100)
    try:
        registry.register_cuda("g", handle(), 0, 1 << 40, 1)  # beyond max_bytes: not counted
        registry.register("s", key, 0, 100)  # the whole byte budget is still there
        for call in (lambda: registry.register_cuda("h", handle(), 0, 8, 1),
                     lambda: registry.register("t", key, 0, 8)):
            error = error_of(call)
            assert error.code is ErrorCode.UNAVAILABLE
            assert "--client-shm-max-regions" in error.message
        registry.resolve_output(1, "g", 0, 8, "Y")
        registry.cuda_unregister("g")  # retiring: still counted until request 1 ends
        assert error_of(lambda: registry.register_cuda("h", handle(), 0, 8, 1)).code is (
            ErrorCode.UNAVAILABLE)
        registry.release_request(1)
        registry.register_cuda("h", handle(), 0, 8, 1)
    finally:
        registry.close()


# ---------------------------------------------------------------- use by requests


def test_references_point_into_the_allocation(registry: ClientSharedMemoryRegistry) -> None:
    raw = handle()
    registry.register_cuda("g", raw, 0, 4096, 1)
    cuda = CudaHandle(raw, 0, 4096)
    ref = registry.resolve_input(7, "g", 16, 24, "X", "FP32", [2, 3])
    assert ref == TensorRef("X", "FP32", [2, 3], "", 16, 24, cuda=cuda)
    assert registry.resolve_output(7, "g", 1000, 3096, "Y") == OutputTarget("", 1000, 3096,
                                                                            cuda=cuda)


@pytest.mark.parametrize("offset,byte_size", [
    (0, 101), (100, 4), (97, 4), (2**63 - 1, 4), (4, 2**63 - 1), (2**64 - 1, 2**64 - 1),
    (-4, 4), (0, -4),
])
def test_slices_past_the_allocation_are_refused(registry: ClientSharedMemoryRegistry,
                                                forgets: Forgets, offset: int,
                                                byte_size: int) -> None:
    registry.register_cuda("g", handle(), 0, 100, 1)
    for call in (lambda: registry.resolve_output(1, "g", offset, byte_size, "Y"),
                 lambda: registry.resolve_input(1, "g", offset, byte_size, "X", "UINT8",
                                                [max(byte_size, 0)])):
        error = error_of(call)
        assert error.code is ErrorCode.INVALID_ARG and "'g'" in error.message
    registry.cuda_unregister("g")
    assert len(forgets.calls) == 1  # nothing was marked in use: forgotten at once


def test_input_byte_size_must_match_the_tensor(registry: ClientSharedMemoryRegistry) -> None:
    registry.register_cuda("g", handle(), 0, 64, 1)
    error = error_of(lambda: registry.resolve_input(1, "g", 0, 12, "X", "FP32", [4]))
    assert error.code is ErrorCode.INVALID_ARG
    assert "'X'" in error.message and "16" in error.message and "12" in error.message


def test_bytes_inputs_in_cuda_memory_are_left_to_the_worker(
        registry: ClientSharedMemoryRegistry) -> None:
    registry.register_cuda("g", handle(), 0, 64, 1)
    ref = registry.resolve_input(1, "g", 8, 3, "S", "BYTES", [5])  # 3 bytes cannot frame 5
    assert (ref.region, ref.offset, ref.nbytes) == ("", 8, 3) and ref.cuda is not None


def test_unknown_region_names_region_and_tensor(registry: ClientSharedMemoryRegistry) -> None:
    registry.register_cuda("g", handle(), 0, 64, 1)
    registry.cuda_unregister("g")
    error = error_of(lambda: registry.resolve_output(1, "g", 0, 4, "Y"))
    assert error.code is ErrorCode.NOT_FOUND and "'g'" in error.message and "'Y'" in error.message


# ---------------------------------------------------------------- forgetting


def test_unregister_while_in_use_forgets_after_the_last_user(
        registry: ClientSharedMemoryRegistry, forgets: Forgets) -> None:
    raw = handle()
    registry.register_cuda("g", raw, 0, 64, 1)
    registry.resolve_input(1, "g", 0, 16, "X", "FP32", [4])
    registry.resolve_output(1, "g", 16, 16, "Y")  # same region twice in one request
    registry.resolve_output(2, "g", 32, 16, "Y")
    registry.cuda_unregister("g")
    assert registry.cuda_status(None) == [] and forgets.calls == []
    replacement = handle()
    registry.register_cuda("g", replacement, 0, 32, 1)  # the name is free again at once
    registry.release_request(1)
    assert forgets.calls == []
    registry.release_request(2)
    assert forgets.calls == [[CudaHandle(raw, 0, 64)]]
    registry.release_request(2)  # idempotent
    registry.release_request(1)
    assert len(forgets.calls) == 1
    assert registry.cuda_status("g") == [CudaRegionStatus("g", 0, 32)]


def test_one_handle_under_two_names_is_forgotten_with_the_last(
        registry: ClientSharedMemoryRegistry, forgets: Forgets) -> None:
    raw = handle()
    registry.register_cuda("a", raw, 0, 64, 1)
    registry.register_cuda("b", raw, 0, 32, 1)
    registry.resolve_output(1, "b", 0, 4, "Y")
    registry.cuda_unregister("a")
    assert forgets.calls == []  # "b" still names the allocation
    registry.cuda_unregister("b")
    assert forgets.calls == []  # request 1 still uses it
    registry.release_request(1)
    assert forgets.calls == [[CudaHandle(raw, 0, 32)]]


def test_close_forgets_everything_once(forgets: Forgets, make_object: MakeObject) -> None:
    registry = ClientSharedMemoryRegistry(ENABLED, on_cuda_forget=forgets)
    key = make_object(64)
    raws = [handle() for _ in range(3)]
    for i, raw in enumerate(raws):
        registry.register_cuda(f"g{i}", raw, 0, 64, 1)
    registry.register("s", key, 0, 64)
    registry.resolve_input(1, "g0", 0, 4, "X", "INT32", [1])
    registry.cuda_unregister("g0")  # retiring
    registry.close()
    assert len(forgets.calls) == 1
    assert sorted(h.raw_handle for h in forgets.calls[0]) == sorted(raws)
    assert open_fds_on(key) == 0
    registry.release_request(1)  # after close: nothing more
    assert len(forgets.calls) == 1


def test_a_failing_forget_leaves_the_registry_consistent(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(handles: list[CudaHandle]) -> None:
        raise RuntimeError("socket closed")

    registry = ClientSharedMemoryRegistry(ENABLED, on_cuda_forget=broken)
    registry.register_cuda("g", handle(), 0, 64, 1)
    registry.cuda_unregister("g")
    assert registry.cuda_status(None) == []
    assert "forget 1 CUDA registrations" in caplog.text
    registry.register_cuda("g", handle(), 0, 64, 1)
    registry.close()
