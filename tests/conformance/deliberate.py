"""Where shoal answers differently from the real tritonserver 2.51 on purpose.

This table is the only place a difference found by the differential tests may be accepted.
Each entry names the cases it covers (``fnmatch`` patterns over ``http:<case id>`` and
``grpc:<case id>``), what Triton answers and what shoal answers there (predicates the test
asserts on the two answers), and why shoal differs. An entry may also ``mask`` the aspect it is
about (e.g. the media type) so the rest of the two answers is still compared.

docs/triton-differences.md renders this table for people; a test checks that every entry's
``key`` appears there. An entry whose cases answer the same on both servers fails the test: a
difference that went away must leave the table."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

Answer = dict[str, Any]
Check = Callable[[Answer], bool]


def status(*codes: int) -> Check:
    return lambda a: a.get("status") in codes


def grpc_code(*codes: str) -> Check:
    return lambda a: a.get("code") in codes


def error_text(a: Answer) -> str:
    body = a.get("body")
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return str(a.get("details", ""))


def error_contains(text: str) -> Check:
    return lambda a: text in error_text(a)


def both(*checks: Check) -> Check:
    return lambda a: all(c(a) for c in checks)


def _without_media_type(a: Answer) -> Answer:
    return {k: v for k, v in a.items() if k != "media_type"}


def _without_error_text(a: Answer) -> Answer:
    masked = dict(a)
    if isinstance(masked.get("body"), dict) and "error" in masked["body"]:
        masked["body"] = {**masked["body"], "error": "<text>"}
    if "details" in masked:
        masked["details"] = "<text>"
    return masked


def _without_status_and_text(a: Answer) -> Answer:
    masked = _without_error_text(_without_media_type(a))
    masked.pop("status", None)
    masked.pop("code", None)
    return masked


@dataclasses.dataclass(frozen=True)
class Difference:
    key: str
    summary: str
    why: str
    cases: tuple[str, ...]
    triton: Check
    shoal: Check
    mask: Callable[[Answer], Answer] = _without_status_and_text


def _float32_data(a: Answer) -> Answer:
    """JSON FP32 values rounded to float32: Triton prints a float32 through double (0.1 becomes
    0.10000000149011612), shoal prints the shortest text that reads back as the same float32."""
    import numpy as np

    masked = _without_media_type(a)
    body = masked.get("body")
    if isinstance(body, dict) and isinstance(body.get("outputs"), list):
        outputs = []
        for out in body["outputs"]:
            if out.get("datatype") == "FP32" and isinstance(out.get("data"), list):
                out = {**out, "data": np.asarray(out["data"], np.float32).tolist()}
            outputs.append(out)
        masked["body"] = {**body, "outputs": outputs}
    return masked


def _without_parameters(a: Answer) -> Answer:
    masked = _without_media_type(a)
    for key in ("body", "reply"):
        body = masked.get(key)
        if isinstance(body, dict) and "parameters" in body:
            masked[key] = {k: v for k, v in body.items() if k != "parameters"}
    return masked


def _map_index_entries(a: Answer, entry: Callable[[dict[str, Any]], dict[str, Any]]) -> Answer:
    """``a`` with ``entry`` applied to each entry of a repository index (HTTP body or gRPC
    reply); other answers unchanged."""
    masked = dict(a)
    if isinstance(masked.get("body"), list):
        masked["body"] = [entry(e) if isinstance(e, dict) else e for e in masked["body"]]
    reply = masked.get("reply")
    if isinstance(reply, dict) and isinstance(reply.get("models"), list):
        masked["reply"] = {**reply, "models": [entry(e) for e in reply["models"]]}
    return masked


def _without_failure_texts(a: Answer) -> Answer:
    """Error texts, and the reasons of index entries whose load failed, replaced."""
    return _map_index_entries(
        _without_error_text(a),
        lambda e: {**e, "reason": "<text>"} if e.get("reason", "unloaded") != "unloaded" else e)


def _unloading_as_unloaded(a: Answer) -> Answer:
    """Index entries of a version Triton is still unloading read as shoal's unloaded ones."""
    return _map_index_entries(
        _without_media_type(a),
        lambda e: {**e, "state": "UNAVAILABLE", "reason": "unloaded"}
        if e.get("state") == "UNLOADING" else e)


