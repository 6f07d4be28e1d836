"""The server's processes as psutil sees them, sampled by frontend 0.

The tree: the supervisor (frontend 0's parent) -> the broker and the frontends -> the broker's
workers and auto-complete helpers. A process's role comes from its command line
(``python -m shoal.broker|shoal.frontend|shoal.workers|shoal.workers.autocomplete ...``), read
once per process. ``psutil.Process`` objects are kept between samples because ``cpu_percent``
is measured from the previous call on the same object.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import psutil  # type: ignore[import-untyped]

from shoal.ops.schema import ProcessStats

_PSUTIL_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)
_DEVICE_NAMES = {"CPU": "cpu", "MODEL": "model"}


class _WorkerArgs(msgspec.Struct):
    """The part of a worker's ``WorkerSpec`` JSON argv the dashboard shows (others ignored)."""

    model_name: str
    model_version: int
    instance_name: str
    kind: str
    device_id: int
    arena_prefix: str = ""


@dataclass(frozen=True)
class Role:
    """What a process is, from its command line. ``key`` names the slot (stable across
    restarts); ``arena_prefix``: a worker's segment name prefix (``/shoal-<id>-w<serial>-``)."""

    role: str
    key: str
    label: str
    frontend_index: int | None = None
    model: str | None = None
    version: int | None = None
    instance: str | None = None
    device: str | None = None
    arena_prefix: str = ""


def _module_and_args(cmdline: Sequence[str]) -> tuple[str, list[str]]:
    """``("shoal.broker", [args...])`` for ``python -m shoal.broker args...``; ``("", [])``
    for anything else."""
    if len(cmdline) >= 3 and cmdline[1] == "-m":
        return cmdline[2], list(cmdline[3:])
    return "", []


def device_name(kind: str, device_id: int) -> str:
    return _DEVICE_NAMES.get(kind, f"{kind.lower()}:{device_id}")


def classify(cmdline: Sequence[str], pid: int, is_root: bool) -> Role:
    """The role of one process of the tree (``is_root``: the supervisor, whatever its command
    line: ``shoal serve`` or ``python -m shoal serve``)."""
    if is_root:
        return Role("supervisor", "supervisor", "supervisor")
    module, args = _module_and_args(cmdline)
    if module == "shoal.broker":
        return Role("broker", "broker", "broker")
    if module == "shoal.frontend":
        index = int(args[1]) if len(args) > 1 and args[1].isdigit() else 0
        return Role("frontend", f"frontend {index}", f"frontend {index}", frontend_index=index)
    if module == "shoal.workers" and args:
        try:
            spec = msgspec.json.decode(args[0], type=_WorkerArgs)
        except msgspec.DecodeError:
            spec = None
        if spec is not None:
            device = device_name(spec.kind, spec.device_id)
            return Role("worker", f"worker {spec.model_name}:{spec.model_version}:"
                        f"{spec.instance_name}@{device}",
                        f"{spec.model_name} v{spec.model_version} {spec.instance_name} "
                        f"({device})", model=spec.model_name, version=spec.model_version,
                        instance=spec.instance_name, device=device,
                        arena_prefix=spec.arena_prefix)
    if module == "shoal.workers.autocomplete":
        return Role("autocomplete", f"autocomplete {pid}", "auto-complete helper")
    name = os.path.basename(cmdline[0]) if cmdline else "?"
    return Role("other", f"other {pid}", name)


class FrontendRestarts:
    """Counts pid changes per frontend index: a new pid in a slot is one restart. Restarts of
    frontend 0 itself cannot be seen (the sampler lives there and starts again with it)."""

    def __init__(self) -> None:
        self._pids: dict[int, int] = {}
        self._counts: dict[int, int] = {}

    def observe(self, index: int, pid: int) -> int:
        """Record that ``pid`` serves ``index`` now; returns the restarts counted so far."""
        previous = self._pids.get(index)
        if previous is not None and previous != pid:
            self._counts[index] = self._counts.get(index, 0) + 1
        self._pids[index] = pid
        return self._counts.get(index, 0)


@dataclass
class _Tracked:
    process: psutil.Process
    role: Role


class ProcessTable:
    """Samples the tree under ``root_pid`` (the supervisor). Single-threaded."""

    def __init__(self, root: psutil.Process) -> None:
        self.root = root
        self.root_pid: int = root.pid
        self._tracked: dict[int, _Tracked] = {}
        self._restarts = FrontendRestarts()
        self.roles: dict[int, Role] = {}  # of the last sample, by pid

    def _members(self) -> list[psutil.Process]:
        """The root and its descendants; nothing once the root is gone (a pid reused by
        another process is not the root: psutil compares the start time)."""
        if not self.root.is_running():
            return []
        try:
            children = self.root.children(recursive=True)
        except _PSUTIL_GONE:
            return []
        return [self.root, *(self._known(child) for child in children)]

    def _known(self, process: psutil.Process) -> psutil.Process:
        """The kept object for this pid (the same process: psutil compares pid and start)."""
        tracked = self._tracked.get(process.pid)
        return tracked.process if tracked is not None and tracked.process == process else process

    def sample(self, now: float | None = None) -> list[ProcessStats]:
        """One row per live process (gone ones are dropped). Frontend restarts are counted
        here; ``shm_bytes`` and worker restarts are filled in by the caller."""
        wall = time.time() if now is None else now
        rows: list[ProcessStats] = []
        alive: dict[int, _Tracked] = {}
        keys: set[str] = set()
        for process in self._members():
            tracked = self._tracked.get(process.pid)
            try:
                with process.oneshot():
                    if tracked is None or tracked.process is not process:
                        role = classify(process.cmdline(), process.pid,
                                        process.pid == self.root_pid)
                        tracked = _Tracked(process, role)
                    cpu = process.cpu_percent(interval=None)
                    rss = process.memory_info().rss
                    threads = process.num_threads()
                    fds = process.num_fds()
                    started = process.create_time()
                    ppid = process.ppid()
            except _PSUTIL_GONE:
                continue
            alive[process.pid] = tracked
            role = tracked.role
            key = role.key if role.key not in keys else f"{role.key}#{process.pid}"
            keys.add(key)
            restarts = (self._restarts.observe(role.frontend_index, process.pid)
                        if role.frontend_index is not None else 0)
            rows.append(ProcessStats(
                key=key, role=role.role, label=role.label, pid=process.pid, ppid=ppid,
                cpu_percent=round(cpu, 1), rss_bytes=rss, threads=threads, open_fds=fds,
                uptime_s=round(max(0.0, wall - started), 1), restarts=restarts, shm_bytes=0,
                frontend_index=role.frontend_index, model=role.model, version=role.version,
                instance=role.instance, device=role.device))
        self._tracked = alive
        self.roles = {pid: t.role for pid, t in alive.items()}
        return rows

