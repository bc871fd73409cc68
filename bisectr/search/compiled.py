"""Inside a compiled culprit: where its compiled code differs from its eager code, on the inputs it was
recorded with, asked of the side whose model it is (`engines.compiled`'s questions, each answered there by
the adapter's primitives; every probe compiles afresh):
- where: the module's children compiled one at a time, the rest eager; the first child whose compiled
  code alone makes the difference is searched the same way, down to a module none of whose children
  does (the compiled code of several modules together, or of its own code);
- the op: that module's graphs as the compiler captures them, cut after one node and compiled, in a
  binary search for the first node whose compiled value leaves what rounding makes (its eager float32
  value against float64); where none does, the graph itself computes otherwise: the first node on a
  line the eager code never runs;
- why: the compiler step, bisected by the compiler's own bisector where it has one;
- the proof: the compiled module again, every module of the culprit's class left eager.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from ..adapters import COMPILED_OP
from ..engines.compiled import (
    CalledChildren,
    CaptureGraphs,
    CloseCompiled,
    CompiledError,
    CompilerBisection,
    CuttableNodes,
    CutError,
    ExecutedLines,
    ModulesOfClass,
    OpenCompiled,
)
from ..sides.runner import Request
from ..measure.live import LiveRun
from ..leafref import leaf_kind
from ..measure.numerics import (
    COMPILED_CONFIRMED_ROUNDING,
    COMPILED_CONFIRMED_SHARE,
    COMPILED_NODE_FACTOR,
    COMPILED_NODE_FLOOR,
    COMPILED_SHARE,
)
from ..measure.result import InCompiled
from ..measure.runrecord import RunRecord


def in_compiled(live: LiveRun, candidate_ops: list[int]) -> InCompiled | None:
    """The search inside the first compiled module's call among `candidate_ops` (None: there is none)."""
    run = live.run
    candidate = run.candidate
    compiled = next((index for index in candidate_ops if candidate.ops[index].framework_op == COMPILED_OP), None)
    if compiled is None:
        return None
    op = candidate.ops[compiled]
    live.say(f"searching inside the compiled module {op.module or '(the model)'}: each step compiles afresh")
    values = {
        tid: candidate.value(tid)
        for tid in op.inputs
        if candidate.tensors[tid].leaf is None or leaf_kind(candidate.tensors[tid].leaf) not in ("param", "buffer")
    }
    found = _search(lambda request: live.ask("candidate", request), compiled, values)
    if found is None:
        return None

    def inside(path):
        return f"{op.module}.{path}" if op.module and path else op.module or path

    return replace(
        found,
        module=inside(found.module),
        eager_modules=[inside(path) for path in found.eager_modules],
        eager_ops=_at_line(run, found.source, found.op, inside(found.module)),
    )


def _search(ask: Callable[[Request], Any], index: int, values: dict) -> InCompiled | None:
    """The search inside op `index`, a compiled module's call on `values`, asking its side with `ask`
    (None: op `index` is no compiled call). Module paths are relative to the compiled module."""
    started = time.monotonic()
    opened = ask(OpenCompiled(index, values))
    if opened is None:
        return None
    try:
        return _CompiledSearch(ask, *opened, started).run()
    finally:
        ask(CloseCompiled())


