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
import os
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

    def __init__(self, ctx: Ctx, repo: Path, log: Path, flags: list[str]) -> None:
        self.ctx, self.repo, self.log, self.flags = ctx, repo, log, flags
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
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
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


SUITES: dict[str, Callable[[Ctx], None]] = {
    "pb_examples": suite_pb_examples,
    "client_examples": suite_client_examples,
    "client_model_control": suite_client_model_control,
    "qa_decoupled": suite_qa_decoupled,
    "qa_http": suite_qa_http,
    "qa_generate": suite_qa_generate,
    "qa_input_validation": suite_qa_input_validation,
    "qa_parameters": suite_qa_parameters,
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