def _strip_version(a: Answer) -> Answer:
    masked = _without_media_type(a)
    body = masked.get("body") or masked.get("reply")
    if isinstance(body, dict) and "version" in body:
        key = "body" if "body" in masked else "reply"
        masked[key] = {k: v for k, v in body.items() if k != "version"}
    return masked


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        key="duplicate-outputs",
        summary="An output named twice in `outputs` is refused (400, `output 'X' already "
                "exists in request`), as later Triton releases refuse it; 2.51 answers it once",
        why="two requests for one output are a client mistake; later Triton agrees",
        cases=("http:infer/add_sub/duplicate-outputs", "grpc:infer/add_sub/duplicate-outputs"),
        triton=lambda a: a.get("status") == 200 or a.get("code") == "OK",
        shoal=error_contains("already exists in request"),
        mask=lambda a: {},  # an answer against a refusal: nothing else to compare
    ),
    Difference(
        key="never-loaded-series",
        summary="A model whose load failed (no version ever loaded) has no metric series; "
                "Triton 2.51 exports its four `nv_inference_request_failure` series at 0",
        why="series of a model that never served say nothing and would pile up for every "
            "failed name; a model that loaded keeps its series",
        cases=("metrics:never-loaded",),
        triton=lambda a: bool(a.get("series")) and not any(a["series"].values()),
        shoal=lambda a: not a.get("series"),
        mask=lambda a: {},
    ),
    Difference(
        key="unload-waits",
        summary="An unload answers once the model is unloaded: the index then shows it "
                "UNAVAILABLE (`unloaded`); Triton answers at once and shows it UNLOADING for a "
                "while (seconds, for a python model)",
        why="a client that unloads and then loads or checks the index sees a settled state",
        cases=("control:index/*", "control:grpc/index/*"),
        triton=lambda a: "UNLOADING" in str(a),
        shoal=lambda a: "UNLOADING" not in str(a),
        mask=_unloading_as_unloaded,
    ),
    Difference(
        key="shm-mistake-400",
        summary="Registering a region whose key does not exist or that does not fit its "
                "object, and an output region too small for the output, are 400s with the "
                "region, key and sizes named; Triton answers 500",
        why="the mistake is the client's (see client-mistake-400); the server is fine",
        cases=("shm:register/missing-key", "shm:register/too-big",
               "shm:infer/output-region-too-small"),
        triton=status(500),
        shoal=status(400),
    ),
    Difference(
        key="shm-region-names-tensor",
        summary="`Unable to find shared memory region: 'R'` goes on to name the input or "
                "output that used it (`(used by input 'INPUT0')`)",
        why="a request can name several regions; Triton's text is kept as the prefix, so "
                "clients matching it still match",
        cases=("shm:infer/unregistered-region", "shm:infer/after-unregister"),
        triton=both(status(404), error_contains("Unable to find shared memory region")),
        shoal=both(status(404), error_contains("(used by ")),
    ),
    Difference(
        key="media-type",
        summary="Error bodies are labelled `application/json` (Triton labels some of them, and "
                "empty 200 bodies, `text/plain`); empty bodies carry no content type",
        why="the body is JSON; clients parse it either way, and tritonclient ignores the label",
        cases=("http:*", "control:*", "shm:*"),
        triton=lambda a: a.get("media_type") in ("text/plain", "application/json"),
        shoal=lambda a: a.get("media_type") in ("application/json", "")
        and (a.get("media_type") == "application/json") == (a.get("body") is not None),
        mask=_without_media_type,
    ),
    Difference(
        key="server-version",
        summary="`version` in server metadata is the Triton release whose protocol shoal "
                "follows (its tritonclient), not 2.51.0",
        why="shoal is not a build of Triton; the extensions list, which clients check, is "
            "the same",
        cases=("http:server/metadata", "grpc:server-metadata"),
        triton=lambda a: True,
        shoal=lambda a: True,
        mask=_strip_version,
    ),
    Difference(
        key="client-mistake-400",
        summary="A malformed request (not JSON, wrong JSON types, negative shape, `data` that "
                "does not fit `shape`, a non-string BYTES element, a bad `sequence_id` type) "
                "gets 400 with a message naming the input; Triton 2.51 answers 500 with its "
                "JSON parser's text",
        why="the mistake is the client's: 5xx makes retry policies resend a request that can "
            "never succeed, and alerts page the server's owner",
        cases=("http:infer/*", "http:generate*", "http:sequence/*"),
        triton=both(status(500), lambda a: "nable to parse" in error_text(a)
                    or "failed to parse" in error_text(a)
                    or "attempt to" in error_text(a)),
        shoal=status(400),
    ),
    Difference(
        key="no-traceback",
        summary="An exception raised in a python model's `execute` is reported without the "
                "traceback's file paths (`At: /path/model.py(3): execute`)",
        why="the client must not learn the server's file layout; the traceback is in the "
            "server's log",
        cases=("http:infer/raises/*", "grpc:infer/raises", "control:load/fails_to_load",
               "control:grpc/load/fails_to_load", "control:index/*", "control:grpc/index/*"),
        triton=lambda a: "\n\nAt:\n" in str(a) or "\\n\\nAt:\\n" in str(a),
        shoal=lambda a: "At:" not in str(a)
        and ("execute blew up" in str(a) or "this model never loads" in str(a)),
        mask=lambda a: _without_failure_texts(_without_media_type(a)),
    ),
    Difference(
        key="fp32-json-text",
        summary="FP32 values in JSON are written as the shortest decimal that reads back as the "
                "same float32 (`0.1`); Triton writes the float32 widened to double "
                "(`0.10000000149011612`)",
        why="both read back as the same float32; the shorter text is what every JSON client "
            "expects to see for the value it sent",
        cases=("http:infer/classify/class-count-0",),
        triton=status(200),
        shoal=status(200),
        mask=_float32_data,
    ),
    Difference(
        key="ensemble-sequence-parameters",
        summary="An ensemble's answer carries no `sequence_id` / `sequence_start` / "
                "`sequence_end` parameters the request did not send (Triton 2.51 adds "
                "`0` / `false` / `false` to every ensemble answer)",
        why="they describe no sequence; shoal's answers carry only parameters that mean "
            "something",
        cases=("http:infer/pipeline/json", "grpc:infer/pipeline"),
        triton=lambda a: "sequence_id" in str(a),
        shoal=lambda a: "sequence_id" not in str(a),
        mask=_without_parameters,
    ),
    Difference(
        key="generate-decoupled-status",
        summary="`generate` on a decoupled model that sends other than one response is a 501 "
                "with Triton's message; Triton sends the message with status 200",
        why="a 200 whose body is an error passes every client's status check as a success",
        cases=("http:generate/countdown/*",),
        triton=both(status(200), error_contains("exactly 1 response")),
        shoal=both(status(501), error_contains("exactly 1 response")),
    ),
    Difference(
        key="required-input-checked",
        summary="A model with an optional input still needs its required ones: a request "
                "without them is a 400 naming them; Triton 2.51 skips the check once a model "
                "has an optional input and runs `execute` without them (a 500 from the model)",
        why="the client's mistake should be named before the model fails on it",
        cases=("http:infer/optional_input/without-required",),
        triton=status(500),
        shoal=both(status(400), error_contains("missing required input(s) ['INPUT0']")),
    ),
    Difference(
        key="unexpected-input-text",
        summary="An input the model does not have is named in the error (`unexpected "
                "inference input 'X' for model 'M'`); Triton counts inputs and lists none as "
                "missing (`... missing required input(s) ]`)",
        why="Triton's text names no input and is malformed; the status (400) is the same",
        cases=("http:infer/add_sub/extra-input",),
        triton=both(status(400), error_contains("missing required input(s) ]")),
        shoal=both(status(400), error_contains("unexpected inference input 'INPUT9'")),
    ),
    Difference(
        key="first-wrong-input",
        summary="When several inputs are wrong, the error names the first in request order; "
                "Triton names the one its hash map yields first",
        why="the request's order is the one the client can predict; the status is the same",
        cases=("http:infer/add_sub/batch-dim-on-unbatched", "grpc:infer/add_sub/wrong-shape"),
        triton=error_contains("'INPUT1'"),
        shoal=error_contains("'INPUT0'"),
    ),
    Difference(
        key="empty-body",
        summary="An empty request body is a JSON error (400); Triton reads it as a raw binary "
                "request and answers that the model has more than one input (400)",
        why="an empty body is not a tensor; the status is the same",
        cases=("http:infer/add_sub/empty-body",),
        triton=status(400),
        shoal=both(status(400), error_contains("failed to parse the request JSON")),
    ),
)


