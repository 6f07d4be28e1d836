"""``--trace-config``: tritonserver's syntax, parsed and checked once at start-up (pure).

Each flag is ``<setting>=<value>`` (global: ``level``, ``rate``, ``count``, ``mode``) or
``<mode>,<setting>=<value>`` (``triton,file=<path>``, ``triton,log-frequency=<n>``;
``opentelemetry,url=<collector>``, ``opentelemetry,resource=<key>=<value>``,
``opentelemetry,bsp_max_queue_size|bsp_schedule_delay|bsp_max_export_batch_size=<n>``). The
split is Triton's: a mode prefix ends at a ``,`` before the first ``=``, the setting at the first
``=`` after it, the value is the rest. ``level`` may repeat (TIMESTAMPS and TENSORS add up; OFF,
anywhere, turns tracing off). ``log_frequency`` is accepted for ``log-frequency``.

Stricter than Triton, because a flag that does nothing is a mistake worth stopping for: unknown
settings and modes are refused, and a triton-mode level other than OFF needs ``file``. The trace
file is fixed here; the settings API can never change it (Triton's CVE-2023-31036 let the API
point it anywhere).

Settings carry the flags as ``(mode, setting, value)`` triples (mode "" = global);
``TraceConfig.from_triples`` gives the checked config to each frontend process.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Final

UINT32_MAX: Final = 2**32 - 1
INT32_MAX: Final = 2**31 - 1
MIN_TRACE_COUNT: Final = -1
DEFAULT_OTEL_URL: Final = "http://localhost:4318/v1/traces"
DEFAULT_SERVICE_NAME: Final = "triton-inference-server"  # Triton's default resource


class TraceLevel(enum.IntFlag):
    OFF = 0
    TIMESTAMPS = 1
    TENSORS = 2

    def names(self) -> list[str]:
        """Triton's ``trace_level`` list: ``["OFF"]`` or the levels that are on, in order."""
        if not self:
            return ["OFF"]
        return [name for name, flag in (("TIMESTAMPS", TraceLevel.TIMESTAMPS),
                                        ("TENSORS", TraceLevel.TENSORS)) if self & flag]


class TraceMode(enum.StrEnum):
    TRITON = "triton"
    OPENTELEMETRY = "opentelemetry"


# --trace-config level=<x>: Triton's ParseTraceLevelOption words (case-insensitive)
_LEVEL_WORDS: Final = {
    "off": TraceLevel.OFF, "false": TraceLevel.OFF, "none": TraceLevel.OFF,
    "on": TraceLevel.TIMESTAMPS, "min": TraceLevel.TIMESTAMPS, "max": TraceLevel.TIMESTAMPS,
    "timestamps": TraceLevel.TIMESTAMPS, "tensors": TraceLevel.TENSORS,
}
_GLOBAL_KEYS: Final = ("level", "rate", "count", "mode")
_TRITON_KEYS: Final = ("file", "log-frequency", "log_frequency")
_OTEL_KEYS: Final = ("url", "resource", "bsp_max_queue_size", "bsp_schedule_delay",
                     "bsp_max_export_batch_size")


@dataclass(frozen=True, slots=True)
class OtelOptions:
    """OpenTelemetry mode: where spans go and how the batch span processor batches them
    (Triton's defaults: 2048 spans queued, an export every 5000 ms, 512 spans a batch)."""

    url: str = DEFAULT_OTEL_URL
    resource: tuple[tuple[str, str], ...] = ()
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512
    given: tuple[tuple[str, str], ...] = ()  # the opentelemetry flags as given (settings API)

    def resource_attributes(self) -> dict[str, str]:
        return {"service.name": DEFAULT_SERVICE_NAME, **dict(self.resource)}


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """The start-up trace settings (the global settings' defaults). ``file`` is absolute
    ("" = none)."""

    level: TraceLevel = TraceLevel.OFF
    rate: int = 1000
    count: int = -1
    mode: TraceMode = TraceMode.TRITON
    file: str = ""
    log_frequency: int = 0
    otel: OtelOptions = field(default_factory=OtelOptions)

    @staticmethod
    def from_triples(triples: list[tuple[str, str, str]] | list[list[str]]) -> TraceConfig:
        """The config of checked triples (raises ValueError on a bad one)."""
        return parse_trace_config([(str(m), str(k), str(v)) for m, k, v in triples])


