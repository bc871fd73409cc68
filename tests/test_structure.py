"""The package's structure: no import cycle among bisectr's modules."""
import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
# Package directories as installed (pyproject's package-dir: `adapters/` ships as `bisectr.adapters`).
PACKAGES = {"bisectr": ROOT / "bisectr", "bisectr.adapters": ROOT / "adapters"}


def module_files() -> dict[str, Path]:
    modules = {}
    for package, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            parts = path.relative_to(directory).with_suffix("").parts
            name = ".".join((package, *parts))
            modules[name.removesuffix(".__init__")] = path
    return modules


def import_graph() -> nx.DiGraph:
    """Module -> module it imports, for every import statement (deferred ones inside functions
    included: they are import arrows all the same). `from . import x` points at submodule x."""
    modules = module_files()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
                targets = submodules or [target]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def test_the_import_graph_is_read_from_the_sources():
    graph = import_graph()
    assert ("bisectr.forward", "bisectr.analysis") in graph.edges
    assert ("bisectr.run", "bisectr.forward") in graph.edges
    assert ("bisectr.cli", "bisectr.run") in graph.edges  # a deferred import, inside a function
    assert len(graph) > 25


def test_one_search_serves_both_passes_and_training_judges_with_the_same_numbers():
    """The forward and backward passes plug into `search`; neither reaches into the other, and
    training takes its thresholds and float64 rule from `numerics`, not from a pass."""
    graph = import_graph()
    assert ("bisectr.forward", "bisectr.search") in graph.edges and ("bisectr.backward", "bisectr.search") in graph.edges
    assert ("bisectr.backward", "bisectr.forward") not in graph.edges
    assert ("bisectr.training", "bisectr.backward") not in graph.edges
    assert ("bisectr.training", "bisectr.numerics") in graph.edges


def test_no_import_cycle_among_bisectr_modules():
    """A package `__init__` importing its submodules is not a cycle: importing `bisectr.x` runs
    `bisectr/__init__` first anyway, so arrows into a package's own `__init__` are left out."""
    graph = import_graph()
    graph.remove_edges_from([(a, b) for a, b in graph.edges if a.startswith(b + ".")])
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:10])
