"""Triton's system shared-memory extension end to end: a server started with --allow-client-shm,
tritonclient (its HTTP client and its shared_memory utilities, unchanged), shoal.client, and the
hostile cases. Every test ends with the server live, no worker restarted and every region
unregistered; the objects are ``/shmtest-<random>`` (or shoal.client's), unlinked afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as triton_shm
from tritonclient.utils import InferenceServerException

from shoal.client import ShmClient
from shoal.dtypes import DATATYPES
from tests.conftest import MakeObject
from tests.e2e.server import ShoalServer
from tests.e2e.test_datatypes import sample


@pytest.fixture
def client(shm_server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    """tritonclient over HTTP; afterwards the server must be live with the same workers and
    every region gets unregistered (so the frontend holds none of our objects)."""
    workers = sorted(shm_server.worker_pids())
    triton = httpclient.InferenceServerClient(shm_server.url)
    yield triton
    triton.unregister_system_shared_memory()
    assert triton.get_system_shared_memory_status() == []
    assert triton.is_server_live()
    assert sorted(shm_server.worker_pids()) == workers, "a worker restarted"
    triton.close()


def pwrite(key: str, offset: int, data: bytes) -> None:
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def pread(key: str, offset: int, nbytes: int) -> bytes:
    fd = os.open("/dev/shm" + key, os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def frontend_fds_on(server: ShoalServer, key: str) -> int:
    """Descriptors the frontend process holds on /dev/shm<key>."""
    count = 0
    for child in server.children():
        if "shoal.frontend" not in " ".join(child.cmdline()):
            continue
        for entry in os.listdir(f"/proc/{child.pid}/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/{child.pid}/fd/{entry}") == "/dev/shm" + key
    return count


def error_text(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.message())


def wire(data: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(x)) + x for x in data.tolist())
    return data.tobytes()


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_through_registered_regions(
        client: httpclient.InferenceServerClient, make_object: MakeObject,
        datatype: str) -> None:
    data = sample(datatype)
    payload = wire(data, datatype)
    in_key, out_key = make_object(4096), make_object(4096)
    pwrite(in_key, 200, payload)
    client.register_system_shared_memory("in", in_key, 1024, offset=100)
    client.register_system_shared_memory("out", out_key, 2048, offset=1000)
    inp = httpclient.InferInput(f"IN_{datatype}", list(data.shape), datatype)
    inp.set_shared_memory("in", len(payload), offset=100)
    out = httpclient.InferRequestedOutput(f"OUT_{datatype}")
    out.set_shared_memory("out", 1024, offset=24)
    result = client.infer("identity_all", [inp], outputs=[out])
    meta = result.get_output(f"OUT_{datatype}")
    # name, datatype and shape only: no data, no binary part
    assert meta == {"name": f"OUT_{datatype}", "datatype": datatype, "shape": list(data.shape)}
    assert pread(out_key, 1024, len(payload)) == payload  # registration offset + tensor offset


def test_tritonclient_shared_memory_utilities_work_unchanged(
        client: httpclient.InferenceServerClient) -> None:
    """Triton's simple_http_shm_client flow against add_sub, with tritonclient's own regions."""
    input0 = np.arange(4, dtype=np.float32)
    input1 = np.full(4, 0.5, dtype=np.float32)
    tag = secrets.token_hex(6)
    ip = triton_shm.create_shared_memory_region("input_data", f"/shmtest-in-{tag}", 32)
    op = triton_shm.create_shared_memory_region("output_data", f"/shmtest-out-{tag}", 32)
    try:
        triton_shm.set_shared_memory_region(ip, [input0])
        triton_shm.set_shared_memory_region(ip, [input1], offset=16)
        client.register_system_shared_memory("input_data", f"/shmtest-in-{tag}", 32)
        client.register_system_shared_memory("output_data", f"/shmtest-out-{tag}", 32)
        status = client.get_system_shared_memory_status()
        assert {s["name"] for s in status} == {"input_data", "output_data"}
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"),
                  httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_shared_memory("input_data", 16)
        inputs[1].set_shared_memory("input_data", 16, offset=16)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                   httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
        outputs[0].set_shared_memory("output_data", 16)
        outputs[1].set_shared_memory("output_data", 16, offset=16)
        result = client.infer("add_sub", inputs, outputs=outputs)
        out0 = result.get_output("OUTPUT0")
        got0 = triton_shm.get_contents_as_numpy(op, np.float32, out0["shape"])
        got1 = triton_shm.get_contents_as_numpy(op, np.float32, [4], offset=16)
        np.testing.assert_array_equal(got0, input0 + input1)
        np.testing.assert_array_equal(got1, input0 - input1)
        client.unregister_system_shared_memory("input_data")
        client.unregister_system_shared_memory("output_data")
    finally:
        triton_shm.destroy_shared_memory_region(ip)
        triton_shm.destroy_shared_memory_region(op)
    assert not triton_shm.mapped_shared_memory_regions()


def test_inputs_and_outputs_at_offsets_of_one_region(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    key = make_object(1 << 16)
    client.register_system_shared_memory("shared", key, 60000, offset=512)
    rows = [np.random.default_rng(i).standard_normal((2, 16)).astype(np.float32)
            for i in range(3)]
    for i, rows_i in enumerate(rows):
        pwrite(key, 512 + 4096 * i, rows_i.tobytes())
    for i in range(len(rows)):
        inp = httpclient.InferInput("INPUT0", [2, 16], "FP32")
        inp.set_shared_memory("shared", 128, offset=4096 * i)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("shared", 128, offset=32768 + 4096 * i)
        client.infer("identity_fp32", [inp], outputs=[out])
    for i, rows_i in enumerate(rows):
        assert pread(key, 512 + 32768 + 4096 * i, 128) == rows_i.tobytes()
        assert pread(key, 512 + 4096 * i, 128) == rows_i.tobytes()  # inputs untouched


def test_several_clients_at_once(shm_server: ShoalServer,
                                 client: httpclient.InferenceServerClient) -> None:
    failures: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            with ShmClient(shm_server.url) as own:
                for step in range(15):
                    x = np.full((1 + step % 3, 16), seed * 100 + step, dtype=np.float32)
                    got = own.infer_numpy("identity_fp32", {"INPUT0": x}, {"OUTPUT0": 4096})
                    np.testing.assert_array_equal(got["OUTPUT0"], x)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    assert client.get_system_shared_memory_status() == []  # each client unregistered its own


def test_shoal_client_helper_zero_copy(shm_server: ShoalServer,
                                       client: httpclient.InferenceServerClient) -> None:
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    with ShmClient(shm_server.url) as own:
        source = own.create_region(x.nbytes, name="source")
        target = own.create_region(x.nbytes, name="target")
        source.ndarray("FP32", [4, 16])[:] = x
        result = own.infer("identity_fp32", [source.input("INPUT0", "FP32", [4, 16])],
                           [target.output("OUTPUT0")])
        view = result["OUTPUT0"]
        np.testing.assert_array_equal(view, x)
        assert np.shares_memory(view, target.ndarray("FP32", [4, 16]))  # a view, not a copy
        keys = [source.key, target.key]
        assert {s["name"] for s in own.status()} == {"source", "target"}
        del view, result
    assert client.get_system_shared_memory_status() == []
    assert not [k for k in keys if os.path.exists("/dev/shm" + k)]


# ---------------------------------------------------------------- hostile cases


def fp32_input(region: str, byte_size: int = 64, offset: int = 0) -> httpclient.InferInput:
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory(region, byte_size, offset=offset)
    return inp


def test_unknown_region(client: httpclient.InferenceServerClient) -> None:
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("ghost")]))
    assert "'ghost'" in message and "'INPUT0'" in message


@pytest.mark.parametrize("offset,byte_size", [
    (4096, 64), (4064, 64), (2**63 - 1, 64), (64, 2**63 - 1), (2**64 - 1, 64),
])
def test_offset_or_size_past_the_end_or_overflowing(
        shm_server: ShoalServer, client: httpclient.InferenceServerClient,
        make_object: MakeObject, offset: int, byte_size: int) -> None:
    client.register_system_shared_memory("r", make_object(4096), 4096)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {
        "shared_memory_region": "r", "shared_memory_offset": offset,
        "shared_memory_byte_size": byte_size}}]}
    reply = httpx.post(shm_server.base + "/v2/models/identity_fp32/infer", json=body)
    assert reply.status_code == 400, reply.text
    output_body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                               "data": [0.0] * 16}],
                   "outputs": [{"name": "OUTPUT0", "parameters": {
                       "shared_memory_region": "r", "shared_memory_offset": offset,
                       "shared_memory_byte_size": byte_size}}]}
    reply = httpx.post(shm_server.base + "/v2/models/identity_fp32/infer", json=output_body)
    assert reply.status_code == 400, reply.text


def test_byte_size_not_matching_the_tensor(client: httpclient.InferenceServerClient,
                                           make_object: MakeObject) -> None:
    client.register_system_shared_memory("r", make_object(4096), 4096)
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("r", 60)]))
    assert "'INPUT0'" in message and "64" in message and "60" in message


def test_output_region_too_small(client: httpclient.InferenceServerClient,
                                 make_object: MakeObject) -> None:
    key = make_object(4096)
    pwrite(key, 0, np.ones(16, np.float32).tobytes())
    client.register_system_shared_memory("r", key, 4096)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("r", 32, offset=1024)
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("r")], outputs=[out]))
    assert "'OUTPUT0'" in message and "64" in message
    assert pread(key, 1024, 64) == b"\0" * 64  # nothing written


def test_registering_a_key_that_does_not_exist(client: httpclient.InferenceServerClient) -> None:
    key = f"/shmtest-{secrets.token_hex(6)}"
    message = error_text(lambda: client.register_system_shared_memory("r", key, 64))
    assert key in message
    assert client.get_system_shared_memory_status() == []


def test_registering_an_internal_segment_is_refused(
        shm_server: ShoalServer, client: httpclient.InferenceServerClient) -> None:
    internal = sorted(n for n in os.listdir("/dev/shm") if n.startswith("shoal-"))
    assert internal, "the server has segments"
    for name in internal[:3]:
        for key in (f"/{name}", name, f"//{name}"):
            message = error_text(lambda k=key: client.register_system_shared_memory(
                "evil", k, 64))
            assert "reserved" in message and name not in message and "shoal-" not in message
    for key in ("/", "///"):
        error_text(lambda k=key: client.register_system_shared_memory("evil", k, 64))
    assert client.get_system_shared_memory_status() == []


def start_sleepy_inference(url: str, region: str
                           ) -> tuple[httpclient.InferInput, threading.Thread, list[Any]]:
    """A thread running ``sleepy`` with DELAY (4 bytes at offset 0 of ``region``) and DELAY_OUT
    (at offset 32): the input, the thread and the list its result lands in."""
    inp = httpclient.InferInput("DELAY", [1], "FP32")
    inp.set_shared_memory(region, 4)
    out = httpclient.InferRequestedOutput("DELAY_OUT")
    out.set_shared_memory(region, 4, offset=32)
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(
        httpclient.InferenceServerClient(url).infer("sleepy", [inp], outputs=[out])))
    thread.start()
    return inp, thread, results


def test_unregister_during_an_inference(shm_server: ShoalServer,
                                        client: httpclient.InferenceServerClient,
                                        make_object: MakeObject) -> None:
    key = make_object(64)
    pwrite(key, 0, np.array([0.8], np.float32).tobytes())
    client.register_system_shared_memory("slow", key, 64)
    inp, thread, results = start_sleepy_inference(shm_server.url, "slow")
    time.sleep(0.3)  # the model is sleeping now
    client.unregister_system_shared_memory("slow")
    assert client.get_system_shared_memory_status() == []
    assert frontend_fds_on(shm_server, key) == 1  # still held for the request
    thread.join(30)
    assert results and results[0].get_output("DELAY_OUT")["shape"] == [1]
    assert pread(key, 32, 4) == np.array([0.8], np.float32).tobytes()  # written after unregister
    deadline = time.monotonic() + 5
    while frontend_fds_on(shm_server, key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert frontend_fds_on(shm_server, key) == 0  # closed once the request ended
    message = error_text(lambda: client.infer("sleepy", [inp]))
    assert "'slow'" in message  # the region is gone


def test_truncating_the_object_after_registration(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    key = make_object(8192)
    client.register_system_shared_memory("r", key, 8192)
    os.truncate("/dev/shm" + key, 1024)
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("r", offset=4096)]))
    assert "truncated" in message and "'INPUT0'" in message
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("r", 64, offset=4096)
    message = error_text(lambda: client.infer("identity_fp32", [fp32_input("r")],
                                              outputs=[out]))
    assert "truncated" in message and "'OUTPUT0'" in message


def test_client_shared_memory_is_off_by_default(server: ShoalServer,
                                                make_object: MakeObject) -> None:
    key = make_object(64)
    default = httpclient.InferenceServerClient(server.url)
    assert "--allow-client-shm" in error_text(
        lambda: default.register_system_shared_memory("r", key, 64))
    assert default.get_system_shared_memory_status() == []
    reply = httpx.post(server.base + "/v2/models/identity_fp32/infer", json={"inputs": [{
        "name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64}}]})
    assert reply.status_code == 501 and "--allow-client-shm" in reply.json()["error"]
    assert "system_shared_memory" in default.get_server_metadata()["extensions"]
    assert default.is_server_live()
