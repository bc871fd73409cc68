"""Inside a `torch.compile`d module: which of its modules' compiled code, which op of that module's
graph and which compiler step make a difference its eager code does not (`TorchAdapter.search_compiled`).

Every probe compiles afresh (`torch._dynamo.reset()` first, so no cached code or guard stands in)
with the module's own compile settings (its `dynamo_ctx`) and runs on the inputs the compiled module
was recorded with, against the same code run eagerly:
- where: the module's children compiled one at a time, the rest eager; the first child whose
  compiled code alone makes the difference is searched the same way, down to a module none of
  whose children does (the compiled code of several modules together, or of its own code);
- the op: that module's graphs as dynamo captures them, cut after one node and compiled, in a
  binary search for the first node whose compiled value leaves what rounding makes (its eager
  float32 value against float64); where none does, the graph itself computes otherwise: the first
  node on a line the eager code never runs;
- why: `CompilerBisector` (eager -> aot_eager -> aot_eager_decomp_partition -> inductor, then
  inductor's subsystems and passes), for a module compiled by inductor;
- the proof: the compiled module again, every module of the culprit's class left eager.
"""
from __future__ import annotations

import contextlib
import copy
import io
import re
import sys
import time
from typing import Any, Iterator

from .base import InCompiled

# A probe's difference counts as the module's when it reaches this share of the whole module's.
_SHARE = 0.1
# Confirmed: with the culprit's class eager, the compiled module's error within this many times its
# eager rounding, or below this share of its difference.
_CONFIRMED_ROUNDING = 10
_CONFIRMED_SHARE = 0.01
# A node's compiled value differs where it leaves its eager rounding this many times over.
_ROUNDING_FACTOR = 100
_FLOOR = 1e-5
# What each of `CompilerBisector`'s backends adds to the one before it.
_BACKEND_STEPS = {"eager": "dynamo's graph capture: the graph it traced computes otherwise",
                  "aot_eager": "AOTAutograd's tracing and functionalization",
                  "aot_eager_decomp_partition": "AOTAutograd with inductor's decompositions and partitioner",
                  "inductor": "inductor's lowering and generated code"}
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in \S+\n\s*(?P<code>[^\n]*)')


def search_compiled(module: Any, settings: Any, args: tuple, kwargs: dict) -> InCompiled:
    """Where `module` compiled with `settings` (dynamo's context) differs from its eager self, called on `args`/`kwargs`."""
    import torch

    compiled_in_place = module._compiled_call_impl
    module._compiled_call_impl = None  # `module.compile()`: the module runs eagerly unless the search compiles it
    try:
        with torch.no_grad():
            return _Search(module, settings, args, kwargs).run()
    finally:
        module._compiled_call_impl = compiled_in_place


