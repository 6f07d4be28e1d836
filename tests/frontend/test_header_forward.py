"""Which headers ``--*-header-forward-pattern`` forwards, and how (no server needed)."""

from __future__ import annotations

import pytest

from shoal.frontend.core.header_forward import compile_pattern, forwarded_parameters, with_forwarded

HEADERS = [("my_header_1", "a"), ("MY_HEADER_2", "b"), ("other", "c"), ("x-my_header", "d")]


def test_no_pattern_forwards_nothing() -> None:
    assert compile_pattern("") is None
    assert forwarded_parameters(HEADERS, None) == {}


def test_matching_is_case_insensitive_and_partial_by_default() -> None:
    forwarded = forwarded_parameters(HEADERS, compile_pattern("MY_HEADER.*"))
    assert forwarded == {"my_header_1": "a", "MY_HEADER_2": "b", "x-my_header": "d"}


def test_a_leading_minus_i_group_makes_it_case_sensitive() -> None:
    assert forwarded_parameters(HEADERS, compile_pattern("(?-i)MY_HEADER.*")) == \
        {"MY_HEADER_2": "b"}
    assert forwarded_parameters(HEADERS, compile_pattern("(?-i)^my_header")) == \
        {"my_header_1": "a"}


def test_reserved_names_and_binary_metadata_are_never_forwarded() -> None:
    headers: list[tuple[str, str | bytes]] = [
        ("triton_x", "1"), ("shoal_y", "2"), ("sequence_id", "3"), ("priority", "4"),
        ("trace-bin", b"\x00"), ("kept", "5")]
    assert forwarded_parameters(headers, compile_pattern(".*")) == {"kept": "5"}


def test_the_first_of_a_repeated_name_wins() -> None:
    assert forwarded_parameters([("h", "1"), ("h", "2")], compile_pattern("h")) == {"h": "1"}


def test_the_request_s_own_parameters_keep_their_values() -> None:
    parameters: dict[str, str | int | bool | float] = {"h": 7}
    with_forwarded(parameters, {"h": "header", "g": "header"})
    assert parameters == {"h": 7, "g": "header"}


def test_a_pattern_that_does_not_compile_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"invalid header forward pattern 'a\(b'"):
        compile_pattern("a(b")
