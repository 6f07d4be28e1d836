"""Restricted APIs, as Triton's ``--http-restricted-api`` / ``--grpc-restricted-protocol``: the
API categories, the flag parser and the gate's decision (which header, which value, what a
refused call is told). The protocol layers apply it: ``http/restricted.py`` (every HTTP route),
``grpc/restricted.py`` (every gRPC method) and ``http/restricted.py``'s dashboard gate (the
metrics port).

Contract for whoever adds an endpoint: every HTTP route and every gRPC method has exactly one
``ApiCategory``, given where it is built, so a restriction can never miss it.
- HTTP: build the route with ``shoal.frontend.http.restricted.ApiRoute(path, endpoint,
  methods=[...], category=ApiCategory.X)``. ``create_app`` refuses (TypeError, at start-up and in
  every test) a route that is not an ``ApiRoute``.
- gRPC: add the RPC's name to ``GRPC_METHOD_CATEGORIES`` below. ``create_grpc_server`` refuses to
  start when a method of the generated service descriptor has no category.
A new kind of endpoint belongs to one of Triton's categories (a trace route is ``TRACE``);
``DASHBOARD`` is ours: every path under ``/dashboard`` on the metrics port, HTTP only.

Flags (repeatable): ``<category>[,<category>...]:<key>=<value>``. A category may appear in one
group only, unknown categories are refused, and each part must be non-empty (Triton's rules and
messages, with the offending flag named). The key and value are split as Triton splits them: the
categories end at the first ``:``, the key at the first ``=`` after it, the value is the rest.

Matching, as Triton: HTTP checks the header named ``<key>`` (names are case-insensitive; the
first header of that name counts) for exactly ``<value>``; gRPC checks the metadata key
``triton-grpc-protocol-<key>`` (gRPC metadata keys are lowercase, so the key is lowercased) for
exactly ``<value>``. Values are compared in constant time.
"""

from __future__ import annotations

import enum
import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NamedTuple

GRPC_HEADER_PREFIX: Final = "triton-grpc-protocol-"


