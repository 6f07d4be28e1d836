"""Triton's CUDA shared-memory extension end to end, through the real processes.

This machine has no GPU, so the server runs with the test stand-in for CUDA IPC plugged in
(``tests.fakes.cuda_ipc.FAKE_IPC_ENV``: ``SHOAL_CUDA_IPC_PROVIDER`` names
``tests.fakes.cuda_ipc:FakeCudaIpc``): a "CUDA IPC handle" then names a POSIX shm object
(``tests.fakes.cuda_ipc.fake_handle``) and the worker maps it where it would call
``cuIpcOpenMemHandle``. Everything else is the production path: tritonclient's
``register_cuda_shared_memory`` over HTTP and gRPC, the frontend's registry and checks, the
references through the broker, the worker's handle cache, copies in and out of the "device"
allocation, and the unmapping when a registration ends. ``test_cuda_shm_on_a_gpu.py`` runs the
same flows against real device memory where torch sees CUDA.
"""

from __future__ import annotations

import base64
import contextlib
import pathlib
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal.dtypes import DATATYPES
from shoal.frontend.cuda_shm import torch_sees_cuda
from tests.conftest import MakeObject
from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.e2e.test_datatypes import sample
from tests.e2e.test_shared_memory import pread, pwrite, start_sleepy_inference, wire
from tests.fakes.cuda_ipc import FAKE_IPC_ENV, fake_handle


@pytest.fixture(scope="module")
def cuda_server(standard_repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(standard_repo)], ["--allow-client-shm=true"],
                             env=FAKE_IPC_ENV)) as srv:
        yield srv


