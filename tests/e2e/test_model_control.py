"""Explicit model control through the real processes: load, reload with overrides while clients
infer, unload while requests are queued, failed loads that keep the old version serving, file
overrides, ensembles and their composing models, HTTP and gRPC (tritonclient)."""

from __future__ import annotations

import base64
import concurrent.futures
import pathlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.control_models import (
    PROBE_MODEL,
    config_json,
    index_of,
    infer_probe,
    probe_config,
    probe_ensemble,
    probe_model,
)
from tests.e2e.server import ShoalServer


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("control-repo")
    probe_model(root, "probe", tag=1)
    probe_model(root, "other", tag=7)
    probe_model(root, "first", tag=11)
    probe_model(root, "second", tag=22)
    probe_ensemble(root, "pipeline", "first", "second")
    probe_model(root, "broken", fail_init=True)
    return root


@pytest.fixture(scope="module")
def server(repo: pathlib.Path) -> Iterator[ShoalServer]:
    args = ["--model-control-mode=explicit", "--load-model=probe", "--exit-timeout-secs=10"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        yield srv


@pytest.fixture
def client(server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url, concurrency=16, network_timeout=120)
    yield c
    c.close()


def _workers(server: ShoalServer, model: str) -> list[int]:
    return server.worker_pids(model)


def _wait(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_only_the_named_models_load_at_start(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_ready()
    assert client.is_model_ready("probe")
    assert not client.is_model_ready("other")
    assert index_of(client, "other") == [{"name": "other"}]
    with pytest.raises(InferenceServerException, match="'other' is not found"):
        infer_probe(client, "other")  # never loaded: Triton's 404, as for an unknown name


def test_load_then_unload(server: ShoalServer, client: httpclient.InferenceServerClient) -> None:
    client.load_model("other")
    assert client.is_model_ready("other")  # ready when load returns
    assert infer_probe(client, "other")["tag"] == 7
    assert index_of(client, "other") == [
        {"name": "other", "version": "1", "state": "READY"}]
    client.unload_model("other")
    assert not client.is_model_ready("other")
    _wait(lambda: not _workers(server, "other"))
    _wait(lambda: index_of(client, "other") == [
        {"name": "other", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}])
    with pytest.raises(InferenceServerException):
        infer_probe(client, "other")
    assert client.is_server_ready()


def test_unknown_model_load_fails_like_triton(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        client.load_model("no_such_model")
    client.unload_model("no_such_model")  # unloading what is not loaded succeeds (Triton)
    assert client.is_server_ready()


def test_reload_with_config_override_while_clients_infer(
        server: ShoalServer, client: httpclient.InferenceServerClient) -> None:
    """Batch size and instance count change under 16 clients: no request fails, and traffic
    moves to the new load once it is ready."""
    old_pids = set(_workers(server, "probe"))
    stop = threading.Event()
    tags: list[int] = []
    errors: list[str] = []

    def hammer() -> None:
        c = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            while not stop.is_set():
                try:
                    tags.append(infer_probe(c, "probe", delay=0.005)["tag"])
                except Exception as exc:
                    errors.append(str(exc))
        finally:
            c.close()

    threads = [threading.Thread(target=hammer) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        new = probe_config("probe", tag=2, max_batch_size=4, count=2)
        client.load_model("probe", config=config_json(new))
        seen_after = len(tags)
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert 1 in tags[:seen_after] and tags[-1] == 2
    assert client.get_model_config("probe")["max_batch_size"] == 4
    _wait(lambda: len(_workers(server, "probe")) == 2
          and not set(_workers(server, "probe")) & old_pids)
    client.load_model("probe", config=config_json(probe_config("probe", tag=1)))


def test_failed_reload_keeps_the_old_version_serving(
        client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="told to fail at load"):
        client.load_model("probe", config=config_json(probe_config("probe", tag=5,
                                                                   fail_init=True)))
    assert client.is_model_ready("probe")
    assert infer_probe(client, "probe")["tag"] == 1
    entry = index_of(client, "probe")[0]
    assert entry["state"] == "READY" and "told to fail at load" in entry["reason"]
    client.load_model("probe")  # a good load clears the reason
    assert "reason" not in index_of(client, "probe")[0]


def test_failed_first_load_is_reported_and_the_server_stays_ready(
        server: ShoalServer, client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="told to fail at load"):
        client.load_model("broken")
    entry = index_of(client, "broken")[0]
    assert entry["state"] == "UNAVAILABLE" and "told to fail at load" in entry["reason"]
    assert client.is_server_ready()
    _wait(lambda: not _workers(server, "broken"))


def test_unload_while_requests_are_queued(server: ShoalServer,
                                          client: httpclient.InferenceServerClient) -> None:
    """Queued and running requests finish (or fail with a clear error); none hangs; the
    workers stop afterwards."""
    client.load_model("other", config=config_json(probe_config("other", tag=7, max_batch_size=1,
                                                              dynamic_batching=False)))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(infer_probe, httpclient.InferenceServerClient(server.url),
                               "other", 0.2) for _ in range(8)]
        time.sleep(0.3)
        started = time.monotonic()
        client.unload_model("other")
        assert time.monotonic() - started < 1.0  # unload is asynchronous, as in Triton
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(timeout=30)["tag"])
            except InferenceServerException as exc:
                outcomes.append(str(exc))
    assert all(o == 7 or "unloaded" in str(o) for o in outcomes), outcomes
    _wait(lambda: not _workers(server, "other"))


def test_file_override_loads_a_new_model(server: ShoalServer,
                                         client: httpclient.InferenceServerClient) -> None:
    config = config_json(probe_config("fresh", tag=99))
    client.load_model("fresh", config=config,
                      files={"file:1/model.py": PROBE_MODEL.encode()})
    assert infer_probe(client, "fresh")["tag"] == 99
    repo_dirs = {p.name for p in pathlib.Path(server.args[4].split("=", 1)[1]).iterdir()}
    assert "fresh" not in repo_dirs  # materialised under the server's temp root
    client.unload_model("fresh")


def test_files_without_config_are_refused(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as exc:
        client.load_model("fresh2", files={"file:1/model.py": b"x"})
    assert exc.value.status() == "400"


def test_ensemble_load_brings_its_composing_models(
        client: httpclient.InferenceServerClient) -> None:
    client.load_model("pipeline")
    assert client.is_model_ready("first") and client.is_model_ready("second")
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(__import__("numpy").array([[0.0]], dtype="float32"))
    assert int(client.infer("pipeline", [x]).as_numpy("TAG")[0, 0]) == 22
    client.unload_model("pipeline", unload_dependents=True)
    _wait(lambda: not client.is_model_ready("first") and not client.is_model_ready("second"))


def test_grpc_load_and_unload(server: ShoalServer) -> None:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.load_model("other")
    assert c.is_model_ready("other")
    c.unload_model("other")
    assert not c.is_model_ready("other")
    with pytest.raises(InferenceServerException, match="failed to poll"):
        c.load_model("nope")
    c.close()


def test_http_load_bodies(server: ShoalServer) -> None:
    url = f"{server.base}/v2/repository/models/other/load"
    bad = httpx.post(url, json={"parameters": {"file:1/model.py": "@@not base64@@",
                                               "config": "{}"}})
    assert bad.status_code == 400 and "file:1/model.py" in bad.json()["error"]
    files = {"config": config_json(probe_config("other", tag=3)),
             "file:1/model.py": base64.b64encode(PROBE_MODEL.encode()).decode()}
    assert httpx.post(url, json={"parameters": files}, timeout=60).status_code == 200
    assert httpx.post(f"{server.base}/v2/repository/models/other/unload").status_code == 200


def test_load_is_refused_in_none_mode(tmp_path: pathlib.Path) -> None:
    probe_model(tmp_path, "probe")
    with serving(ShoalServer([str(tmp_path)])) as srv:
        r = httpx.post(f"{srv.base}/v2/repository/models/probe/load")
        assert r.status_code == 503
        assert r.json() == {"error": "explicit model load / unload is not allowed if polling "
                                     "is enabled"}


def test_load_events_and_states_are_metrics(server: ShoalServer,
                                            client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException):
        client.load_model("broken")
    client.load_model("other")
    client.unload_model("other")
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    lines = set(text.splitlines())
    assert 'shoal_model_state{model="probe",state="READY",version="1"} 1.0' in lines
    assert 'shoal_model_state{model="probe",state="LOADING",version="1"} 0.0' in lines
    loads = [line for line in lines if line.startswith('shoal_model_loads{model="other"}')]
    assert loads and int(loads[0].split()[-1]) >= 1
    failures = [line for line in lines
                if line.startswith('shoal_model_load_failures{model="broken"}')]
    assert failures and int(failures[0].split()[-1]) >= 1
    assert any(line.startswith('shoal_model_unloads{model="other"}') and
               int(line.split()[-1]) >= 1 for line in lines)
    duration = [line for line in lines if line.startswith(
        'shoal_model_last_load_duration_seconds{model="other"}')]
    assert duration and float(duration[0].split()[-1]) > 0


def test_reloading_a_composing_model_keeps_a_running_ensemble_request(
        server: ShoalServer, client: httpclient.InferenceServerClient) -> None:
    client.load_model("pipeline")
    np = __import__("numpy")
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[0.6]], dtype=np.float32))  # each step sleeps 0.6 s
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: httpclient.InferenceServerClient(server.url).infer(
            "pipeline", [x]))
        time.sleep(0.2)  # the first step is running
        client.load_model("second", config=config_json(probe_config("second", tag=23)))
        result = running.result(timeout=30)
    assert int(result.as_numpy("TAG")[0, 0]) in (22, 23)
    assert float(result.as_numpy("Y")[0, 0]) == pytest.approx(0.6)
    x.set_data_from_numpy(np.array([[0.0]], dtype=np.float32))
    assert int(client.infer("pipeline", [x]).as_numpy("TAG")[0, 0]) == 23
    client.unload_model("pipeline", unload_dependents=True)


