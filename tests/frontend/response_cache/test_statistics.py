"""Cache figures in the broker's statistics (Triton's counting rules) and the nv_cache_*
metric families."""

from __future__ import annotations

import msgspec

from shoal.broker.stats import ModelVersionStats
from shoal.frontend.metrics import render_prometheus
from shoal.frontend.metrics.config import MetricsConfig
from shoal.messages import Duration, RepositorySnapshot
from tests.frontend.http.fakes import make_model
from tests.frontend.test_metrics import samples, stats


def test_hits_count_as_successes_without_inferences_and_misses_only_as_misses() -> None:
    version = ModelVersionStats("m", 1)
    version.record_cache(hits=2, hit_ns=3000, misses=1, miss_ns=500)
    snapshot = version.snapshot(pending=0)
    assert snapshot.cache_hit == Duration(2, 3000)
    assert snapshot.cache_miss == Duration(1, 500)
    assert snapshot.success == Duration(2, 3000)  # "success ... includes cache hits"
    assert snapshot.queue == Duration(2, 0)  # "queue ... includes cache hits"
    assert (snapshot.inference_count, snapshot.execution_count) == (0, 0)
    assert snapshot.compute_infer == Duration(0, 0)
    assert snapshot.last_inference_ms > 0


def test_cache_metrics_only_for_models_with_the_cache_on_a_server_with_one() -> None:
    cached = stats("cached", cache_hit=Duration(3, 7_000), cache_miss=Duration(2, 4_000))
    plain = stats("plain")
    info = msgspec.structs.replace(make_model("cached"), response_cache=True)
    snapshot = RepositorySnapshot([info, make_model("plain")], True)
    values = samples(render_prometheus([cached, plain], snapshot,
                                       config=MetricsConfig(response_cache=True)))
    labels = '{model="cached",version="1"}'
    assert values[f"nv_cache_num_hits_per_model{labels}"] == 3
    assert values[f"nv_cache_num_misses_per_model{labels}"] == 2
    assert values[f"nv_cache_hit_duration_per_model{labels}"] == 7
    assert values[f"nv_cache_miss_duration_per_model{labels}"] == 4
    assert not any('model="plain"' in key for key in values if key.startswith("nv_cache"))
    without = render_prometheus([cached], snapshot, config=MetricsConfig())
    assert "nv_cache_" not in without
