"""The ledger of requests Triton counts and shoal does not (``deliberate.UNCOUNTED``): each such
case sent is noted, and the statistics answers and metric samples Triton gives afterwards are
read with those requests taken out, so the rest of the counts are compared exactly."""

from __future__ import annotations

import collections
import copy
import fnmatch
from typing import Any

from tests.conformance.answers import normalise
from tests.conformance.deliberate import UNCOUNTED, Answer, Uncounted

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

_SENT: collections.Counter[Uncounted] = collections.Counter()

# the request-level durations a success adds to (inference_stats) and those an execution adds to
_SUCCESS_DURATIONS = ("success", "queue", "compute_input", "compute_infer", "compute_output")
_COMPUTE_DURATIONS = ("compute_input", "compute_infer", "compute_output")


def note_sent(case_key: str) -> None:
    for entry in UNCOUNTED:
        if any(fnmatch.fnmatchcase(case_key, pattern) for pattern in entry.cases):
            _SENT[entry] += 1


def _less(value: Any, n: int) -> Any:
    """``value - n`` in ``value``'s own type (gRPC's JSON prints uint64 counts as strings)."""
    return str(int(value) - n) if isinstance(value, str) else int(value) - n


def _take_from_duration(duration: dict[str, Any], n: int, grpc: bool) -> None:
    duration["count"] = _less(duration.get("count", 0), n)
    if grpc and int(duration["count"]) == 0:  # proto3 prints neither field of an empty one
        duration.pop("count")
        duration.pop("ns", None)


def _take_from_model(stats: dict[str, Any], entry: Uncounted, n: int, grpc: bool) -> None:
    inference = stats["inference_stats"]
    if entry.succeeded:
        stats["inference_count"] = _less(stats["inference_count"], n)
        for name in _SUCCESS_DURATIONS:
            _take_from_duration(inference[name], n, grpc)
    else:
        _take_from_duration(inference["fail"], n, grpc)
    if entry.executed:
        stats["execution_count"] = _less(stats["execution_count"], n)
        batch = next(b for b in stats["batch_stats"] if int(b["batch_size"]) == 1)
        for name in _COMPUTE_DURATIONS:
            _take_from_duration(batch[name], n, grpc)


def discount_stats(answer: Answer) -> Answer:
    """A statistics answer of Triton's (HTTP ``body`` or gRPC ``reply``) less the requests
    noted so far; other answers are returned as they are."""
    grpc = "reply" in answer
    document = answer.get("reply" if grpc else "body")
    if not isinstance(document, dict) or "model_stats" not in document:
        return answer
    discounted = copy.deepcopy(answer)
    for stats in discounted["reply" if grpc else "body"]["model_stats"]:
        for entry, n in _SENT.items():
            if stats.get("name") == entry.model and str(stats.get("version")) == "1":
                _take_from_model(stats, entry, n, grpc)
    field = "reply" if grpc else "body"
    discounted[field] = normalise(discounted[field])  # the models' order follows their counts
    return discounted


def discount_metrics(samples: Samples) -> Samples:
    """Triton's per-model counters less the requests noted so far."""
    discounted = dict(samples)

    def take(name: str, labels: dict[str, str], n: int) -> None:
        key = (name, frozenset(labels.items()))
        if key in discounted:
            discounted[key] -= n

    for entry, n in _SENT.items():
        labels = {"model": entry.model, "version": "1"}
        if entry.succeeded:
            take("nv_inference_request_success", labels, n)
            take("nv_inference_count", labels, n)
        else:
            take("nv_inference_request_failure", {**labels, "reason": "BACKEND"}, n)
        if entry.executed:
            take("nv_inference_exec_count", labels, n)
    return discounted
