"""Prometheus text in Triton's names and labels, and the metrics app."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from shoal.frontend.metrics import create_metrics_app, failures_by_reason, render_prometheus
from shoal.frontend.metrics.config import MetricsConfig
from shoal.messages import (
    CustomMetric,
    CustomMetricFamily,
    CustomMetricKind,
    Duration,
    ModelLoadStats,
    ModelStats,
    RepositorySnapshot,
    StatsReply,
)
from tests.frontend.http.fakes import FakeDataPlane, make_model


def stats(name: str = "m", version: int = 1, **overrides: object) -> ModelStats:
    values: dict[str, object] = dict(
        name=name, version=version, last_inference_ms=0, inference_count=12,
        execution_count=3, success=Duration(10, 5_000_000), fail=Duration(4, 1000),
        queue=Duration(10, 2_000_000), compute_input=Duration(3, 30_000),
        compute_infer=Duration(3, 900_000), compute_output=Duration(3, 7_000),
        batch_stats=[], pending=2, fail_by_reason={"REJECTED": 1, "BACKEND": 2})
    values.update(overrides)
    return ModelStats(**values)  # type: ignore[arg-type]


def samples(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            found[key] = float(value)
    return found


def test_per_model_counters_use_triton_names_and_labels() -> None:
    values = samples(render_prometheus([stats()]))
    labels = '{model="m",version="1"}'
    assert values["nv_inference_request_success" + labels] == 10
    assert values["nv_inference_count" + labels] == 12
    assert values["nv_inference_exec_count" + labels] == 3
    assert values["nv_inference_pending_request_count" + labels] == 2
    assert values["nv_inference_request_duration_us" + labels] == 5000
    assert values["nv_inference_queue_duration_us" + labels] == 2000
    assert values["nv_inference_compute_input_duration_us" + labels] == 30
    assert values["nv_inference_compute_infer_duration_us" + labels] == 900
    assert values["nv_inference_compute_output_duration_us" + labels] == 7


def test_failures_have_every_triton_reason_with_the_labels_in_tritons_order() -> None:
    values = samples(render_prometheus([stats()]))
    by_reason = {reason: values[f'nv_inference_request_failure{{model="m",reason="{reason}",'
                                f'version="1"}}']
                 for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}
    assert by_reason == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 2, "OTHER": 1}


def test_unclassified_failures_count_as_other() -> None:
    assert failures_by_reason(stats(fail_by_reason={}))["OTHER"] == 4


def test_help_and_type_lines_and_no_total_suffix() -> None:
    text = render_prometheus([stats(), stats("a", 2)])
    assert "# TYPE nv_inference_request_success counter" in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    assert "# HELP nv_inference_count " in text
    assert not re.search(r"^nv_\w+_total[{ ]", text, re.MULTILINE)
    assert text.count("# TYPE nv_inference_count counter") == 1
    lines = [line for line in text.splitlines() if line.startswith("nv_inference_count{")]
    assert lines == ['nv_inference_count{model="a",version="2"} 12',
                     'nv_inference_count{model="m",version="1"} 12']


def test_the_exposition_parses_with_the_families_typed() -> None:
    text = render_prometheus([stats()], RepositorySnapshot([make_model("m")], True))
    kinds = {family.name: family.type for family in text_string_to_metric_families(text)}
    assert kinds["nv_inference_count"] == "counter"  # the parser files it under the family name
    assert kinds["nv_inference_request_failure"] == "counter"
    assert kinds["nv_inference_pending_request_count"] == "gauge"
    assert kinds["shoal_model_state"] == "gauge"
    assert kinds["nv_cpu_utilization"] == "gauge"


def test_prometheus_client_would_add_total_to_counters() -> None:
    """Why counters are written by hand (exposition.py): prometheus-client names a counter
    family <name>_total, which would rename every Triton counter."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily

    class One:
        def collect(self) -> list[CounterMetricFamily]:
            family = CounterMetricFamily("nv_inference_count", "n", labels=["model"])
            family.add_metric(["m"], 12)
            return [family]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert "# TYPE nv_inference_count_total counter" in text
    assert 'nv_inference_count_total{model="m"} 12.0' in text


