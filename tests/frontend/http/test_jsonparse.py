"""JSON parsing limits: nesting depth 100 checked on raw bytes, NaN literals, object-only."""

from __future__ import annotations

import json

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.http.jsonparse import json_depth_exceeds, parse_json, parse_json_object


def nested(depth: int, leaf: str = "1") -> bytes:
    return ("[" * depth + leaf + "]" * depth).encode()


def test_depth_at_the_limit_is_fine() -> None:
    assert not json_depth_exceeds(nested(100))
    assert parse_json(nested(50)) is not None


def test_depth_over_the_limit_is_refused_with_triton_message() -> None:
    assert json_depth_exceeds(nested(101))
    with pytest.raises(ShoalError) as info:
        parse_json(nested(120))
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in info.value.message


def test_very_deep_json_is_refused_without_recursing() -> None:
    with pytest.raises(ShoalError):
        parse_json(nested(250_000))


def test_objects_count_towards_depth() -> None:
    text = ('{"a":' * 101 + "1" + "}" * 101).encode()
    assert json_depth_exceeds(text)


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": "[" * 500, "t": ["{" * 300]}).encode()
    assert not json_depth_exceeds(text)


def test_escaped_quotes_do_not_end_a_string() -> None:
    text = json.dumps({"s": 'a\\"' + "[" * 500 + '"'}).encode()
    assert not json_depth_exceeds(text)
    assert json_depth_exceeds(json.dumps({"s": 'x\\"y', "v": json.loads(nested(101))}).encode())


def test_many_shallow_brackets_are_not_deep() -> None:
    text = json.dumps([[i] for i in range(5000)]).encode()
    assert not json_depth_exceeds(text)


@pytest.mark.parametrize("padding", [0, 5000])  # short texts count brackets, long ones find them
def test_depth_limit_is_the_same_for_short_and_long_texts(padding: int) -> None:
    def padded(depth: int) -> bytes:
        return ("[" * depth + " " * padding + "1" + "]" * depth).encode()

    assert not json_depth_exceeds(padded(100))
    assert json_depth_exceeds(padded(101))
    objects = ('{"a":' * 101 + " " * padding + "1" + "}" * 101).encode()
    assert json_depth_exceeds(objects)


def test_depth_is_tracked_across_scan_chunks() -> None:
    padding = " " * (1 << 20)
    text = ("[" * 60 + padding + "[" * 60 + "1" + "]" * 120).encode()
    assert json_depth_exceeds(text)


def test_nan_and_infinity_literals_parse() -> None:
    value = parse_json(b"[NaN, Infinity, -Infinity, 1]")
    assert value[1] == float("inf") and value[2] == float("-inf") and value[3] == 1


def test_parse_errors_name_what_was_parsed() -> None:
    with pytest.raises(ShoalError) as info:
        parse_json(b"{", "logging request")
    assert "failed to parse the logging request" in info.value.message


def test_object_is_required_where_one_is_expected() -> None:
    with pytest.raises(ShoalError) as info:
        parse_json_object(b"[1]")
    assert "expected a JSON object" in info.value.message


@pytest.mark.parametrize("body", [
    b'{"id": "\\ud800", "inputs": []}',  # orjson refuses it; the fallback parser did not
    b'{"inputs": [], "parameters": {"k": "a\\udfff"}, "x": NaN}',
    b'{"\\udc00": 1, "inputs": [Infinity]}',
])
def test_lone_surrogate_escapes_are_refused_by_the_fallback_parser_too(body: bytes) -> None:
    """Found by fuzzing: such a string has no UTF-8 form, and encoding the request for the
    broker failed outside any handler (the other requests of that send never left)."""
    with pytest.raises(ShoalError) as info:
        parse_json_object(body)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "surrogate" in info.value.message


def test_escaped_backslash_before_u_and_surrogate_pairs_still_parse() -> None:
    assert parse_json(b'["\\\\ud800", NaN]')[0] == "\\ud800"
    assert parse_json(b'["\\ud83d\\ude00", NaN]')[0] == "\U0001F600"