@dataclasses.dataclass(frozen=True)
class Uncounted:
    """A request Triton's statistics and metrics count for ``model`` and shoal's do not, because
    shoal answers it before the model runs. ``executed``: Triton ran ``execute`` on it (an
    execution, its batch's compute counts); ``succeeded``: Triton counted it a success, else a
    failure. The differential tests take each one such case sent out of Triton's counts before
    comparing, so an entry that stops holding fails the statistics and metrics comparisons."""
    key: str
    summary: str
    why: str
    cases: tuple[str, ...]
    model: str
    executed: bool
    succeeded: bool


UNCOUNTED: tuple[Uncounted, ...] = (
    Uncounted(
        key="duplicate-outputs-uncounted",
        summary="The request refused for naming an output twice (`duplicate-outputs`) is not "
                "counted; Triton 2.51 ran it and counts a success and an execution",
        why="shoal refuses it before the model runs: there is nothing to count",
        cases=("http:infer/add_sub/duplicate-outputs", "grpc:infer/add_sub/duplicate-outputs"),
        model="add_sub", executed=True, succeeded=True,
    ),
    Uncounted(
        key="required-input-uncounted",
        summary="The request refused for a missing required input (`required-input-checked`) "
                "is not counted; Triton 2.51 ran `execute` without it and counts a failed "
                "execution",
        why="shoal refuses it before the model runs: there is nothing to count",
        cases=("http:infer/optional_input/without-required",),
        model="optional_input", executed=True, succeeded=False,
    ),
    Uncounted(
        key="malformed-bytes-uncounted",
        summary="A binary BYTES input whose length prefixes overrun its data is refused with "
                "Triton's status and text but not counted; Triton's python backend finds it "
                "when it reads the inputs and counts a model failure (no execution)",
        why="shoal checks the framing when the request arrives, before any model sees it",
        cases=("http:infer/identity_bytes/binary-bad-length",),
        model="identity_bytes", executed=False, succeeded=False,
    ),
)
