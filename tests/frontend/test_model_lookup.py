"""model_lookup: Triton's version-string reading and model resolution codes and texts (as the
real tritonserver 2.51 answers them)."""

from __future__ import annotations

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core import model_lookup
from shoal.messages import ModelVersionInfo, ModelVersionState
from tests.frontend.http.fakes import make_model


def _ready(info: ModelVersionInfo) -> bool:
    return info.state is ModelVersionState.READY


@pytest.mark.parametrize("text,version", [
    (None, None), ("", None), ("1", 1), ("01", 1), (" 1", 1), ("\t+7", 7), ("1abc", 1),
    ("0", 0), ("9223372036854775807", (1 << 63) - 1),
])
def test_version_strings_read_as_stol_reads_them(text: str | None, version: int | None) -> None:
    assert model_lookup.parse_version(text) == version


@pytest.mark.parametrize("text", ["abc", " ", "+", "-", "x1", "9223372036854775808",
                                  "99999999999999999999", "-9223372036854775809"])
def test_unreadable_version_strings_are_tritons_invalid_arg(text: str) -> None:
    with pytest.raises(ShoalError) as caught:
        model_lookup.parse_version(text)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        f"failed to get model version from specified version string '{text}' (details: stol), "
        "version should be an integral value > 0")


def test_a_negative_version_is_tritons_invalid_arg() -> None:
    with pytest.raises(ShoalError) as caught:
        model_lookup.parse_version("-1")
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == ("invalid model version specified '-1' , version should be "
                                    "an integral value > 0")


def _error(versions: dict[int, ModelVersionInfo] | None, version: str | None
           ) -> tuple[ErrorCode, str]:
    with pytest.raises(ShoalError) as caught:
        model_lookup.resolve(versions, "m", version, _ready)
    return caught.value.code, caught.value.message


def test_a_name_without_versions_is_not_found_with_or_without_a_version() -> None:
    for versions in (None, {}):
        for version in (None, "1"):
            assert _error(versions, version) == (
                ErrorCode.NOT_FOUND, "Request for unknown model: 'm' is not found")


def test_a_model_with_nothing_ready_has_no_available_versions() -> None:
    failed = {1: make_model("m", state=ModelVersionState.UNAVAILABLE)}
    assert _error(failed, None) == (
        ErrorCode.NOT_FOUND, "Request for unknown model: 'm' has no available versions")
    assert _error(failed, "1") == (
        ErrorCode.UNAVAILABLE, "Request for unknown model: 'm' version 1 is not at ready state")
    assert _error(failed, "2") == (
        ErrorCode.NOT_FOUND, "Request for unknown model: 'm' version 2 is not found")


def test_the_version_is_read_before_the_name_is_looked_up() -> None:
    code, message = _error(None, "abc")
    assert code is ErrorCode.INVALID_ARG and message.startswith("failed to get model version")


def test_the_highest_ready_version_answers_a_request_without_one() -> None:
    versions = {1: make_model("m", version=1), 2: make_model("m", version=2),
                3: make_model("m", version=3, state=ModelVersionState.LOADING)}
    assert model_lookup.resolve(versions, "m", None, _ready).version == 2
    assert model_lookup.resolve(versions, "m", " 1", _ready).version == 1


def test_readiness() -> None:
    versions = {1: make_model("m", version=1),
                2: make_model("m", version=2, state=ModelVersionState.UNAVAILABLE)}
    assert model_lookup.is_ready(versions, None, _ready)
    assert model_lookup.is_ready(versions, "1", _ready)
    assert not model_lookup.is_ready(versions, "2", _ready)
    assert not model_lookup.is_ready(None, None, _ready)
    with pytest.raises(ShoalError):
        model_lookup.is_ready(versions, "abc", _ready)


def test_statistics_texts() -> None:
    with pytest.raises(ShoalError) as caught:
        model_lookup.check_stats_target([], "m", -1)
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.INVALID_ARG, "requested model 'm' is not available")
    with pytest.raises(ShoalError) as caught:
        model_lookup.check_stats_target([1], "m", 2)
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.INVALID_ARG, "requested model version is not available for model 'm'")
    model_lookup.check_stats_target([1], "m", 1)
    model_lookup.check_stats_target([1], "m", -1)
    assert model_lookup.stats_version("") == -1
    assert model_lookup.stats_version("3") == 3


@pytest.mark.parametrize("text", ["1" * 5000, "+" + "9" * 4301, "-" + "1" * 4400,
                                  " " + "12345678901234567890" + "x"])
def test_a_version_string_of_thousands_of_digits_is_the_stol_error(text: str) -> None:
    """Not Python's int() limit of 4300 digits (a ValueError, an INTERNAL answer)."""
    with pytest.raises(ShoalError) as caught:
        model_lookup.parse_version(text)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        f"failed to get model version from specified version string '{text}' (details: stol), "
        "version should be an integral value > 0")


@pytest.mark.parametrize("text,version", [
    ("0" * 5000 + "7", 7), ("-" + "0" * 5000, 0), ("0" * 5000 + "9223372036854775807",
                                                     (1 << 63) - 1),
])
def test_leading_zeros_of_any_length_are_read_as_stol_reads_them(text: str,
                                                                 version: int) -> None:
    assert model_lookup.parse_version(text) == version


@pytest.mark.parametrize("text,version", [
    ("0", 0), ("00", 0), ("0" * 18, 0), ("007", 7), ("999999999999999999", 10**18 - 1),
    ("0000000000000000001", 1), ("1_0", 1), ("\u0661", None), ("\u00b2", None),
])
def test_strings_of_digits_only_read_as_stol_reads_them(text: str, version: int | None) -> None:
    """(Up to 18 ASCII digits take a shortcut; non-ASCII digits are none to stol.)"""
    if version is None:
        with pytest.raises(ShoalError):
            model_lookup.parse_version(text)
    else:
        assert model_lookup.parse_version(text) == version


def test_resolve_number_is_resolve_of_a_version_already_read() -> None:
    versions = {1: make_model("m", version=1), 2: make_model("m", version=2)}
    assert model_lookup.resolve_number(versions, "m", 1, _ready).version == 1
    assert model_lookup.resolve_number(versions, "m", None, _ready).version == 2
    with pytest.raises(ShoalError) as caught:
        model_lookup.resolve_number(versions, "m", 3, _ready)
    assert caught.value.message == "Request for unknown model: 'm' version 3 is not found"
