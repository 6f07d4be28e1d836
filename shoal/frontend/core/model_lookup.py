"""Finding the model version a request names, with Triton's rules, codes and texts (pure).

The version string (a URL segment or a gRPC ``version`` field) is read as Triton reads it,
``std::stol``: leading white space, an optional sign, decimal digits, and anything after them
ignored (``" 1"`` and ``"1abc"`` are version 1). No digits, or a value outside int64, is
INVALID_ARG "failed to get model version from specified version string ..."; a negative one is
INVALID_ARG "invalid model version specified ...". An empty or missing string means the highest
ready version.

Then the name (Triton's ``ModelRepositoryManager::GetModel``):

- a name the repository has no version of (never heard of, or only listed, never loaded in
  explicit mode) is NOT_FOUND "Request for unknown model: 'x' is not found", with or without a
  version;
- a name whose versions are all unloaded or failed, asked without a version, is NOT_FOUND
  "Request for unknown model: 'x' has no available versions" (a model that is gone: retry
  policies and load balancers must not retry it as a 503);
- a version the model does not have is NOT_FOUND "... version N is not found";
- a version it has that does not serve (loading, unloading, unloaded, failed) is UNAVAILABLE
  "Request for unknown model: 'x' version N is not at ready state".

Statistics use another text, Triton's (``TRITONSERVER_ServerModelStatistics``): INVALID_ARG
"requested model 'x' is not available" when the model has no ready version, and "requested
model version is not available for model 'x'" when the version asked for is not one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Protocol

from shoal.errors import invalid_arg, not_found, unavailable
from shoal.messages import ModelVersionInfo

_INT64_MAX: Final = (1 << 63) - 1
_INT64_MIN: Final = -(1 << 63)
_C_SPACE: Final = " \t\n\v\f\r"  # isspace() in the C locale, what strtol skips

Versions = Mapping[int, ModelVersionInfo]


def parse_version(text: str | None) -> int | None:
    """The version a request names (None: the highest ready one); raises INVALID_ARG with
    Triton's texts for a string ``std::stol`` refuses and for a negative version."""
    if not text:
        return None
    if len(text) <= 18 and text.isascii() and text.isdigit():
        return int(text)  # the usual "1": digits only, inside int64 whatever they are
    body = text.lstrip(_C_SPACE)
    digits_from = 1 if body[:1] in ("+", "-") else 0
    end = digits_from
    while end < len(body) and "0" <= body[end] <= "9":
        end += 1
    # read without the leading zeros; past 19 digits the value is outside int64 whatever they
    # are: refused before int(), which refuses over 4300 digits with an error of its own
    digits = body[digits_from:end].lstrip("0") or "0"
    value = None
    if end > digits_from and len(digits) <= 19:
        value = -int(digits) if body[:1] == "-" else int(digits)
    if value is None or not _INT64_MIN <= value <= _INT64_MAX:
        raise invalid_arg(
            f"failed to get model version from specified version string '{text}' (details: "
            "stol), version should be an integral value > 0")
    if value < 0:
        raise invalid_arg(f"invalid model version specified '{text}' , version should be an "
                          "integral value > 0")
    return value


def resolve(versions: Versions | None, name: str, version: str | None,
            serving: Callable[[ModelVersionInfo], bool]) -> ModelVersionInfo:
    """The version of model ``name`` (its ``versions``, None when the name is unknown) that a
    request for ``version`` goes to; raises ShoalError with Triton's code and text (module
    doc). ``serving`` tells whether a version takes requests."""
    return resolve_number(versions, name, parse_version(version), serving)


def resolve_number(versions: Versions | None, name: str, number: int | None,
                   serving: Callable[[ModelVersionInfo], bool]) -> ModelVersionInfo:
    """``resolve`` of a version already read (``parse_version``; None: the highest ready)."""
    if not versions:
        raise not_found(f"Request for unknown model: '{name}' is not found")
    if number is None:
        ready = [v for v, info in versions.items() if serving(info)]
        if not ready:
            raise not_found(f"Request for unknown model: '{name}' has no available versions")
        return versions[max(ready)]
    info = versions.get(number)
    if info is None:
        raise not_found(f"Request for unknown model: '{name}' version {number} is not found")
    if not serving(info):
        raise unavailable(f"Request for unknown model: '{name}' version {number} is not at "
                          "ready state")
    return info


def is_ready(versions: Versions | None, version: str | None,
             ready: Callable[[ModelVersionInfo], bool]) -> bool:
    """The model-ready endpoints: any ready version, or the one asked for. An unparsable version
    string raises INVALID_ARG (Triton answers those with the version error, not "not ready")."""
    number = parse_version(version)
    if not versions:
        return False
    if number is None:
        return any(ready(info) for info in versions.values())
    info = versions.get(number)
    return info is not None and ready(info)


def check_stats_target(ready_versions: list[int], name: str, version: int) -> None:
    """The statistics endpoints' check for one model (``name`` not empty; ``version`` -1 for
    all of its ready versions): Triton's INVALID_ARG texts (module doc)."""
    if not ready_versions:
        raise invalid_arg(f"requested model '{name}' is not available")
    if version != -1 and version not in ready_versions:
        raise invalid_arg(f"requested model version is not available for model '{name}'")


def stats_version(text: str | None) -> int:
    """A statistics request's version string as the broker's query takes it (-1: all)."""
    number = parse_version(text)
    return -1 if number is None else number



class _ReadyProbe(Protocol):
    def model_ready(self, name: str, version: str | None) -> bool: ...


def check_trace_model(dataplane: _ReadyProbe, model: str) -> None:
    """A model's trace settings need the model ready (any version), as Triton (HTTP and gRPC)."""
    if model and not dataplane.model_ready(model, None):
        raise invalid_arg(f"Request for unknown model : {model}")
