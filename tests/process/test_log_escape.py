"""Control characters in log messages are written escaped; tabs and tracebacks are untouched."""

from __future__ import annotations

import io
import logging

from shoal.process.log_escape import EscapeControlCharacters, escape_controls


def test_controls_are_escaped_and_tabs_kept() -> None:
    assert escape_controls("a\nb\rc\x1b[31md\te\x00f\x85g\u2028h") == \
        "a\\nb\\rc\\x1b[31md\te\\x00f\\x85g\\u2028h"
    assert escape_controls("plain text") == "plain text"


def test_a_record_s_arguments_are_escaped_and_its_traceback_keeps_its_lines() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(EscapeControlCharacters())
    log = logging.getLogger("tests.log_escape")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("model %s refused", "m\nERROR forged")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed %d", 1)
        log.warning("bad %d", "not a number")  # a malformed call still reaches the handler
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[0] == "model m\\nERROR forged refused"
    assert lines[1] == "failed 1" and lines[2] == "Traceback (most recent call last):"
    assert not any(line.startswith("ERROR forged") for line in lines)
