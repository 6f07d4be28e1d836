"""The deliberate-differences table and its page for people agree (no servers needed)."""

from __future__ import annotations

import pathlib
import re

from tests.conformance.deliberate import DIFFERENCES, UNCOUNTED

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "triton-differences.md"


def test_every_listed_difference_has_its_row_in_the_docs() -> None:
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", PAGE.read_text(), flags=re.MULTILINE))
    keys = {d.key for d in DIFFERENCES} | {u.key for u in UNCOUNTED}
    assert keys - rows == set(), f"differences without a row in {PAGE.name}: {keys - rows}"
    assert rows - keys == set(), f"rows of {PAGE.name} the tests do not assert: {rows - keys}"


def test_keys_are_unique() -> None:
    keys = [d.key for d in DIFFERENCES] + [u.key for u in UNCOUNTED]
    assert len(keys) == len(set(keys))
