"""The Deployment's container, run on this machine as Kubernetes would run it: the container's
args and env, as the Deployment's uid and gid, with the whole root filesystem read-only and
writable only where the Deployment mounts an emptyDir (tmpfs of the same sizes, /dev/shm
included). shoal must start, serve HTTP, gRPC and metrics, and drain on SIGTERM with exit 0
within the grace period.

A private mount namespace (`unshare -m`, needs root) confines the mounts to the test. The only
differences from the pod: the model repository is the one the Containerfile copies, at its path
in this checkout (run with this checkout's shoal, read-only too; a checkout under /tmp stays
visible below the new /tmp); the ports are free ones on 127.0.0.1; and if this interpreter sits
under a directory the Deployment's uid cannot enter (pyenv under /root), that one directory is
replaced in the namespace by a tmpfs that holds only the interpreter's tree."""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import shoal
from tests.deploy.containerfile import image_model_repository
from tests.deploy.manifests import ROOT, Manifest, one, quantity_bytes, shoal_container
from tests.e2e.server import free_port

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 180.0  # four models on a busy 2-core machine
SHOAL_SOURCE = pathlib.Path(shoal.__file__).resolve().parents[1]  # the dir that holds shoal/


def _unshare_works() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --make-rprivate / && true"],
                           capture_output=True)
    return probe.returncode == 0


if not _unshare_works():
    pytest.skip("needs root and a private mount namespace (unshare -m)", allow_module_level=True)


def _writable_mounts(pod: Manifest) -> dict[str, int]:
    """mountPath -> size limit in bytes of every emptyDir the shoal container mounts."""
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {}
    for mount in container["volumeMounts"]:
        empty_dir = volumes[mount["name"]]["emptyDir"]
        mounts[mount["mountPath"]] = quantity_bytes(empty_dir["sizeLimit"])
    return mounts


def _other_mounts(keep_writable: set[str]) -> list[str]:
    """Mount points of this machine to make read-only: all but the kernel's own trees and the
    paths that get a fresh tmpfs."""
    found = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            point = line.split()[1]
            if "\\" in point or point in keep_writable:
                continue
            if point.startswith(("/proc", "/sys", "/dev")) and point != "/":
                continue
            found.append(point)
    return sorted(found, key=len)


def _reach_interpreter(scratch: str) -> list[str]:
    """Shell lines that let an unprivileged uid run this interpreter when one directory above it
    (e.g. /root, mode 0700) does not let others pass: a tmpfs replaces that directory and gets
    back only the subtree that holds the interpreter."""
    target = pathlib.Path(os.path.realpath(sys.executable))
    blocked = [p for p in reversed(target.parents) if not p.stat().st_mode & stat.S_IXOTH]
    if not blocked:
        return []
    if len(blocked) > 1:
        pytest.skip(f"the interpreter {target} is behind several closed directories")
    closed = blocked[0]
    child = closed / target.relative_to(closed).parts[0]
    keep = f"{scratch}/.keep-interpreter"
    return [f"mkdir {keep}", f"mount --bind {shlex.quote(str(child))} {keep}",
            f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(str(closed))}",
            f"mkdir {shlex.quote(str(child))}",
            f"mount --move {keep} {shlex.quote(str(child))}", f"rmdir {keep}"]


def _hidden_by(mounts: dict[str, int], paths: list[pathlib.Path]) -> list[pathlib.Path]:
    """The outermost of ``paths`` that lie below a mount path (and would be hidden by it)."""
    hidden = {p.resolve() for p in paths
              if any(p.resolve().is_relative_to(m) for m in mounts)}
    return sorted(p for p in hidden if not any(p != q and p.is_relative_to(q) for q in hidden))


def _replace(args: list[str], values: dict[str, str]) -> list[str]:
    """``args`` with ``--flag=value`` replaced for each flag in ``values`` (each must occur)."""
    out, seen = [], set()
    for arg in args:
        flag = arg.partition("=")[0]
        if flag in values:
            out.append(f"{flag}={values[flag]}")
            seen.add(flag)
        else:
            out.append(arg)
    assert seen == set(values), f"the Deployment's args lack {set(values) - seen}"
    return out


