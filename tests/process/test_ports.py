"""Port checks at start: a taken port is found whoever holds it (SO_REUSEPORT too), and the
message names the holder's pid and command line."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from shoal.process.ports import (
    listening_ports,
    port_free,
    port_holders,
    port_in_use_message,
    taken_ports,
)
from shoal.settings import settings_from_flags
from tests.e2e.server import free_port

_HOLD = """
import socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(sys.argv[2]))
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print("listening", flush=True)
time.sleep(60)
"""


@pytest.fixture(params=[0, 1], ids=["plain", "reuseport"])
def holder(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    child = subprocess.Popen([sys.executable, "-c", _HOLD, str(port), str(request.param),
                              "held-by-test"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "listening"
        yield child, port
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


def test_a_held_port_is_taken_and_its_holder_named(
    holder: tuple[subprocess.Popen[str], int],
) -> None:
    child, port = holder
    assert not port_free("127.0.0.1", port)
    (named,) = port_holders(port)
    assert named.startswith(f"pid {child.pid} (") and "held-by-test" in named
    assert "\n" not in named  # the -c script's newlines are folded
    message = port_in_use_message("gRPC", "127.0.0.1", port)
    assert message.startswith(f"cannot listen for gRPC on 127.0.0.1:{port}: address already "
                              f"in use; it is held by pid {child.pid} (")


def test_taken_ports_checks_each_listener_of_the_settings(
    holder: tuple[subprocess.Popen[str], int],
) -> None:
    _, port = holder
    settings = settings_from_flags(model_repositories=["/m"], http_address="127.0.0.1",
                                   grpc_address="127.0.0.1", http_port=free_port(),
                                   grpc_port=free_port(), metrics_port=port)
    (message,) = taken_ports(settings, grace_s=0.0)
    assert f"for metrics on 127.0.0.1:{port}" in message
    assert taken_ports(settings_from_flags(model_repositories=["/m"], http_address="127.0.0.1",
                                           allow_metrics=False, allow_grpc=False,
                                           http_port=free_port()), grace_s=0.0) == []


def test_a_free_port_and_the_ports_a_server_uses() -> None:
    port = free_port()
    assert port_free("127.0.0.1", port)
    assert port_holders(port) == []
    with socket.socket() as bound_only:  # bound but not listening: nobody to name
        bound_only.bind(("127.0.0.1", port))
        assert not port_free("127.0.0.1", port)
        assert "cannot see" in port_in_use_message("HTTP", "127.0.0.1", port)
    settings = settings_from_flags(model_repositories=["/m"], http_port=1, grpc_port=2,
                                   metrics_port=0)
    assert listening_ports(settings) == [("HTTP", "0.0.0.0", 1), ("gRPC", "0.0.0.0", 2)]
