"""Who may import whom (docs/architecture.md, "Layers"): read from the import statements.

A module of ctxd imports only packages of a lower layer (or its own package), never a
private ``_module`` of another package, and no two packages import each other. The
clients take only the protocol and paths of ctxd; the benchmarks only public names of
ctxd and ctxclient. A daemon's start loads no library of a feature it does not use.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CTXD = ROOT / "ctxd"

LAYERS: dict[str, int] = {
    "__main__": 9,
    "daemon": 8,
    "gateway": 7,
    "sessions": 6,
    "folding": 5,
    "hygiene": 5,
    "team": 5,
    "memory": 4,
    "hub": 3,
    "store": 2,
    "mcp": 2,
    "config": 2,
    "cost": 2,
    "transcripts": 2,
    "wire": 1,
    "tokens": 1,
    "errors": 0,
    "scrub": 0,
    "paths": 0,
    "jobs": 0,
    "remote": 0,
    "__init__": 0,
}
"""The layer of each package (and top-level module) of ctxd: higher imports lower."""


def _unit(module: str) -> str:
    """The package (or top-level module) a dotted ``ctxd.…`` name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, packages: tuple[str, ...] = ("ctxd",)) -> Iterator[tuple[int, str]]:
    """(line, imported dotted name) of every import of ``packages`` in a file; ``from a
    import b`` yields ``a.b`` (b may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else _module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in packages:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module.split(".")[0] not in packages:
                continue
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _edges() -> Iterator[tuple[Path, int, str, str, str]]:
    """(file, line, importing unit, imported unit, imported name) across units."""
    for path in sorted(CTXD.rglob("*.py")):
        mine = _unit(_module_name(path))
        for line, name in _imports(path):
            theirs = _unit(name)
            if name == "ctxd.__version__":
                theirs = "__init__"
            if theirs != mine:
                yield path, line, mine, theirs, name


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_every_package_has_a_layer() -> None:
    units = {_unit(_module_name(path)) for path in CTXD.rglob("*.py")}
    assert sorted(units - LAYERS.keys()) == []


def test_imports_run_down_the_layers() -> None:
    upward = [f"{_where(path, line)}: {mine} (layer {LAYERS[mine]}) imports {name} "
              f"(layer {LAYERS[theirs]})"
              for path, line, mine, theirs, name in _edges()
              if theirs in LAYERS and LAYERS[theirs] >= LAYERS[mine]]
    assert upward == []


def test_no_package_imports_another_packages_private_module() -> None:
    private = [f"{_where(path, line)}: {name}"
               for path, line, _, _, name in _edges()
               if any(part.startswith("_") and not part.startswith("__")
                      for part in name.split(".")[2:])]
    assert private == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's smallest rotation, found by depth-first search."""
    found: set[tuple[str, ...]] = set()

    def visit(node: str, path: list[str]) -> None:
        for after in graph.get(node, ()):
            if after == path[0]:
                rotations = [path[i:] + path[:i] for i in range(len(path))]
                found.add(tuple(min(rotations)))
            elif after not in path and after > path[0]:
                visit(after, [*path, after])

    for start in graph:
        visit(start, [start])
    return [list(cycle) for cycle in sorted(found)]


def test_no_two_packages_import_each_other() -> None:
    graph: dict[str, set[str]] = {}
    for _, _, mine, theirs, _ in _edges():
        graph.setdefault(mine, set()).add(theirs)
    assert _cycles(graph) == []


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}}, []),
])
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]],
                                       expected: list[list[str]]) -> None:
    assert _cycles(graph) == expected


def test_the_layers_are_written_down() -> None:
    """docs/architecture.md names every package of every layer."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [unit for unit in LAYERS if not unit.startswith("__") and f"`{unit}`" not in text]
    assert missing == []


CLIENT_MAY_IMPORT = {"ctxd.__version__", "ctxd.cost", "ctxd.errors", "ctxd.paths",
                     "ctxd.wire.types"}
"""What the clients take from ctxd: the protocol's types and codes, the default paths, and
the cost model (``ctxctl replay`` prices requests as the provider would); none of which
loads the daemon (its store or index)."""


def test_the_clients_import_only_the_protocol_and_paths_of_ctxd() -> None:
    taken = {f"{_where(path, line)}: {name}"
             for path in sorted((ROOT / "clients").rglob("*.py"))
             for line, name in _imports(path)
             if not any(name == allowed or name.startswith(f"{allowed}.")
                        for allowed in CLIENT_MAY_IMPORT)}
    assert sorted(taken) == []


def _private(name: str) -> bool:
    """A dotted name through a ``_private`` module or to a ``_private`` name."""
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def test_the_benchmarks_import_only_public_names() -> None:
    """bench/ measures ctxd from outside: what it needs is exported (``__all__``), so a
    refactoring of a private module cannot silently break a benchmark."""
    private = [f"{_where(path, line)}: {name}"
               for path in sorted((ROOT / "bench").rglob("*.py"))
               for line, name in _imports(path, ("ctxd", "ctxclient"))
               if _private(name)]
    assert private == []


@pytest.mark.parametrize(("name", "private"), [
    ("ctxd.memory.lexical", False), ("ctxd.memory._queries", True),
    ("ctxd.memory._embedders.stem", True), ("ctxd.memory.feature_bucket", False),
    ("ctxd.__version__", False), ("ctxclient._replay.replay", True),
])
def test_a_private_name_is_told_apart(name: str, private: bool) -> None:
    assert _private(name) is private


def test_a_daemon_start_loads_neither_the_team_database_nor_the_upstream_client() -> None:
    # psycopg (0.1 s) comes with a team's link, httpx2 (80 ms) with the first model call
    # (docs/decisions.md, Team memory and Gateway).
    code = "import json, sys, ctxd.daemon; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True, timeout=60).stdout)
    assert "ctxd.team" in loaded
    assert [name for name in ("psycopg", "httpx2") if name in loaded] == []