class _Search:
    def __init__(self, root: Any, settings: Any, args: tuple, kwargs: dict):
        self.root, self.settings, self.args, self.kwargs = root, settings, args, kwargs
        self.eager = _floating(root(*args, **kwargs))
        self.compiles = 0
        self.started = time.monotonic()

    def run(self) -> InCompiled:
        whole = self.error_alone(self.root)
        path, module, module_error = self.culprit_module(whole)
        op, source, code, op_error, other_path = self.culprit_op(module)
        step, detail = self.compiler_step(module, module_error)
        eager_modules = [] if module is self.root else [name for name, m in self.root.named_modules() if type(m) is type(module)]
        confirmed_error = self.error_kept_eager([self.root.get_submodule(name) for name in eager_modules]) if eager_modules else 0.0
        rounding = self.rounding()
        return InCompiled(path, type(module).__name__, whole, module_error, op, source, code, op_error, other_path, step, detail,
                          eager_modules, confirmed_error, rounding,
                          confirmed=bool(eager_modules) and confirmed_error <= max(_CONFIRMED_ROUNDING * rounding, _CONFIRMED_SHARE * whole),
                          compiles=self.compiles, seconds=round(time.monotonic() - self.started, 1),
                          backend=_backend_name(self.settings))

    # -- probes ------------------------------------------------------------------------------------
    def compile(self, module: Any) -> Any:
        """`module` compiled afresh as the recorded module is."""
        import torch

        torch._dynamo.reset()
        self.compiles += 1
        return torch._dynamo.eval_frame.OptimizedModule(module, self.settings)

    def run_with(self, module: Any, replacement: Any) -> list[Any]:
        """The root's floating outputs with `module` (one of its modules, or itself) replaced by `replacement`."""
        if module is self.root:
            return _floating(replacement(*self.args, **self.kwargs))
        with _swapped(self.root, _path_of(self.root, module), replacement):
            return _floating(self.root(*self.args, **self.kwargs))

    def error_alone(self, module: Any) -> float:
        """The root's difference from its eager self with only `module` compiled."""
        return _error(self.run_with(module, self.compile(module)), self.eager)

    def captured_alone(self, module: Any) -> tuple[float, bool]:
        """`error_alone`, and whether dynamo captured any graph of `module`'s code (a frame it skips, such as
        a forward under some decorators, is run eagerly whole, its submodules' code too)."""
        from torch._dynamo.utils import counters

        counters.clear()
        error = self.error_alone(module)
        return error, counters["stats"]["unique_graphs"] > 0

    def error_kept_eager(self, eager: list[Any]) -> float:
        """The root's difference from its eager self compiled whole, `eager` modules kept eager."""
        with _kept_eager(eager):
            return self.error_alone(self.root)

    def culprit_module(self, whole: float) -> tuple[str, Any, float]:
        """The deepest module whose compiled code alone makes the difference (the root where no child's does).
        A child that compiled alone captures no graph says nothing of its own children, which are tried in its place."""
        path, module, error = "", self.root, whole
        while True:
            children = list(_called_children(module, path))
            while children:
                child_path, child = children.pop(0)
                child_error, captured = self.captured_alone(child)
                if child_error >= _SHARE * whole:
                    path, module, error = child_path, child, child_error
                    break
                if not captured:
                    children[:0] = _called_children(child, child_path)
            else:
                return path, module, error

    def culprit_op(self, module: Any) -> tuple[str | None, str, str, float | None, bool]:
        """The first node of the module's captured graphs whose compiled value differs beyond rounding;
        else the first on a line its eager run never executes (and True)."""
        import torch

        graphs: list[tuple[Any, list[Any]]] = []

        def capture(gm, example_inputs):
            graphs.append((gm, list(example_inputs)))
            return gm.forward

        torch._dynamo.reset()
        self.run_with(module, torch.compile(module, backend=capture))
        for gm, inputs in graphs:
            found = self.first_differing_node(gm, inputs)
            if found is not None:
                node, error = found
                source, code = _source(node)
                return _node_name(node), source, code, error, False
        # No node's compiled value differs from the graph's own eager run: the graph itself computes
        # something else, where dynamo traced a path the eager code does not take.
        executed = self.executed_lines(module, {_source(n)[0].rpartition(":")[0] for gm, _ in graphs for n in gm.graph.nodes})
        for gm, _ in graphs:
            for node in gm.graph.nodes:
                source, code = _source(node)
                if source and source not in executed:
                    return _node_name(node), source, code, None, True
        return None, "", "", None, False

    def executed_lines(self, module: Any, files: set[str]) -> set[str]:
        """The "path:line"s of `files` that the module's eager run executes."""
        executed: set[str] = set()

        def lines(frame, event, arg):
            if event == "line":
                executed.add(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            return lines

        def calls(frame, event, arg):
            return lines if frame.f_code.co_filename in files else None

        sys.settrace(calls)
        try:
            self.root(*self.args, **self.kwargs)
        finally:
            sys.settrace(None)
        return executed

    def first_differing_node(self, gm: Any, inputs: list[Any]) -> tuple[Any, float] | None:
        eager32 = _node_values(gm, inputs)
        try:
            eager64 = _node_values(copy.deepcopy(gm).double(), [_double(t) for t in inputs])
        except RuntimeError:  # a dtype the graph fixes (a cast to float32) meets float64 values: the floor judges
            eager64 = {name: _double(value) for name, value in eager32.items()}
        nodes = [n for n in gm.graph.nodes if n.op != "placeholder" and _is_floating(eager32.get(n.name))]

        def error_of(index: int) -> float | None:
            node = nodes[index]
            compiled = self.compile(_cut_after(gm, node))(*inputs)
            exact, rounded = eager64[node.name], eager32[node.name]
            rounding = _error([rounded.double()], [exact])
            error = _error([compiled.double()], [exact])
            return error if error > max(_ROUNDING_FACTOR * rounding, _FLOOR) else None

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

    def compiler_step(self, module: Any, module_error: float) -> tuple[str, str]:
        """The compiler backend and, for inductor, the subsystem and pass that make the module's difference."""
        import torch
        from torch._inductor.compiler_bisector import CompilerBisector

        backend = _backend_name(self.settings)
        if backend != "inductor":
            return backend, _BACKEND_STEPS.get(backend, "")

        def good() -> bool:  # compiled as CompilerBisector sets inductor up for this try
            torch._dynamo.reset()
            self.compiles += 1
            return _error(self.run_with(module, torch.compile(module)), self.eager) < _SHARE * module_error

        with contextlib.redirect_stdout(io.StringIO()):
            found = CompilerBisector.do_bisect(good)
        torch._dynamo.reset()
        if found is None:
            return "inductor", "no single compiler step: every backend and subsystem reproduced it, or none did alone"
        if found.subsystem is None:
            return found.backend, _BACKEND_STEPS.get(found.backend, "")
        return f"{found.backend}, {found.subsystem}", f"applied to {_short_op(found.debug_info)}" if found.debug_info else ""

    def rounding(self) -> float:
        """The eager module's own rounding: its float32 outputs against a float64 copy's."""
        exact = _floating(copy.deepcopy(self.root).double()(*_double(self.args), **_double(self.kwargs)))
        return _error([t.double() for t in self.eager], exact)


# -- helpers -----------------------------------------------------------------------------------------
def _floating(outputs: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(outputs) if _is_floating(t)]


def _is_floating(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _double(value: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.double() if _is_floating(t) else t, value)


def _error(outputs: list[Any], expected: list[Any]) -> float:
    """The largest difference of `outputs` from `expected`, relative to the largest magnitude of each."""
    worst = 0.0
    for got, want in zip(outputs, expected, strict=True):
        scale = want.abs().max().item() if want.numel() else 0.0
        difference = (got.to(want.dtype) - want).abs().max().item() if want.numel() else 0.0
        worst = max(worst, difference / scale if scale else difference)
    return worst


def _called_children(module: Any, path: str) -> Iterator[tuple[str, Any]]:
    """`module`'s submodules that are called (a container's items in its place), in order."""
    import torch

    for name, child in module.named_children():
        child_path = f"{path}.{name}" if path else name
        if type(child).forward is torch.nn.Module.forward:  # ModuleList, ModuleDict: never called
            yield from _called_children(child, child_path)
        else:
            yield child_path, child


def _path_of(root: Any, module: Any) -> str:
    return next(name for name, m in root.named_modules() if m is module)


@contextlib.contextmanager
def _swapped(root: Any, path: str, replacement: Any) -> Iterator[None]:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path)
    original = parent._modules[name]
    parent._modules[name] = replacement
    try:
        yield
    finally:
        parent._modules[name] = original


@contextlib.contextmanager
def _kept_eager(modules: list[Any]) -> Iterator[None]:
    """`modules` run eagerly inside compiled code (dynamo breaks the graph at each call)."""
    import torch

    own = {id(module): module.__dict__["forward"] for module in modules if "forward" in module.__dict__}  # a patched forward (accelerate's hooks)
    for module in modules:
        module.forward = torch._dynamo.disable(module.forward)
    try:
        yield
    finally:
        for module in modules:
            if id(module) in own:
                module.forward = own[id(module)]
            else:
                del module.forward


def _node_values(gm: Any, inputs: list[Any]) -> dict[str, Any]:
    """Every node's value by name, `gm` run eagerly node by node."""
    import torch
    import torch.fx

    values: dict[Any, Any] = {}

    class Keeping(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if not (isinstance(result, torch.Tensor) and torch._C._functorch.is_batchedtensor(result)):
                values[node.name] = result  # a value inside an inlined vmap cannot be read once it has run
            return result

    Keeping(gm).run(*inputs)
    return values


def _cut_after(gm: Any, last: Any) -> Any:
    """A copy of `gm` ending at node `last`, whose value it returns."""
    import torch.fx

    graph = torch.fx.Graph()
    copies: dict[Any, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        copies[node] = graph.node_copy(node, lambda n: copies[n])
        if node is last:
            break
    graph.output(copies[last])
    return torch.fx.GraphModule(gm, graph)


def _node_name(node: Any) -> str:
    from torch.overrides import resolve_name

    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return str(node.target)
    if getattr(node.target, "__module__", None) == "_operator":  # `x * y` in the model's code
        return f"Tensor.{node.target.__name__}"
    name = resolve_name(node.target) or getattr(node.target, "__name__", str(node.target))
    return name.removeprefix("torch.")


def _source(node: Any) -> tuple[str, str]:
    """The "path:line" and code of the model's line the node was traced from ("" where dynamo kept none)."""
    frames = list(_FRAME.finditer(node.meta.get("stack_trace") or ""))
    if not frames:
        return "", ""
    last = frames[-1]
    return f"{last['path']}:{last['line']}", last["code"].strip()


def _short_op(debug_info: str) -> str:
    """`<OpOverload(op='aten.mean', overload='dim')>` -> `aten.mean.dim`."""
    found = re.search(r"op='([^']+)', overload='([^']+)'", debug_info)
    return f"{found[1]}.{found[2]}" if found else debug_info


def _backend_name(settings: Any) -> str:
    backend = settings.callback
    while hasattr(backend, "_torchdynamo_orig_backend"):
        backend = backend._torchdynamo_orig_backend
    return getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None) or type(backend).__name__
