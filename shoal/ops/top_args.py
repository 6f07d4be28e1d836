"""``shoal top`` flags (kept apart from ``top.py`` so that building the CLI parser does not
import ``rich``)."""

from __future__ import annotations

import argparse

DEFAULT_URL = "http://127.0.0.1:8002"


def parse_header(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the restricted-API header the server asks for)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--header expects KEY=VALUE, got '{text}'")
    return key.strip(), value


def parse_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(
            f"--interval expects seconds from 0.1 to 3600, got '{text}'")
    return value


def add_top_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL,
                        help=f"the server's metrics port (default {DEFAULT_URL})")
    parser.add_argument("--interval", type=parse_interval, default=1.0, metavar="SECONDS",
                        help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true",
                        help="print one frame and exit (scripts, tests)")
    parser.add_argument("--header", type=parse_header, action="append", default=[],
                        metavar="KEY=VALUE",
                        help="send this header (a restricted dashboard's credentials; "
                        "repeatable)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="HTTP timeout of one poll (default 5)")
