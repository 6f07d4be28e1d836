"""Every manifest in deploy/kubernetes is valid offline: Kubernetes kinds against the JSON schemas
that kubernetes-validate bundles (strict: unknown fields fail), custom resources against the
CRD subsets in tests/deploy/schemas."""

from __future__ import annotations

import copy
import functools
import json
import pathlib
from importlib import resources
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml

from tests.deploy.manifests import (
    KUBERNETES,
    Manifest,
    all_manifests,
    load_documents,
    load_schema,
    manifest_files,
    one,
)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# the oldest Kubernetes the manifests are written for (README: 1.29) or, once kubernetes-validate
# no longer bundles it, its oldest schemas; and the newest schemas it bundles
OLDEST_SUPPORTED = "1.29"
KUBERNETES_VERSIONS = (
    min((v for v in kubernetes_validate.utils.all_versions()
         if _version_key(v) >= _version_key(OLDEST_SUPPORTED)), key=_version_key),
    kubernetes_validate.latest_version(),
)

CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.json",
}


@functools.cache
def _definitions(version: str) -> dict[str, Any]:
    """kubernetes-validate's strict definitions for ``version`` (the newest bundled one that is
    not newer), which the CRD schemas reference for pod-level types."""
    bundled = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    wanted = tuple(int(part) for part in version.split(".")[:2])
    chosen = max(
        (entry for entry in bundled.iterdir() if entry.name.endswith("-local-strict")
         and tuple(int(p) for p in entry.name[1:].split("-")[0].split(".")[:2]) <= wanted),
        key=lambda entry: tuple(int(p) for p in entry.name[1:].split("-")[0].split(".")))
    definitions: dict[str, Any] = json.loads((chosen / "_definitions.json").read_text())
    return definitions


def validate_custom_resource(doc: Manifest, version: str) -> None:
    schema = load_schema(CRD_SCHEMAS[doc["apiVersion"], doc["kind"]])
    definitions = _definitions(version)
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
        definitions["$id"], referencing.Resource.from_contents(definitions))
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)


def _cases() -> list[tuple[pathlib.Path, int, Manifest]]:
    cases = []
    for path in manifest_files():
        for index, doc in enumerate(load_documents(path)):
            cases.append((path, index, doc))
    return cases


def _case_id(case: tuple[pathlib.Path, int, Manifest]) -> str:
    path, _, doc = case
    return f"{path.relative_to(KUBERNETES)}:{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_manifest_is_valid(case: tuple[pathlib.Path, int, Manifest], version: str) -> None:
    _, _, doc = case
    if (doc["apiVersion"], doc["kind"]) in CRD_SCHEMAS:
        validate_custom_resource(doc, version)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_kind_is_covered() -> None:
    """The objects the issue asks for are all there (and nothing is silently skipped)."""
    kinds = {doc["kind"] for _, doc in all_manifests()}
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ServiceMonitor", "ConfigMap", "ServingRuntime", "InferenceService",
            "Namespace"} <= kinds


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The schemas are strict: a typo in a probe (core) or in a ServiceMonitor endpoint (CRD)
    fails instead of being ignored."""
    deployment = copy.deepcopy(one("Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["paht"] = container["readinessProbe"]["httpGet"].pop(
        "path")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    monitor = copy.deepcopy(one("ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate_custom_resource(monitor, KUBERNETES_VERSIONS[-1])
    runtime = copy.deepcopy(one("ServingRuntime"))
    runtime["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(jsonschema.ValidationError):
        validate_custom_resource(runtime, KUBERNETES_VERSIONS[-1])


@pytest.mark.parametrize("kustomization", sorted(KUBERNETES.rglob("kustomization.yaml")),
                         ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_kustomization_lists_existing_files(kustomization: pathlib.Path) -> None:
    with open(kustomization) as file:
        doc = yaml.safe_load(file)
    assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert doc["kind"] == "Kustomization"
    for resource in doc["resources"]:
        assert (kustomization.parent / resource).is_file(), resource


def test_base_kustomization_applies_the_core_objects() -> None:
    """`kubectl apply -k deploy/kubernetes` creates the namespace and everything that needs no
    CRD; the CRD-based objects live in their own directories."""
    with open(KUBERNETES / "kustomization.yaml") as file:
        listed = set(yaml.safe_load(file)["resources"])
    top_level = {p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == top_level
