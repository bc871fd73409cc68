"""What a side is asked about a compiled module's call, for the search inside it (`bisectr.search.compiled`), and how
the side answers it.

The module lives in the side's process, so the search asks small questions of the call that `OpenCompiled`
made ready there, each answered by the adapter's primitives (`adapters.base.CompiledProbe`) with plain data.
Modules are named by path from the compiled module ("": itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..adapters.base import Adapter, CompiledGraphs, CompiledProbe, facet
from ..capture.trace import Trace
from ..capture.calls import RecordedCalls
from .values import ValuesInterpreter


@dataclass
class OpenCompiled:
    """Make ready the call of op `index`, a compiled module's call, on `values` (tid -> array) for the inputs
    that are no parameter: its eager outputs computed once, for the questions below until `CloseCompiled`.
    -> (the compiler backend's name, the eager module's rounding), or None where op `index` is no compiled call"""

    index: int
    values: dict[int, np.ndarray]


@dataclass
class CloseCompiled:
    """Done with the call `OpenCompiled` made ready. -> None"""


class CompiledQuestion:
    """A question about the call `OpenCompiled` made ready."""


@dataclass
class CalledChildren(CompiledQuestion):
    """The submodules of module `path` that are called, in order. -> list of paths"""

    path: str


@dataclass
class CompiledError(CompiledQuestion):
    """The compiled module's error with only module `path` compiled (compiling once), the modules `kept_eager`
    run eagerly inside it. -> (error, whether the compiler captured any graph)"""

    path: str
    kept_eager: list[str] = field(default_factory=list)


@dataclass
class CaptureGraphs(CompiledQuestion):
    """The graphs the compiler captures of module `path`'s code. -> each graph's nodes (`GraphNode`s)"""

    path: str


@dataclass
class CuttableNodes(CompiledQuestion):
    """The positions of the nodes of captured graph `graph` that a cut can end at. -> list of positions"""

    graph: int


@dataclass
class CutError(CompiledQuestion):
    """Captured graph `graph` cut after its node at position `node` and compiled (once).
    -> (the node's compiled error against float64, its eager rounding)"""

    graph: int
    node: int


@dataclass
class ExecutedLines(CompiledQuestion):
    """The lines of `files` the eager module's run executes. -> set of "path:line"s"""

    files: set[str]


@dataclass
class CompilerBisection(CompiledQuestion):
    """The compiler step that makes the difference of module `path` compiled alone, a try being good where its
    error stays below `good_below`. -> (`CompilerStep`, or None where no single step does; the compiles it took)"""

    path: str
    good_below: float


@dataclass
class ModulesOfClass(CompiledQuestion):
    """The class of module `path`. -> (its name, the paths of every module of that class)"""

    path: str


def answer_compiled(probe: CompiledProbe | None, question: CompiledQuestion) -> Any:
    """`question` answered by `probe`, the call `OpenCompiled` made ready."""
    if probe is None:
        raise RuntimeError(f"{type(question).__name__} asked with no compiled call made ready (OpenCompiled)")
    match question:
        case CalledChildren(path):
            return probe.called_children(path)
        case CompiledError(path, kept_eager):
            return probe.error_compiled(path, kept_eager)
        case CaptureGraphs(path):
            return probe.capture_graphs(path)
        case CuttableNodes(graph):
            return probe.cuttable_nodes(graph)
        case CutError(graph, node):
            return probe.cut_error(graph, node)
        case ExecutedLines(files):
            return probe.executed_lines(files)
        case CompilerBisection(path, good_below):
            return probe.bisect_compiler(path, good_below)
        case ModulesOfClass(path):
            return probe.modules_of_class(path)
    raise TypeError(f"not a question about a compiled call: {question!r}")


def probe_compiled(
    adapter: Adapter, trace: Trace, recorded: RecordedCalls, index: int, values: dict[int, np.ndarray]
) -> CompiledProbe | None:
    """Op `index`'s call probed on its recorded inputs, `values` for those that are no parameter (None:
    op `index` is no compiled call)."""
    calls = recorded.calls
    replay = ValuesInterpreter(adapter, trace, calls, recorded.own_values(values), leaves=recorded.leaves)
    args, kwargs = calls[index].filled(replay.fetch)
    return facet(adapter, CompiledGraphs).probe_compiled(calls[index].fn, args, kwargs)
