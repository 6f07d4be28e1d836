"""The gRPC server's channel arguments come from the settings (flags: frontend/cli.py)."""

from __future__ import annotations

from shoal.frontend.grpc.server import MAX_MESSAGE_BYTES, server_options
from shoal.settings import settings_from_flags


def test_defaults_are_tritons_with_caps() -> None:
    options = dict(server_options(settings_from_flags(model_repositories=["/m"]).for_frontends()))
    assert options["grpc.max_receive_message_length"] == MAX_MESSAGE_BYTES == 2**31 - 1
    assert options["grpc.max_send_message_length"] == MAX_MESSAGE_BYTES
    assert options["grpc.max_concurrent_streams"] == 1024
    assert options["grpc.max_allowed_incoming_connections"] == 4096
    assert options["grpc.keepalive_time_ms"] == 7_200_000
    assert options["grpc.keepalive_timeout_ms"] == 20_000
    assert options["grpc.keepalive_permit_without_calls"] == 0
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 300_000
    assert options["grpc.http2.max_ping_strikes"] == 2
    assert options["grpc.http2.max_pings_without_data"] == 2
    assert not {"grpc.max_connection_idle_ms", "grpc.max_connection_age_ms",
                "grpc.max_connection_age_grace_ms"} & options.keys()  # none by default


def test_configured_values_and_the_budget_override() -> None:
    settings = settings_from_flags(model_repositories=["/m"], grpc_max_input_size=1024,
                                   grpc_max_concurrent_streams=8,
                                   grpc_keepalive_permit_without_calls=True,
                                   grpc_max_connection_idle_ms=1000,
                                   grpc_max_connection_age_ms=60_000,
                                   grpc_max_connection_age_grace_ms=5000).for_frontends()
    options = dict(server_options(settings, max_connections=100))
    assert options["grpc.max_receive_message_length"] == 1024
    assert options["grpc.max_concurrent_streams"] == 8
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.max_allowed_incoming_connections"] == 100
    assert (options["grpc.max_connection_idle_ms"], options["grpc.max_connection_age_ms"],
            options["grpc.max_connection_age_grace_ms"]) == (1000, 60_000, 5000)
