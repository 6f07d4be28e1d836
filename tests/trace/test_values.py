"""The settings API's values: parsing HTTP / gRPC updates, the answer document."""

from __future__ import annotations

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.trace.config import OtelOptions, TraceConfig, TraceLevel, TraceMode
from shoal.trace.values import (
    SettingsChange,
    TraceValues,
    check_valid,
    parse_grpc_change,
    parse_http_change,
    settings_document,
)


def test_http_update_sets_and_clears() -> None:
    change = parse_http_change({"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "5",
                                "trace_count": "-1", "log_frequency": None, "unknown": 3})
    assert change.sets == {"trace_level": TraceLevel.TIMESTAMPS | TraceLevel.TENSORS,
                           "trace_rate": 5, "trace_count": -1}
    assert change.clears == {"log_frequency"}


def test_grpc_update_empty_list_clears() -> None:
    change = parse_grpc_change({"trace_level": ["OFF"], "trace_rate": [], "log_frequency": ["2"]})
    assert change.sets == {"trace_level": TraceLevel.OFF, "log_frequency": 2}
    assert change.clears == {"trace_rate"}


@pytest.mark.parametrize("document, message", [
    ({"trace_file": "/etc/passwd"}, "'trace_file' is set only at start-up"),
    ({"trace_file": None}, "'trace_file' is set only at start-up"),
    ({"trace_rate": 5}, "Unable to parse 'trace_rate': expected a string"),
    ({"trace_rate": "ten"}, "Unable to parse 'trace_rate', got: ten"),
    ({"trace_rate": "10abc"}, "Unable to parse 'trace_rate', got: 10abc"),
    ({"trace_rate": "-1"}, "out of range [ 0, 4294967295 ]"),
    ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1"),
    ({"trace_count": "2147483648"}, "'trace_count', value is out of range"),
    ({"log_frequency": "x"}, "Unable to parse 'log_frequency'"),
    ({"trace_level": "TIMESTAMPS"}, "Unable to parse 'trace_level': expected an array"),
    ({"trace_level": ["LOUD"]}, "unknown level 'LOUD'"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF'"),
])
def test_bad_http_values_name_the_field(document: dict[str, object], message: str) -> None:
    with pytest.raises(ShoalError) as caught:
        parse_http_change(document)
    assert caught.value.code is ErrorCode.INVALID_ARG and message in caught.value.message


def test_grpc_refuses_trace_file_and_several_values() -> None:
    with pytest.raises(ShoalError, match="trace_file"):
        parse_grpc_change({"trace_file": ["x"]})
    with pytest.raises(ShoalError, match="expect only 1 value for 'trace_count'"):
        parse_grpc_change({"trace_count": ["1", "2"]})


def test_document_in_each_mode() -> None:
    values = TraceValues(TraceLevel.TIMESTAMPS, 10, -1, 0)
    triton = TraceConfig(file="/t.json")
    assert settings_document(values, triton, "/t.json") == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "10", "trace_count": "-1",
        "log_frequency": "0", "trace_file": "/t.json", "trace_mode": "triton"}
    otel = TraceConfig(mode=TraceMode.OPENTELEMETRY, otel=OtelOptions(
        url="http://c/v1", given=(("url", "http://c/v1"), ("resource", "a=b"))))
    assert settings_document(TraceValues(TraceLevel.OFF, 1, 3, 0), otel, "") == {
        "trace_level": ["OFF"], "trace_rate": "1", "trace_count": "3",
        "trace_mode": "opentelemetry", "url": "http://c/v1", "resource": ["a=b"]}


def test_a_setting_that_cannot_trace_is_refused_unless_off() -> None:
    with pytest.raises(ShoalError, match="sample rate must be non-zero"):
        check_valid(TraceValues(TraceLevel.TIMESTAMPS, 0, -1, 0), TraceConfig(file="/t"))
    with pytest.raises(ShoalError, match="trace file name is not given"):
        check_valid(TraceValues(TraceLevel.TIMESTAMPS, 1, -1, 0), TraceConfig())
    check_valid(TraceValues(TraceLevel.OFF, 0, -1, 0), TraceConfig())
    assert not SettingsChange()
