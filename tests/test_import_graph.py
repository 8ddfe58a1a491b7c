"""No two modules of ours import each other, directly or around a loop.

A cycle is how layering rots: the engine and its checkpointing, or a Lambda CLI and its
endpoint, each reaching into the other until neither can be read or tested alone. The graph
is read from the source (every ``import``, at module level or inside a function, since a lazy
import only hides the loop), so the test needs none of the packages' dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernel", "plugins", "algos", "envs")


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that ``module`` imports (``from pkg import sub`` names ``pkg.sub``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names += [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                      for a in node.names]
    edges = set()
    for name in names:
        while name and name not in known:  # `import kernel.codec.x` -> the module it names
            name = name.rpartition(".")[0]
        if name and name != module:
            edges.add(name)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_our_packages() -> None:
    known = module_files()
    graph = {module: imported(module, path, known) for module, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_loop_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