@pytest.fixture
def client(cuda_server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    """tritonclient over HTTP; afterwards the server is live with the same workers and every
    region is unregistered."""
    workers = sorted(cuda_server.worker_pids())
    triton = httpclient.InferenceServerClient(cuda_server.url)
    yield triton
    triton.unregister_cuda_shared_memory()
    triton.unregister_system_shared_memory()
    assert triton.get_cuda_shared_memory_status() == []
    assert triton.is_server_live()
    assert sorted(cuda_server.worker_pids()) == workers, "a worker restarted"
    triton.close()


def raw_handle(key: str) -> str:
    """The handle as tritonclient's ``cuda_shared_memory.get_raw_handle`` gives it: base64."""
    return base64.b64encode(fake_handle(key)).decode()


def error_text(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.message())


def mapped_by_workers(server: ShoalServer, key: str, model: str) -> bool:
    """Whether a worker of ``model`` maps /dev/shm<key> now (the fake's 'open IPC handle')."""
    for pid in server.worker_pids(model):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            if any(line.rstrip().endswith("/dev/shm" + key) for line in maps):
                return True
    return False


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_through_cuda_regions(client: httpclient.InferenceServerClient,
                                             make_object: MakeObject,
                                             datatype: str) -> None:
    data = sample(datatype)
    payload = wire(data, datatype)
    in_key, out_key = make_object(4096), make_object(4096)
    pwrite(in_key, 100, payload)
    client.register_cuda_shared_memory("in", raw_handle(in_key), 0, 4096)
    client.register_cuda_shared_memory("out", raw_handle(out_key), 0, 4096)
    inp = httpclient.InferInput(f"IN_{datatype}", list(data.shape), datatype)
    inp.set_shared_memory("in", len(payload), offset=100)
    out = httpclient.InferRequestedOutput(f"OUT_{datatype}")
    out.set_shared_memory("out", 1024, offset=512)
    result = client.infer("identity_all", [inp], outputs=[out])
    assert result.get_output(f"OUT_{datatype}") == {
        "name": f"OUT_{datatype}", "datatype": datatype, "shape": list(data.shape)}
    assert pread(out_key, 512, len(payload)) == payload


def test_grpc_pytorch_model_reads_and_writes_cuda_regions(
        cuda_server: ShoalServer, client: httpclient.InferenceServerClient,
        make_object: MakeObject) -> None:
    """The TorchScript MLP over gRPC, its input and output in CUDA regions, gives what the same
    request with inline tensors gives."""
    x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    triton = grpcclient.InferenceServerClient(cuda_server.grpc_url)
    try:
        inline = grpcclient.InferInput("INPUT__0", [4, 256], "FP32")
        inline.set_data_from_numpy(x)
        expected = triton.infer("mlp", [inline]).as_numpy("OUTPUT__0")
        in_key, out_key = make_object(x.nbytes), make_object(4 * 16 * 4)
        pwrite(in_key, 0, x.tobytes())
        triton.register_cuda_shared_memory("x", raw_handle(in_key), 0, x.nbytes)
        triton.register_cuda_shared_memory("y", raw_handle(out_key), 0, 4 * 16 * 4)
        status = triton.get_cuda_shared_memory_status(as_json=True)["regions"]
        assert status["x"] == {"name": "x", "byte_size": str(x.nbytes)}  # device_id 0 omitted
        inp = grpcclient.InferInput("INPUT__0", [4, 256], "FP32")
        inp.set_shared_memory("x", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUTPUT__0")
        out.set_shared_memory("y", 4 * 16 * 4)
        result = triton.infer("mlp", [inp], outputs=[out])
        meta = result.get_output("OUTPUT__0")  # (its as_json=True returns None: tritonclient)
        assert list(meta.shape) == [4, 16]  # the data is in the region only
        got = np.frombuffer(pread(out_key, 0, 4 * 16 * 4), np.float32).reshape(4, 16)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
        triton.unregister_cuda_shared_memory()
        assert triton.get_cuda_shared_memory_status(as_json=True) == {}
    finally:
        triton.close()


def test_concurrent_requests_batched_from_cuda_regions(
        cuda_server: ShoalServer, client: httpclient.InferenceServerClient,
        make_object: MakeObject) -> None:
    """identity_fp32 batches concurrent requests: each one's rows come from, and go back to, its
    own slice of one shared allocation."""
    count, row_bytes = 8, 16 * 4
    key = make_object(2 * count * row_bytes)
    rows = np.arange(count * 16, dtype=np.float32).reshape(count, 16)
    pwrite(key, 0, rows.tobytes())
    client.register_cuda_shared_memory("shared", raw_handle(key), 0, 2 * count * row_bytes)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            triton = httpclient.InferenceServerClient(cuda_server.url)
            inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_shared_memory("shared", row_bytes, offset=k * row_bytes)
            out = httpclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("shared", row_bytes, offset=(count + k) * row_bytes)
            for _ in range(5):
                triton.infer("identity_fp32", [inp], outputs=[out])
            triton.close()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    out = np.frombuffer(pread(key, count * row_bytes, count * row_bytes), np.float32)
    np.testing.assert_array_equal(out.reshape(count, 16), rows)


# ---------------------------------------------------------------- registration


def test_status_and_one_name_space_with_system_regions(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    key, system_key = make_object(256), make_object(256)
    client.register_cuda_shared_memory("gpu", raw_handle(key), 0, 256)
    client.register_system_shared_memory("host", system_key, 256)
    assert client.get_cuda_shared_memory_status() == [
        {"name": "gpu", "device_id": 0, "byte_size": 256}]
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["host"]
    assert "already" in error_text(
        lambda: client.register_system_shared_memory("gpu", system_key, 256))
    assert "already" in error_text(
        lambda: client.register_cuda_shared_memory("host", raw_handle(key), 0, 256))
    assert "system shared memory" in error_text(
        lambda: client.get_cuda_shared_memory_status("host"))
    client.unregister_system_shared_memory("gpu")  # the other kind: nothing happens
    assert [r["name"] for r in client.get_cuda_shared_memory_status()] == ["gpu"]
    client.unregister_cuda_shared_memory("gpu")
    assert client.get_cuda_shared_memory_status() == []
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["host"]


@pytest.mark.parametrize("handle,device_id,byte_size,field", [
    (base64.b64encode(b"\x01" * 63).decode(), 0, 64, "raw_handle"),
    ("not base64!", 0, 64, "raw_handle"),
    (None, 1, 64, "device_id"),
    (None, -1, 64, "device_id"),
    (None, 0, 0, "byte_size"),
])
def test_bad_registrations_are_refused_naming_the_field(
        client: httpclient.InferenceServerClient, make_object: MakeObject,
        handle: str | None, device_id: int, byte_size: int, field: str) -> None:
    good = raw_handle(make_object(64))
    message = error_text(lambda: client.register_cuda_shared_memory(
        "bad", good if handle is None else handle, device_id, byte_size))
    assert field in message
    assert client.get_cuda_shared_memory_status() == []


# ---------------------------------------------------------------- hostile use


def fp32_input(region: str, byte_size: int = 64, offset: int = 0) -> httpclient.InferInput:
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory(region, byte_size, offset=offset)
    return inp


def test_a_handle_that_cannot_be_opened_fails_the_request_only(
        client: httpclient.InferenceServerClient) -> None:
    client.register_cuda_shared_memory("ghost", raw_handle("/cudatest-never-created"), 0, 64)
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("ghost")]))
    assert "'INPUT0'" in message and "cannot be opened" in message
    assert "cudatest-never-created" not in message
    forged = base64.b64encode(b"\x07" * 64).decode()  # a handle no allocation has
    client.register_cuda_shared_memory("forged", forged, 0, 64)
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("forged")]))
    assert "cannot be opened" in message