class _CompiledSearch:
    def __init__(self, ask: Callable[[Request], Any], backend: str, rounding: float, started: float):
        self.ask, self.backend, self.rounding, self.started = ask, backend, rounding, started
        self.compiles = 0

    def run(self) -> InCompiled:
        whole, _ = self.error_compiled("")
        path, module_error = self.culprit_module(whole)
        op, source, code, op_error, other_path = self.culprit_op(path)
        step, detail = self.compiler_step(path, module_error)
        module_class, of_class = self.ask(ModulesOfClass(path))
        eager_modules = of_class if path else []
        confirmed_error = self.error_compiled("", kept_eager=eager_modules)[0] if eager_modules else 0.0
        confirmed = bool(eager_modules) and confirmed_error <= max(
            COMPILED_CONFIRMED_ROUNDING * self.rounding, COMPILED_CONFIRMED_SHARE * whole
        )
        return InCompiled(
            path,
            module_class,
            whole,
            module_error,
            op,
            source,
            code,
            op_error,
            other_path,
            step,
            detail,
            eager_modules,
            confirmed_error,
            self.rounding,
            confirmed=confirmed,
            compiles=self.compiles,
            seconds=round(time.monotonic() - self.started, 1),
            backend=self.backend,
        )

    def error_compiled(self, path: str, kept_eager: Sequence[str] = ()) -> tuple[float, bool]:
        """The compiled module's error with only module `path` compiled, `kept_eager` eager inside it, and
        whether the compiler captured any graph of the code it compiled."""
        self.compiles += 1
        return self.ask(CompiledError(path, list(kept_eager)))

    def culprit_module(self, whole: float) -> tuple[str, float]:
        """The deepest module whose compiled code alone makes the difference (the compiled module where no
        child's does), and its error. A child that compiled alone captures no graph (a frame the compiler skips
        runs eagerly whole) says nothing of its own children, which are tried in its place."""
        path, error = "", whole
        while True:
            children = self.ask(CalledChildren(path))
            while children:
                child = children.pop(0)
                child_error, captured = self.error_compiled(child)
                if child_error >= COMPILED_SHARE * whole:
                    path, error = child, child_error
                    break
                if not captured:
                    children[:0] = self.ask(CalledChildren(child))
            else:
                return path, error

    def culprit_op(self, path: str) -> tuple[str | None, str, str, float | None, bool]:
        """The first node of module `path`'s captured graphs whose compiled value differs beyond rounding
        (its op, source line, code, error); else the first on a line its eager run never executes (and True)."""
        graphs = self.ask(CaptureGraphs(path))
        for graph, nodes in enumerate(graphs):
            found = self.first_differing_node(graph)
            if found is not None:
                position, error = found
                node = nodes[position]
                return node.op, node.source, node.code, error, False
        # No node's compiled value differs from the graph's own eager run: the graph itself computes
        # something else, where the compiler traced a path the eager code does not take.
        executed = self.ask(ExecutedLines({node.source.rpartition(":")[0] for nodes in graphs for node in nodes}))
        for nodes in graphs:
            for node in nodes:
                if node.source and node.source not in executed:
                    return node.op, node.source, node.code, None, True
        return None, "", "", None, False

    def first_differing_node(self, graph: int) -> tuple[int, float] | None:
        """The position of captured graph `graph`'s first node whose compiled value differs, and its error."""
        nodes = self.ask(CuttableNodes(graph))

        def error_of(index: int) -> float | None:
            self.compiles += 1
            error, rounding = self.ask(CutError(graph, nodes[index]))
            return error if error > max(COMPILED_NODE_FACTOR * rounding, COMPILED_NODE_FLOOR) else None

        low, high = 0, len(nodes) - 1  # the first differing node lies in [low, high]; high differs
        found = error_of(high) if nodes else None
        if found is None:
            return None
        while low < high:
            middle = (low + high) // 2
            error = error_of(middle)
            if error is None:
                low = middle + 1
            else:
                high, found = middle, error
        return nodes[high], found

    def compiler_step(self, path: str, module_error: float) -> tuple[str, str]:
        """The compiler step that makes module `path`'s difference, and what it is."""
        step, compiles = self.ask(CompilerBisection(path, good_below=COMPILED_SHARE * module_error))
        self.compiles += compiles
        if step is None:
            return self.backend, "no single compiler step: every backend and subsystem reproduced it, or none did alone"
        if step.subsystem is None:
            return step.backend, step.adds
        return f"{step.backend}, {step.subsystem}", f"applied to {step.applied_to}" if step.applied_to else ""


def _at_line(run: RunRecord, source: str, op: str | None, module: str) -> list[int]:
    """The reference's ops of `source`'s line (those named `op` in `module` where there are); for a
    reference in other code (a port), its ops in `module` whose canonical name ends `op`'s name."""
    at_line = [r for r in run.reference.ops if source and r.source == source]
    alike = [r for r in at_line if r.framework_op == op and r.module == module]
    if at_line:
        return [r.index for r in alike or at_line]
    name = (op or "").rpartition(".")[2]
    return [r.index for r in run.reference.ops if r.module == module and r.op == name]
