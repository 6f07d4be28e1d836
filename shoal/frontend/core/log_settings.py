"""Triton's logging extension (``GET``/``POST /v2/logging``) for this process.

The settings object is ``{"log_file","log_info","log_warning","log_error","log_verbose_level",
"log_format"}``. POST updates the keys given (JSON null leaves a key as it is; unknown keys are
ignored); an update is validated as a whole before anything changes. ``log_file`` cannot be set
over the network (UNSUPPORTED). The result is applied to the process's root logger level:
verbose > 0 -> DEBUG, else the most verbose of INFO / WARNING / ERROR that is on, else nothing
below CRITICAL.
``log_format`` is recorded and reported (``default`` | ``ISO8601``); the log line format itself
is the process's logging configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from shoal.errors import invalid_arg, unsupported
from shoal.process.lifecycle import log_level
from shoal.settings import FrontendSettings

LOG_FORMATS: Final = ("default", "ISO8601")
_BOOL_KEYS: Final = ("log_info", "log_warning", "log_error")


@dataclass(frozen=True, slots=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def updated(self, changes: dict[str, Any]) -> LogSettings:
        """A copy with ``changes`` applied; raises INVALID_ARG / UNSUPPORTED, changing nothing."""
        values: dict[str, Any] = {}
        for key, value in changes.items():
            if value is None:
                continue
            if key == "log_file":
                raise unsupported(
                    "'log_file' cannot be changed through the logging API; set it when the "
                    "server starts"
                )
            if key in _BOOL_KEYS:
                if not isinstance(value, bool):
                    raise invalid_arg(f"Unable to parse '{key}': expected a boolean")
            elif key == "log_verbose_level":
                if type(value) is not int or value < 0 or value > 2**31 - 1:
                    raise invalid_arg(
                        "Unable to parse 'log_verbose_level': expected an unsigned integer"
                    )
            elif key == "log_format":
                if value not in LOG_FORMATS:
                    raise invalid_arg(f"invalid argument for --log_format, got: {value}")
            else:
                continue  # unknown keys are ignored, as Triton does
            values[key] = value
        return replace(self, **values)

    @staticmethod
    def starting(settings: FrontendSettings) -> LogSettings:
        """The settings the server started with (``--log-*`` flags)."""
        return LogSettings(log_file=settings.log.file, log_info=settings.log.info,
                           log_warning=settings.log.warning, log_error=settings.log.error,
                           log_verbose_level=max(settings.log.verbose, 0),
                           log_format=settings.log.format)

    def python_level(self) -> int:
        return log_level(self.log_verbose_level, self.log_info, self.log_warning,
                         self.log_error)

    def apply(self) -> None:
        logging.getLogger().setLevel(self.python_level())


@dataclass(slots=True)
class ProcessLogSettings:
    """The logging settings of one frontend process, shared by its HTTP and gRPC endpoints
    (logging is process-wide, so both must see and change the same settings). ``on_change``:
    told each applied update (the frontend passes the level on to the broker and the workers,
    so the settings hold server-wide). Event loop only."""

    current: LogSettings = field(default_factory=LogSettings)
    on_change: Callable[[LogSettings], None] | None = None

    def update(self, changes: dict[str, Any]) -> LogSettings:
        """Validate and apply ``changes`` as a whole (nothing changes on error)."""
        updated = self.current.updated(changes)
        updated.apply()
        self.current = updated
        if self.on_change is not None:
            self.on_change(updated)
        return updated