def split_trace_config(text: str) -> tuple[str, str, str]:
    """One ``--trace-config`` value -> (mode or "", setting, value); raises ValueError."""
    equals = text.find("=")
    comma = text.find(",")
    mode = ""
    rest = text
    if 0 <= comma < (equals if equals >= 0 else len(text)):
        mode, rest = text[:comma].strip().lower(), text[comma + 1:]
        if not mode:
            raise ValueError("No trace mode specified. --trace-config option format is "
                             f"<trace mode>,<setting>=<value> or <setting>=<value>. Got {text}")
        if mode not in (m.value for m in TraceMode):
            raise ValueError(f"invalid value for trace mode option: {mode}. Available options "
                             "are \"triton\" and \"opentelemetry\"")
    setting, sep, value = rest.partition("=")
    if not sep or not setting or not value:
        raise ValueError("--trace-config option format is '<trace mode>,<setting>=<value>'. "
                         f"Got {text}")
    return mode, setting, value


def _uint(key: str, value: str, low: int = 0, high: int = UINT32_MAX) -> int:
    text = value.strip()
    digits = text[1:] if text.startswith("-") else text
    if not digits.isdigit() or not low <= int(text) <= high:
        raise ValueError(f"--trace-config {key}: expected an integer in [{low}, {high}], "
                         f"got '{value}'")
    return int(text)


def parse_trace_config(triples: list[tuple[str, str, str]]) -> TraceConfig:
    """Checked TraceConfig of ``(mode, setting, value)`` triples (raises ValueError)."""
    level, explicit_off = TraceLevel.OFF, False
    rate, count, mode = 1000, -1, TraceMode.TRITON
    file, log_frequency = "", 0
    otel: dict[str, object] = {}
    resources: list[tuple[str, str]] = []
    given: list[tuple[str, str]] = []
    for scope, key, value in triples:
        if scope == "":
            if key not in _GLOBAL_KEYS:
                raise ValueError(f"--trace-config: unknown setting '{key}' (global settings: "
                                 f"{', '.join(_GLOBAL_KEYS)})")
            if key == "level":
                word = _LEVEL_WORDS.get(value.strip().lower())
                if word is None:
                    raise ValueError(f"invalid value for trace level option: {value}")
                explicit_off |= word == TraceLevel.OFF
                level |= word
            elif key == "rate":
                rate = _uint("rate", value)
            elif key == "count":
                count = _uint("count", value, MIN_TRACE_COUNT, INT32_MAX)
            else:
                if value.strip().lower() not in (m.value for m in TraceMode):
                    raise ValueError(f"invalid value for trace mode option: {value}. Available "
                                     "options are \"triton\" and \"opentelemetry\"")
                mode = TraceMode(value.strip().lower())
        elif scope == TraceMode.TRITON:
            if key not in _TRITON_KEYS:
                raise ValueError(f"--trace-config triton,{key}: unknown setting (triton "
                                 "settings: file, log-frequency)")
            if key == "file":
                file = os.path.abspath(value)
            else:
                log_frequency = _uint("triton,log-frequency", value)
        else:
            if key not in _OTEL_KEYS:
                raise ValueError(f"--trace-config opentelemetry,{key}: unknown setting "
                                 f"(opentelemetry settings: {', '.join(_OTEL_KEYS)})")
            given.append((key, value))
            if key == "url":
                otel["url"] = value
            elif key == "resource":
                name, sep, attribute = value.partition("=")
                if not sep or not name:
                    raise ValueError("--trace-config opentelemetry,resource=<key>=<value> "
                                     f"expected, got resource={value}")
                resources.append((name, attribute))
            else:
                otel[key if key != "bsp_schedule_delay" else "bsp_schedule_delay_ms"] = _uint(
                    f"opentelemetry,{key}", value, 1)
    if explicit_off:
        level = TraceLevel.OFF
    options = OtelOptions(resource=tuple(resources), given=tuple(given),
                          **otel)  # type: ignore[arg-type]
    if options.bsp_max_export_batch_size > options.bsp_max_queue_size:
        raise ValueError("--trace-config opentelemetry,bsp_max_export_batch_size must be at "
                         "most bsp_max_queue_size")
    config = TraceConfig(level, rate, count, mode, file, log_frequency, options)
    _check_file(config)
    return config


def _check_file(config: TraceConfig) -> None:
    if config.mode is not TraceMode.TRITON:
        return
    if config.level and not config.file:
        raise ValueError("--trace-config level=... in triton mode needs a trace file: "
                         "--trace-config triton,file=<path>")
    if config.file:
        directory = os.path.dirname(config.file)
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise ValueError(f"--trace-config triton,file: directory '{directory}' does not "
                             "exist or is not writable")


def frontend_trace_file(config: TraceConfig, index: int) -> str:
    """The file frontend process ``index`` writes: the configured one for frontend 0, with
    ``.fe<index>`` appended for the others (--http-workers > 1: one writer per file)."""
    if not config.file or index == 0:
        return config.file
    return f"{config.file}.fe{index}"


def trace_config_arg(text: str) -> tuple[str, str, str]:
    """argparse ``type`` of ``--trace-config``: the split triple (the whole set is checked by
    ``parse_trace_config`` once every flag is read)."""
    import argparse

    try:
        return split_trace_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