class ApiCategory(enum.StrEnum):
    """Triton's ``RestrictedCategory`` names (restricted_features.h), plus ``dashboard``."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"
    DASHBOARD = "dashboard"


HTTP_CATEGORIES: Final = frozenset(ApiCategory)
GRPC_CATEGORIES: Final = frozenset(ApiCategory) - {ApiCategory.DASHBOARD}

# Every RPC of inference.GRPCInferenceService (grpc_service.proto) and of grpc.health.v1.Health,
# by method name, with Triton's category (grpc_server.cc). The standard health check is
# ``health``, as Triton documents it.
GRPC_METHOD_CATEGORIES: Final[Mapping[str, ApiCategory]] = {
    "ServerLive": ApiCategory.HEALTH,
    "ServerReady": ApiCategory.HEALTH,
    "ModelReady": ApiCategory.HEALTH,
    "Check": ApiCategory.HEALTH,  # grpc.health.v1.Health
    "ServerMetadata": ApiCategory.METADATA,
    "ModelMetadata": ApiCategory.METADATA,
    "ModelInfer": ApiCategory.INFERENCE,
    "ModelStreamInfer": ApiCategory.INFERENCE,
    "ModelConfig": ApiCategory.MODEL_CONFIG,
    "ModelStatistics": ApiCategory.STATISTICS,
    "RepositoryIndex": ApiCategory.MODEL_REPOSITORY,
    "RepositoryModelLoad": ApiCategory.MODEL_REPOSITORY,
    "RepositoryModelUnload": ApiCategory.MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": ApiCategory.SHARED_MEMORY,
    "SystemSharedMemoryRegister": ApiCategory.SHARED_MEMORY,
    "SystemSharedMemoryUnregister": ApiCategory.SHARED_MEMORY,
    "CudaSharedMemoryStatus": ApiCategory.SHARED_MEMORY,
    "CudaSharedMemoryRegister": ApiCategory.SHARED_MEMORY,
    "CudaSharedMemoryUnregister": ApiCategory.SHARED_MEMORY,
    "TraceSetting": ApiCategory.TRACE,
    "LogSettings": ApiCategory.LOGGING,
}

_HTTP_TOKEN: Final = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 field-name
_GRPC_KEY: Final = re.compile(r"^[0-9a-z_.\-]+$")  # gRPC metadata key characters
# visible ASCII, spaces only between characters
_VALUE: Final = re.compile(r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$")


class RestrictionError(ValueError):
    """A bad --http-restricted-api / --grpc-restricted-protocol value (the CLI exits 2)."""


class Restriction(NamedTuple):
    """One restricted category: the request must carry header ``key`` with value ``value``
    (``key`` as the client sends it: for gRPC, already ``triton-grpc-protocol-<key>``). Settings
    carry these as plain ``(category, key, value)`` tuples."""

    category: str
    key: str
    value: str


def parse_restrictions(texts: Sequence[str], *, flag: str, grpc: bool
                       ) -> list[tuple[str, str, str]]:
    """Every ``--http-restricted-api`` (``grpc`` False) or ``--grpc-restricted-protocol`` value
    -> ``(category, header key, value)`` per category. Raises RestrictionError with the message
    for the operator."""
    kind = "protocol" if grpc else "api"
    allowed = GRPC_CATEGORIES if grpc else HTTP_CATEGORIES
    found: dict[str, tuple[Restriction, str]] = {}
    for text in texts:
        names, key, value = _split(text, flag)
        if grpc:
            key = key.lower()
        _check_header(text, flag, key, value, grpc)
        for name in (n.strip() for n in names.split(",")):
            if not name:
                raise RestrictionError(_format_error(flag, text))
            if name not in allowed:
                hint = (" (the dashboard is HTTP only: use --http-restricted-api)"
                        if name == ApiCategory.DASHBOARD else "")
                raise RestrictionError(
                    f"{flag}: unknown restricted {kind} '{name}'{hint}; known: "
                    f"{', '.join(c.value for c in ApiCategory if c in allowed)}")
            if name in found:
                raise RestrictionError(
                    f"{flag}: restricted {kind} '{name}' can not be specified in multiple "
                    f"config groups ('{found[name][1]}' and '{text}')")
            header = GRPC_HEADER_PREFIX + key if grpc else key
            found[name] = (Restriction(name, header, value), text)
    return [(r.category, r.key, r.value) for r, _ in found.values()]


def _split(text: str, flag: str) -> tuple[str, str, str]:
    """Triton's ParseGenericConfigOption(arg, ":", "=")."""
    names, colon, setting = text.partition(":")
    key, equals, value = setting.partition("=")
    if not colon or not equals or not names or not key or not value:
        raise RestrictionError(_format_error(flag, text))
    return names, key, value


def _format_error(flag: str, text: str) -> str:
    return f"{flag} option format is '<category>[,<category>...]:<key>=<value>'. Got '{text}'"


def _check_header(text: str, flag: str, key: str, value: str, grpc: bool) -> None:
    if not (_GRPC_KEY if grpc else _HTTP_TOKEN).match(key) or (grpc and key.endswith("-bin")):
        what = "a gRPC metadata key ([0-9a-z_.-], not ending in -bin)" if grpc else \
            "an HTTP header name"
        raise RestrictionError(f"{flag}: '{key}' in '{text}' is not {what}")
    if not _VALUE.match(value):
        raise RestrictionError(f"{flag}: the value in '{text}' must be visible ASCII characters "
                         "(spaces only between them)")


def http_refusal_message(key: str) -> str:
    """Triton's HTTP 403 text (http_server.cc RespondIfRestricted)."""
    return f"This API is restricted, expecting header '{key}'"


def grpc_refusal_message(key: str) -> str:
    """Triton's gRPC text (grpc_handler.h); ``key`` is the full metadata key."""
    return f"This protocol is restricted, expecting header '{key}'"


class RestrictedApis:
    """The restrictions of one protocol, by category (immutable after construction)."""

    def __init__(self, restrictions: Iterable[tuple[str, str, str]]) -> None:
        self._by_category = {ApiCategory(category): Restriction(category, key, value)
                             for category, key, value in restrictions}

    def __bool__(self) -> bool:
        return bool(self._by_category)

    def get(self, category: ApiCategory) -> Restriction | None:
        return self._by_category.get(category)


def value_matches(expected: bytes, actual: bytes | None) -> bool:
    """The gate's comparison: exact, in constant time."""
    return actual is not None and hmac.compare_digest(expected, actual)
