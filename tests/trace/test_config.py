"""--trace-config parsing (tritonserver's syntax, shoal's stricter checks)."""

from __future__ import annotations

import pathlib

import pytest

from shoal.trace.config import (
    TraceConfig,
    TraceLevel,
    TraceMode,
    frontend_trace_file,
    parse_trace_config,
    split_trace_config,
)


def parse(*flags: str) -> TraceConfig:
    return parse_trace_config([split_trace_config(f) for f in flags])


def test_defaults_are_tritons() -> None:
    config = parse()
    assert (config.level, config.rate, config.count, config.mode, config.file,
            config.log_frequency) == (TraceLevel.OFF, 1000, -1, TraceMode.TRITON, "", 0)
    assert config.otel.url == "http://localhost:4318/v1/traces"
    assert (config.otel.bsp_max_queue_size, config.otel.bsp_schedule_delay_ms,
            config.otel.bsp_max_export_batch_size) == (2048, 5000, 512)


def test_split_follows_tritons_rule() -> None:
    assert split_trace_config("rate=100") == ("", "rate", "100")
    assert split_trace_config("triton,file=/tmp/a,b=c") == ("triton", "file", "/tmp/a,b=c")
    assert split_trace_config("OpenTelemetry,resource=service.name=x") == (
        "opentelemetry", "resource", "service.name=x")
    for bad in ("rate", "rate=", "=1", ",rate=1", "zipkin,url=x"):
        with pytest.raises(ValueError):
            split_trace_config(bad)


def test_triton_mode_flags(tmp_path: pathlib.Path) -> None:
    config = parse(f"triton,file={tmp_path}/t.json", "triton,log-frequency=50", "rate=100",
                   "level=TIMESTAMPS", "level=TENSORS", "count=100")
    assert config.level == TraceLevel.TIMESTAMPS | TraceLevel.TENSORS
    assert (config.rate, config.count, config.log_frequency) == (100, 100, 50)
    assert config.file == f"{tmp_path}/t.json"
    assert parse(f"triton,file={tmp_path}/t", "triton,log_frequency=3").log_frequency == 3


def test_level_off_anywhere_turns_tracing_off(tmp_path: pathlib.Path) -> None:
    assert parse(f"triton,file={tmp_path}/t", "level=TIMESTAMPS", "level=OFF").level == 0
    assert parse(f"triton,file={tmp_path}/t", "level=max").level == TraceLevel.TIMESTAMPS


def test_file_is_made_absolute(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse("triton,file=t.json").file == str(tmp_path / "t.json")


@pytest.mark.parametrize("flags, message", [
    (("level=TIMESTAMPS",), "needs a trace file"),
    (("level=loud",), "invalid value for trace level option"),
    (("rate=-1",), "rate: expected an integer"),
    (("rate=4294967296",), "rate: expected an integer"),
    (("count=-2",), "count: expected an integer"),
    (("mode=zipkin",), "invalid value for trace mode option"),
    (("colour=red",), "unknown setting 'colour'"),
    (("triton,url=x",), "triton,url: unknown setting"),
    (("opentelemetry,file=x",), "opentelemetry,file: unknown setting"),
    (("opentelemetry,resource=novalue",), "resource=<key>=<value>"),
    (("opentelemetry,bsp_max_queue_size=10", "opentelemetry,bsp_max_export_batch_size=20"),
     "at most bsp_max_queue_size"),
    (("triton,file=/no/such/dir/t.json",), "does not exist or is not writable"),
])
def test_bad_flags_are_refused(flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(*flags)


def test_opentelemetry_options() -> None:
    config = parse("mode=opentelemetry", "level=TIMESTAMPS", "opentelemetry,url=http://c:1/v1",
                   "opentelemetry,resource=service.name=shoal",
                   "opentelemetry,resource=deployment=test",
                   "opentelemetry,bsp_schedule_delay=100")
    assert config.mode is TraceMode.OPENTELEMETRY and config.file == ""
    assert config.otel.url == "http://c:1/v1" and config.otel.bsp_schedule_delay_ms == 100
    assert config.otel.resource_attributes() == {"service.name": "shoal", "deployment": "test"}


def test_each_frontend_writes_its_own_file(tmp_path: pathlib.Path) -> None:
    config = parse(f"triton,file={tmp_path}/t.json")
    assert frontend_trace_file(config, 0) == f"{tmp_path}/t.json"
    assert frontend_trace_file(config, 2) == f"{tmp_path}/t.json.fe2"


def test_from_triples_takes_settings_json_lists(tmp_path: pathlib.Path) -> None:
    config = TraceConfig.from_triples([["", "rate", "7"], ["triton", "file", f"{tmp_path}/x"]])
    assert config.rate == 7 and config.file == f"{tmp_path}/x"
