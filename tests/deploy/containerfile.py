"""A small reader of the repository's Containerfile and .containerignore, enough for the deploy
tests: instructions with their stage, exec-form arguments, and the build context's ignore rules
(Docker's semantics: the last matching pattern wins, and a pattern that matches a parent
directory matches everything below it)."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
from dataclasses import dataclass

from tests.deploy.manifests import ROOT

CONTAINERFILE = ROOT / "Containerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str    # upper case: FROM, RUN, COPY, ...
    text: str       # the rest of the instruction, continuation lines joined
    stage: int      # 0 for the first FROM's stage, 1 for the next, ...

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form instruction (ENTRYPOINT, CMD)."""
        value = json.loads(self.text)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self.text
        return list(value)

    def words(self) -> list[str]:
        return shlex.split(self.text)


def read_instructions(path: pathlib.Path = CONTAINERFILE) -> list[Instruction]:
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Containerfile ends inside a continued line"
    instructions = []
    stage = -1
    for line in logical:
        keyword, _, text = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, text.strip(), stage))
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def ignore_patterns(path: pathlib.Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def is_ignored(relative: str, patterns: list[str]) -> bool:
    """Whether the build context leaves out ``relative`` (a path from the context root)."""
    parts = relative.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            ignored = not negated
    return ignored


def image_model_repository() -> tuple[str, str]:
    """(source in the repository, path in the image) of the final stage's model COPY."""
    for instruction in final_stage(read_instructions()):
        words = instruction.words()
        if instruction.keyword == "COPY" and "examples/model_repository" in words:
            return words[-2], words[-1]
    raise AssertionError("the Containerfile copies no model repository")
