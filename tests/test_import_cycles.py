"""No import cycles in the shipped packages, between modules or between sub-packages.

The graph is read from the source with `ast`, not by importing it: every `import` and
`from ... import` counts, at module level and inside functions (deferring an import into a
function is how a cycle hides, it does not remove it). Imports under `if TYPE_CHECKING:` are
left out: they never run. Three graphs are checked:

- modules: an edge from a module to each `specdraft` module it imports;
- sub-packages: each `specdraft.<pkg>.<x>` (and `specdraft.trainer.disagg.<x>`) folder or loose
  module is one node, so `train -> disagg -> train` fails even when no two modules form a cycle;
- distributions: `specdraft.config`, `.collate`, `.trainer`, `.cli` (config must not import the
  trainer, and so on).

A failure prints each cycle as `a -> b -> ... -> a`, with the file and line of every edge.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = sorted(ROOT.glob("packages/*/src"))
# Sub-packages whose own children are nodes of the sub-package graph (one level deeper).
NESTED_PACKAGES = ("specdraft.trainer.disagg",)


@dataclass(frozen=True)
class Edge:
    """One import: `source` imports `target` at `path:line`."""

    source: str
    target: str
    path: str
    line: int


def discover_modules() -> dict[str, Path]:
    """Every module under packages/*/src/specdraft, by dotted name (packages by their __init__)."""
    modules: dict[str, Path] = {}
    for src in SOURCE_ROOTS:
        for path in sorted((src / "specdraft").rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """True for `TYPE_CHECKING` and `typing.TYPE_CHECKING`."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _walk_runtime(node: ast.AST) -> Iterable[ast.AST]:
    """All nodes below `node`, skipping the bodies of `if TYPE_CHECKING:` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _walk_runtime(other)
            continue
        yield child
        yield from _walk_runtime(child)


def _deepest_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest dotted prefix of `name` that is one of our modules."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_edges(name: str, path: Path, modules: dict[str, Path], root: Path = ROOT) -> list[Edge]:
    """The `specdraft` modules that module `name` imports at run time, wherever the import sits."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    rel = str(path.relative_to(root))
    edges: list[Edge] = []

    def add(target: str | None, line: int) -> None:
        if target is not None and target != name:
            edges.append(Edge(name, target, rel, line))

    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_deepest_module(alias.name, modules), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                # `from pkg import sub` imports the module pkg.sub when there is one.
                target = f"{base}.{alias.name}"
                add(target if target in modules else _deepest_module(base, modules), node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            add(_deepest_module(node.args[0].value, modules), node.lineno)
    return edges


def module_graph() -> list[Edge]:
    """Every run-time import edge between our modules."""
    modules = discover_modules()
    edges: list[Edge] = []
    for name, path in modules.items():
        edges.extend(import_edges(name, path, modules))
    return edges


def subpackage_of(module: str) -> str:
    """The sub-package node of a module: `specdraft.<pkg>.<x>`, one level deeper in disagg."""
    parts = module.split(".")
    for nested in NESTED_PACKAGES:
        if module == nested or module.startswith(nested + "."):
            return ".".join(parts[: len(nested.split(".")) + 1])
    return ".".join(parts[:3])


def distribution_of(module: str) -> str:
    """The distribution node of a module: `specdraft.<pkg>`."""
    return ".".join(module.split(".")[:2])


def collapse(edges: list[Edge], node_of: Callable[[str], str]) -> list[Edge]:
    """The same edges between coarser nodes, dropping edges inside one node."""
    collapsed = []
    for edge in edges:
        source, target = node_of(edge.source), node_of(edge.target)
        if source != target:
            collapsed.append(Edge(source, target, edge.path, edge.line))
    return collapsed


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One shortest cycle per strongly connected component of the graph, as a list of edges."""
    graph: dict[str, dict[str, Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
        graph.setdefault(edge.target, {})

    # Tarjan's strongly connected components, iterative (the graph has hundreds of nodes).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    cycles: list[list[Edge]] = []
    seen: set[frozenset[tuple[str, str]]] = set()
    for component in components:
        # The shortest cycle through each member, so every loop of a tangle shows at once.
        for start in component:
            cycle = _shortest_cycle(graph, start, set(component))
            key = frozenset((edge.source, edge.target) for edge in cycle)
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
    return cycles


def _shortest_cycle(graph: dict[str, dict[str, Edge]], start: str, members: set[str]) -> list[Edge]:
    """Breadth-first search inside a strongly connected component for the way back to `start`."""
    parent: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child, edge in sorted(graph[node].items()):
                if child == start:
                    cycle = [edge]
                    while cycle[0].source != start:
                        cycle.insert(0, parent[cycle[0].source])
                    return cycle
                if child in members and child not in parent:
                    parent[child] = edge
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def describe(cycles: list[list[Edge]]) -> str:
    """Each cycle as `a -> b -> a`, then the import behind each arrow."""
    lines = []
    for cycle in cycles:
        lines.append(" -> ".join([edge.source for edge in cycle] + [cycle[0].source]))
        for edge in cycle:
            lines.append(f"    {edge.source} -> {edge.target}  ({edge.path}:{edge.line})")
    return "\n".join(lines)


def test_the_walk_sees_deferred_imports_and_skips_type_checking(tmp_path):
    """A function-level import is an edge; an `if TYPE_CHECKING:` import is not."""
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from specdraft.b import Hint\n"
        "def late():\n"
        "    from specdraft import c\n"
        "    from . import d\n",
        encoding="utf-8",
    )
    modules = {name: path for name in ("specdraft.a", "specdraft.b", "specdraft.c", "specdraft.d")}
    edges = import_edges("specdraft.a", path, modules, root=tmp_path)
    targets = sorted(edge.target for edge in edges)
    assert targets == ["specdraft.c", "specdraft.d"]


def test_find_cycles_reports_the_loop_and_its_imports():
    """A three-node loop is found and printed with the file and line of each import."""
    edges = [
        Edge("a", "b", "a.py", 1),
        Edge("b", "c", "b.py", 2),
        Edge("c", "a", "c.py", 3),
        Edge("c", "d", "c.py", 4),
    ]
    text = describe(find_cycles(edges))
    assert text.splitlines()[0] == "a -> b -> c -> a"
    assert "c -> a  (c.py:3)" in text
    assert find_cycles(edges[:2]) == []


def test_the_walk_finds_the_packages():
    """The walk covers all four distributions (an empty graph would pass vacuously)."""
    modules = discover_modules()
    for distribution in ("config", "collate", "trainer", "cli"):
        assert f"specdraft.{distribution}" in {distribution_of(name) for name in modules}
    edges = module_graph()
    assert any(edge.target.startswith("specdraft.config") for edge in edges)


@pytest.mark.parametrize(
    ("level", "node_of"),
    [
        ("modules", None),
        ("sub-packages", subpackage_of),
        ("distributions", distribution_of),
    ],
)
def test_no_import_cycles(level, node_of):
    """No cycle between modules, sub-packages or distributions of packages/*/src/specdraft."""
    edges = module_graph()
    if node_of is not None:
        edges = collapse(edges, node_of)
    cycles = find_cycles(edges)
    assert not cycles, f"import cycles between {level}:\n{describe(cycles)}"


def test_no_library_module_starts_the_cli():
    """The trainer, collate and config packages neither import nor spawn `specdraft.cli`.

    A library that shells out to `python -m specdraft.cli ...` depends at run time on the package
    that depends on it; child processes start the owning package's own entry points instead.
    """
    offenders = []
    for name, path in discover_modules().items():
        if distribution_of(name) == "specdraft.cli":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if "specdraft.cli" in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "library modules that reach for the CLI:\n" + "\n".join(offenders)
