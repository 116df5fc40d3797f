"""The package's import graph: dependencies point down (DESIGN.md, "Packages and commands").

Every import in flare/ is read from the AST (imports inside functions included), and
mapped to the top-level subpackage it reaches. The graph between subpackages must
have no cycle, and nothing on the engine side may import the HTTP server.
"""

from __future__ import annotations

import ast
from pathlib import Path

FLARE = Path(__file__).resolve().parents[1] / "flare"
ENGINE_SIDE = ("engine", "scheduler", "cache", "model", "execution", "core", "frontend", "contract")


def _unit(path: Path) -> str:
    """The top-level unit of a module: a subpackage, or a top-level module's name."""
    parts = path.relative_to(FLARE).with_suffix("").parts
    return parts[0]


def _module_parts(path: Path) -> list[str]:
    parts = list(path.relative_to(FLARE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return parts


def _imports(path: Path) -> set[str]:
    """Top-level flare units that ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = _module_parts(path)
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = base + (node.module.split(".") if node.module else [])
                if node.module is None:  # from . import a, b: each name may be a module
                    names = [".".join(target + [alias.name]) for alias in node.names]
                else:
                    names = [".".join(target)]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "flare" and len(parts) > 1:
                out.add(parts[1])
    return out


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(FLARE.rglob("*.py")):
        unit = _unit(path)
        edges = graph.setdefault(unit, set())
        edges.update(target for target in _imports(path) if target != unit)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_the_graph_reads_real_imports():
    graph = import_graph()
    assert "server" in graph and "engine" in graph["server"], graph


def test_no_cycle_between_top_level_subpackages():
    cycles = _cycles(import_graph())
    assert not cycles, f"import cycles between flare subpackages: {cycles}"


def test_the_engine_side_never_imports_the_server():
    graph = import_graph()
    offenders = {unit: sorted(graph[unit] & {"server", "dashboard"}) for unit in ENGINE_SIDE if unit in graph}
    assert not any(offenders.values()), offenders
