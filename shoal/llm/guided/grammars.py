"""Compiling guides into xgrammar grammars, once per distinct (guide type, guide).

``GrammarCache.get`` returns the compiled grammar of a ``GuidedDecodingParams`` or raises
``GuideError`` with a message for the client (an invalid JSON schema, regex or grammar). Compiled
grammars are kept in an LRU of ``capacity`` entries (xgrammar's own cache is off, so this is the
one bound). Thread-safe: the worker's thread validates requests (compiling them) while the
executor's loop thread looks grammars up; compiling holds the lock, so two threads never
compile the same guide twice.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from shoal.llm.guided.params import GuidedDecodingParams, GuideType

if TYPE_CHECKING:
    import xgrammar

DEFAULT_CAPACITY = 128
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the client needs the rest
_LOCATION = re.compile(r"^\s*\[[0-9:]+\]\s*\S+:\d+:\s*")
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false:\s*")
_MAX_MESSAGE = 500


class GuideError(ValueError):
    """A guide that does not compile; ``str()`` is the message for the client."""


class GrammarCache:
    def __init__(self, compiler: xgrammar.GrammarCompiler,
                 capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"grammar cache capacity must be >= 1, got {capacity}")
        self._compiler = compiler
        self._capacity = capacity
        self._lock = threading.Lock()
        self._grammars: OrderedDict[tuple[GuideType, str], xgrammar.CompiledGrammar] = (
            OrderedDict())
        self.compilations = 0  # how many guides were compiled (tests check the cache with it)

    def __len__(self) -> int:
        with self._lock:
            return len(self._grammars)

    def get(self, params: GuidedDecodingParams) -> xgrammar.CompiledGrammar:
        key = (params.guide_type, params.guide or "")
        with self._lock:
            grammar = self._grammars.get(key)
            if grammar is not None:
                self._grammars.move_to_end(key)
                return grammar
            grammar = self._compile(*key)
            self.compilations += 1
            self._grammars[key] = grammar
            if len(self._grammars) > self._capacity:
                self._grammars.popitem(last=False)
            return grammar

    def _compile(self, guide_type: GuideType, guide: str) -> xgrammar.CompiledGrammar:
        compiler = self._compiler
        if guide_type is GuideType.JSON:
            return compiler.compile_builtin_json_grammar()
        if not guide:
            raise GuideError(f"guide type {guide_type.value} needs a guide (the "
                             f"{_WHAT[guide_type]})")
        try:
            if guide_type is GuideType.JSON_SCHEMA:
                # compact output (no free whitespace between tokens): a model cannot wander
                # off into endless blanks, and the shortest valid output stays short
                return compiler.compile_json_schema(_json_schema(guide), any_whitespace=False)
            if guide_type is GuideType.REGEX:
                return compiler.compile_regex(guide)
            if guide_type is GuideType.EBNF_GRAMMAR:
                return compiler.compile_grammar(guide)
            return compiler.compile_structural_tag(*_structural_tag(guide))
        except GuideError:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's parse errors
            raise GuideError(f"invalid {_WHAT[guide_type]}: {client_text(exc)}") from None


_WHAT = {GuideType.JSON: "JSON", GuideType.JSON_SCHEMA: "JSON schema",
         GuideType.REGEX: "regular expression", GuideType.EBNF_GRAMMAR: "EBNF grammar",
         GuideType.STRUCTURAL_TAG: "structural tag"}


def client_text(exc: BaseException) -> str:
    """xgrammar's error message without its C++ source location, on one line, bounded."""
    lines = [_CHECK_FAILED.sub("", _LOCATION.sub("", line)).strip()
             for line in str(exc).splitlines()]
    text = " ".join(line for line in lines if line)
    return text[:_MAX_MESSAGE] or type(exc).__name__


def _json_schema(guide: str) -> str:
    """The schema text, checked to be a JSON object or boolean (xgrammar's own message for a
    non-JSON text quotes the whole text back)."""
    try:
        schema = json.loads(guide)
    except ValueError as exc:
        raise GuideError(f"invalid JSON schema: not JSON ({exc})") from None
    if not isinstance(schema, dict | bool):
        raise GuideError(f"invalid JSON schema: a schema is a JSON object or a boolean, got "
                         f"{type(schema).__name__}")
    return guide


def _structural_tag(guide: str) -> tuple[Any, ...]:
    """Arguments of ``compile_structural_tag``: TensorRT-LLM's ``{"structures": [{"begin",
    "schema", "end"}], "triggers": [...]}`` as xgrammar's tag items, else xgrammar's own
    structural-tag JSON as is."""
    import xgrammar

    try:
        document = json.loads(guide)
    except ValueError as exc:
        raise GuideError(f"invalid structural tag: not JSON ({exc})") from None
    if not (isinstance(document, dict) and "structures" in document):
        return (guide,)
    structures, triggers = document.get("structures"), document.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise GuideError("invalid structural tag: 'structures' and 'triggers' must be lists")
    items = []
    for index, item in enumerate(structures):
        if not (isinstance(item, dict) and isinstance(item.get("begin"), str)
                and isinstance(item.get("end"), str) and "schema" in item):
            raise GuideError(f"invalid structural tag: structures[{index}] needs 'begin', "
                             f"'schema' and 'end'")
        schema = item["schema"]
        items.append(xgrammar.StructuralTagItem(
            begin=item["begin"], end=item["end"],
            schema=schema if isinstance(schema, str) else json.dumps(schema)))
    if not all(isinstance(t, str) and t for t in triggers):
        raise GuideError("invalid structural tag: 'triggers' must be non-empty strings")
    return (items, triggers)
