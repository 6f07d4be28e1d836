"""deploy/kubernetes agrees with shoal itself: ports and probe paths with the CLI and the HTTP
app, the /dev/shm size with the arena formula, the grace period with the shutdown sequence, the
writable volumes with what shoal writes, and the Service, PodDisruptionBudget, HPA,
ServiceMonitor, Prometheus adapter rule and KServe objects with each other."""

from __future__ import annotations

import re
from typing import Any, cast

import yaml
from starlette.routing import Route

from shoal.frontend.core.dataplane import DataPlane
from shoal.frontend.metrics import create_metrics_app, render_prometheus
from shoal.messages.frontend import Duration, ModelStats
from shoal.server.supervisor import _LEAVE_WAIT_S
from shoal.settings import Settings
from tests.deploy.containerfile import image_model_repository
from tests.deploy.manifests import (
    EXAMPLE_REPOSITORY,
    KUBERNETES,
    LIVE_PATH,
    READY_PATH,
    ROOT,
    Manifest,
    cli_defaults,
    one,
    quantity_bytes,
    settings_of,
    shm_need,
    shoal_container,
)

PENDING_METRIC = "nv_inference_pending_request_count"
# Supervisor.stop gives each stage (frontends, then the broker) the exit timeout + 5 s
STOP_STAGE_MARGIN_S = 5.0
# what the processes of the example repository need besides /dev/shm: 700 MiB RSS measured for
# its 7 processes (supervisor, broker, frontend, 4 workers; the TorchScript worker 321 MiB)
PROCESS_MEMORY_BYTES = 1 << 30


def deployment() -> Manifest:
    return one("Deployment", "shoal")


def pod_spec() -> Manifest:
    return dict(deployment()["spec"]["template"]["spec"])


def container() -> Manifest:
    return shoal_container(deployment())


def settings() -> Settings:
    return settings_of(container()["args"])


