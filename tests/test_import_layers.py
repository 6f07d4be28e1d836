"""The package's imports keep the floors docs/architecture.md §10 draws: every ``shoal`` import
(module level, in functions, and under ``TYPE_CHECKING``) runs down a floor or stays inside its
own room, and no two modules import each other, directly or round a longer circle.

The floors, top to bottom: ``server``; ``frontend`` and ``broker`` (peers, neither imports the
other); ``ops`` and ``trace`` (below the frontend that serves them); ``workers``; ``llm``; the
ground floor (``process``, ``messages``, ``shm``, ``client``, the config modules, ``settings``,
``errors``, ``dtypes``, ``correlation_ids``), whose modules may import each other.

``KNOWN`` lists what is still wrong, each with what is left to do; an entry that no longer
happens fails too, so the list only shrinks."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "shoal"

FLOORS: dict[str, int] = {
    "__main__": 0, "server": 1, "frontend": 2, "broker": 2, "ops": 3, "trace": 3, "workers": 4,
    "llm": 5,
}
GROUND = 6  # every other top-level room of the package

# (importing module, imported module) -> what is left to do
KNOWN: dict[tuple[str, str], str] = {}  # empty: no circle and no arrow up is left


def _modules() -> dict[str, pathlib.Path]:
    found: dict[str, pathlib.Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _target(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: pathlib.Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        for name in names:
            target = _target(name) if name.startswith("shoal") else None
            if target is not None and target != module:
                yield target


EDGES: dict[str, set[str]] = {m: set(_imports(m, p)) for m, p in MODULES.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _floor(module: str) -> int:
    return FLOORS.get(_room(module), GROUND)


def test_no_import_runs_up_a_floor_or_across_to_a_peer() -> None:
    wrong = sorted((a, b) for a, targets in EDGES.items() for b in targets
                   if _room(a) != _room(b) and _floor(b) <= _floor(a)
                   and not (_floor(a) == _floor(b) == GROUND))
    assert [w for w in wrong if w not in KNOWN] == [], "imports against the floors"


def _strongly_connected() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(EDGES[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(EDGES):
        if module not in index:
            visit(module)
    return groups


def test_no_import_circles() -> None:
    known_circles = {frozenset(k) for k in KNOWN if k[1] in EDGES and k[0] in EDGES[k[1]]}
    circles = [g for g in _strongly_connected() if frozenset(g) not in known_circles]
    assert circles == [], "modules that import each other (round a circle)"


def test_every_known_entry_still_happens() -> None:
    gone = [k for k in KNOWN if k[1] not in EDGES.get(k[0], set())]
    assert gone == [], "fixed: take these out of KNOWN"


def test_http_and_grpc_are_adapters_over_the_frontend_core() -> None:
    """Inside the frontend: ``core/`` imports neither protocol, and neither protocol the other."""
    def side(module: str) -> str:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "frontend" else ""

    forbidden = {("core", "http"), ("core", "grpc"), ("http", "grpc"), ("grpc", "http")}
    wrong = sorted((a, b) for a, targets in EDGES.items() for b in targets
                   if (side(a), side(b)) in forbidden)
    assert wrong == [], "frontend rooms importing across"
