"""Restricted-API flags: --http-restricted-api / --grpc-restricted-protocol parse as Triton's do
(categories, one group per category, <categories>:<key>=<value>), and bad values stop
``shoal serve`` with exit 2 and a message naming the flag."""

from __future__ import annotations

import pytest

from shoal.frontend.restricted import (
    GRPC_CATEGORIES,
    GRPC_HEADER_PREFIX,
    ApiCategory,
    RestrictedApis,
    RestrictionError,
    grpc_refusal_message,
    http_refusal_message,
    parse_restrictions,
    value_matches,
)
from shoal.server.cli import build_parser, main, settings_from_args


def http(*texts: str) -> list[tuple[str, str, str]]:
    return parse_restrictions(list(texts), flag="--http-restricted-api", grpc=False)


def grpc(*texts: str) -> list[tuple[str, str, str]]:
    return parse_restrictions(list(texts), flag="--grpc-restricted-protocol", grpc=True)


def test_categories_are_tritons_nine_plus_dashboard() -> None:
    assert [c.value for c in ApiCategory] == [
        "health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
        "statistics", "trace", "logging", "dashboard"]
    assert ApiCategory.DASHBOARD not in GRPC_CATEGORIES


def test_one_group_restricts_each_of_its_categories_with_its_header() -> None:
    assert http("model-repository,shared-memory:admin-key=s3cret") == [
        ("model-repository", "admin-key", "s3cret"),
        ("shared-memory", "admin-key", "s3cret")]


def test_groups_are_repeatable_with_their_own_headers() -> None:
    assert http("inference:infer-key=a", "health,metadata:X-Probe=b") == [
        ("inference", "infer-key", "a"), ("health", "X-Probe", "b"), ("metadata", "X-Probe", "b")]


def test_value_is_everything_after_the_first_equals_sign() -> None:
    # Triton's split: categories up to the first ':', key up to the next '=', value the rest
    assert http("trace:k=a=b:c") == [("trace", "k", "a=b:c")]


def test_grpc_key_gets_tritons_prefix_and_is_lowercased() -> None:
    assert grpc("inference:Infer-Key=v") == [
        ("inference", GRPC_HEADER_PREFIX + "infer-key", "v")]
    assert GRPC_HEADER_PREFIX == "triton-grpc-protocol-"


def test_dashboard_is_an_http_category() -> None:
    assert http("dashboard:k=v") == [("dashboard", "k", "v")]
    with pytest.raises(RestrictionError,
                       match=r"unknown restricted protocol 'dashboard'.*HTTP only"):
        grpc("dashboard:k=v")


@pytest.mark.parametrize("texts,message", [
    (["model-reposit,health:k1=v1"], "unknown restricted api 'model-reposit'"),
    (["model-repository,health:k1=v1", "metadata,health:k2=v2"],
     "restricted api 'health' can not be specified in multiple config groups"),
    (["inference,inference:k=v"],
     "restricted api 'inference' can not be specified in multiple config groups"),
    (["health"], "option format is"),
    (["health:k"], "option format is"),
    (["health:=v"], "option format is"),
    (["health:k="], "option format is"),
    ([":k=v"], "option format is"),
    (["health,,metadata:k=v"], "option format is"),
    (["health:bad key=v"], "'bad key' .* is not an HTTP header name"),
    (["health:k= v"], "must be visible ASCII"),
    (["health:k=caf\u00e9"], "must be visible ASCII"),
])
def test_bad_http_values_are_refused_naming_the_problem(texts: list[str], message: str) -> None:
    with pytest.raises(RestrictionError, match=message) as caught:
        http(*texts)
    assert str(caught.value).startswith("--http-restricted-api")


def test_bad_grpc_values_name_the_protocol_flag() -> None:
    with pytest.raises(RestrictionError, match=r"^--grpc-restricted-protocol: restricted "
                       r"protocol 'health' can not be specified in multiple config groups"):
        grpc("health:a=b", "health:c=d")
    with pytest.raises(RestrictionError, match="not ending in -bin"):
        grpc("health:key-bin=v")
    with pytest.raises(RestrictionError, match="is not a gRPC metadata key"):
        grpc("health:a/b=v")


def test_flags_reach_settings() -> None:
    args = build_parser().parse_args([
        "serve", "--model-repository=/m", "--http-restricted-api=model-repository:admin=x",
        "--http-restricted-api", "dashboard,logging:ops=y",
        "--grpc-restricted-protocol=inference:infer=z"])
    settings = settings_from_args(args)
    assert settings.http.restricted_apis == [
        ("model-repository", "admin", "x"), ("dashboard", "ops", "y"), ("logging", "ops", "y")]
    assert settings.grpc.restricted_protocols == [
        ("inference", "triton-grpc-protocol-infer", "z")]
    assert type(settings).from_json(settings.to_json()) == settings


def test_no_flag_restricts_nothing() -> None:
    settings = settings_from_args(build_parser().parse_args(["serve", "--model-repository=/m"]))
    assert settings.http.restricted_apis == [] and settings.grpc.restricted_protocols == []
    assert not RestrictedApis(settings.http.restricted_apis)


@pytest.mark.parametrize("flag,value,message", [
    ("--http-restricted-api", "healthz:k=v", "unknown restricted api 'healthz'"),
    ("--grpc-restricted-protocol", "health:k", "option format is"),
])
def test_bad_flag_exits_2_before_starting_anything(
        capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--model-repository=/nonexistent", f"{flag}={value}"])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_category_repeated_across_flags_exits_2_naming_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--model-repository=/nonexistent",
              "--http-restricted-api=model-repository,health:k1=v1",
              "--http-restricted-api=metadata,health:k2=v2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "restricted api 'health' can not be specified in multiple config groups" in err
    assert "'model-repository,health:k1=v1' and 'metadata,health:k2=v2'" in err


def test_lookup_by_category() -> None:
    apis = RestrictedApis(http("statistics:k=v"))
    restriction = apis.get(ApiCategory.STATISTICS)
    assert restriction is not None and (restriction.key, restriction.value) == ("k", "v")
    assert apis.get(ApiCategory.INFERENCE) is None


def test_messages_are_tritons() -> None:
    assert http_refusal_message("admin-key") == \
        "This API is restricted, expecting header 'admin-key'"
    assert grpc_refusal_message("triton-grpc-protocol-admin-key") == \
        "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"


def test_value_must_match_exactly() -> None:
    assert value_matches(b"s3cret", b"s3cret")
    assert not value_matches(b"s3cret", b"S3cret")
    assert not value_matches(b"s3cret", b"s3cret ")
    assert not value_matches(b"s3cret", b"")
    assert not value_matches(b"s3cret", None)