def test_counter_latencies_false_drops_the_duration_counters() -> None:
    text = render_prometheus([stats()], config=MetricsConfig(counter_latencies=False))
    assert "nv_inference_request_duration_us" not in text
    assert "nv_inference_compute_infer_duration_us" not in text
    assert 'nv_inference_count{model="m",version="1"} 12' in text


def test_cpu_gauges_are_present() -> None:
    values = samples(render_prometheus([]))
    assert 0.0 <= values["nv_cpu_utilization"] <= 1.0
    assert values["nv_cpu_memory_total_bytes"] > 0
    assert 0 < values["nv_cpu_memory_used_bytes"] <= values["nv_cpu_memory_total_bytes"]
    assert "nv_inference_count" not in render_prometheus([])


def test_pinned_memory_pool_gauges_are_present_and_zero() -> None:
    """shoal has no pinned pool: Triton's two gauges, with its HELP/TYPE lines, at 0."""
    text = render_prometheus([stats()])
    for name, what in (("total", "total memory size"), ("used", "used memory size")):
        family = f"nv_pinned_memory_pool_{name}_bytes"
        assert f"# HELP {family} Pinned memory pool {what}, in bytes\n" in text
        assert f"# TYPE {family} gauge\n" in text
        assert samples(text)[family] == 0


def test_label_values_are_escaped() -> None:
    name = 'we"ird\\na\nme'
    text = render_prometheus([stats(name)], RepositorySnapshot([make_model(name)], True))
    assert 'model="we\\"ird\\\\na\\nme"' in text
    for family in text_string_to_metric_families(text):
        if family.name in ("nv_inference_count", "shoal_model_state"):
            assert {s.labels["model"] for s in family.samples} == {name}


def test_model_load_duration_follows_triton_for_ready_versions() -> None:
    snapshot = RepositorySnapshot([make_model("m"), make_model("m", version=2)], True,
                                  load_stats=[ModelLoadStats("m", 1, 0, 0, 1.5)])
    values = samples(render_prometheus([], snapshot))
    assert values['nv_model_load_duration_secs{model="m",version="1"}'] == 1.5
    assert values['nv_model_load_duration_secs{model="m",version="2"}'] == 1.5
    assert values['shoal_model_state{model="m",state="READY",version="1"}'] == 1
    assert values['shoal_model_state{model="m",state="LOADING",version="1"}'] == 0
    assert values['shoal_model_loads{model="m"}'] == 1


def test_metrics_app_routes() -> None:
    dataplane = FakeDataPlane(models=[make_model("m")], stats_models=[stats()])
    with TestClient(create_metrics_app(dataplane)) as client:
        for path in ("/metrics", "/metrics/"):
            response = client.get(path)
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/plain; charset=utf-8"
            assert re.search(r'^nv_inference_count\{model="m",version="1"\} 12$',
                             response.text, re.MULTILINE)
        wrong_method = client.post("/metrics")
        assert (wrong_method.status_code, wrong_method.json()) == (
            405, {"error": "Method Not Allowed"})
        for path in ("/", "/metricsx", "/v2/health/ready"):
            other = client.get(path)
            assert other.status_code == 404, path
            assert other.headers["content-type"] == "application/json"
            assert other.json() == {"error": "Not Found"}


class _CustomDataPlane(FakeDataPlane):
    custom: list[CustomMetricFamily] = []

    async def stats(self, model: str, version: int, custom_metrics: bool = False
                    ) -> StatsReply:
        reply = await super().stats(model, version)
        return StatsReply(reply.query_id, reply.models, reply.error, self.custom)


def test_custom_metrics_reach_the_metrics_app() -> None:
    dataplane = _CustomDataPlane(models=[make_model("m")])
    dataplane.custom = [CustomMetricFamily("requests_seen", "Requests a model saw",
                                           CustomMetricKind.COUNTER,
                                           [CustomMetric([("kind", "a")], 3.0)])]
    with TestClient(create_metrics_app(dataplane)) as client:
        text = client.get("/metrics").text
    assert "# TYPE requests_seen counter" in text
    assert 'requests_seen{kind="a"} 3' in text.splitlines()