def test_offsets_past_the_registration_or_overflowing(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    client.register_cuda_shared_memory("r", raw_handle(make_object(128)), 0, 128)
    for offset, size in ((100, 64), (2**63 - 1, 64), (0, 2**64 - 1)):
        message = error_text(lambda o=offset, s=size: client.infer(
            "identity_fp32", [fp32_input("r", s, o)]))
        assert "'r'" in message or "shared_memory_" in message
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("r", 32)  # 64 bytes of output
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("r")], outputs=[out]))
    assert "'OUTPUT0'" in message and "at least 64" in message


def test_a_registration_larger_than_the_allocation_is_caught_by_the_worker(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    """A client may claim more bytes than its allocation has: the worker checks the real size
    before it touches a byte (on a GPU, an out-of-bounds read would kill the CUDA context)."""
    client.register_cuda_shared_memory("liar", raw_handle(make_object(64)), 0, 1 << 20)
    message = error_text(lambda: client.infer("identity_fp32",
                                              [fp32_input("liar", offset=4096)]))
    assert "'INPUT0'" in message
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("liar", 64, offset=4096)
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("liar")],
                                              outputs=[out]))
    assert "'OUTPUT0'" in message


def test_unregister_during_an_inference_then_workers_unmap(
        cuda_server: ShoalServer, client: httpclient.InferenceServerClient,
        make_object: MakeObject) -> None:
    key = make_object(64)
    pwrite(key, 0, np.array([0.8], np.float32).tobytes())
    client.register_cuda_shared_memory("slow", raw_handle(key), 0, 64)
    inp, thread, results = start_sleepy_inference(cuda_server.url, "slow")
    # the worker maps the allocation as the request starts (its first CUDA request imports torch)
    assert wait_for(lambda: mapped_by_workers(cuda_server, key, "sleepy"))
    time.sleep(0.2)  # the model is sleeping now
    client.unregister_cuda_shared_memory("slow")
    assert client.get_cuda_shared_memory_status() == []
    thread.join(30)
    assert results and results[0].get_output("DELAY_OUT")["shape"] == [1]
    assert pread(key, 32, 4) == np.array([0.8], np.float32).tobytes()  # written after unregister
    # the request ended: the registration is dropped and the worker unmaps the allocation
    assert wait_for(lambda: not mapped_by_workers(cuda_server, key, "sleepy"))
    assert "'slow'" in error_text(lambda: client.infer("sleepy", [inp]))


def test_a_kept_registration_stays_mapped_and_is_reused(
        cuda_server: ShoalServer, client: httpclient.InferenceServerClient,
        make_object: MakeObject) -> None:
    """The worker opens a handle once and reuses it: writes by the client after the first
    request are seen by the next one (no stale copy)."""
    key = make_object(128)
    client.register_cuda_shared_memory("kept", raw_handle(key), 0, 128)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("kept", 64, offset=64)
    for value in (1.0, 2.0, 3.0):
        pwrite(key, 0, np.full(16, value, np.float32).tobytes())
        client.infer("identity_fp32", [fp32_input("kept")], outputs=[out])
        assert np.frombuffer(pread(key, 64, 64), np.float32).tolist() == [value] * 16
        assert mapped_by_workers(cuda_server, key, "identity_fp32")
    client.unregister_cuda_shared_memory("kept")
    assert wait_for(lambda: not mapped_by_workers(cuda_server, key, "identity_fp32"))


def test_without_a_device_cuda_registration_is_unsupported(
        shm_server: ShoalServer) -> None:
    """The server of tests/e2e/test_shared_memory.py runs without the fake: no CUDA here."""
    if torch_sees_cuda():
        pytest.skip("torch sees CUDA here")
    triton = httpclient.InferenceServerClient(shm_server.url)
    try:
        message = error_text(lambda: triton.register_cuda_shared_memory(
            "g", base64.b64encode(b"\0" * 64).decode(), 0, 64))
        assert "CUDA shared memory is not supported" in message
        assert triton.get_cuda_shared_memory_status() == []
    finally:
        triton.close()