def container_port(name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    return int(ports[name])


def volume(spec: Manifest, mount_path: str) -> Manifest:
    """The volume mounted at ``mount_path`` in the first container of ``spec``."""
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert mount_path in mounts, f"nothing is mounted at {mount_path}"
    volumes = {v["name"]: v for v in spec["volumes"]}
    return dict(volumes[mounts[mount_path]])


def env(target: Manifest) -> dict[str, str]:
    return {e["name"]: e["value"] for e in target.get("env", [])}


# ---------------------------------------------------------------- ports and probes


def test_ports_are_named_and_are_the_cli_defaults() -> None:
    ours, defaults = settings(), cli_defaults()
    assert (ours.http.port, ours.grpc.port, ours.metrics.port) == (
        defaults.http.port, defaults.grpc.port, defaults.metrics.port)
    assert container_port("http") == ours.http.port
    assert container_port("grpc") == ours.grpc.port
    assert container_port("metrics") == ours.metrics.port
    assert ours.grpc.enabled and ours.metrics.enabled


def test_probes_ask_the_health_endpoints_on_the_http_port() -> None:
    spec = container()
    probes = {kind: spec[kind]["httpGet"] for kind in
              ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["path"] == LIVE_PATH
    assert probes["readinessProbe"]["path"] == READY_PATH
    assert probes["startupProbe"]["path"] == READY_PATH
    for probe in probes.values():
        assert container_port(probe["port"]) == settings().http.port


def test_startup_probe_gives_a_slow_first_load_minutes() -> None:
    startup = container()["startupProbe"]
    budget_s = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget_s >= 300, "liveness must not restart a pod that is still loading its models"
    assert "initialDelaySeconds" not in container()["livenessProbe"]


# ---------------------------------------------------------------- shared memory and memory


def test_model_repository_is_the_one_in_the_image() -> None:
    source, target = image_model_repository()
    assert settings().model_control.repositories == [target]
    assert EXAMPLE_REPOSITORY.relative_to(ROOT).as_posix() == source


def test_shm_volume_holds_every_arena_at_the_deployments_flags() -> None:
    ours = settings()
    need = shm_need(ours, EXAMPLE_REPOSITORY)
    shm = volume(pod_spec(), "/dev/shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    size = quantity_bytes(shm["emptyDir"]["sizeLimit"])
    assert need.workers == 4 and need.frontends == 1  # the arithmetic in deployment.yaml
    assert size >= need.total_bytes, (
        f"/dev/shm sizeLimit {size} < {need.arenas} arenas x {need.arena_bytes} + "
        f"{need.client_bytes} client bytes")
    assert size >= 2 * ours.shm.segment_bytes  # shoal's start-up preflight


def test_shm_formula_counts_frontends_reloads_and_client_regions() -> None:
    """The formula moves with the flags it names (so the check above is not vacuous)."""
    base = settings_of(["serve", "--model-repository=/models", "--shm-arena-byte-size=1000"])
    more = settings_of(["serve", "--model-repository=/models", "--shm-arena-byte-size=1000",
                        "--http-workers=3", "--model-control-mode=explicit",
                        "--allow-client-shm", "--client-shm-max-bytes=500"])
    small, large = shm_need(base, EXAMPLE_REPOSITORY), shm_need(more, EXAMPLE_REPOSITORY)
    assert small.total_bytes == (1 + 4) * 1000
    assert large.total_bytes == (3 + 4 + 1) * 1000 + 500


def test_memory_limit_covers_the_shm_volume_and_the_processes() -> None:
    resources = container()["resources"]
    limit = quantity_bytes(resources["limits"]["memory"])
    shm = quantity_bytes(volume(pod_spec(), "/dev/shm")["emptyDir"]["sizeLimit"])
    assert limit >= shm + PROCESS_MEMORY_BYTES, "tmpfs pages count against the memory limit"
    assert quantity_bytes(resources["requests"]["memory"]) <= limit
    assert "cpu" in resources["requests"] and "cpu" in resources["limits"]


# ---------------------------------------------------------------- security and writable paths


def test_pod_runs_non_root_read_only_without_privileges() -> None:
    pod, spec = pod_spec(), container()
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert isinstance(security["runAsUser"], int) and security["runAsUser"] > 0
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    own = spec["securityContext"]
    assert own["readOnlyRootFilesystem"] is True
    assert own["allowPrivilegeEscalation"] is False
    assert own.get("privileged", False) is False
    assert own["capabilities"]["drop"] == ["ALL"] and "add" not in own["capabilities"]
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host, False)
    # the restricted Pod Security Standard allows these volume types; ours are emptyDirs
    assert all(set(v) == {"name", "emptyDir"} for v in pod["volumes"])


def test_everything_shoal_writes_is_on_a_writable_volume() -> None:
    """shoal writes its runtime dir (and materialised overrides) under TMPDIR, its segments and
    instance lock in /dev/shm, and nothing else (tests/deploy/test_read_only_root.py runs it
    that way)."""
    variables = env(container())
    assert settings().model_control.temp_root == ""  # overrides go under <TMPDIR>/shoal-<id>/models
    for path in (variables["TMPDIR"], variables["HOME"], "/dev/shm"):
        assert "emptyDir" in volume(pod_spec(), path)


def shutdown_seconds(target: Manifest, exit_timeout_secs: float) -> float:
    """The longest a pod of ``target`` (a container) takes to stop after the kubelet begins:
    the preStop sleep, then Supervisor.stop's two stages and the final wait for stragglers."""
    hook = target["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "sleep"
    drain_s = 2 * (exit_timeout_secs + STOP_STAGE_MARGIN_S) + _LEAVE_WAIT_S
    return float(hook[1]) + drain_s


def test_grace_period_covers_prestop_and_both_drain_stages() -> None:
    needed_s = shutdown_seconds(container(), settings().exit_timeout_secs)
    assert pod_spec()["terminationGracePeriodSeconds"] >= needed_s


# ---------------------------------------------------------------- the objects around the pod


def pod_labels() -> dict[str, str]:
    return dict(deployment()["spec"]["template"]["metadata"]["labels"])


def test_deployment_selector_matches_its_pods_and_leaves_replicas_to_the_hpa() -> None:
    selector = deployment()["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels().items()
    assert "replicas" not in deployment()["spec"]


def test_service_selects_the_pods_and_targets_named_ports() -> None:
    service = one("Service", "shoal")
    assert service["spec"]["selector"].items() <= pod_labels().items()
    names = {p["name"] for p in container()["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in names
        assert port["port"] == container_port(port["targetPort"])
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "grpc", "metrics"}


def test_disruption_budget_keeps_a_pod_serving() -> None:
    budget = one("PodDisruptionBudget", "shoal")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels().items()
    assert budget["spec"]["maxUnavailable"] == 1
    assert one("HorizontalPodAutoscaler", "shoal")["spec"]["minReplicas"] >= 2


def adapter_rule() -> dict[str, Any]:
    config = yaml.safe_load(one("ConfigMap", "adapter-config")["data"]["config.yaml"])
    rules = [r for r in config["rules"] if PENDING_METRIC in r["seriesQuery"]]
    assert len(rules) == 1
    return dict(rules[0])


def test_hpa_scales_the_deployment_on_the_adapters_queue_metric() -> None:
    hpa = one("HorizontalPodAutoscaler", "shoal")["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment()["apiVersion"], "Deployment", deployment()["metadata"]["name"])
    assert hpa["minReplicas"] <= hpa["maxReplicas"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == adapter_rule()["name"]["as"]
    assert metric["pods"]["target"]["type"] == "AverageValue"


def test_adapter_rule_reads_the_gauge_shoal_exports_per_pod() -> None:
    rule = adapter_rule()
    assert re.match(rf"{PENDING_METRIC}\{{", rule["seriesQuery"])
    assert re.fullmatch(rule["name"]["matches"], PENDING_METRIC)
    overrides = rule["resources"]["overrides"]
    assert overrides["namespace"]["resource"] == "namespace"
    assert overrides["pod"]["resource"] == "pod"
    assert "by (<<.GroupBy>>)" in rule["metricsQuery"]
    zero = Duration(0, 0)
    stats = ModelStats("m", 1, 0, 0, 0, zero, zero, zero, zero, zero, zero, [], pending=3)
    assert f'{PENDING_METRIC}{{model="m",version="1"}} 3' in render_prometheus([stats])


def test_helm_values_carry_the_same_adapter_rule() -> None:
    with open(KUBERNETES / "monitoring" / "prometheus-adapter-values.yaml") as file:
        values = yaml.safe_load(file)
    assert values["rules"]["custom"] == [adapter_rule()]


def test_service_monitor_scrapes_the_metrics_route_on_the_metrics_port() -> None:
    monitor = one("ServiceMonitor", "shoal")["spec"]
    service = one("Service", "shoal")
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "namespaceSelector" not in monitor  # the Service's own namespace
    (endpoint,) = monitor["endpoints"]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert container_port(ports[endpoint["port"]]["targetPort"]) == settings().metrics.port
    app = create_metrics_app(cast(DataPlane, object()))
    assert endpoint["path"] in {r.path for r in app.routes if isinstance(r, Route)}


# ---------------------------------------------------------------- KServe


def runtime() -> Manifest:
    return one("ServingRuntime", "shoal")


def runtime_settings() -> Settings:
    (kserve_container,) = runtime()["spec"]["containers"]
    assert "command" not in kserve_container  # the image's ENTRYPOINT (shoal) runs the args
    return settings_of(kserve_container["args"])


def test_serving_runtime_speaks_v2_over_rest_and_grpc_for_triton_models() -> None:
    spec = runtime()["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    assert {"name": "triton", "version": "2"}.items() <= spec["supportedModelFormats"][0].items()
    assert spec["containers"][0]["name"] == "kserve-container"
    assert runtime_settings().model_control.repositories == ["/mnt/models"]
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(
        runtime_settings().metrics.port)


def test_serving_runtime_container_is_restricted_and_sized_like_the_deployment() -> None:
    spec = runtime()["spec"]
    security = spec["containers"][0]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == pod_spec()["securityContext"]["runAsUser"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    shm = volume(spec, "/dev/shm")["emptyDir"]
    need = shm_need(runtime_settings(), EXAMPLE_REPOSITORY)
    assert shm["medium"] == "Memory" and quantity_bytes(shm["sizeLimit"]) >= need.total_bytes
    assert "emptyDir" in volume(spec, env(spec["containers"][0])["TMPDIR"])


def test_serving_runtime_probes_the_health_endpoints_on_its_rest_port() -> None:
    (kserve_container,) = runtime()["spec"]["containers"]
    paths = {kind: kserve_container[kind]["httpGet"] for kind in
             ("livenessProbe", "readinessProbe", "startupProbe")}
    assert paths["livenessProbe"]["path"] == LIVE_PATH
    assert paths["readinessProbe"]["path"] == READY_PATH == paths["startupProbe"]["path"]
    assert {p["port"] for p in paths.values()} == {runtime_settings().http.port}


def inference_services() -> dict[str, Manifest]:
    return {name: one("InferenceService", name)["spec"]["predictor"]
            for name in ("shoal-example", "shoal-example-grpc")}


def test_inference_services_give_the_runtime_its_drain_time() -> None:
    (kserve_container,) = runtime()["spec"]["containers"]
    needed_s = shutdown_seconds(kserve_container, runtime_settings().exit_timeout_secs)
    for predictor in inference_services().values():
        assert predictor["terminationGracePeriodSeconds"] >= needed_s


def test_inference_services_use_the_runtime_and_its_ports() -> None:
    services = {name: predictor["model"] for name, predictor in inference_services().items()}
    for model in services.values():
        assert model["runtime"] == runtime()["metadata"]["name"]
        assert model["protocolVersion"] in runtime()["spec"]["protocolVersions"]
        assert model["modelFormat"]["name"] == "triton"
    assert services["shoal-example"]["protocolVersion"] == "v2"
    grpc = services["shoal-example-grpc"]
    assert grpc["protocolVersion"] == "grpc-v2"
    assert [p["containerPort"] for p in grpc["ports"]] == [runtime_settings().grpc.port]
