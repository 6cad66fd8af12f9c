"""No import circles in either package, ``if TYPE_CHECKING:`` imports included.

import-linter's contracts (pyproject.toml) say which layer may import which; this test says no
module reaches itself through its imports, at any depth (a package's ``__init__`` counts as a
module). A circle hidden behind ``TYPE_CHECKING`` still ties the modules together for a reader
and for the type checker, so it counts too.
"""

from __future__ import annotations

import grimp
import pytest

PACKAGES = ("scheduler_extender", "node_agent")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm, iterative)."""
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            module, at = work.pop()
            if at == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            for i in range(at, len(imports[module])):
                target = imports[module][i]
                if target not in index:
                    work.append((module, i + 1))
                    work.append((target, 0))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                if low[module] == index[module]:
                    part = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        part.append(top)
                        if top == module:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
    return found


def describe(graph: grimp.ImportGraph, part: list[str]) -> str:
    """One circle of ``part`` spelled out: a → b → … → a."""
    first, *rest = part
    for other in rest:
        there = graph.find_shortest_chain(importer=first, imported=other)
        back = graph.find_shortest_chain(importer=other, imported=first)
        if there and back:
            return " → ".join((*there, *back[1:]))
    return ", ".join(part)


def test_no_module_imports_itself_through_other_modules(graph):
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(
        f"  {describe(graph, part)} ({len(part)} modules tied)" for part in found
    )


def test_the_circle_finder_finds_a_circle_and_a_self_contained_chain_has_none():
    g = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        g.add_import(importer=importer, imported=imported)
    assert circles(g) == [["p.a", "p.b", "p.c"]]
    assert describe(g, ["p.a", "p.b", "p.c"]) == "p.a → p.b → p.c → p.a"
    g.remove_import(importer="p.c", imported="p.a")
    assert circles(g) == []
