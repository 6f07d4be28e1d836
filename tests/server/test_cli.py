"""`shoal serve` flags parse once into Settings, with tritonserver's names and defaults."""

from __future__ import annotations

import pytest

from shoal.server.cli import build_parser, main, parse_backend_config, settings_from_args
from shoal.settings import ModelControlMode


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_match_tritonserver() -> None:
    s = parse("--model-repository", "/m")
    assert s.model_control.repositories == ["/m"]
    assert (s.http.port, s.grpc.port, s.metrics.port) == (8000, 8001, 8002)
    assert s.model_control.mode is ModelControlMode.NONE
    assert s.model_control.strict_readiness and s.model_control.exit_on_error
    assert s.exit_timeout_secs == 30.0
    assert s.backend.default_max_batch_size == 4


def test_repeatable_repository_and_bool_forms() -> None:
    s = parse("--model-repository=/a", "--model-store", "/b", "--strict-readiness=false",
              "--exit-on-error", "false", "--disable-auto-complete-config")
    assert s.model_control.repositories == ["/a", "/b"]
    control = s.model_control
    assert not control.strict_readiness and not control.exit_on_error
    assert control.disable_auto_complete_config


def test_backend_config_global_and_per_backend() -> None:
    s = parse("--model-repository=/a", "--backend-config=default-max-batch-size=8",
              "--backend-config=python,shm-default-byte-size=1024")
    assert s.backend.default_max_batch_size == 8
    assert s.backend.setting("python", "shm-default-byte-size") == "1024"
    assert parse_backend_config("pytorch,k=v") == ("pytorch", "k", "v")


@pytest.mark.parametrize("bad", ["noequals", "python,", "=v"])
def test_bad_backend_config_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-repository=/a", f"--backend-config={bad}"])


def test_model_control_flags_parse() -> None:
    from shoal.server.cli import settings_from_args

    args = build_parser().parse_args([
        "serve", "--model-repository=/a", "--model-control-mode=explicit", "--load-model=a",
        "--load-model", "b", "--repository-poll-secs=2.5", "--model-load-gpu-limit=0:0.5",
        "--model-load-device-limit=1:1"])
    s = settings_from_args(args)
    assert s.model_control.mode is ModelControlMode.EXPLICIT
    assert s.model_control.load_models == ["a", "b"]
    assert s.model_control.repository_poll_secs == 2.5
    assert s.model_control.device_limits == [(0, 0.5), (1, 1.0)]


@pytest.mark.parametrize("bad", ["0", "x:0.5", "0:0", "0:1.5", "-1:0.5", "0:abc"])
def test_bad_device_limit_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-repository=/a",
                                   f"--model-load-device-limit={bad}"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--load-model=a"], "needs --model-control-mode=explicit"),
    (["--model-control-mode=explicit", "--load-model=*", "--load-model=a"], "must be the only"),
    (["--model-control-mode=poll", "--repository-poll-secs=0"], "greater than 0"),
])
def test_inconsistent_model_control_flags_are_refused(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model-repository=/a", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_slow_client_and_grpc_limit_flags() -> None:
    s = parse("--model-repository=/a")
    assert (s.http.header_timeout_secs, s.http.body_timeout_secs,
            s.http.idle_timeout_secs) == (10.0, 30.0, 30.0)
    assert (s.http.max_connections, s.grpc.max_connections) == (4096, 4096)
    assert s.grpc.max_input_size == 2**31 - 1
    assert (s.grpc.http2_min_recv_ping_interval_without_data_ms,
            s.grpc.http2_max_ping_strikes) == (300_000, 2)
    s = parse("--model-repository=/a", "--http-header-timeout-secs=1.5",
              "--http-body-timeout-secs=2", "--http-idle-timeout-secs=3",
              "--http-max-connections=20", "--grpc-max-connections=4",
              "--grpc-max-concurrent-streams=2", "--grpc-max-input-size=65536",
              "--grpc-keepalive-time=1000", "--grpc-keepalive-timeout=500",
              "--grpc-keepalive-permit-without-calls=true",
              "--grpc-http2-max-pings-without-data=0",
              "--grpc-http2-min-recv-ping-interval-without-data=50",
              "--grpc-http2-max-ping-strikes=0", "--grpc-max-connection-idle=100",
              "--grpc-max-connection-age=200", "--grpc-max-connection-age-grace=300")
    assert (s.http.header_timeout_secs, s.http.body_timeout_secs,
            s.http.idle_timeout_secs, s.http.max_connections) == (1.5, 2.0, 3.0, 20)
    assert (s.grpc.max_connections, s.grpc.max_concurrent_streams,
            s.grpc.max_input_size) == (4, 2, 65536)
    assert (s.grpc.keepalive_time_ms, s.grpc.keepalive_timeout_ms,
            s.grpc.keepalive_permit_without_calls) == (1000, 500, True)
    assert (s.grpc.http2_max_pings_without_data,
            s.grpc.http2_min_recv_ping_interval_without_data_ms,
            s.grpc.http2_max_ping_strikes) == (0, 50, 0)
    assert (s.grpc.max_connection_idle_ms, s.grpc.max_connection_age_ms,
            s.grpc.max_connection_age_grace_ms) == (100, 200, 300)


@pytest.mark.parametrize(("flag", "message"), [
    ("--http-header-timeout-secs=0", "greater than 0"),
    ("--http-max-connections=0", "greater than 0"),
    ("--grpc-max-concurrent-streams=-1", "greater than 0"),
    ("--grpc-max-input-size=2147483648", "at most 2147483647"),
    ("--grpc-max-connection-age=-1", "0 or more"),
])
def test_bad_limit_flags_are_refused(flag: str, message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model-repository=/a", flag])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_rate_limit_flags_parse() -> None:
    assert parse("--model-repository=/a").rate_limit.mode == "off"
    s = parse("--model-repository=/a", "--rate-limit=execution_count",
              "--rate-limit-resource=R1:10", "--rate-limit-resource", "R2:5:1")
    assert s.rate_limit.mode == "execution_count"
    assert s.rate_limit.resources == [("R1", 10, -1), ("R2", 5, 1)]


@pytest.mark.parametrize("flag", ["--rate-limit=sometimes", "--rate-limit-resource=R",
                                  "--rate-limit-resource=R:x", "--rate-limit-resource=R:1:-1"])
def test_bad_rate_limit_flags_are_refused(flag: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-repository=/a", flag])


def test_version_names_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"shoal {importlib.metadata.version('shoal')}"


@pytest.mark.parametrize("abbreviated", [["serve", "--model-repo", "/m"],
                                         ["serve", "--model-repository", "/m", "--http-po", "1"]])
def test_abbreviated_flags_are_refused(abbreviated: list[str]) -> None:
    """A flag counts only as spelled in full, as tritonserver's: a prefix is an error."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(abbreviated)
    assert exited.value.code == 2
