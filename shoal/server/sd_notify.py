"""systemd's notification protocol without libsystemd: sd_notify(3) datagrams, and the decision
of when the supervisor may send ``WATCHDOG=1`` (only while the broker's loop answers).

Contract with the service manager (see sd_notify(3), sd_watchdog_enabled(3)):

- ``NOTIFY_SOCKET`` names an AF_UNIX datagram socket: a path, or ``@name`` for the abstract
  namespace. Any other form (unset, empty, ``vsock:…``) disables notification.
- The watchdog is on only when ``WATCHDOG_USEC`` is a positive integer and ``WATCHDOG_PID`` is
  unset or this process's pid. Pings then go out every ``WATCHDOG_USEC / 2``.
- The three variables are removed from this process's environment when read, so no child (broker,
  frontends, workers, a model's own code) can notify in the server's name.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

logger = logging.getLogger("shoal.supervisor")

NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_SEND_TIMEOUT_S = 1.0  # a manager that does not read its socket must not wedge the supervisor
_MIN_PING_INTERVAL_S = 0.05


class SystemdNotifier:
    """Sends newline-joined ``KEY=value`` assignments to the service manager's socket, one
    datagram each call. Disabled (every call a no-op) without a usable ``NOTIFY_SOCKET``."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = _socket_address(address)
        self.watchdog_usec = watchdog_usec if self.address is not None else None
        self._socket: socket.socket | None = None
        self._failure_logged = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None,
                         pid: int | None = None) -> SystemdNotifier:
        """Read and remove the notification variables (``os.environ`` by default)."""
        env = os.environ if environ is None else environ
        address, usec_text, watchdog_pid = (env.pop(name, None) for name in NOTIFY_VARIABLES)
        usec = _positive_int(usec_text)
        if watchdog_pid is not None and _positive_int(watchdog_pid) != (pid or os.getpid()):
            usec = None  # the watchdog belongs to another process of the service
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half the manager's timeout; None when the watchdog is off."""
        if self.watchdog_usec is None:
            return None
        return max(_MIN_PING_INTERVAL_S, self.watchdog_usec / 2_000_000)

    def send(self, *assignments: str) -> bool:
        """True when the datagram went out (a full or missing socket is logged once)."""
        if self.address is None or not assignments:
            return False
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.settimeout(_SEND_TIMEOUT_S)
            self._socket.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:
            if not self._failure_logged:
                self._failure_logged = True
                logger.warning("cannot notify systemd at %r: %s", self.address, exc)
            return False
        return True

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class BrokerWatchdog:
    """When the supervisor may ping the watchdog: every ``interval_s`` while the broker's last
    heartbeat (a status-pipe line its main loop writes at least every second) is at most
    ``fresh_s`` old. A stopped (SIGSTOP) or wedged broker loop thus stops the pings, and the
    service manager restarts the service after ``WatchdogSec``. No heartbeat yet counts as stale.
    Times are ``time.monotonic()`` seconds, passed in."""

    def __init__(self, interval_s: float | None, fresh_s: float) -> None:
        self.interval_s = interval_s
        self.fresh_s = fresh_s
        self.last_heartbeat: float | None = None
        self.last_ping: float | None = None

    def heartbeat(self, now: float) -> None:
        self.last_heartbeat = now

    def answering(self, now: float) -> bool:
        return self.last_heartbeat is not None and now - self.last_heartbeat <= self.fresh_s

    def ping_due(self, now: float) -> bool:
        """True (and counted as sent) when a ping is owed now."""
        if self.interval_s is None or not self.answering(now):
            return False
        if self.last_ping is not None and now - self.last_ping < self.interval_s:
            return False
        self.last_ping = now
        return True


def _socket_address(address: str | None) -> str | None:
    if not address or address[0] not in "/@":
        return None
    return "\0" + address[1:] if address[0] == "@" else address


def _positive_int(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return value if value > 0 else None


BROKER_FRESH_S = 3.0  # a broker heartbeat older than this: its loop is stopped or wedged


class ServiceNotifications:
    """What the supervisor tells the service manager, from what the broker tells it:
    ``STATUS=loading models`` at start, ``READY=1`` when the initial load is done, then
    ``STATUS=serving N models[, M failed to load]`` as the counts change, ``WATCHDOG=1`` while the
    broker's heartbeat is fresh (``BrokerWatchdog``), ``STOPPING=1`` on shutdown. A broker that
    stops answering, and one that answers again, is logged (watchdog or not)."""

    def __init__(self, notifier: SystemdNotifier, fresh_s: float = BROKER_FRESH_S) -> None:
        self.notifier = notifier
        self.watchdog = BrokerWatchdog(notifier.watchdog_interval_s, fresh_s)
        self.ready = False
        self.broker_silent = False
        self.status = ""

    def starting(self) -> None:
        self._status("loading models")

    def on_ready(self) -> None:
        self.ready = True
        self.notifier.send("READY=1")

    def on_heartbeat(self, now: float, serving: int, failed: int) -> None:
        self.watchdog.heartbeat(now)
        if not self.ready:
            self._status("loading models")
            return
        text = f"serving {serving} model{'' if serving == 1 else 's'}"
        self._status(text + (f", {failed} failed to load" if failed else ""))

    def tick(self, now: float) -> None:
        """Every supervisor pass: ping when due, and note a broker that went silent."""
        heard = self.watchdog.last_heartbeat
        if heard is not None and not self.broker_silent and not self.watchdog.answering(now):
            self.broker_silent = True
            logger.warning("the broker's main loop has not answered for %.1f s (stopped or "
                           "wedged); systemd watchdog pings are withheld", now - heard)
            self._status("the broker is not answering; watchdog pings withheld")
        elif self.broker_silent and self.watchdog.answering(now):
            self.broker_silent = False
            logger.warning("the broker's main loop answers again")
        if self.watchdog.ping_due(now):
            self.notifier.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.notifier.send("STOPPING=1", "STATUS=stopping: draining in-flight requests")

    def _status(self, text: str) -> None:
        if text != self.status:
            self.status = text
            self.notifier.send(f"STATUS={text}")
