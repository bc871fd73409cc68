"""`torch.compile`'s primitives for the search inside a compiled module's call (`TorchAdapter.probe_compiled`,
`bisectr.search.compiled` decides from what they answer).

Every probe compiles afresh (`torch._dynamo.reset()` first, so no cached code or guard stands in)
with the module's own compile settings (its `dynamo_ctx`) and runs on the inputs the compiled module
was recorded with, against the same code run eagerly:
- a module compiled alone, the rest eager (the whole module, some of its modules kept eager);
- a module's graphs as dynamo captures them, one cut after a node and compiled: the node's compiled
  value, and its eager float32 value, against its eager float64 value;
- the lines the eager code executes (where a graph computes otherwise, the lines only it runs);
- `CompilerBisector` (eager -> aot_eager -> aot_eager_decomp_partition -> inductor, then inductor's
  subsystems and passes), for a module compiled by inductor.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
import sys
from typing import Any, Iterator

from .base import CompiledProbe, CompilerStep, GraphNode

# What each of `CompilerBisector`'s backends adds to the one before it.
_BACKEND_STEPS = {
    "eager": "dynamo's graph capture: the graph it traced computes otherwise",
    "aot_eager": "AOTAutograd's tracing and functionalization",
    "aot_eager_decomp_partition": "AOTAutograd with inductor's decompositions and partitioner",
    "inductor": "inductor's lowering and generated code",
}
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in \S+\n\s*(?P<code>[^\n]*)')


class TorchCompiledProbe(CompiledProbe):
    """`root` (the module as written) compiled with `settings` (dynamo's context), probed on `args`/`kwargs`."""

    def __init__(self, root: Any, settings: Any, args: tuple, kwargs: dict):
        self.root, self.settings, self.args, self.kwargs = root, settings, args, kwargs
        self.backend = _backend_name(settings)
        self.graphs: list[tuple[Any, list[Any]]] = []  # the last capture's graph modules and their example inputs
        # The graph `cuttable_nodes` was last asked of: its nodes' eager float32 and float64 values by name.
        self.node_values: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        with self._probing():
            self.eager = _floating(root(*args, **kwargs))

    @contextlib.contextmanager
    def _probing(self) -> Iterator[None]:
        """No gradients, and the root run eagerly unless a probe compiles it (`module.compile()` compiles in place)."""
        import torch

        compiled_in_place = self.root._compiled_call_impl
        self.root._compiled_call_impl = None
        try:
            with torch.no_grad():
                yield
        finally:
            self.root._compiled_call_impl = compiled_in_place

    def rounding(self) -> float:
        with self._probing():
            exact = _floating(copy.deepcopy(self.root).double()(*_double(self.args), **_double(self.kwargs)))
        return _error([t.double() for t in self.eager], exact)

    def called_children(self, path: str) -> list[str]:
        return [child_path for child_path, _ in _called_children(self.root.get_submodule(path), path)]

    def error_compiled(self, path: str, kept_eager: list[str]) -> tuple[float, bool]:
        from torch._dynamo.utils import counters

        module = self.root.get_submodule(path)
        with self._probing(), _kept_eager([self.root.get_submodule(name) for name in kept_eager]):
            counters.clear()
            error = _error(self._run_with(module, self._compile(module)), self.eager)
            # A frame dynamo skips (a forward under some decorators) runs eagerly whole, its submodules' code too.
            return error, counters["stats"]["unique_graphs"] > 0

    def capture_graphs(self, path: str) -> list[list[GraphNode]]:
        import torch

        module = self.root.get_submodule(path)
        self.graphs, self.node_values = [], {}

        def capture(gm, example_inputs):
            self.graphs.append((gm, list(example_inputs)))
            return gm.forward

        with self._probing():
            torch._dynamo.reset()
            self._run_with(module, torch.compile(module, backend=capture))
        return [[GraphNode(_node_name(node), *_source(node)) for node in gm.graph.nodes] for gm, _ in self.graphs]

    def cuttable_nodes(self, graph: int) -> list[int]:
        gm, inputs = self.graphs[graph]
        with self._probing():
            eager32 = _node_values(gm, inputs)
            try:
                eager64 = _node_values(copy.deepcopy(gm).double(), [_double(t) for t in inputs])
            except RuntimeError:  # a dtype the graph fixes (a cast to float32) meets float64 values: the floor judges
                eager64 = {name: _double(value) for name, value in eager32.items()}
        self.node_values = {graph: (eager32, eager64)}
        return [
            position
            for position, node in enumerate(gm.graph.nodes)
            if node.op != "placeholder" and _is_floating(eager32.get(node.name))
        ]

    def cut_error(self, graph: int, node: int) -> tuple[float, float]:
        gm, inputs = self.graphs[graph]
        eager32, eager64 = self.node_values[graph]
        last = list(gm.graph.nodes)[node]
        with self._probing():
            compiled = self._compile(_cut_after(gm, last))(*inputs)
        exact = eager64[last.name]
        return _error([compiled.double()], [exact]), _error([eager32[last.name].double()], [exact])

    def executed_lines(self, files: set[str]) -> set[str]:
        executed: set[str] = set()

        def lines(frame, event, arg):
            if event == "line":
                executed.add(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            return lines

        def calls(frame, event, arg):
            return lines if frame.f_code.co_filename in files else None

        with self._probing():
            sys.settrace(calls)
            try:
                self.root(*self.args, **self.kwargs)
            finally:
                sys.settrace(None)
        return executed

    def bisect_compiler(self, path: str, good_below: float) -> tuple[CompilerStep | None, int]:
        import torch
        from torch._inductor.compiler_bisector import CompilerBisector

        if self.backend != "inductor":
            return CompilerStep(self.backend, adds=_BACKEND_STEPS.get(self.backend, "")), 0
        module = self.root.get_submodule(path)
        tries = 0

        def good() -> bool:  # compiled as CompilerBisector sets inductor up for this try
            nonlocal tries
            torch._dynamo.reset()
            tries += 1
            return _error(self._run_with(module, torch.compile(module)), self.eager) < good_below

        with self._probing(), contextlib.redirect_stdout(io.StringIO()):
            found = CompilerBisector.do_bisect(good)
        torch._dynamo.reset()
        if found is None:
            return None, tries
        if found.subsystem is None:
            return CompilerStep(found.backend, adds=_BACKEND_STEPS.get(found.backend, "")), tries
        applied_to = _short_op(found.debug_info) if found.debug_info else ""
        return CompilerStep(found.backend, found.subsystem, applied_to), tries

    def modules_of_class(self, path: str) -> tuple[str, list[str]]:
        module = self.root.get_submodule(path)
        return type(module).__name__, [name for name, m in self.root.named_modules() if type(m) is type(module)]

    def _compile(self, module: Any) -> Any:
        """`module` compiled afresh as the recorded module is."""
        import torch

        torch._dynamo.reset()
        return torch._dynamo.eval_frame.OptimizedModule(module, self.settings)

    def _run_with(self, module: Any, replacement: Any) -> list[Any]:
        """The root's floating outputs with `module` (one of its modules, or itself) replaced by `replacement`."""
        if module is self.root:
            return _floating(replacement(*self.args, **self.kwargs))
        with _swapped(self.root, _path_of(self.root, module), replacement):
            return _floating(self.root(*self.args, **self.kwargs))


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

    own = {
        id(module): module.__dict__["forward"] for module in modules if "forward" in module.__dict__
    }  # a patched forward (accelerate's hooks)
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
