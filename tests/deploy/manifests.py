"""Read deploy/kubernetes, the Containerfile and the example model repository for the deploy
tests: YAML documents by kind, Kubernetes quantities, the shoal settings a container's args
give, and the shared-memory size those settings need for a model repository."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from shoal.config.model_config import instance_names, load_config_file, normalize_config
from shoal.frontend.http.guard import HEALTH_PATHS
from shoal.server.cli import build_parser, settings_from_args
from shoal.settings import ModelControlMode, Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
SCHEMAS = pathlib.Path(__file__).resolve().parent / "schemas"
EXAMPLE_REPOSITORY = ROOT / "examples" / "model_repository"

Manifest = dict[str, Any]
LIVE_PATH = next(p.decode() for p in HEALTH_PATHS if p.endswith(b"/live"))
READY_PATH = next(p.decode() for p in HEALTH_PATHS if p.endswith(b"/ready"))


def manifest_files() -> list[pathlib.Path]:
    """Every Kubernetes object file under deploy/kubernetes (kustomizations and the adapter's
    Helm values are not objects)."""
    return sorted(p for p in KUBERNETES.rglob("*.yaml")
                  if p.name != "kustomization.yaml" and not p.name.endswith("-values.yaml"))


def load_documents(path: pathlib.Path) -> list[Manifest]:
    with open(path) as file:
        return [doc for doc in yaml.safe_load_all(file) if doc]


def all_manifests() -> Iterator[tuple[pathlib.Path, Manifest]]:
    for path in manifest_files():
        for doc in load_documents(path):
            yield path, doc


def one(kind: str, name: str | None = None) -> Manifest:
    """The single manifest of ``kind`` (and ``name``) under deploy/kubernetes."""
    found = [doc for _, doc in all_manifests()
             if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def shoal_container(deployment: Manifest) -> Manifest:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "the shoal pod has one container"
    return dict(containers[0])


def settings_of(args: list[str]) -> Settings:
    """The Settings that ``shoal <args>`` would run with (the CLI's own parser)."""
    return settings_from_args(build_parser().parse_args(args))


def cli_defaults() -> Settings:
    return settings_of(["serve", "--model-repository=/models"])


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}


def quantity_bytes(text: str | int) -> int:
    """A Kubernetes memory quantity ("1536Mi", "3Gi", "512M", "1073741824") in bytes."""
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T|)", str(text))
    assert match, f"not a whole memory quantity: {text!r}"
    number, suffix = match.groups()
    return int(number) * (_BINARY.get(suffix) or _DECIMAL[suffix])


@dataclass(frozen=True)
class ShmNeed:
    """Terms of the /dev/shm sizing formula in deploy/kubernetes/deployment.yaml."""

    frontends: int          # F
    workers: int            # W: model instances
    bls_workers: int        # B: instances of python models that call other models
    state_arenas: int       # S: model versions with implicit sequence state
    reload_instances: int   # R: the largest model's instances, when models can be reloaded
    client_bytes: int       # C
    arena_bytes: int        # A

    @property
    def arenas(self) -> int:
        return (self.frontends + self.workers + self.bls_workers + self.state_arenas
                + self.reload_instances)

    @property
    def total_bytes(self) -> int:
        return self.arenas * self.arena_bytes + self.client_bytes


def shm_need(settings: Settings, repository: pathlib.Path) -> ShmNeed:
    """The most shared memory a server with ``settings`` can hold for ``repository``: every
    model loaded, each version's instances counted as shoal's config normalization counts them
    (CPU only). A version dir counts as served (an upper bound on the version policy)."""
    workers = bls = states = largest = 0
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        config = load_config_file(str(model_dir / "config.pbtxt"))
        assert config is not None, f"{model_dir.name}: no config.pbtxt"
        if config.platform == "ensemble":
            continue  # ensembles run no workers
        config = normalize_config(config, model_name=model_dir.name, source=model_dir.name,
                                  default_max_batch_size=settings.backend.default_max_batch_size)
        versions = sum(1 for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit())
        instances = len(instance_names(config)) * versions
        workers += instances
        largest = max(largest, len(instance_names(config)))
        if any("InferenceRequest(" in path.read_text()
               for path in model_dir.glob("*/model.py")):
            bls += instances
        if config.sequence_batching.state:
            states += versions
    reloads = settings.model_control.mode is not ModelControlMode.NONE
    return ShmNeed(
        frontends=settings.http.workers, workers=workers, bls_workers=bls,
        state_arenas=states, reload_instances=largest if reloads else 0,
        client_bytes=settings.client_shm.max_bytes if settings.client_shm.allowed else 0,
        arena_bytes=settings.shm.arena_max_bytes)


def load_schema(name: str) -> dict[str, Any]:
    with open(SCHEMAS / name) as file:
        schema: dict[str, Any] = json.load(file)
    return schema
