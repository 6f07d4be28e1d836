"""docs/architecture.md stays true to the tree: every file or folder it names in backticks
exists in the repository, and every ``module.symbol`` it names is defined in that module (the
page abbreviates paths, e.g. ``http/codec.py`` for ``shoal/frontend/http/codec.py``: a name
matches any tracked path it is the tail of)."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
# named on the page on purpose although not in the tree, and why
NOT_OURS = {
    "../shared/DESIGN.md": "the plan the page compares the code against (outside the repo)",
    "warmup/": "a model's warmup folder in a user's repository",
    "messages.py": "named in §12 as what the package is not",
}


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return listed.stdout.split()


def _named_paths() -> list[str]:
    tokens = set(re.findall(r"`([\w./-]+)`", PAGE.read_text()))
    return sorted(t for t in tokens if "/" in t or t.endswith(".py"))


def _tail_of(name: str, paths: set[str]) -> str | None:
    return next((p for p in paths if p == name or p.endswith("/" + name)), None)


def test_every_path_the_page_names_exists() -> None:
    files = set(_tracked())
    folders = {str(pathlib.PurePosixPath(f).parents[i]) for f in files
               for i in range(len(pathlib.PurePosixPath(f).parents) - 1)}
    first_segments = {part for p in files | folders for part in p.split("/")}
    missing: list[str] = []
    for name in _named_paths():
        if name in NOT_OURS:
            continue
        head = name.split("/")[0]
        if head not in first_segments and head != "..":
            continue  # not a path (e.g. ``compute_input/infer/output``)
        module, _, symbols = name.partition(".") if "/" in name and not name.endswith(
            (".py", ".md", ".pbtxt", ".service", ".sh", ".json", ".toml", "/")) else (name, "", "")
        if symbols:
            source = _tail_of(module + ".py", files)
            if source is None:
                missing.append(name)
                continue
            text = (ROOT / source).read_text()
            for symbol in symbols.split("."):
                if not re.search(rf"^\s*(?:async def|def|class)\s+{re.escape(symbol)}\b"
                                 rf"|^\s*{re.escape(symbol)}\s*[:=]", text, re.MULTILINE):
                    missing.append(name)
                    break
        elif _tail_of(name.rstrip("/"), files | folders) is None:
            missing.append(name)
    assert not missing, f"{PAGE.name} names what the tree does not have: {missing}"


def test_the_allowed_names_are_still_on_the_page() -> None:
    named = set(_named_paths())
    assert set(NOT_OURS) <= named, f"stale entries: {set(NOT_OURS) - named}"
