"""The package's structure: folders in layers, each importing only from its own and those below, and no
import cycle among bisectr's modules."""

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
# Package directories as installed (pyproject's package-dir: `adapters/` ships as `bisectr.adapters`).
PACKAGES = {"bisectr": ROOT / "bisectr", "bisectr.adapters": ROOT / "adapters"}
# Bottom first: a module imports from its own layer and those below it, never from one above.
LAYERS = [
    ("base", ("bisectr.errors", "bisectr.serial", "bisectr.environment", "bisectr.leafref", "bisectr.adapters")),
    ("capture", ("bisectr.capture",)),  # record each side's pass
    ("engines", ("bisectr.engines",)),  # run a side's ops again
    ("sides", ("bisectr.sides",)),  # where a side's model runs: this process, a worker, torchrun's ranks
    ("measure", ("bisectr.measure",)),  # pair the two passes and measure how they differ
    ("search", ("bisectr.search",)),  # find where the difference enters, and prove it
    ("workflows", ("bisectr.run", "bisectr.training", "bisectr.generation", "bisectr.weights")),  # what a user calls
    ("present", ("bisectr.present",)),  # text, JSON, TUI, notebooks, repro scripts, the command line
    ("facade", ("bisectr", "bisectr.__main__")),
]


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
    assert ("bisectr.search.forward", "bisectr.measure.analysis") in graph.edges
    assert ("bisectr.run", "bisectr.search.forward") in graph.edges
    assert ("bisectr.present.cli", "bisectr.run") in graph.edges  # a deferred import, inside a function
    assert len(graph) > 25


def layer_of(module: str) -> int:
    """The layer holding `module` (the longest prefix of it a layer names)."""
    best = max(
        (
            (len(prefix), position)
            for position, (_, prefixes) in enumerate(LAYERS)
            for prefix in prefixes
            if module == prefix or module.startswith(prefix + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def test_every_module_sits_in_a_layer_and_imports_nothing_above_it():
    graph = import_graph()
    upward = [
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, b in graph.edges
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "imports upward: " + "; ".join(sorted(upward))
    assert {LAYERS[layer_of(m)][0] for m in graph} == {name for name, _ in LAYERS}


def test_one_search_serves_both_passes_and_training_judges_with_the_same_numbers():
    """The forward and backward passes plug into `search`; neither reaches into the other, and
    training takes its thresholds and float64 rule from `numerics`, not from a pass."""
    graph = import_graph()
    assert ("bisectr.search.forward", "bisectr.search.core") in graph.edges and (
        "bisectr.search.backward",
        "bisectr.search.core",
    ) in graph.edges
    assert ("bisectr.search.backward", "bisectr.search.forward") not in graph.edges
    assert ("bisectr.training", "bisectr.search.backward") not in graph.edges
    assert ("bisectr.training", "bisectr.measure.numerics") in graph.edges


def test_no_import_cycle_among_bisectr_modules():
    """A package `__init__` importing its submodules is not a cycle: importing `bisectr.x` runs
    `bisectr/__init__` first anyway, so arrows into a package's own `__init__` are left out."""
    graph = import_graph()
    graph.remove_edges_from([(a, b) for a, b in graph.edges if a.startswith(b + ".")])
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:10])
