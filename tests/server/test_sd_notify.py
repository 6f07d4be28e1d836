"""sd_notify without libsystemd: the environment contract (sd_watchdog_enabled's rules), datagrams
on real AF_UNIX sockets (path and abstract), and when the broker's heartbeat allows a ping."""

from __future__ import annotations

import os
import pathlib
import secrets
import socket
from collections.abc import Iterator

import pytest

from shoal.server.sd_notify import BrokerWatchdog, ServiceNotifications, SystemdNotifier


@pytest.fixture
def manager_socket(tmp_path: pathlib.Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket standing for the service manager's, and its address."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(1.0)
        yield path, sock


def _received(sock: socket.socket) -> list[str]:
    messages = []
    sock.settimeout(0.05)
    try:
        while True:
            messages.append(sock.recv(4096).decode())
    except TimeoutError:
        return messages


def test_the_environment_is_read_and_removed() -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000",
           "WATCHDOG_PID": "4242", "OTHER": "kept"}
    notifier = SystemdNotifier.from_environment(env, pid=4242)
    assert notifier.address == "/run/systemd/notify"
    assert notifier.watchdog_interval_s == 15.0  # half of WATCHDOG_USEC
    assert env == {"OTHER": "kept"}  # children cannot notify in the server's name


def test_the_watchdog_is_off_unless_watchdog_usec_names_us() -> None:
    assert SystemdNotifier.from_environment({"NOTIFY_SOCKET": "/n"}).watchdog_interval_s is None
    other_pid = {"NOTIFY_SOCKET": "/n", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}
    assert SystemdNotifier.from_environment(other_pid, pid=2).watchdog_interval_s is None
    for usec in ("0", "-5", "soon", ""):
        env = {"NOTIFY_SOCKET": "/n", "WATCHDOG_USEC": usec}
        assert SystemdNotifier.from_environment(env).watchdog_interval_s is None
    no_socket = {"WATCHDOG_USEC": "1000000"}
    assert not SystemdNotifier.from_environment(no_socket).enabled


def test_unusable_addresses_disable_notification() -> None:
    for address in (None, "", "relative/path", "vsock:2:1234"):
        notifier = SystemdNotifier(address, 1_000_000)
        assert not notifier.enabled
        assert notifier.watchdog_interval_s is None
        assert not notifier.send("READY=1")


def test_one_datagram_per_send(manager_socket: tuple[str, socket.socket]) -> None:
    path, sock = manager_socket
    notifier = SystemdNotifier(path)
    assert notifier.send("READY=1", "STATUS=serving 2 models")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving 2 models"
    notifier.close()


def test_abstract_namespace_socket() -> None:
    name = f"shoal-test-{secrets.token_hex(6)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(1.0)
        notifier = SystemdNotifier("@" + name)
        assert notifier.send("WATCHDOG=1")
        assert sock.recv(4096) == b"WATCHDOG=1"
        notifier.close()


def test_a_missing_socket_is_not_an_error(tmp_path: pathlib.Path) -> None:
    notifier = SystemdNotifier(str(tmp_path / "gone"))
    assert not notifier.send("READY=1")
    assert not notifier.send("READY=1")  # logged once, never raised
    notifier.close()


def test_pings_need_a_fresh_heartbeat() -> None:
    watchdog = BrokerWatchdog(interval_s=0.5, fresh_s=3.0)
    assert not watchdog.ping_due(0.0)  # no heartbeat yet: the broker may still be importing
    watchdog.heartbeat(1.0)
    assert watchdog.ping_due(1.0)
    assert not watchdog.ping_due(1.2)  # within the interval
    assert watchdog.ping_due(1.6)
    assert watchdog.ping_due(4.0)  # 3 s after the heartbeat: still fresh
    assert not watchdog.ping_due(4.6)  # stale: the broker's loop stopped answering
    assert not watchdog.answering(4.6)
    watchdog.heartbeat(5.0)
    assert watchdog.ping_due(5.0)


def test_no_pings_without_a_watchdog() -> None:
    watchdog = BrokerWatchdog(interval_s=None, fresh_s=3.0)
    watchdog.heartbeat(0.0)
    assert watchdog.answering(0.0)
    assert not watchdog.ping_due(0.0)


def test_service_notifications_follow_the_broker(
        manager_socket: tuple[str, socket.socket]) -> None:
    path, sock = manager_socket
    service = ServiceNotifications(SystemdNotifier(path, 1_000_000), fresh_s=3.0)
    service.starting()
    service.on_heartbeat(0.0, 0, 0)
    service.tick(0.0)
    assert _received(sock) == ["STATUS=loading models", "WATCHDOG=1"]
    service.on_ready()
    service.on_heartbeat(0.4, 2, 1)
    service.on_heartbeat(0.5, 2, 1)  # same counts: no second STATUS
    service.tick(0.5)
    assert _received(sock) == ["READY=1", "STATUS=serving 2 models, 1 failed to load",
                               "WATCHDOG=1"]
    service.tick(4.0)  # 3.5 s without a heartbeat
    assert _received(sock) == ["STATUS=the broker is not answering; watchdog pings withheld"]
    service.on_heartbeat(4.1, 1, 0)
    service.tick(4.1)
    assert _received(sock) == ["STATUS=serving 1 model", "WATCHDOG=1"]
    service.stopping()
    assert _received(sock) == ["STOPPING=1\nSTATUS=stopping: draining in-flight requests"]
    service.notifier.close()


def test_the_supervisor_removes_the_variables_from_its_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "@x")
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = SystemdNotifier.from_environment()
    assert notifier.watchdog_interval_s == 1.0
    assert "NOTIFY_SOCKET" not in os.environ and "WATCHDOG_USEC" not in os.environ
