"""Runs Triton's own examples and QA tests, unchanged, against shoal (or the real tritonserver).

Nothing is fetched here: pass the paths of work trees of triton-inference-server/server,
python_backend and client (r24.10 matches Triton 2.51). Each suite builds its model repository
in --work (copying model files out of those trees, as the suite's test.sh does), starts the
server on the ports the tests hard-code (8000 HTTP, 8001 gRPC, 8002 metrics), runs the example
clients / test files as a user would, stops the server, and the runner prints one pass/fail
table. Per-test results of unittest files come from pytest's junit XML.

    python bench/triton_suites/run.py --server-tree S --python-backend-tree P --client-tree C \
        [--against shoal|triton] [--suite NAME ...] [--work DIR]

Environment the tests need: tritonclient, pytest, pytest-timeout; sseclient-py for the
generate-endpoint test (--extra-pythonpath names a folder holding it). Triton's QA shm-leak
probe needs a compiled module; TEST_JETSON=1 (an env switch the tests read) skips it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench.* from the checkout

from bench import tritonserver  # noqa: E402
from bench.triton_suites import make_model_repository  # noqa: E402

SHOAL = ROOT / ".venv" / "bin" / "shoal"
PYTHON = sys.executable


@dataclass
class Result:
    suite: str
    name: str
    status: str  # pass / fail / error / skip / timeout
    detail: str = ""


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    results: list[Result] = field(default_factory=list)

    @property
    def server_tree(self) -> Path:
        return Path(self.args.server_tree).resolve()

    @property
    def pb_tree(self) -> Path:
        return Path(self.args.python_backend_tree).resolve()

    @property
    def client_tree(self) -> Path:
        return Path(self.args.client_tree).resolve()

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["TEST_JETSON"] = "1"  # skips the QA shm-leak probe (needs a compiled module)
        extra = [p for p in (self.args.extra_pythonpath or []) if p]
        if extra:
            env["PYTHONPATH"] = os.pathsep.join([*extra, env.get("PYTHONPATH", "")])
        return env


class Server:
    """shoal serve or tritonserver on 8000/8001/8002, its log in ``log``."""

    def __init__(self, ctx: Ctx, repo: Path, log: Path, flags: list[str],
                 env: dict[str, str] | None = None) -> None:
        """``env``: variables the server (and so its models) gets on top of this one's, as a
        test.sh exports them before run_server."""
        self.ctx, self.repo, self.log, self.flags = ctx, repo, log, flags
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._segments_before = tritonserver.backend_segments()

    def __enter__(self) -> Server:
        env = None
        if self.ctx.args.against == "triton":
            reason = tritonserver.unavailable_reason()
            if reason is not None:
                raise RuntimeError(reason)
            cmd, env = tritonserver.command([self.repo], self.log.parent / "triton", 8000, 8001,
                                            8002, address="0.0.0.0",
                                            extra_args=["--exit-on-error=false", *self.flags])
        else:
            cmd = [str(SHOAL), "serve", "--model-repository", str(self.repo),
                   "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002",
                   *self.flags]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = self.log.open("wb")
        if self.extra_env:
            env = {**(env if env is not None else os.environ), **self.extra_env}
        # from the test's directory, as test.sh runs it (models open paths relative to it)
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env, cwd=self.log.parent)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early (rc {self.proc.returncode}); see "
                                   f"{self.log}")
            if _status("http://localhost:8000/v2/health/ready") == 200:
                break
            if (_status("http://localhost:8000/v2/health/live") == 200
                    and time.monotonic() > deadline - 45):
                break  # live but some model not ready: run anyway, the tests will say
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        tritonserver.remove_backend_segments(self._segments_before)
        time.sleep(1)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except Exception as exc:  # any failure means "not yet"
        return int(getattr(exc, "code", 0) or 0)


def _copy_model(src_model: Path, src_config: Path, dst: Path, name: str) -> None:
    (dst / name / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(src_model, dst / name / "1" / "model.py")
    if src_config.exists():
        shutil.copy(src_config, dst / name / "config.pbtxt")


def run_script(ctx: Ctx, suite: str, name: str, cmd: list[str], cwd: Path,
               need: str | None = None, timeout: float = 120) -> None:
    """A client script: passes when it exits 0 (and prints ``need`` when given)."""
    logdir = ctx.work / "logs" / suite
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run(cmd, cwd=cwd, env=ctx.env(), capture_output=True, timeout=timeout)
        text = (p.stdout + p.stderr).decode(errors="replace")
        ok = p.returncode == 0 and (need is None or need in text)
        status = "pass" if ok else "fail"
    except subprocess.TimeoutExpired as exc:
        text = ((exc.stdout or b"") + (exc.stderr or b"")).decode(errors="replace")
        status = "timeout"
    (logdir / f"{name}.log").write_text(text)
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-3:])
    ctx.results.append(Result(suite, name, status, "" if status == "pass" else tail[-300:]))


def run_pytest(ctx: Ctx, suite: str, target: str, cwd: Path, timeout_each: int = 60,
               total: float = 900, env: dict[str, str] | None = None) -> None:
    """A unittest/pytest file: one result per test case, read from pytest -v's lines.

    A test that hangs past ``timeout_each`` is recorded as a timeout; pytest-timeout's thread
    method ends the whole process then, so the tests not yet run are run again by node id."""
    logdir = ctx.work / "logs" / suite
    logdir.mkdir(parents=True, exist_ok=True)
    run_env = dict(ctx.env(), **(env or {}))
    base = [PYTHON, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider",
            f"--timeout={timeout_each}", "--timeout-method=thread"]
    col = subprocess.run([PYTHON, "-m", "pytest", "-q", "--collect-only", "-p",
                          "no:cacheprovider", target], cwd=cwd, env=run_env,
                         capture_output=True, text=True)
    ids = [ln.strip() for ln in col.stdout.splitlines() if "::" in ln]
    if not ids:
        ctx.results.append(Result(suite, target, "error", (col.stdout + col.stderr)[-300:]))
        return
    remaining = list(ids)
    deadline = time.monotonic() + total
    round_no = 0
    while remaining and time.monotonic() < deadline:
        try:
            p = subprocess.run(base + remaining, cwd=cwd, env=run_env, capture_output=True,
                               timeout=max(10.0, deadline - time.monotonic()))
            out = (p.stdout + p.stderr).decode(errors="replace")
        except subprocess.TimeoutExpired as exc:
            out = ((exc.stdout or b"") + (exc.stderr or b"")).decode(errors="replace")
        (logdir / f"{Path(target.split('::')[0]).stem}.{round_no}.log").write_text(out)
        round_no += 1
        seen = _verbose_results(out)
        messages = _short_summary(out)
        progressed = False
        for node in list(remaining):
            status = seen.get(node)
            if status is None:
                continue
            remaining.remove(node)
            progressed = True
            detail = messages.get(node, "")
            if status == "timeout":
                detail = f"no answer in {timeout_each} s (pytest-timeout)"
            ctx.results.append(Result(suite, node.split("::", 1)[-1], status, detail[:300]))
        if not progressed:
            for node in remaining:
                ctx.results.append(Result(suite, node.split("::", 1)[-1], "error",
                                          out.strip()[-300:]))
            return


def run_unittest(ctx: Ctx, suite: str, target: str, cwd: Path, total: float = 600) -> None:
    """``python FILE -v`` (files built on qa/common/test_util's result collector, which only
    works under unittest's runner): one result per ``test_x (...) ... ok/FAIL/ERROR`` line."""
    logdir = ctx.work / "logs" / suite
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run([PYTHON, target, "-v"], cwd=cwd, env=ctx.env(), capture_output=True,
                           timeout=total)
        out = (p.stdout + p.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = ((exc.stdout or b"") + (exc.stderr or b"")).decode(errors="replace")
        ctx.results.append(Result(suite, target, "timeout", f"file ran past {total} s"))
    (logdir / f"{Path(target).stem}.log").write_text(out)
    verdicts = {"ok": "pass", "FAIL": "fail", "ERROR": "error", "skipped": "skip"}
    for line in out.splitlines():
        if " ... " not in line or not line.startswith("test"):
            continue
        head, _, tail = line.rpartition(" ... ")
        word = tail.split()[0] if tail.split() else ""
        if word in verdicts:
            ctx.results.append(Result(suite, head.split()[0], verdicts[word]))
    for block in out.split("=" * 70)[1:]:  # the FAIL:/ERROR: sections: attach the last line
        lines = [ln for ln in block.strip().splitlines() if ln.strip()]
        if not lines:
            continue
        name = lines[0].split()[1] if len(lines[0].split()) > 1 else ""
        last = next((ln for ln in reversed(lines) if not ln.startswith("-")), "")
        for r in ctx.results:
            if r.suite == suite and r.name == name and not r.detail:
                r.detail = last.strip()[:300]


_STATUS = {"PASSED": "pass", "FAILED": "fail", "ERROR": "error", "SKIPPED": "skip",
           "XFAIL": "pass", "XPASS": "fail"}


def _verbose_results(out: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if not parts or "::" not in parts[0]:
            continue
        node = parts[0]
        if "Timeout" in line:
            found.setdefault(node, "timeout")
        for word in parts[1:3]:
            if word in _STATUS:
                found.setdefault(node, _STATUS[word])
                break
    return found


def _short_summary(out: str) -> dict[str, str]:
    msgs: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith(("FAILED ", "ERROR ")) and "::" in line:
            _, rest = line.split(" ", 1)
            node, _, msg = rest.partition(" - ")
            msgs[node.strip()] = msg.strip()
    return msgs


# ---------------------------------------------------------------- suites


def suite_pb_examples(ctx: Ctx) -> None:
    """python_backend/examples: each model + its client.py (the L0_backend_python/examples
    recipe; instance_kind (resnet50 download), jax and preprocessing (images) left out)."""
    root = ctx.work / "pb_examples"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(ctx.pb_tree / "examples", root / "examples")
    ex, models = root / "examples", root / "models"
    for name, model, config in (
        ("add_sub", "add_sub/model.py", "add_sub/config.pbtxt"),
        ("pytorch", "pytorch/model.py", "pytorch/config.pbtxt"),
        ("bls_sync", "bls/sync_model.py", "bls/sync_config.pbtxt"),
        ("bls_async", "bls/async_model.py", "bls/async_config.pbtxt"),
        ("repeat_int32", "decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
        ("square_int32", "decoupled/square_model.py", "decoupled/square_config.pbtxt"),
        ("nobatch_auto_complete", "auto_complete/nobatch_model.py", "-"),
        ("batch_auto_complete", "auto_complete/batch_model.py", "-"),
        ("bls_decoupled_sync", "bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
        ("bls_decoupled_async", "bls_decoupled/async_model.py",
         "bls_decoupled/async_config.pbtxt"),
        ("custom_metrics", "custom_metrics/model.py", "custom_metrics/config.pbtxt"),
    ):
        _copy_model(ex / model, ex / config, models, name)
    with Server(ctx, models, root / "server.log", ["--log-verbose=1"]):
        for name, client in (("add_sub", "add_sub/client.py"), ("pytorch", "pytorch/client.py"),
                             ("bls_sync", "bls/sync_client.py"),
                             ("bls_async", "bls/async_client.py"),
                             ("repeat_int32", "decoupled/repeat_client.py"),
                             ("square_int32", "decoupled/square_client.py"),
                             ("auto_complete", "auto_complete/client.py"),
                             ("bls_decoupled_sync", "bls_decoupled/sync_client.py"),
                             ("bls_decoupled_async", "bls_decoupled/async_client.py"),
                             ("custom_metrics", "custom_metrics/client.py")):
            run_script(ctx, "pb_examples", name, [PYTHON, f"examples/{client}"], root,
                       need="PASS")


CLIENT_SCRIPTS: list[tuple[str, list[str]]] = [
    ("simple_http_infer_client", []), ("simple_http_async_infer_client", []),
    ("simple_http_aio_infer_client", []), ("simple_http_string_infer_client", []),
    ("simple_http_health_metadata", []), ("simple_http_shm_client", []),
    ("simple_http_shm_string_client", []), ("simple_http_sequence_sync_infer_client", []),
    ("simple_http_sequence_sync_infer_client", ["--dyna"]),
    ("simple_grpc_infer_client", []), ("simple_grpc_async_infer_client", []),
    ("simple_grpc_aio_infer_client", []), ("simple_grpc_string_infer_client", []),
    ("simple_grpc_health_metadata", []), ("simple_grpc_shm_client", []),
    ("simple_grpc_shm_string_client", []), ("simple_grpc_custom_args_client", []),
    ("simple_grpc_keepalive_client", []), ("simple_grpc_custom_repeat", []),
    ("simple_grpc_sequence_stream_infer_client", []),
    ("simple_grpc_sequence_stream_infer_client", ["--dyna"]),
    ("simple_grpc_sequence_sync_infer_client", []),
    ("simple_grpc_sequence_sync_infer_client", ["--dyna"]),
    ("simple_grpc_aio_sequence_stream_infer_client", []),
    ("grpc_explicit_byte_content_client", []),
    ("grpc_explicit_int_content_client", []), ("grpc_explicit_int8_content_client", []),
    ("reuse_infer_objects_client", []),
]


def _client_repo(ctx: Ctx, with_repeat: bool = True) -> Path:
    """Our stand-in models (+ python_backend's repeat_int32 for simple_grpc_custom_repeat;
    the model-control examples count exactly the seven ``simple*`` models)."""
    repo = ctx.work / "client_examples" / "models"
    shutil.rmtree(repo, ignore_errors=True)
    make_model_repository.build(repo)
    if with_repeat:
        ex = ctx.pb_tree / "examples" / "decoupled"
        _copy_model(ex / "repeat_model.py", ex / "repeat_config.pbtxt", repo, "repeat_int32")
    return repo


def suite_client_examples(ctx: Ctx) -> None:
    """tritonclient's example scripts (system shm; cudashm and image clients, and grpc_client.py
    (inception_graphdef), left out)."""
    repo = _client_repo(ctx)
    examples = ctx.client_tree / "src" / "python" / "examples"
    flags = [] if ctx.args.against == "triton" else ["--allow-client-shm=true"]
    with Server(ctx, repo, ctx.work / "client_examples" / "server.log", flags):
        for script, extra in CLIENT_SCRIPTS:
            name = script + ("_" + "_".join(a.strip("-") for a in extra) if extra else "")
            run_script(ctx, "client_examples", name, [PYTHON, f"{script}.py", *extra], examples)


def suite_client_model_control(ctx: Ctx) -> None:
    """The model-control examples count the repository: the HTTP one wants 7 models, the gRPC
    one 8 (Triton's two examples disagree), so each gets its own server."""
    examples = ctx.client_tree / "src" / "python" / "examples"
    for script, with_repeat in (("simple_http_model_control", False),
                                ("simple_grpc_model_control", True)):
        repo = _client_repo(ctx, with_repeat=with_repeat)
        with Server(ctx, repo, ctx.work / "client_examples" / f"server_{script}.log",
                    ["--model-control-mode=explicit"]):
            run_script(ctx, "client_model_control", script, [PYTHON, f"{script}.py"], examples)


def _qa_copy(ctx: Ctx, sub: str) -> Path:
    """A copy of server/qa/<sub> plus qa/common (the tests import ../common by path)."""
    qa = ctx.work / "qa"
    (qa).mkdir(parents=True, exist_ok=True)
    if not (qa / "common").exists():
        shutil.copytree(ctx.server_tree / "qa" / "common", qa / "common")
    dst = qa / sub
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ctx.server_tree / "qa" / sub, dst)
    return dst


def suite_qa_decoupled(ctx: Ctx) -> None:
    """qa/L0_backend_python/decoupled (its test.sh's model set; log checks included)."""
    d = _qa_copy(ctx, "L0_backend_python/decoupled")
    pm = ctx.server_tree / "qa" / "python_models"
    for m in ("identity_fp32", "execute_cancel", "dlpack_add_sub"):
        _copy_model(pm / m / "model.py", pm / m / "config.pbtxt", d / "models", m)
    with (d / "models" / "execute_cancel" / "config.pbtxt").open("a") as f:
        f.write("\nmodel_transaction_policy { decoupled: True }\n")
    ex = ctx.pb_tree / "examples" / "decoupled"
    _copy_model(ex / "square_model.py", ex / "square_config.pbtxt", d / "models", "square_int32")
    log = d / "decoupled_server.log"
    with Server(ctx, d / "models", log, ["--log-verbose=1"]):
        run_pytest(ctx, "qa_decoupled", "decoupled_test.py", d, timeout_each=60)
    text = log.read_text(errors="replace")
    for needle, want in (("Specific Msg!", None), ("Info Msg!", None), ("Warning Msg!", None),
                         ("Error Msg!", None), ("Finalize invoked", 3),
                         ("Finalize complete...", 3)):
        n = text.count(needle)
        ok = n >= 1 if want is None else n == want
        ctx.results.append(Result("qa_decoupled", f"log count '{needle}'",
                                  "pass" if ok else "fail", f"found {n}"))


def suite_qa_http(ctx: Ctx) -> None:
    """qa/L0_http/http_test.py on the identity ONNX models Triton's own generator writes."""
    if ctx.args.against == "triton" and not ctx.args.triton_has_onnx:
        ctx.results.append(Result("qa_http", "http_test.py", "skip",
                                  "this tritonserver has no onnxruntime backend"))
        return
    d = _qa_copy(ctx, "L0_http")
    gen = ctx.work / "gen_identity"
    if not (gen / "onnx_zero_1_float32").exists():
        subprocess.run([PYTHON, "gen_qa_identity_models.py", "--onnx", "--models_dir",
                        str(gen)], cwd=ctx.work / "qa" / "common", check=True,
                       capture_output=True)
    repo = d / "python_unit_test_models"
    for m in ("onnx_zero_1_float32", "onnx_zero_1_object", "onnx_zero_1_float16",
              "onnx_zero_3_float32"):
        shutil.copytree(gen / m, repo / m)
    # the two derived models test.sh makes with sed
    one = repo / "onnx_zero_1_object_1_element"
    shutil.copytree(repo / "onnx_zero_1_object", one)
    cfg = (one / "config.pbtxt").read_text().replace("onnx_zero_1_object",
                                                     "onnx_zero_1_object_1_element")
    (one / "config.pbtxt").write_text(cfg.replace("-1", "1", 1))
    q = repo / "onnx_zero_1_float32_queue"
    shutil.copytree(repo / "onnx_zero_1_float32", q)
    cfg = (q / "config.pbtxt").read_text().replace("onnx_zero_1_float32",
                                                   "onnx_zero_1_float32_queue")
    cfg += ("dynamic_batching {\n    max_queue_delay_microseconds: 1000000\n"
            "    preferred_batch_size: [ 8 ]\n    default_queue_policy {\n"
            "        max_queue_size: 1\n    }\n}\n")
    (q / "config.pbtxt").write_text(cfg)
    with Server(ctx, repo, d / "inference_server_http_test.log", []):
        run_unittest(ctx, "qa_http", "http_test.py", d)


def suite_qa_generate(ctx: Ctx) -> None:
    d = _qa_copy(ctx, "L0_http")
    with Server(ctx, d / "generate_models", d / "inference_server_generate.log", []):
        run_unittest(ctx, "qa_generate", "generate_endpoint_test.py", d)


def suite_qa_input_validation(ctx: Ctx) -> None:
    d = _qa_copy(ctx, "L0_input_validation")
    with Server(ctx, d / "models", d / "inference_server.log", []):
        run_pytest(ctx, "qa_input_validation", "input_validation_test.py::InputValTest", d)


# L0_parameters' rounds: TEST_HEADER and the header forward flags of each (as its test.sh)
PARAMETER_ROUNDS: dict[str, list[str]] = {
    "test_params": [],
    "test_headers": ["--grpc-header-forward-pattern", "my_header.*",
                     "--http-header-forward-pattern", "my_header.*"],
    "test_header_forward_pattern_case_insensitive": [
        "--grpc-header-forward-pattern", "MY_HEADER.*",
        "--http-header-forward-pattern", "MY_HEADER.*"],
    "test_grpc_header_forward_pattern_case_sensitive": [
        "--grpc-header-forward-pattern", "(?-i)MY_HEADER.*"],
}


def suite_qa_parameters(ctx: Ctx) -> None:
    """qa/L0_parameters: its four rounds, each on a server started with that round's flags."""
    d = _qa_copy(ctx, "L0_parameters")
    for sub in ("identity/1", "ensemble/1"):
        (d / "model_repository" / sub).mkdir(parents=True, exist_ok=True)
    for round_name, flags in PARAMETER_ROUNDS.items():
        with Server(ctx, d / "model_repository", d / f"inference_server_{round_name}.log",
                    ["--exit-timeout-secs=120", *flags]):
            run_pytest(ctx, f"qa_parameters/{round_name}", "parameters_test.py", d,
                       env={"TEST_HEADER": round_name})


# ------------------------------------------------ qa/L0_backend_python subtests


def _pm(ctx: Ctx, models: Path, src: str, name: str | None = None,
        model_file: str = "model.py") -> Path:
    """qa/python_models/<src> as models/<name> (config's ``name:`` line set to it, as the
    test.sh files' sed does); returns the model's folder."""
    pm = ctx.server_tree / "qa" / "python_models" / src
    name = name or src
    dst = models / name
    (dst / "1").mkdir(parents=True, exist_ok=True)
    if (pm / model_file).exists():
        shutil.copy(pm / model_file, dst / "1" / "model.py")
    if (pm / "config.pbtxt").exists():
        lines = (pm / "config.pbtxt").read_text().splitlines()
        lines = [f'name: "{name}"' if ln.startswith("name:") else ln for ln in lines]
        (dst / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return dst


def _edit_config(model: Path, *, sub: tuple[str, str] | None = None,
                 line: tuple[str, str] | None = None, append: str = "") -> None:
    cfg = model / "config.pbtxt"
    text = cfg.read_text()
    if sub is not None:
        text = text.replace(*sub)
    if line is not None:  # sed "s/^<prefix>.*/<new>/"
        text = "\n".join(line[1] if ln.startswith(line[0]) else ln
                         for ln in text.splitlines()) + "\n"
    cfg.write_text(text + (append + "\n" if append else ""))


SHM_LEAK_TEST = "test_infer_shm_leak.py"


def _pb_copy(ctx: Ctx, sub: str) -> Path:
    """_qa_copy of L0_backend_python/<sub>, with the shared test_infer_shm_leak.py copied in
    (the subtests run it as ../test_infer_shm_leak.py; from inside, pytest's node ids name
    it as run_pytest passes them back; it finds ../../common from the same cwd)."""
    d = _qa_copy(ctx, f"L0_backend_python/{sub}")
    shutil.copy(ctx.server_tree / "qa" / "L0_backend_python" / SHM_LEAK_TEST, d / SHM_LEAK_TEST)
    return d


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _check(ctx: Ctx, suite: str, name: str, ok: bool, detail: str = "") -> None:
    ctx.results.append(Result(suite, name, "pass" if ok else "fail", "" if ok else detail))


def _start_and_stop(ctx: Ctx, repo: Path, log: Path, flags: list[str],
                    wait: float = 40) -> bool:
    """Starts a server, waits until it is ready, exits, or has been live without being ready
    for a few seconds (util.sh's run_server gives up on a server that is not ready), stops it;
    True when it became ready. The log is in ``log``."""
    cmd: list[str]
    env = None
    if ctx.args.against == "triton":
        cmd, env = tritonserver.command([repo], log.parent / "triton", 8000, 8001, 8002,
                                        address="0.0.0.0", extra_args=flags)
    else:
        cmd = [str(SHOAL), "serve", "--model-repository", str(repo), "--http-port", "8000",
               "--grpc-port", "8001", "--metrics-port", "8002", *flags]
    before = tritonserver.backend_segments()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    ready, live_since = False, None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and proc.poll() is None:
        if _status("http://localhost:8000/v2/health/ready") == 200:
            ready = True
            break
        if _status("http://localhost:8000/v2/health/live") == 200:
            live_since = live_since or time.monotonic()
            if time.monotonic() - live_since > 8:
                break
        time.sleep(0.5)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    tritonserver.remove_backend_segments(before)
    time.sleep(1)
    return ready


def _shm_pages() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _shm_left(ctx: Ctx, before: set[str], log: Path, wait: float = 5) -> set[str]:
    """/dev/shm entries of this server that appeared since ``before`` and are still there
    after ``wait`` s (test.sh counts right after the server process ended; a little grace
    for the children). Other servers on the machine make entries too, so only the server's
    own count: the python backend's regions for tritonserver, for shoal the entries of the
    server whose frontend pid its log names (``shoal-<id>-fe<pid>-<n>`` and the rest of
    that ``<id>``)."""
    text = log.read_text(errors="replace")

    def own(names: set[str]) -> set[str]:
        if ctx.args.against == "triton":
            return {n for n in names if n.startswith(tritonserver.SHM_PREFIX)}
        pids = set(re.findall(r"\[frontend pid (\d+)\]", text))
        ids = {m.group(1) for n in names
               if (m := re.match(r"(shoal-[0-9a-f]+)-fe(\d+)-", n)) and m.group(2) in pids}
        return {n for n in names if any(n.startswith(i) for i in ids)}

    deadline = time.monotonic() + wait
    while True:
        left = own(_shm_pages() - before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def suite_qa_pb_io(ctx: Ctx) -> None:
    """L0_backend_python/io: test_requested_output_default (add_sub). Left out, as they need a
    GPU: test_ensemble_io (each of its three dlpack identities is asked to move its output to
    the GPU in turn, ``.cuda()``), test_requested_output_decoupled (its GPU_OUTPUT flags are
    ``np.random.rand(4).astype(bool)``, all true, so the model calls ``.cuda()``; without CUDA
    its response thread dies and the stream never ends), test_empty_gpu_output,
    test_variable_gpu_output."""
    d = _pb_copy(ctx, "io")
    models = _fresh(d / "models")
    _pm(ctx, models, "add_sub")
    _pm(ctx, models, "dlpack_io_identity_decoupled")
    with Server(ctx, models, d / "io_server.log", ["--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_io", "io_test.py::IOTest::test_requested_output_default", d)


BLS_MODELS = ("bls", "dlpack_add_sub", "bls_async", "bls_memory", "bls_memory_async",
              "add_sub", "execute_error", "identity_fp32", "dlpack_identity", "dlpack_square",
              "identity_fp32_timeout")


def _qa_data(ctx: Ctx) -> Path | None:
    """Triton's QA data directory, the part of it the CPU suites use, made by Triton's own
    generators (gen_qa_models.py --onnx --libtorch into qa_model_repository/,
    gen_qa_implicit_models.py --onnx into qa_sequence_implicit_model_repository/), once per
    work directory. None against tritonserver: this one has neither backend."""
    if ctx.args.against == "triton":
        return None
    data = ctx.work / "qa_data"
    common = ctx.server_tree / "qa" / "common"
    for script, flags, out in (
            ("gen_qa_models.py", ["--onnx", "--libtorch"], "qa_model_repository"),
            ("gen_qa_implicit_models.py", ["--onnx"], "qa_sequence_implicit_model_repository")):
        if not (data / out).is_dir():
            subprocess.run([PYTHON, script, *flags, "--models_dir", str(data / out)],
                           cwd=common, check=True, capture_output=True)
    return data


def _cpu_copy(src: Path, dst: Path) -> None:
    """A generated model, its instances on the CPU: Triton's generators write KIND_GPU (their
    data directory is made for GPU machines), which neither server can place here."""
    shutil.copytree(src, dst)
    cfg = dst / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("KIND_GPU", "KIND_CPU"))


def suite_qa_pb_bls(ctx: Ctx) -> None:
    """L0_backend_python/bls: the four BLS unittest models (bls, bls_memory, bls_memory_async,
    bls_async) in both BLS_KIND trials, each run through test_infer_shm_leak.py, the
    "Request timeout: 11000000000" log check, bls_init_error / bls_finalize_error,
    bls_model_loading and bls_parameters_test.py. Left out: the CUDA memory-pool sizes (one
    server per trial, no --cuda-memory-pool-byte-size) and libtorch_gpu (a KIND_GPU model).
    The models of other backends test.sh copies from its data dir (onnx_nobatch_sequence_int32,
    libtorch_cpu, onnx_int32_int32_int32) come from ``_qa_data`` against shoal; tritonserver
    here has neither backend, so the bls models' sub-tests that call them fail there."""
    d = _pb_copy(ctx, "bls")
    suite = "qa_pb_bls"
    models = _fresh(d / "models")
    for m in BLS_MODELS:
        _pm(ctx, models, m)
    data = _qa_data(ctx)
    if data is not None:
        _cpu_copy(data / "qa_sequence_implicit_model_repository" / "onnx_nobatch_sequence_int32",
                  models / "onnx_nobatch_sequence_int32")
        libtorch = models / "libtorch_cpu"
        shutil.copytree(data / "qa_model_repository" / "libtorch_nobatch_float32_float32_float32",
                        libtorch)
        cfg = (libtorch / "config.pbtxt").read_text().replace(
            "libtorch_nobatch_float32_float32_float32", "libtorch_cpu")
        (libtorch / "config.pbtxt").write_text(cfg + "\ninstance_group [ { kind: KIND_CPU} ]\n")
    ex = ctx.pb_tree / "examples" / "decoupled"
    _copy_model(ex / "square_model.py", ex / "square_config.pbtxt", models, "square_int32")
    for trial in ("non_decoupled", "decoupled"):
        log = d / f"bls_{trial}.inference_server.log"
        with Server(ctx, models, log, ["--log-verbose=1"], env={"BLS_KIND": trial}):
            for m in ("bls", "bls_memory", "bls_memory_async", "bls_async"):
                run_pytest(ctx, f"{suite}/{trial}/{m}", SHM_LEAK_TEST, d,
                           timeout_each=150, env={"BLS_KIND": trial, "MODEL_NAME": m})
        text = log.read_text(errors="replace")
        _check(ctx, suite, f"{trial}: log 'Request timeout: 11000000000'",
               "Request timeout: 11000000000" in text, "not in the server log")
    error = "BLS is only supported during the 'execute' function."
    models = _fresh(d / "models")
    _pm(ctx, models, "bls_init_error")
    log = d / "bls_init_error_server.log"
    ready = _start_and_stop(ctx, models, log, ["--log-verbose=1"])
    _check(ctx, suite, "bls_init_error: not ready, message logged",
           not ready and error in log.read_text(errors="replace"),
           f"ready={ready}, message {'found' if error in log.read_text() else 'missing'}")
    models = _fresh(d / "models")
    _pm(ctx, models, "bls_finalize_error")
    log = d / "bls_finalize_error_server.log"
    ready = _start_and_stop(ctx, models, log, ["--log-verbose=1"])
    _check(ctx, suite, "bls_finalize_error: ready, message logged at unload",
           ready and error in log.read_text(errors="replace"),
           f"ready={ready}, message {'found' if error in log.read_text() else 'missing'}")
    models = _fresh(d / "models")
    _pm(ctx, models, "bls_model_loading")
    if data is not None:  # only versions 2 and 3 are valid version directories
        _cpu_copy(data / "qa_model_repository" / "onnx_int32_int32_int32",
                  models / "onnx_int32_int32_int32")
        shutil.rmtree(models / "onnx_int32_int32_int32" / "1")
    with Server(ctx, models, d / "bls_model_loading_server.log",
                ["--model-control-mode=explicit", "--log-verbose=1"]):
        req = urllib.request.Request(
            "http://localhost:8000/v2/repository/models/bls_model_loading/load", data=b"",
            method="POST")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                code = r.status
        except Exception as exc:
            code = int(getattr(exc, "code", 0) or 0)
        _check(ctx, suite, "bls_model_loading: load", code == 200, f"HTTP {code}")
        run_pytest(ctx, f"{suite}/bls_model_loading", SHM_LEAK_TEST, d,
                   timeout_each=300, env={"MODEL_NAME": "bls_model_loading"})
    params = _fresh(d / "params_models")
    _pm(ctx, params, "bls_parameters")
    with Server(ctx, params, d / "bls_parameters.server.log", ["--log-verbose=1"]):
        run_pytest(ctx, f"{suite}/bls_parameters", "bls_parameters_test.py", d)


def suite_qa_pb_lifecycle(ctx: Ctx) -> None:
    """L0_backend_python/lifecycle: lifecycle_test.py (one round, not test.sh's five), the
    /dev/shm page count before and after, init_error / fini_error / auto_complete_error log
    checks."""
    d = _pb_copy(ctx, "lifecycle")
    suite = "qa_pb_lifecycle"
    models = _fresh(d / "models")
    for m in ("error_code", "execute_cancel", "execute_return_error"):
        _pm(ctx, models, m)
    _edit_config(_pm(ctx, models, "execute_error"), line=("max_batch_size:", "max_batch_size: 8"),
                 append="dynamic_batching { preferred_batch_size: [8], "
                        "max_queue_delay_microseconds: 12000000 }")
    _edit_config(_pm(ctx, models, "execute_grpc_error"),
                 line=("max_batch_size:", "max_batch_size: 8"),
                 append="dynamic_batching { preferred_batch_size: [8], "
                        "max_queue_delay_microseconds: 1200000 }")
    _edit_config(_pm(ctx, models, "wrong_model"), sub=("TYPE_FP32", "TYPE_UINT32"))
    pages = _shm_pages()
    with Server(ctx, models, d / "lifecycle_server.log", ["--log-verbose=1"]):
        run_pytest(ctx, suite, "lifecycle_test.py", d, timeout_each=120)
    left = _shm_left(ctx, pages, d / "lifecycle_server.log")
    _check(ctx, suite, "shm pages cleaned", not left, f"left: {sorted(left)[:5]}")
    for model, needle, flags, want_ready in (
            ("init_error", "name 'lorem_ipsum' is not defined", [], False),
            ("fini_error", "name 'undefined_variable' is not defined", [], True),
            ("auto_complete_error", "name 'undefined_variable' is not defined",
             ["--strict-model-config=false"], False)):
        models = _fresh(d / "models")
        dst = _pm(ctx, models, model)
        if model == "auto_complete_error":
            (dst / "config.pbtxt").unlink(missing_ok=True)  # test.sh copies model.py only
        log = d / f"{model}_server.log"
        pages = _shm_pages()
        if ctx.args.against == "shoal":
            flags = [f for f in flags if not f.startswith("--strict-model-config")]
        ready = _start_and_stop(ctx, models, log, ["--log-verbose=1", *flags])
        text = log.read_text(errors="replace")
        _check(ctx, suite, f"{model}: ready={want_ready}, message logged",
               ready == want_ready and needle in text,
               f"ready={ready}, message {'found' if needle in text else 'missing'}")
        left = _shm_left(ctx, pages, log)
        _check(ctx, suite, f"{model}: shm pages cleaned", not left, f"left: {sorted(left)[:5]}")


def suite_qa_pb_argument_validation(ctx: Ctx) -> None:
    """L0_backend_python/argument_validation: its own models dir, test_infer_shm_leak.py."""
    d = _pb_copy(ctx, "argument_validation")
    with Server(ctx, d / "models", d / "arg_validation_server.log", ["--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_argument_validation", SHM_LEAK_TEST, d,
                   timeout_each=240, env={"MODEL_NAME": "argument_validation"})


def suite_qa_pb_async_execute(ctx: Ctx) -> None:
    """L0_backend_python/async_execute: concurrency_test.py (SERVER_LOG names the log)."""
    d = _pb_copy(ctx, "async_execute")
    models = _fresh(d / "models")
    _pm(ctx, models, "async_execute_decouple")
    _pm(ctx, models, "async_execute_decouple_bls")
    log = d / "concurrency_test.server.log"
    with Server(ctx, models, log, ["--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_async_execute", "concurrency_test.py", d, timeout_each=120,
                   env={"SERVER_LOG": str(log)})


def suite_qa_pb_ensemble(ctx: Ctx) -> None:
    """L0_backend_python/ensemble: test_ensemble (two add_sub steps); test_ensemble_gpu is
    left out (a libtorch model on KIND_GPU), and so is its model."""
    d = _pb_copy(ctx, "ensemble")
    models = _fresh(d / "models")
    pm = ctx.server_tree / "qa" / "python_models"
    (models / "ensemble" / "1").mkdir(parents=True)
    shutil.copy(pm / "ensemble" / "config.pbtxt", models / "ensemble" / "config.pbtxt")
    for name in ("add_sub_1", "add_sub_2"):  # test.sh keeps the config's name: add_sub
        _copy_model(pm / "add_sub" / "model.py", pm / "add_sub" / "config.pbtxt", models, name)
    pages = _shm_pages()
    with Server(ctx, models, d / "ensemble_server.log", ["--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_ensemble", "ensemble_test.py::EnsembleTest::test_ensemble", d)
    left = _shm_left(ctx, pages, d / "ensemble_server.log")
    _check(ctx, "qa_pb_ensemble", "shm pages cleaned", not left, f"left: {sorted(left)[:5]}")


def suite_qa_pb_model_control(ctx: Ctx) -> None:
    """L0_backend_python/model_control: model_control_test.py, explicit mode."""
    d = _pb_copy(ctx, "model_control")
    models = _fresh(d / "models")
    pm = ctx.server_tree / "qa" / "python_models"
    _copy_model(pm / "identity_fp32" / "model.py", pm / "identity_fp32" / "config.pbtxt",
                models, "identity_fp32")
    (models / "simple_identity_fp32" / "1").mkdir(parents=True)
    shutil.copy(pm / "simple_identity_fp32" / "config.pbtxt",
                models / "simple_identity_fp32" / "config.pbtxt")
    with Server(ctx, models, d / "model_control_server.log",
                ["--model-control-mode=explicit", "--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_model_control", "model_control_test.py", d, timeout_each=120)


def suite_qa_pb_response_sender(ctx: Ctx) -> None:
    """L0_backend_python/response_sender: response_sender_test.py on its eight variants, then
    response_sender_complete_final_test.py (SERVER_LOG names each server's log)."""
    d = _pb_copy(ctx, "response_sender")
    pm = ctx.server_tree / "qa" / "python_models" / "response_sender"
    models = _fresh(d / "models")
    decoupled = "model_transaction_policy { decoupled: True }"
    batching = "dynamic_batching { max_queue_delay_microseconds: 500000 }"
    for name, file, extra in (
            ("response_sender", "model.py", []),
            ("response_sender_decoupled", "model.py", [decoupled]),
            ("response_sender_async", "model_async.py", []),
            ("response_sender_decoupled_async", "model_async.py", [decoupled]),
            ("response_sender_batching", "model.py", [batching]),
            ("response_sender_decoupled_batching", "model.py", [decoupled, batching]),
            ("response_sender_async_batching", "model_async.py", [batching]),
            ("response_sender_decoupled_async_batching", "model_async.py",
             [decoupled, batching])):
        dst = models / name / "1"
        dst.mkdir(parents=True)
        shutil.copy(pm / "model_common.py", dst / "model_common.py")
        shutil.copy(pm / file, dst / "model.py")
        cfg = (pm / "config.pbtxt").read_text()  # test.sh keeps the config's name line
        (models / name / "config.pbtxt").write_text(cfg + "".join(f"\n{e}\n" for e in extra))
    log = d / "response_sender_test.server.log"
    with Server(ctx, models, log, ["--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_response_sender", "response_sender_test.py", d,
                   timeout_each=120, env={"SERVER_LOG": str(log)})
    models = _fresh(d / "models")
    _pm(ctx, models, "response_sender_complete_final")
    log = d / "response_sender_complete_final_test.server.log"
    with Server(ctx, models, log, ["--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_response_sender/complete_final",
                   "response_sender_complete_final_test.py", d, env={"SERVER_LOG": str(log)})


def suite_qa_pb_request_rescheduling(ctx: Ctx) -> None:
    """L0_backend_python/request_rescheduling: bls_request_rescheduling through
    test_infer_shm_leak.py, then grpc_endpoint_test.py (explicit mode, --load-model=*)."""
    d = _pb_copy(ctx, "request_rescheduling")
    models = _fresh(d / "models")
    for m in ("bls_request_rescheduling", "request_rescheduling_addsub", "iterative_sequence",
              "wrong_return_type"):
        _pm(ctx, models, m)
    with Server(ctx, models, d / "request_rescheduling_server.log",
                ["--model-control-mode=explicit", "--load-model=*", "--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_request_rescheduling", SHM_LEAK_TEST, d,
                   timeout_each=240, env={"MODEL_NAME": "bls_request_rescheduling"})
        run_pytest(ctx, "qa_pb_request_rescheduling/grpc", "grpc_endpoint_test.py", d)


def _model_processes(server: Server) -> list[int]:
    """The processes that run the models: Triton's python stubs are the server's children;
    shoal's workers are the broker's (the server's children are its broker and frontends,
    whose death ends the server by design: the service manager restarts it)."""
    assert server.proc is not None
    children = _children(server.proc.pid)
    if server.ctx.args.against == "triton":
        return children
    return [pid for child in children for pid in _children(child)
            if "shoal.workers" in _cmdline(pid)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except FileNotFoundError:
        return ""  # it exited meanwhile


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "--parent", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def suite_qa_pb_restart(ctx: Ctx) -> None:
    """L0_backend_python/restart: restart_test.py's test_infer, then kill -9 of the processes
    that run the models (Triton's stubs; shoal's workers, see ``_model_processes``),
    test_restart, and test.sh's two /dev/shm checks (after that run, and after a second server
    whose model processes were killed before it was stopped)."""
    d = _pb_copy(ctx, "restart")
    suite = "qa_pb_restart"
    log = d / "restart_server.log"
    before = _shm_pages()
    with Server(ctx, d / "models", log, ["--log-verbose=1"]) as server:
        run_pytest(ctx, suite, "restart_test.py::RestartTest::test_infer", d)
        for pid in _model_processes(server):
            os.kill(pid, signal.SIGKILL)
        run_pytest(ctx, suite, "restart_test.py::RestartTest::test_restart", d)
    left = _shm_left(ctx, before, log)
    _check(ctx, suite, "shm clean after the restart run", not left, " ".join(sorted(left)))
    log2 = d / "restart_server_2.log"
    before = _shm_pages()
    with Server(ctx, d / "models", log2, ["--log-verbose=1"]) as server:
        for pid in _model_processes(server):
            os.kill(pid, signal.SIGKILL)
    left = _shm_left(ctx, before, log2)
    _check(ctx, suite, "shm clean after killing the model processes", not left,
           " ".join(sorted(left)))


def suite_qa_pb_python_based_backends(ctx: Ctx) -> None:
    """L0_backend_python/python_based_backends: a python-based backend ``add_sub`` in the
    backend directory (models add v1/v2 and sub, configured by model.json), the add_sub python
    model in two versions and gen_qa_pytorch_model.py's TorchScript add_sub_pytorch; explicit
    mode, python_based_backends_test.py. shoal only: this tritonserver has no pytorch backend,
    and its backend directory is the runner's."""
    suite = "qa_pb_python_based_backends"
    if ctx.args.against == "triton":
        ctx.results.append(Result(suite, "python_based_backends_test.py", "skip",
                                  "this tritonserver has no pytorch backend"))
        return
    d = _pb_copy(ctx, "python_based_backends")
    pm = ctx.server_tree / "qa" / "python_models"
    backends = _fresh(d / "backends")
    (backends / "add_sub").mkdir()
    shutil.copy(pm / "python_based_backends" / "add_sub_backend" / "model.py",
                backends / "add_sub" / "model.py")
    models = _fresh(d / "models")
    for name, operation in (("add", "add"), ("sub", "sub")):
        (models / name / "1").mkdir(parents=True)
        (models / name / "1" / "model.json").write_text(f'{{ "operation": "{operation}" }}\n')
        (models / name / "config.pbtxt").write_text('backend: "add_sub"\n')
    shutil.copytree(models / "add" / "1", models / "add" / "2")
    _pm(ctx, models, "add_sub")
    shutil.copytree(models / "add_sub" / "1", models / "add_sub" / "2")
    gen = ctx.server_tree / "qa" / "common" / "gen_qa_pytorch_model.py"
    subprocess.run([PYTHON, str(gen), "-m", str(models)], check=True, capture_output=True)
    with Server(ctx, models, d / "python_based_backends_server.log",
                ["--backend-directory", str(backends), "--model-control-mode=explicit",
                 "--log-verbose=1"]):
        run_pytest(ctx, suite, "python_based_backends_test.py", d, timeout_each=180)


def suite_qa_pb_custom_metrics(ctx: Ctx) -> None:
    """L0_backend_python/custom_metrics: the custom_metrics model's unittest through
    test_infer_shm_leak.py."""
    d = _pb_copy(ctx, "custom_metrics")
    models = _fresh(d / "models")
    _pm(ctx, models, "custom_metrics")
    with Server(ctx, models, d / "custom_metrics_server.log", ["--log-verbose=1"]):
        run_pytest(ctx, "qa_pb_custom_metrics", SHM_LEAK_TEST, d,
                   timeout_each=240, env={"MODEL_NAME": "custom_metrics"})


def _log_counts(ctx: Ctx, suite: str, text: str, non_verbose: int, verbose: int) -> None:
    for msg in ("Specific Msg!", "Info Msg!", "Warning Msg!", "Error Msg!", "Verbose Msg!"):
        want = verbose if msg == "Verbose Msg!" else non_verbose
        n = sum(msg in ln for ln in text.splitlines())  # grep -c counts lines
        _check(ctx, suite, f"log count '{msg}' == {want}", n == want, f"found {n}")


def suite_qa_pb_logging(ctx: Ctx) -> None:
    """L0_backend_python/logging: logging_test.py in three rounds (default, log_verbose_level
    1 set over /v2/logging, log_info/warning/error turned off), each followed by test.sh's
    per-line message counts."""
    d = _pb_copy(ctx, "logging")
    models = _fresh(d / "models")
    _pm(ctx, models, "identity_fp32_logging")
    for round_name, settings, counts in (
            ("default", [], (4, 0)),
            ("verbose", [{"log_verbose_level": 1}], (4, 3)),
            ("disabled", [{"log_info": False}, {"log_warning": False}, {"log_error": False}],
             (1, 0))):
        log = d / f"logging_server.{round_name}.log"
        with Server(ctx, models, log, []):
            for body in settings:
                req = urllib.request.Request("http://localhost:8000/v2/logging",
                                             data=json.dumps(body).encode(), method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        code = r.status
                except Exception as exc:
                    code = int(getattr(exc, "code", 0) or 0)
                _check(ctx, f"qa_pb_logging/{round_name}", f"POST /v2/logging {body}",
                       code == 200, f"HTTP {code}")
            run_pytest(ctx, f"qa_pb_logging/{round_name}", "logging_test.py", d)
        _log_counts(ctx, f"qa_pb_logging/{round_name}", log.read_text(errors="replace"),
                    *counts)


SUITES: dict[str, Callable[[Ctx], None]] = {
    "pb_examples": suite_pb_examples,
    "client_examples": suite_client_examples,
    "client_model_control": suite_client_model_control,
    "qa_decoupled": suite_qa_decoupled,
    "qa_http": suite_qa_http,
    "qa_generate": suite_qa_generate,
    "qa_input_validation": suite_qa_input_validation,
    "qa_parameters": suite_qa_parameters,
    "qa_pb_io": suite_qa_pb_io,
    "qa_pb_bls": suite_qa_pb_bls,
    "qa_pb_lifecycle": suite_qa_pb_lifecycle,
    "qa_pb_argument_validation": suite_qa_pb_argument_validation,
    "qa_pb_async_execute": suite_qa_pb_async_execute,
    "qa_pb_ensemble": suite_qa_pb_ensemble,
    "qa_pb_model_control": suite_qa_pb_model_control,
    "qa_pb_response_sender": suite_qa_pb_response_sender,
    "qa_pb_request_rescheduling": suite_qa_pb_request_rescheduling,
    "qa_pb_custom_metrics": suite_qa_pb_custom_metrics,
    "qa_pb_restart": suite_qa_pb_restart,
    "qa_pb_python_based_backends": suite_qa_pb_python_based_backends,
    "qa_pb_logging": suite_qa_pb_logging,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-tree", required=True)
    ap.add_argument("--python-backend-tree", required=True)
    ap.add_argument("--client-tree", required=True)
    ap.add_argument("--against", choices=("shoal", "triton"), default="shoal")
    ap.add_argument("--suite", action="append", choices=sorted(SUITES))
    ap.add_argument("--work", default="/tmp/shoal-triton-suites")
    ap.add_argument("--extra-pythonpath", action="append")
    ap.add_argument("--triton-has-onnx", action="store_true")
    args = ap.parse_args()
    ctx = Ctx(args, Path(args.work).resolve() / args.against)
    ctx.work.mkdir(parents=True, exist_ok=True)
    for name in args.suite or list(SUITES):
        print(f"== {name}", flush=True)
        before = len(ctx.results)
        try:
            SUITES[name](ctx)
        except Exception as exc:  # a broken suite is a row, not a crash
            ctx.results.append(Result(name, "(suite)", "error", repr(exc)[:300]))
        for r in ctx.results[before:]:
            print(f"   {r.status:7} {r.name}  {r.detail[:160]}", flush=True)
    print(f"\nagainst {args.against}:")
    print(f"{'suite':24} {'pass':>5} {'fail':>5} {'err':>5} {'t/o':>5} {'skip':>5}")
    for name in args.suite or list(SUITES):
        rs = [r for r in ctx.results if r.suite.split("/")[0] == name]
        c = {s: sum(r.status == s for r in rs) for s in ("pass", "fail", "error", "timeout",
                                                        "skip")}
        print(f"{name:24} {c['pass']:5} {c['fail']:5} {c['error']:5} {c['timeout']:5} "
              f"{c['skip']:5}")
    bad = [r for r in ctx.results if r.status in ("fail", "error", "timeout")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
