"""The trace settings API's values: parsing an update (HTTP JSON or the gRPC map) and the settings
document an answer carries (pure).

An update names any of ``trace_level`` (a list: ``["OFF"]`` or ``TIMESTAMPS`` / ``TENSORS``),
``trace_rate``, ``trace_count`` (>= -1, -1 = no limit), ``log_frequency`` (all three strings of
decimal digits, as Triton). JSON ``null`` (gRPC: an empty value list) clears the setting: a
model's setting falls back to the global one, a global setting to its start-up value. Unknown
keys are ignored (Triton does so). ``trace_file`` is refused, whatever its value: the file is
set only at start-up (Triton's CVE-2023-31036).

Stricter than Triton, which lets these pass silently: an unknown level name and numbers with
anything but digits (``"10abc"``, ``" 5"``) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from shoal.errors import invalid_arg
from shoal.trace.config import INT32_MAX, MIN_TRACE_COUNT, UINT32_MAX, TraceConfig, TraceLevel

LEVEL: Final = "trace_level"
RATE: Final = "trace_rate"
COUNT: Final = "trace_count"
LOG_FREQUENCY: Final = "log_frequency"
FIELDS: Final = (LEVEL, RATE, COUNT, LOG_FREQUENCY)
TRACE_FILE_REFUSED: Final = (
    "trace file location can not be updated through network protocol: 'trace_file' is set "
    "only at start-up (--trace-config triton,file=<path>)")

_LEVEL_NAMES: Final = {"TIMESTAMPS": TraceLevel.TIMESTAMPS, "TENSORS": TraceLevel.TENSORS}
_RANGES: Final = {RATE: (0, UINT32_MAX), COUNT: (MIN_TRACE_COUNT, INT32_MAX),
                  LOG_FREQUENCY: (0, UINT32_MAX)}

SettingValue = TraceLevel | int


@dataclass(frozen=True, slots=True)
class TraceValues:
    """One scope's settings. ``count``: traces still to take (-1 = no limit)."""

    level: TraceLevel
    rate: int
    count: int
    log_frequency: int

    def get(self, name: str) -> SettingValue:
        return {LEVEL: self.level, RATE: self.rate, COUNT: self.count,
                LOG_FREQUENCY: self.log_frequency}[name]

    @staticmethod
    def of(values: Mapping[str, SettingValue]) -> TraceValues:
        return TraceValues(TraceLevel(values[LEVEL]), int(values[RATE]), int(values[COUNT]),
                           int(values[LOG_FREQUENCY]))


@dataclass(frozen=True, slots=True)
class SettingsChange:
    """A parsed update: the settings it sets and those it clears (never both for one)."""

    sets: dict[str, SettingValue] = field(default_factory=dict)
    clears: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.sets or self.clears)


def _refuse_trace_file(keys: Sequence[str]) -> None:
    if "trace_file" in keys:
        raise invalid_arg(TRACE_FILE_REFUSED)


def parse_level(names: Sequence[str]) -> TraceLevel | None:
    """``["OFF"]`` or TIMESTAMPS / TENSORS names -> the level; None for an empty list."""
    level = TraceLevel.OFF
    for name in names:
        if name == "OFF":
            if len(names) != 1:
                raise invalid_arg("Expect only one trace level 'OFF' is specified")
        elif name in _LEVEL_NAMES:
            level |= _LEVEL_NAMES[name]
        else:
            raise invalid_arg(f"Unable to parse '{LEVEL}': unknown level '{name}' (expected "
                              "OFF, TIMESTAMPS or TENSORS)")
    return level if names else None


def parse_number(name: str, text: str) -> int:
    """A ``trace_rate`` / ``trace_count`` / ``log_frequency`` string, with Triton's messages."""
    low, high = _RANGES[name]
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise invalid_arg(f"Unable to parse '{name}', got: {text}")
    value = int(text)
    if name == COUNT and value < low:
        raise invalid_arg(f"Unable to parse '{name}'. Expecting value >= {low}, got: {text}")
    if not low <= value <= high:
        raise invalid_arg(f"Unable to parse '{name}', value is out of range [ {low}, {high} ], "
                          f"got: {text}")
    return value


def parse_http_change(document: Mapping[str, Any]) -> SettingsChange:
    """A ``POST .../trace/setting`` body: levels as a JSON array of strings, numbers as
    strings, null to clear."""
    _refuse_trace_file(list(document))
    sets: dict[str, SettingValue] = {}
    clears: set[str] = set()
    for name in FIELDS:
        if name not in document:
            continue
        value = document[name]
        if value is None:
            clears.add(name)
        elif name == LEVEL:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise invalid_arg(f"Unable to parse '{LEVEL}': expected an array of strings")
            level = parse_level(value)
            if level is not None:
                sets[name] = level
        elif isinstance(value, str):
            sets[name] = parse_number(name, value)
        else:
            raise invalid_arg(f"Unable to parse '{name}': expected a string")
    return SettingsChange(sets, frozenset(clears))


def parse_grpc_change(settings: Mapping[str, Sequence[str]]) -> SettingsChange:
    """A TraceSettingRequest's ``settings`` map (each value's repeated ``value``): an empty
    list clears; the numbers take exactly one value."""
    _refuse_trace_file(list(settings))
    sets: dict[str, SettingValue] = {}
    clears: set[str] = set()
    for name in FIELDS:
        if name not in settings:
            continue
        values = list(settings[name])
        if not values:
            clears.add(name)
        elif name == LEVEL:
            level = parse_level(values)
            if level is not None:
                sets[name] = level
        elif len(values) != 1:
            raise invalid_arg(f"expect only 1 value for '{name}'")
        else:
            sets[name] = parse_number(name, values[0])
    return SettingsChange(sets, frozenset(clears))


def settings_document(values: TraceValues, config: TraceConfig, trace_file: str
                      ) -> dict[str, str | list[str]]:
    """Triton's answer: level, rate, count; in triton mode log_frequency and trace_file; the
    mode; the mode's other start-up options (opentelemetry: as given, ``resource`` a list)."""
    document: dict[str, str | list[str]] = {
        LEVEL: values.level.names(), RATE: str(values.rate), COUNT: str(values.count)}
    if config.mode == "triton":
        document[LOG_FREQUENCY] = str(values.log_frequency)
        document["trace_file"] = trace_file
    document["trace_mode"] = config.mode.value
    resources = [value for key, value in config.otel.given if key == "resource"]
    if config.mode == "opentelemetry":
        for key, value in config.otel.given:
            if key != "resource":
                document[key] = value
        if resources:
            document["resource"] = resources
    return document


def check_valid(values: TraceValues, config: TraceConfig) -> None:
    """Triton's rule: a setting that could never trace is refused unless it turns tracing off."""
    if not values.level:
        return
    reason = ""
    if values.rate == 0:
        reason = "sample rate must be non-zero"
    elif config.mode == "triton" and not config.file:
        reason = "trace file name is not given"
    if reason:
        raise invalid_arg(f"Attempting to set invalid trace setting: {reason}")
