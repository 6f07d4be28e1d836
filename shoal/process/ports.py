"""Which listening ports of a server are taken, and by whom (psutil), so that a start that cannot
listen says which process holds the port.

A probe binds without SO_REUSEPORT: the frontends bind HTTP and gRPC with SO_REUSEPORT, which
the kernel grants even while another process of the same user listens there with it too (it
would then split the connections between the two servers); the probe fails in that case, as it
does for any other listener. SO_REUSEADDR keeps connections in TIME_WAIT from counting.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from typing import Final

import psutil  # type: ignore[import-untyped]

from shoal.settings import Settings

PORT_GRACE_S: Final = 2.0  # a server that just lost its supervisor frees its ports in ms


def listening_ports(settings: Settings) -> list[tuple[str, str, int]]:
    """(what, address, port) for each TCP port this server listens on (port 0 = any: none)."""
    ports = [("HTTP", settings.http.address, settings.http.port)]
    if settings.grpc.enabled:
        ports.append(("gRPC", settings.grpc.address, settings.grpc.port))
    if settings.metrics.enabled:
        ports.append(("metrics", settings.metrics.address or settings.http.address,
                      settings.metrics.port))
    return [p for p in ports if p[2] != 0]


def port_free(address: str, port: int) -> bool:
    """True when nobody listens on ``address:port`` (an unusable address counts as free: the
    real bind reports it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


def port_holders(port: int) -> list[str]:
    """``pid N (command line)`` for each process that listens on TCP ``port``; processes of
    other users are not visible without privileges."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    pids = sorted({c.pid for c in connections
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   and c.pid is not None})
    holders = []
    for pid in pids:
        command = "?"
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            command = " ".join(process.cmdline()) or process.name()
        command = " ".join(command.split())  # one line, whatever the arguments hold
        holders.append(f"pid {pid} ({command[:300]})")
    return holders


def port_in_use_message(what: str, address: str, port: int) -> str:
    holders = port_holders(port)
    held_by = ("it is held by " + ", ".join(holders) if holders else
               "it is held by a process this user cannot see")
    return f"cannot listen for {what} on {address}:{port}: address already in use; {held_by}"


def taken_ports(settings: Settings, grace_s: float = PORT_GRACE_S) -> list[str]:
    """A message for each port of ``settings`` that stays taken for ``grace_s`` (a server whose
    supervisor was killed frees its ports as soon as its frontend hears of it)."""
    deadline = time.monotonic() + grace_s
    while True:
        taken = [(what, address, port) for what, address, port in listening_ports(settings)
                 if not port_free(address, port)]
        if not taken or time.monotonic() >= deadline:
            return [port_in_use_message(*entry) for entry in taken]
        time.sleep(0.05)

