"""The event loop of an ``async def`` python model (docs/architecture.md §7, the python backend).

``AsyncRunner`` runs the coroutines of one model instance (``initialize``, ``execute``,
``is_ready``, ``finalize`` when they are ``async def``) on one event loop that lives for the
model's lifetime, on a daemon thread started at the first coroutine, so state bound to the
loop survives between executes (as in Triton's stub).

Contracts: ``run`` waits for the coroutine's result (its exception is raised in the caller);
``submit`` runs one in the background and calls ``done(future)`` on the loop's thread when it
ends; ``close`` stops the loop (waiting up to 5 s for its thread): coroutines still pending are
dropped, and a later call starts a new loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any


class AsyncRunner:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                            name="shoal-python-model-loop")
            self._thread.start()
        return self._loop

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._start()).result()

    def submit(self, coroutine: Coroutine[Any, Any, Any],
               done: Callable[[concurrent.futures.Future[Any]], None]) -> None:
        """Runs ``coroutine`` in the background; ``done(future)`` when it ends."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._start())
        future.add_done_callback(done)

    def close(self) -> None:
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if not self._loop.is_running():
            self._loop.close()
        self._loop = None
        self._thread = None