def test_unload_drain_is_bounded_by_the_exit_timeout(tmp_path: pathlib.Path) -> None:
    """A request that would run 5 s and two queued behind it: after --exit-timeout-secs (1 s)
    the queued ones fail with "was unloaded", the running one with the instance's exit, and the
    worker is gone."""
    probe_model(tmp_path, "slow", tag=1, max_batch_size=1, dynamic_batching=False)
    args = ["--model-control-mode=explicit", "--load-model=slow", "--exit-timeout-secs=1"]
    with serving(ShoalServer([str(tmp_path)], args)) as srv:
        control = httpclient.InferenceServerClient(srv.url)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(infer_probe, httpclient.InferenceServerClient(srv.url),
                                   "slow", 5.0) for _ in range(3)]
            time.sleep(0.5)
            started = time.monotonic()
            control.unload_model("slow")
            errors = []
            for f in futures:
                with pytest.raises(InferenceServerException) as exc:
                    f.result(timeout=30)
                errors.append(str(exc.value))
            assert time.monotonic() - started < 4.0
        assert sum("was unloaded" in e for e in errors) == 2, errors
        assert sum("killed by signal" in e for e in errors) == 1, errors
        _wait(lambda: not srv.worker_pids("slow"))
        assert control.is_server_ready()
        control.close()
