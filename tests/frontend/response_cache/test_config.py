"""--cache-config / --response-cache-byte-size -> the cache's byte size, Triton's refusals."""

from __future__ import annotations

import pytest

from shoal.frontend.response_cache.config import (
    CacheConfigError,
    cache_byte_size,
    parse_cache_setting,
)
from shoal.server.cli import build_parser, settings_from_args


def _settings(*flags: str) -> int:
    args = build_parser().parse_args(["serve", "--model-repository=/r", *flags])
    return settings_from_args(args).response_cache_bytes


def test_local_size_in_both_spellings_and_the_old_flag() -> None:
    assert _settings("--cache-config", "local,size=1048576") == 1048576
    assert _settings("--cache-config=local,size=8192") == 8192
    assert _settings("--response-cache-byte-size=4096") == 4096
    assert _settings() == 0


def test_a_setting_needs_cache_key_and_value() -> None:
    assert parse_cache_setting("local,size=10") == ("local", "size", "10")
    for bad in ("local", "local,size", "size=10", ",size=10"):
        with pytest.raises(CacheConfigError, match="--cache-config expects"):
            parse_cache_setting(bad)


def test_both_flag_styles_together_are_incompatible() -> None:
    with pytest.raises(CacheConfigError, match="incompatible flags"):
        cache_byte_size([("local", "size", "10")], 10)


def test_two_cache_implementations_are_refused() -> None:
    with pytest.raises(CacheConfigError, match="multiple cache configurations"):
        cache_byte_size([("local", "size", "10"), ("redis", "host", "x")], None)


def test_only_the_local_cache_exists() -> None:
    with pytest.raises(CacheConfigError, match="'redis' is not available"):
        cache_byte_size([("redis", "host", "localhost")], None)


@pytest.mark.parametrize(("setting", "message"), [
    (("local", "capacity", "10"), "unknown setting 'capacity'"),
    (("local", "size", "ten"), "expects a number of bytes"),
    (("local", "size", "-5"), "expects a number of bytes"),
])
def test_bad_local_settings_name_the_problem(setting: tuple[str, str, str], message: str) -> None:
    with pytest.raises(CacheConfigError, match=message):
        cache_byte_size([setting], None)


def test_the_cli_refuses_bad_cache_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from shoal.server.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--model-repository=/r", "--cache-config=local,size=10",
              "--response-cache-byte-size=10"])
    assert exit_info.value.code == 2
    assert "incompatible flags" in capsys.readouterr().err
