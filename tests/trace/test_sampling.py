"""The tracer: sampling by rate and count, Triton's settings semantics (per-model fields over the
global ones, clearing), and when batches of traces are written (log_frequency, count)."""

from __future__ import annotations

import json
import pathlib

import pytest

from shoal.errors import ShoalError
from shoal.trace.config import TraceConfig, TraceLevel, TraceMode
from shoal.trace.record import REQUEST_END, REQUEST_START
from shoal.trace.sampling import Tracer
from shoal.trace.values import parse_http_change


def tracer(tmp_path: pathlib.Path, **fields: object) -> Tracer:
    values: dict[str, object] = {"level": TraceLevel.TIMESTAMPS, "rate": 1,
                                 "file": str(tmp_path / "trace.json")}
    values.update(fields)
    return Tracer(TraceConfig(**values))  # type: ignore[arg-type]


def run(t: Tracer, model: str, n: int) -> list[int]:
    """n requests of ``model``: the ids of those traced (each finished at once)."""
    ids = []
    for _ in range(n):
        trace = t.sample(model)
        if trace is not None:
            trace.stamp(REQUEST_START)
            trace.stamp(REQUEST_END)
            t.finish(trace)
            ids.append(trace.trace_id)
    return ids


def read(path: pathlib.Path) -> list[int]:
    """The trace ids in a trace file, one per trace."""
    return [r["id"] for r in json.loads(path.read_text()) if "model_name" in r]


def test_every_rate_th_request_is_traced(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path, rate=3)
    assert run(t, "m", 9) == [1, 2, 3]
    assert t.sample("m") is None and t.sample("m") is None
    assert t.sample("m") is not None


def test_off_samples_nothing_and_keeps_no_count(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path, level=TraceLevel.OFF)
    assert run(t, "m", 5) == []
    assert t.settings()["trace_level"] == ["OFF"]


def test_count_limits_traces_and_reads_as_what_is_left(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path, count=2)
    assert len(run(t, "m", 5)) == 2
    assert t.settings()["trace_count"] == "0"
    t.close()
    # count used up: the batch went to <file>.0 as soon as its last trace finished (Triton)
    assert read(tmp_path / "trace.json.0") == [1, 2]
    assert not (tmp_path / "trace.json").exists()


def test_log_frequency_writes_indexed_batches(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path, log_frequency=2)
    run(t, "m", 5)
    t.close()
    assert read(tmp_path / "trace.json.0") == [1, 2]
    assert read(tmp_path / "trace.json.1") == [3, 4]
    assert read(tmp_path / "trace.json.2") == [5]  # the rest, at close


def test_log_frequency_zero_writes_one_file_at_close(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path)
    run(t, "m", 3)
    t.update("", parse_http_change({"trace_rate": "1"}))  # replaced: its batch is appended
    run(t, "m", 2)
    assert not (tmp_path / "trace.json.0").exists()
    t.close()
    assert read(tmp_path / "trace.json") == [1, 2, 3, 4, 5]


def test_a_replaced_scope_writes_when_its_last_trace_finishes(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path)
    open_trace = t.sample("m")
    assert open_trace is not None
    t.update("", parse_http_change({"trace_level": ["OFF"]}))
    t.finish(open_trace)
    t.close()
    assert read(tmp_path / "trace.json") == [1]


def test_model_settings_mirror_the_global_ones(tmp_path: pathlib.Path) -> None:
    # Triton's L0_trace test_http_update_settings / test_http_clear_settings, step by step
    t = tracer(tmp_path)
    initial = {"trace_file": str(tmp_path / "trace.json"), "trace_level": ["TIMESTAMPS"],
               "trace_rate": "1", "trace_count": "-1", "log_frequency": "0",
               "trace_mode": "triton"}
    assert t.settings() == initial and t.settings("simple") == initial
    t.update("", parse_http_change({"trace_level": ["TIMESTAMPS", "TENSORS"]}))
    assert t.settings("simple")["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    t.update("", parse_http_change({"trace_level": None}))

    t.update("simple", parse_http_change({"trace_rate": "12", "log_frequency": "34"}))
    t.update("", parse_http_change({"trace_rate": "56", "trace_count": "78",
                                    "trace_level": ["OFF"]}))
    cleared = t.update("", parse_http_change({"trace_rate": None, "trace_count": None}))
    assert cleared == {**initial, "trace_level": ["OFF"]}
    assert t.settings("simple") == {**initial, "trace_level": ["OFF"], "trace_rate": "12",
                                    "log_frequency": "34"}
    model = t.update("simple", parse_http_change({"trace_rate": None, "trace_level": None}))
    assert model == {**initial, "trace_level": ["OFF"], "log_frequency": "34"}
    assert t.settings() == {**initial, "trace_level": ["OFF"]}


def test_a_model_with_no_field_of_its_own_uses_the_global_scope(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path, rate=2)
    t.update("a", parse_http_change({"trace_rate": "1"}))
    assert run(t, "a", 2) == [1, 2] and run(t, "b", 2) == [3]
    t.update("a", parse_http_change({"trace_rate": None}))
    assert t.settings("a")["trace_rate"] == "2"
    assert run(t, "a", 2) == [4]  # sampled by the global scope again (its counter)


def test_model_override_can_turn_tracing_on_for_one_model(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path, level=TraceLevel.OFF)
    assert run(t, "a", 2) == []
    t.update("a", parse_http_change({"trace_level": ["TIMESTAMPS"]}))
    assert len(run(t, "a", 2)) == 2 and run(t, "b", 2) == []


def test_invalid_update_changes_nothing(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path)
    with pytest.raises(ShoalError, match="sample rate must be non-zero"):
        t.update("", parse_http_change({"trace_rate": "0"}))
    assert t.settings()["trace_rate"] == "1"
    t.update("", parse_http_change({"trace_rate": "0", "trace_level": ["OFF"]}))  # allowed


def test_no_file_means_no_tracing_in_triton_mode(tmp_path: pathlib.Path) -> None:
    t = Tracer(TraceConfig(level=TraceLevel.OFF))
    with pytest.raises(ShoalError, match="trace file name is not given"):
        t.update("", parse_http_change({"trace_level": ["TIMESTAMPS"]}))


def test_tensors_only_in_triton_mode(tmp_path: pathlib.Path) -> None:
    t = tracer(tmp_path, level=TraceLevel.TIMESTAMPS | TraceLevel.TENSORS)
    trace = t.sample("m")
    assert trace is not None and trace.tensors
    t.finish(trace)
    otel = Tracer(TraceConfig(level=TraceLevel.TENSORS, mode=TraceMode.OPENTELEMETRY,
                              rate=1))
    try:
        trace = otel.sample("m")
        assert trace is not None and not trace.tensors
    finally:
        otel.close(timeout_s=2)


def test_frontends_take_distinct_ids(tmp_path: pathlib.Path) -> None:
    config = TraceConfig(level=TraceLevel.TIMESTAMPS, rate=1, file=str(tmp_path / "t"))
    first, second = Tracer(config, 0, 2), Tracer(config, 1, 2)
    assert run(first, "m", 2) == [1, 3] and run(second, "m", 2) == [2, 4]
    first.close()
    second.close()
    assert read(tmp_path / "t") == [1, 3] and read(tmp_path / "t.fe1") == [2, 4]