class PodLikeServer:
    def __init__(self) -> None:
        deployment = one("Deployment", "shoal")
        pod = deployment["spec"]["template"]["spec"]
        self.container = shoal_container(deployment)
        self.uid = pod["securityContext"]["runAsUser"]
        self.gid = pod["securityContext"]["runAsGroup"]
        self.grace_s = pod["terminationGracePeriodSeconds"]
        self.mounts = _writable_mounts(pod)
        self.http_port, self.grpc_port, self.metrics_port = (free_port() for _ in range(3))
        source, in_image = image_model_repository()
        args = _replace(self.container["args"], {
            "--model-repository": str(ROOT / source),
            "--http-port": str(self.http_port), "--grpc-port": str(self.grpc_port),
            "--metrics-port": str(self.metrics_port)})
        assert f"--model-repository={in_image}" in self.container["args"]
        self.args = [*args, "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = ""

    def script(self) -> str:
        """The shell that builds the pod's filesystem view in the new mount namespace, then
        becomes shoal. /dev/shm gets its tmpfs first and serves as scratch space."""
        assert "/dev/shm" in self.mounts and all(os.path.isdir(p) for p in self.mounts)
        scratch = "/dev/shm"
        tmpfs = [f"mount -t tmpfs -o size={size},mode=1777 tmpfs {shlex.quote(path)}"
                 for path, size in sorted(self.mounts.items(), key=lambda m: m[0] != scratch)]
        kept = _hidden_by(self.mounts, [ROOT, pathlib.Path(sys.prefix), SHOAL_SOURCE])
        lines = ["set -e", "mount --make-rprivate /", tmpfs[0]]
        # a checkout (or virtualenv) under a path that gets a tmpfs, e.g. a clone in /tmp,
        # stays visible: bound aside first, moved back into the fresh tmpfs after
        for n, path in enumerate(kept):
            lines += [f"mkdir {scratch}/.keep-{n}",
                      f"mount --bind {shlex.quote(str(path))} {scratch}/.keep-{n}"]
        lines += tmpfs[1:]
        for n, path in enumerate(kept):
            lines += [f"mkdir -p {shlex.quote(str(path))}",
                      f"mount --move {scratch}/.keep-{n} {shlex.quote(str(path))}",
                      f"rmdir {scratch}/.keep-{n}"]
        lines += _reach_interpreter(scratch)
        lines += [f"mount -o remount,bind,ro {shlex.quote(point)}"
                  for point in [*_other_mounts(set(self.mounts)), *map(str, kept)]]
        command = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                   sys.executable, "-m", "shoal", *self.args]
        lines += ["cd /", "exec " + shlex.join(command)]
        return "\n".join(lines)

    def start(self) -> None:
        # PYTHONPATH: the shoal of this checkout, whatever the virtualenv has installed
        environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SHOAL_SOURCE)}
        environment.update({e["name"]: e["value"] for e in self.container["env"]})
        with tempfile.NamedTemporaryFile(prefix="shoal-pod-", suffix=".log",
                                         delete=False) as log:
            self.log_path = log.name
            # exec all the way down: this pid becomes shoal's supervisor
            self.process = subprocess.Popen(["unshare", "-m", "sh", "-c", self.script()],
                                            stdout=log, stderr=subprocess.STDOUT,
                                            env=environment)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"shoal exited with {self.process.returncode}:\n"
                                     f"{self.log()}")
            try:
                ready = httpx.get(f"http://127.0.0.1:{self.http_port}/v2/health/ready",
                                  timeout=1)
                if ready.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"not ready after {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        return pathlib.Path(self.log_path).read_text(errors="replace")[-6000:]

    def terminate(self) -> tuple[int, float]:
        """SIGTERM as the kubelet sends it; (exit code, seconds to exit)."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=self.grace_s)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for child in psutil.Process(self.process.pid).children(recursive=True):
            child.kill()
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def pod() -> Iterator[PodLikeServer]:
    server = PodLikeServer()
    try:
        server.start()
        yield server
    finally:
        server.kill()
        if server.log_path:
            os.unlink(server.log_path)


def test_runs_as_the_deployments_uid(pod: PodLikeServer) -> None:
    assert pod.process is not None
    supervisor = psutil.Process(pod.process.pid)
    assert "shoal" in " ".join(supervisor.cmdline())
    for process in [supervisor, *supervisor.children(recursive=True)]:
        assert process.uids().real == pod.uid and process.gids().real == pod.gid


def test_serves_http_inference(pod: PodLikeServer) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{pod.http_port}")
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2.0, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"),
              httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    batch = np.random.default_rng(0).random((8, 256), dtype=np.float32)
    mlp_input = httpclient.InferInput("INPUT__0", list(batch.shape), "FP32")
    mlp_input.set_data_from_numpy(batch)
    assert client.infer("mlp", [mlp_input]).as_numpy("OUTPUT__0").shape == (8, 16)


def test_serves_grpc_inference(pod: PodLikeServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{pod.grpc_port}")
    assert client.is_server_ready()
    rows = np.random.default_rng(1).random((3, 16), dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    np.testing.assert_array_equal(
        client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), rows)
    client.close()


def test_serves_the_hpa_metric(pod: PodLikeServer) -> None:
    text = httpx.get(f"http://127.0.0.1:{pod.metrics_port}/metrics", timeout=5).text
    assert 'nv_inference_pending_request_count{model="mlp",version="1"}' in text


def test_sigterm_drains_within_the_grace_period(pod: PodLikeServer) -> None:
    """Last in the module: stops the server."""
    code, took_s = pod.terminate()
    assert code == 0, pod.log()
    assert took_s < pod.grace_s
    assert "received SIGTERM; shutting down" in pod.log()
