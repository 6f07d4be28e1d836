"""The Containerfile builds the image deploy/kubernetes runs: CPU torch before shoal, the user the
Deployment runs as, shoal's ports, the model repository the Deployment serves, a health check on
the readiness endpoint, SIGTERM to stop; and its build context holds what it copies."""

from __future__ import annotations

import re
import subprocess

from tests.deploy.containerfile import (
    Instruction,
    final_stage,
    ignore_patterns,
    image_model_repository,
    is_ignored,
    read_instructions,
)
from tests.deploy.manifests import (
    READY_PATH,
    ROOT,
    cli_defaults,
    one,
    settings_of,
    shoal_container,
)

CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def instructions() -> list[Instruction]:
    return read_instructions()


def runtime_stage() -> list[Instruction]:
    return final_stage(instructions())


def only(keyword: str) -> Instruction:
    found = [i for i in runtime_stage() if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the runtime stage, found {len(found)}"
    return found[0]


def pod_security() -> dict[str, int]:
    return dict(one("Deployment", "shoal")["spec"]["template"]["spec"]["securityContext"])


def test_every_stage_is_python_311_slim() -> None:
    images = [i.words()[0] for i in instructions() if i.keyword == "FROM"]
    assert images and all(image.startswith("python:3.11-slim") for image in images)


def test_cpu_torch_is_installed_before_shoal_at_the_makefiles_pin() -> None:
    runs = [i.text for i in instructions() if i.keyword == "RUN" and "pip install" in i.text]
    torch_at = next(n for n, text in enumerate(runs) if "torch==" in text)
    shoal_at = next(n for n, text in enumerate(runs) if re.search(r"pip install /src\b", text))
    assert torch_at < shoal_at
    assert CPU_INDEX in runs[torch_at]
    pinned = re.search(r"torch==([0-9.]+)", (ROOT / "Makefile").read_text())
    assert pinned and f"torch=={pinned.group(1)}" in runs[torch_at].split()


def test_runs_as_the_deployments_uid_and_gid() -> None:
    security = pod_security()
    assert only("USER").text == f"{security['runAsUser']}:{security['runAsGroup']}"
    create_user = next(i.text for i in runtime_stage()
                       if i.keyword == "RUN" and "useradd" in i.text)
    assert f"--uid {security['runAsUser']}" in create_user
    assert f"--gid {security['runAsGroup']}" in create_user


def test_exposes_shoals_default_ports() -> None:
    defaults = cli_defaults()
    exposed = {int(port) for port in only("EXPOSE").words()}
    assert exposed == {defaults.http.port, defaults.grpc.port, defaults.metrics.port}
    container = shoal_container(one("Deployment", "shoal"))
    assert exposed == {p["containerPort"] for p in container["ports"]}


def test_entrypoint_serves_the_copied_model_repository() -> None:
    assert only("ENTRYPOINT").exec_form() == ["shoal"]
    served = settings_of(only("CMD").exec_form()).model_control.repositories
    _, in_image = image_model_repository()
    assert served == [in_image]
    container = shoal_container(one("Deployment", "shoal"))
    assert settings_of(container["args"]).model_control.repositories == served


def test_health_check_asks_readiness_on_the_http_port() -> None:
    check = only("HEALTHCHECK").text
    assert f"127.0.0.1:{cli_defaults().http.port}{READY_PATH}" in check


def test_stops_with_sigterm() -> None:
    assert only("STOPSIGNAL").text == "SIGTERM"


def test_tmpdir_and_bytecode_suit_a_read_only_root() -> None:
    settings = only("ENV").text
    assert "TMPDIR=/tmp" in settings and "PYTHONDONTWRITEBYTECODE=1" in settings
    container = shoal_container(one("Deployment", "shoal"))
    assert {"name": "TMPDIR", "value": "/tmp"} in container["env"]


def _tracked(path: str) -> list[str]:
    listing = subprocess.run(["git", "ls-files", "--", path], cwd=ROOT, check=True,
                             capture_output=True, text=True)
    return listing.stdout.split()


def test_build_context_holds_every_copied_file_and_little_else() -> None:
    patterns = ignore_patterns(ROOT / ".containerignore")
    assert patterns == ignore_patterns(ROOT / ".dockerignore")
    sources = [word for i in instructions() if i.keyword == "COPY" and "--from" not in i.text
               for word in i.words()[:-1] if not word.startswith("--")]
    assert sources
    for source in sources:
        files = _tracked(source)
        assert files, f"COPY {source}: nothing tracked there"
        for path in files:
            assert not is_ignored(path, patterns), f"COPY {source}: {path} is ignored"
    for left_out in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "bench/run.py",
                     "shoal/__pycache__/settings.cpython-311.pyc",
                     "examples/embedding_pipeline/build.py"):
        assert is_ignored(left_out, patterns), left_out
