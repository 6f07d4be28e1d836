"""Runs model control for the broker loop: start-up loads, the load / unload API, poll-mode scans,
reloads that switch traffic when the new generation is ready, drains, and device memory
admission.

Threads: everything here runs on the broker loop, except ``ModelManager.read_source`` and
``fingerprint_models``, which run on ``load_threads`` and hand their result back through
``completions`` plus one byte on the wake pipe (``wake_fd`` is in the loop's poller). The loop
performs the process work through ``LoopHooks``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from shoal.broker.ensemble import composing_model_names
from shoal.broker.lifecycle.admission import admit
from shoal.broker.lifecycle.device_ledger import ledger_from_settings
from shoal.broker.lifecycle.materialize import remove_materialized
from shoal.broker.lifecycle.outcomes import ensemble_outcome, load_outcome
from shoal.broker.lifecycle.polling import PollTracker, fingerprint_models
from shoal.broker.lifecycle.records import (
    Command,
    Generation,
    LoadCommand,
    ModelRecord,
    Phase,
    UnloadCommand,
    Waiter,
)
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime
from shoal.broker.models import ModelManager, SourceRead, model_temp_root
from shoal.broker.rate_limiter.placement import check_load
from shoal.broker.repository import discover_models
from shoal.config.load_overrides import check_model_name
from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error, LoadModel, UnloadModel
from shoal.settings import BrokerSettings, ModelControlMode

logger = logging.getLogger(__name__)

_LOAD_THREADS = 4  # Triton's --model-load-thread-count default
NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"


class LoopHooks(Protocol):
    def spawn(self, runtime: ModelVersionRuntime, slot: InstanceSlot, now: float) -> None: ...

    def stop_workers(self, runtime: ModelVersionRuntime, kill: bool) -> None:
        """Idle workers get WorkerShutdown; loading ones (and busy ones with ``kill``) are
        killed. Idempotent."""
        ...

    def fail_queued(self, runtime: ModelVersionRuntime, now: float, message: str = "") -> None:
        ...


class LifecycleDriver:
    def __init__(self, settings: BrokerSettings, models: ModelManager, hooks: LoopHooks) -> None:
        self.settings = settings
        self.models = models
        self.hooks = hooks
        self.load_threads = ThreadPoolExecutor(_LOAD_THREADS, thread_name_prefix="model-load")
        self.completions: queue.SimpleQueue[Callable[[float], None]] = queue.SimpleQueue()
        self.wake_fd, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.ledger = ledger_from_settings(settings, device_count=models.gpu_count)
        self.replies: list[tuple[Waiter, Error | None]] = []
        self.dirty = False  # the repository snapshot changed
        self.stopping = False
        self.poll: PollTracker | None = None
        self.next_poll: float | None = None
        self._scanning = False

    # ------------------------------------------------------------------ start

    def start(self, now: float) -> None:
        self.models.discover()
        mode = self.settings.model_control.mode
        names = sorted(self.models.repository_models)
        if mode is ModelControlMode.EXPLICIT and self.settings.model_control.load_models != ["*"]:
            names = list(dict.fromkeys(self.settings.model_control.load_models))
        if mode is ModelControlMode.POLL:
            self.poll = PollTracker()
            self.poll.baseline(fingerprint_models(self.settings.model_control.repositories) or {})
            self.next_poll = now + self.settings.model_control.repository_poll_secs
        for name in names:
            self.models.record(name).wanted = True
            self.submit(name, LoadCommand(None, "start"), now)
        self.dirty = True

    def initial_done(self) -> bool:
        return not any(r.busy or r.commands for r in self.models.records.values())

    # ------------------------------------------------------------------ commands

    def on_control(self, identity: bytes, message: LoadModel | UnloadModel, now: float) -> None:
        waiter = Waiter(identity, message.query_id)
        if self.stopping:
            self.reply(waiter, Error(ErrorCode.UNAVAILABLE, "Server exiting"))
            return
        if self.settings.model_control.mode is not ModelControlMode.EXPLICIT:
            self.reply(waiter, Error(ErrorCode.UNAVAILABLE, NOT_ALLOWED))
            return
        try:
            check_model_name(message.model)
        except ShoalError as exc:
            self.reply(waiter, Error(exc.code, exc.message))
            return
        if isinstance(message, LoadModel):
            command: Command = LoadCommand(waiter, "api", message.config, dict(message.files))
        else:
            command = UnloadCommand(waiter, "api", message.unload_dependents)
        self.submit(message.model, command, now)

    def submit(self, name: str, command: Command, now: float) -> None:
        record = self.models.record(name)
        record.commands.append(command)
        self._advance(record, now)

    def _advance(self, record: ModelRecord, now: float) -> None:
        while not record.busy and record.commands and not self.stopping:
            command = record.commands.popleft()
            if isinstance(command, UnloadCommand):
                self._unload(record, command, now)
            else:
                record.busy = True
                self._read_in_thread(record.name, command)
        # a name tried, not a model (it is in no snapshot: nothing to publish)
        self.models.forget_if_unknown(record.name)

    def _read_in_thread(self, name: str, command: LoadCommand) -> None:
        def read() -> None:
            try:  # a model added since the last scan can be loaded
                found: dict[str, str] | None = discover_models(
                    self.settings.model_control.repositories)
            except ShoalError:
                found = None
            known = found if found is not None else self.models.repository_models
            result = self.models.read_source(name, command, known.get(name))
            self._complete(lambda now: self._on_read(name, command, result, now, found))

        self.load_threads.submit(read)

    def _complete(self, action: Callable[[float], None]) -> None:
        """Load thread: hand ``action`` to the loop and wake it."""
        self.completions.put(action)
        with contextlib.suppress(BlockingIOError):  # a full pipe: the loop is awake anyway
            os.write(self._wake_write, b"x")

    def on_wake(self, now: float) -> None:
        """Loop: run what the load threads finished."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_fd, 4096):
                pass
        while True:
            try:
                action = self.completions.get_nowait()
            except queue.Empty:
                break
            action(now)
        self.settle(now)

    # ------------------------------------------------------------------ loading

    def _on_read(self, name: str, command: LoadCommand, read: SourceRead, now: float,
                 found: dict[str, str] | None) -> None:
        if found is not None:
            self.models.repository_models = found
        record = self.models.record(name)
        if self.stopping or read.source is None:
            self._remove_dir(read.materialized_dir)
            self._load_failed(record, command.waiter, "Server exiting" if self.stopping
                              else read.error, now, not_found=read.not_found,
                              versions=read.versions)
            return
        try:
            generation = self.models.build_generation(name, read, command, now)
            if self.settings.rate_limit.mode != "off":  # before admit reserves device memory
                check_load(self.models.runtimes(), generation.runtimes.values(),
                           self.settings.rate_limit.resources)
            if not generation.is_ensemble:
                admit(generation, self.models, self.ledger, self.settings)
        except ShoalError as exc:
            self._remove_dir(read.materialized_dir)
            self._load_failed(record, command.waiter, exc.message, now,
                              versions=tuple(read.source.versions))
            return
        record.loading = generation
        if generation.is_ensemble:
            self._load_composing(record, generation, now)
        for runtime in generation.runtimes.values():
            for slot in runtime.instances:
                self.hooks.spawn(runtime, slot, now)
        self.dirty = True

    def _load_composing(self, record: ModelRecord, generation: Generation, now: float) -> None:
        generation.dependencies = tuple(composing_model_names(generation.source.config))
        for name in generation.dependencies:
            dependency = self.models.record(name)
            if dependency.serving is None and not dependency.busy and not dependency.commands:
                record.loaded_with.add(name)
                self.submit(name, LoadCommand(None, "dependency"), now)

    def settle(self, now: float) -> None:
        """Promote or fail every loading generation that has reached an end (repeats while one
        outcome enables another, e.g. an ensemble waiting on its composing models)."""
        changed = True
        while changed:
            changed = False
            for record in list(self.models.records.values()):
                generation = record.loading
                if generation is None:
                    continue
                outcome = (ensemble_outcome(generation, self.models.records)
                           if generation.is_ensemble else load_outcome(generation))
                if outcome is None:
                    continue
                changed = True
                if outcome:
                    self._load_failed(record, generation.waiter, outcome, now, generation)
                else:
                    self._promote(record, generation, now)

    def _promote(self, record: ModelRecord, generation: Generation, now: float) -> None:
        old = record.promote(generation, now)
        record.wanted = True
        if old is not None:
            self._drain(record, old, now)
        logger.info("model '%s' versions %s loaded in %.2f s%s", record.name,
                    sorted(generation.runtimes), record.stats.last_load_seconds,
                    " (replacing the previous load)" if old is not None else "")
        self.reply(generation.waiter, None)
        self._command_done(record, now)

    def _load_failed(self, record: ModelRecord, waiter: Waiter | None, reason: str, now: float,
                     generation: Generation | None = None, not_found: bool = False,
                     versions: tuple[int, ...] = ()) -> None:
        """``not_found``: the repository has no such model: Triton's INTERNAL (500) with its
        text alone; any other failure is INVALID_ARG (400) "load failed for model ...". A
        failure before any generation existed shows ``versions`` (those the load would have
        loaded) UNAVAILABLE with the reason, as a failed generation's do, unless a generation
        still serves."""
        message = reason if reason == "Server exiting" or not_found else \
            f"load failed for model '{record.name}': {reason}"
        logger.error("%s", message)
        if generation is not None:
            record.fail(generation, message)
            self._release(generation)
            record.start_draining(generation, now)
        else:
            record.failure = message
            record.stats.failures += 1
            if versions and record.serving is None:
                record.retired = {v: message for v in versions}
        self.reply(waiter, Error(ErrorCode.INTERNAL if not_found else ErrorCode.INVALID_ARG,
                                 message))
        self._command_done(record, now)

    def _command_done(self, record: ModelRecord, now: float) -> None:
        record.busy = False
        self.dirty = True
        self._advance(record, now)

    # ------------------------------------------------------------------ unloading and drains

    def _unload(self, record: ModelRecord, command: UnloadCommand, now: float) -> None:
        generation = record.serving
        if generation is not None:
            record.retire(generation, "unloaded")
            self._drain(record, generation, now)
            logger.info("model '%s' unloading", record.name)
        record.wanted = False
        self.reply(command.waiter, None)
        if command.unload_dependents:
            for name in sorted(record.loaded_with):
                self.submit(name, UnloadCommand(None, "dependency"), now)
            record.loaded_with.clear()
        self.dirty = True

    def _drain(self, record: ModelRecord, generation: Generation, now: float) -> None:
        record.start_draining(generation, now + self.settings.exit_timeout_secs)
        self.dirty = True

    def tick(self, now: float) -> None:
        for record in list(self.models.records.values()):
            for generation in list(record.draining):
                self._advance_drain(record, generation, now)
        self.settle(now)
        if (self.poll is not None and self.next_poll is not None and now >= self.next_poll
                and not self._scanning and not self.stopping):
            self._scan()

    def _advance_drain(self, record: ModelRecord, generation: Generation, now: float) -> None:
        overdue = generation.drain_deadline is not None and now >= generation.drain_deadline
        for runtime in generation.runtimes.values():
            if runtime.requests and overdue:
                self.hooks.fail_queued(runtime, now, f"model '{runtime.name}' version "
                                       f"{runtime.version} was unloaded")
            if not runtime.requests or overdue or generation.phase is Phase.FAILED:
                self.hooks.stop_workers(runtime, kill=overdue or generation.phase is Phase.FAILED)
        if generation.workers_gone() and not generation.holds_requests():
            record.forget(generation)
            self._release(generation)
            for runtime in generation.runtimes.values():
                runtime.scheduling.close()
            self._remove_dir(generation.materialized_dir)
            self.dirty = True

    def next_deadline(self, now: float, recheck_s: float) -> float | None:
        """When ``tick`` must run next: a drain's deadline, the next poll, and ``recheck_s``
        from now while a generation drains (its last request may end at any moment)."""
        draining = [g for g in self.models.generations() if g.phase is not Phase.SERVING
                    and g.drain_deadline is not None]
        deadlines = [g.drain_deadline for g in draining if g.drain_deadline is not None]
        if draining:
            deadlines.append(now + recheck_s)
        if self.next_poll is not None and not self._scanning:
            deadlines.append(self.next_poll)
        return min(deadlines) if deadlines else None

    def _release(self, generation: Generation) -> None:
        if generation.ledger_owner:
            self.ledger.release(generation.ledger_owner)
            generation.ledger_owner = ""

    def _remove_dir(self, directory: str) -> None:
        if directory:
            remove_materialized(directory, model_temp_root(self.settings))

    # ------------------------------------------------------------------ polling

    def _scan(self) -> None:
        self._scanning = True

        def scan() -> None:
            found = fingerprint_models(self.settings.model_control.repositories)
            self._complete(lambda now: self._on_scan(found, now))

        self.load_threads.submit(scan)

    def _on_scan(self, found: dict[str, str] | None, now: float) -> None:
        self._scanning = False
        self.next_poll = now + self.settings.model_control.repository_poll_secs
        if found is None or self.poll is None or self.stopping:
            return
        load, unload = self.poll.observe(found)
        for name in load:
            logger.info("poll: model '%s' was added or changed", name)
            self.submit(name, LoadCommand(None, "poll"), now)
        for name in unload:
            logger.info("poll: model '%s' was removed", name)
            self.submit(name, UnloadCommand(None, "poll"), now)

    # ------------------------------------------------------------------ answers and shutdown

    def reply(self, waiter: Waiter | None, error: Error | None) -> None:
        if waiter is not None:
            self.replies.append((waiter, error))

    def take_replies(self) -> list[tuple[Waiter, Error | None]]:
        replies, self.replies = self.replies, []
        return replies

    def shutdown(self) -> None:
        """Refuse new commands, answer every waiting one, stop loading generations."""
        if self.stopping:
            return
        self.stopping = True
        exiting = Error(ErrorCode.UNAVAILABLE, "Server exiting")
        for record in self.models.records.values():
            for command in record.commands:
                self.reply(command.waiter, exiting)
            record.commands.clear()
            if record.loading is not None:
                self.reply(record.loading.waiter, exiting)
                record.loading.waiter = None
        self.load_threads.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.load_threads.shutdown(wait=True, cancel_futures=True)
        for generation in self.models.generations():
            self._release(generation)
            self._remove_dir(generation.materialized_dir)
        os.close(self.wake_fd)
        os.close(self._wake_write)
