"""Log lines a client cannot forge (issue #26 part 3; the class of CVE-2024-0095): every record's
message, client-supplied strings included (model and input names from a URL path or a JSON
body, request ids, parameters), has its control characters escaped before it is written, so a
newline, a carriage return or an ANSI escape in a name shows as ``\\n``, ``\\r``, ``\\x1b`` and
can never start a line of its own. A tab stays a tab. Tracebacks (``exc_info``) are the
formatter's and keep their lines. ``setup_logging`` puts the filter on every process's handler.
"""

from __future__ import annotations

import logging
import re
from typing import Final

# C0 controls but tab, DEL, C1 controls, and the Unicode line and paragraph separators
_CONTROL: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED: Final = {"\n": "\\n", "\r": "\\r"}


def escape_controls(text: str) -> str:
    """``text`` with each control character written as an escape (``\\n``, ``\\r``, ``\\xNN``,
    ``\\uNNNN``)."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"
                                             if ord(m.group()) < 0x100
                                             else f"\\u{ord(m.group()):04x}"), text)


class EscapeControlCharacters(logging.Filter):
    """Rewrites a record whose message holds a control character to its escaped text (the
    message is formatted once here; its arguments are then spent)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: the handler's emit reports it as it would
            return True
        if _CONTROL.search(message) is not None:
            record.msg, record.args = escape_controls(message), None
        return True
