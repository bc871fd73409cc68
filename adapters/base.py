"""The narrow interface every framework adapter implements, and the optional ones it may.

An adapter knows how to talk to one framework and nothing about traces. The
core records, re-runs with patches, replays ops and checks them in float64 using
only the methods of `Adapter` (its facets `Tensors`, `Interception`, `Autograd`,
`Models`), the way einops' backends hide each framework behind a few primitives.
A new framework is one module of this package with one `Adapter` subclass;
tests/test_adapters.py is the conformance test every adapter passes.

More interfaces are optional: `Training` (`bisectr train`), `WeightConversion`
(`bisectr.weights`), `Determinism` (`bisectr.search.repeat`) and `CompiledGraphs`. An adapter that
implements one also subclasses it, and a caller asks for it by type with `facet(adapter, Training)`.
"""

from __future__ import annotations

import itertools
import os
import sys
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

import numpy as np


class OpListener(Protocol):
    """What an adapter reports to while intercepting a forward pass."""

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Handle one outermost framework API call; must call `fn(*args, **kwargs)` (or a substitute)."""

    def enter_module(self, path: str) -> None:
        """A module (layer) at `path` starts its forward."""

    def exit_module(self) -> None:
        """The innermost module's forward ended (also when it raised)."""

    def adopt_root(self, module: Any, prefix: str) -> None:
        """Optional. A module outside the side's model starts its forward (the side is a function
        calling it): its parameters and buffers are named under `prefix` (see `ModulePaths`)."""


# Tensor methods that bring a tensor's values into Python (`t.item()`, `if t:`). A value read this
# way is baked into the calls recorded after it, so the recorder counts them.
VALUE_READ_METHODS = (
    "item",
    "tolist",
    "numpy",
    "__bool__",
    "__nonzero__",
    "__float__",
    "__int__",
    "__index__",
    "__complex__",
    "__array__",
    "__format__",
    "__contains__",
)
TENSOR_VALUE_READS = frozenset(f"Tensor.{method}" for method in VALUE_READ_METHODS)


# What a frame of the framework's own code is to an op's source line, where no user code called
# the op (`Adapter.frame_role`):
CALLER = 0  # code that calls the op: a layer's forward; the innermost such frame is the source
API = 1  # a public function passing the call on to its op (functional, tensor methods): the source only where no
# CALLER frame is on the stack
PLUMBING = 2  # hooks, decorators, dispatch: never the source


class ModulePaths:
    """Module (layer) paths by object identity, as `named_modules` gives them. Seeded from the
    side's model when it is a module; a module not known when it starts its forward (the side is
    a function calling a model, or the forward builds a module) is adopted as a root with all its
    submodules: the first root unprefixed, as a side's model is, a later one prefixed by its
    class name. Adopted roots are kept alive while this object lives, so that ids stay theirs."""

    def __init__(
        self,
        named_modules: Callable[[Any], Iterable[tuple[str, Any]]],
        model: Any = None,
        on_root: Callable[[Any, str], None] | None = None,
    ):
        self._named_modules = named_modules
        self._on_root = on_root
        self._paths: dict[int, tuple[Any, str]] = {}  # id(module) -> (module, path)
        self._rooted = False
        if model is not None:
            self._adopt(model)

    def path(self, module: Any) -> str:
        entry = self._paths.get(id(module))
        if entry is None or entry[0] is not module:
            return self._adopt(module)
        return entry[1]

    def _adopt(self, root: Any) -> str:
        prefix = type(root).__name__ if self._rooted else ""
        self._rooted = True
        paths = self._paths
        for name, module in self._named_modules(root):
            path = f"{prefix}.{name}" if prefix and name else (prefix or name)
            entry = paths.get(id(module))
            if entry is None or entry[0] is not module:  # a module already known keeps its path
                paths[id(module)] = (module, path)
        entry = paths.get(id(root))
        if self._on_root is not None:
            self._on_root(root, prefix)
        return prefix if entry is None else entry[1]


class CannotUpcast(Exception):
    """The model cannot be run in float64 as a whole; the message says why."""


@dataclass(frozen=True)
class ReproSnippets:
    """The framework's side of a standalone repro script (`bisectr.present.repro`), as Python source."""

    imports: str  # "import torch"
    to_tensor: str  # an expression: a tensor of dtype name `dtype` from numpy array `a`
    to_numpy: str  # an expression: tensor `t` as a float64 numpy array
    requiring_grad: str  # a statement: tensor `t` requires a gradient
    gradients: str  # an expression: the gradients of `inputs` from `outputs` seeded with `upstream`


@dataclass(frozen=True)
class Reductions:
    """What a tensor's statistics are made of, reduced by the framework where the tensor lives
    (`Tensors.reductions`): over its finite values (complex: their magnitudes), in float64."""

    low: float
    high: float
    total: float
    squares: float  # the sum of the squares
    finite: int
    nan: int
    inf: int
    picked: list[float]  # the values at the fingerprint's positions (complex: real parts)


# The op a compiled module's call is recorded as: the compiler runs its code as one graph.
COMPILED_OP = "compiled"


# Layouts of a linear layer's weight matrix.
OUT_IN = "(out, in)"
IN_OUT = "(in, out)"

# Every concrete `Adapter` subclass, in the order defined (see `bisectr.adapters`).
REGISTERED: list[type["Adapter"]] = []


class Tensors(ABC):
    """Tensors: telling them apart, their values and where they live."""

    tensor_class: tuple[str, str] = ("", "")  # (module, class name) of the framework's tensors
    _tensor_types: tuple[type, ...] = ()

    def owns(self, obj: Any) -> bool:
        """Is `obj` a model, layer or tensor of this framework? Must not import the framework."""
        return self.is_module(obj) or self.is_tensor(obj)

    def is_tensor(self, obj: Any) -> bool:
        """Is `obj` a tensor of this framework? Called on every argument of every op, so the
        class is looked up once, as soon as the framework has been imported (never importing it)."""
        if not self._tensor_types:
            module, name = self.tensor_class
            tensor_type = getattr(sys.modules.get(module), name, None)
            if tensor_type is None:
                return False
            self._tensor_types = (tensor_type,)
        return isinstance(obj, self._tensor_types)

    @abstractmethod
    def to_numpy(self, tensor: Any) -> np.ndarray:
        """A host copy of the values (bfloat16 widened to float32)."""

    def unreadable(self, tensor: Any) -> str | None:
        """What the tensor is, where bisectr cannot read its values as one array (a tensor subclass that
        holds them elsewhere, such as a DTensor); None for a tensor it reads."""
        return None

    def on_host(self, tensor: Any) -> bool:
        """Does the tensor live in host memory, where `to_numpy` reads it without a copy? If not, a
        recording describes it with `reductions`, computed where it lives."""
        return True

    def reductions(self, tensor: Any, positions: np.ndarray) -> Reductions:
        """The reductions of the tensor's statistics and its values at the flat `positions`, computed by
        the framework where the tensor lives: only these numbers are copied to the host."""
        raise NotImplementedError

    @abstractmethod
    def from_numpy(self, values: np.ndarray, dtype: str, device: str, layout: Any = None) -> Any:
        """A new tensor of the given framework dtype name on the given device; with a `layout` (see
        `layout`), spread over the processes as it says, each holding its part of `values`."""

    def like(self, tensor: Any, values: np.ndarray) -> Any:
        """A new tensor of `values` held as `tensor` is: its dtype, its device, its spread over processes."""
        return self.from_numpy(values, self.dtype_name(tensor), self.device_name(tensor), self.layout(tensor))

    def hold_whole(self, model: Any) -> None:
        """Keep a model whose data-parallel wrapping shards its parameters (FSDP2) holding them whole from now on,
        gathered once and never freed: every run of its forward then reads the same parameter tensors, which
        bisectr names and reads back. A model held whole already is left as it is."""

    def full_precision(self, model: Any) -> None:
        """Drop the mixed precision a data-parallel wrapper was given (FSDP2's `MixedPrecisionPolicy`), before the
        model's first forward: a float64 copy of it then computes and reduces its gradients in float64."""

    def layout(self, tensor: Any) -> Any:
        """How the tensor's values are spread over processes (a DTensor's mesh and placements), for
        `from_numpy` to make another tensor of the same global shape spread the same way (a partial
        sum's processes each keep their part of this one, moved by an even share of the difference);
        None for a tensor held whole."""
        return None

    def placement(self, tensor: Any) -> str | None:
        """How a distributed tensor's values are placed over the processes, as the framework writes it
        ("Shard(dim=0)", "Partial(sum)"); None for a plain tensor."""
        return None

    def sharded(self, tensor: Any) -> bool:
        """Does each process hold only a part of the tensor (a shard)?"""
        return False

    def replicated(self, tensor: Any) -> bool:
        """Does the framework hold that every process has the same values of this distributed tensor (a
        DTensor placed `Replicate()` on every dimension of its mesh)? False for a plain tensor."""
        return False

    def reduced_over_ranks(self, tensor: Any, how: str) -> Any:
        """A replicated distributed tensor whose processes hold different values, made one: each process's
        values summed ("sum") or averaged ("mean") over its mesh, placed as it was. A collective: every process
        calls it at the same point. What a reduction the model left out would have made of a gradient each
        process holds its own part of. A plain tensor is returned as it is."""
        return tensor

    def shared_numpy(self, tensor: Any) -> np.ndarray:
        """The values every process of a distributed run takes the tensor to hold: a distributed
        tensor's global values, a plain one's as the first process holds it (each may hold its own:
        a shard). A collective where there are several processes: every one calls it at the same op.
        One process: `to_numpy`."""
        return self.to_numpy(tensor)

    @abstractmethod
    def dtype_name(self, tensor: Any) -> str:
        """Framework-neutral dtype name: 'float32', 'bfloat16', 'int64', 'bool', ..."""

    @abstractmethod
    def device_name(self, tensor: Any) -> str: ...

    @abstractmethod
    def version(self, tensor: Any) -> int:
        """A counter that changes when the tensor is modified in place."""

    @abstractmethod
    def data_address(self, tensor: Any) -> int:
        """The address of the tensor's first element: a view's lies inside the memory of what it views."""

    @abstractmethod
    def assign(self, tensor: Any, values: np.ndarray) -> None:
        """Overwrite the tensor's values in place."""

    @abstractmethod
    def named_leaves(self, model: Any) -> Iterator[tuple[str, Any]]:
        """('param:NAME' | 'buffer:NAME', tensor) for the model's parameters and buffers."""

    def describe(self, model: Any, inputs: list[Any]) -> tuple[str, str]:
        """(device, dtype) of the model: its first floating parameter, else its first input."""
        tensors = itertools.chain(
            (tensor for _, tensor in self.named_leaves(model)), (x for x in inputs if self.is_tensor(x))
        )
        chosen = None
        for tensor in tensors:  # stops at the first floating one: a large model's parameters are not all walked
            if self.dtype_name(tensor).startswith(("float", "bfloat", "complex")):
                chosen = tensor
                break
            chosen = tensor if chosen is None else chosen
        if chosen is None:
            return "unknown", "unknown"
        return self.device_name(chosen), self.dtype_name(chosen)


class Interception(ABC):
    """Running a model with every op call and module entry handed to a listener, and naming what ran."""

    # The framework's op names (the last dotted part, in-place and dunder spellings folded) that the
    # shared op vocabulary spells otherwise: "elementwise_add" -> "add" (see `bisectr.capture.ops`).
    op_synonyms: dict[str, str] = {}
    value_reads: frozenset[str] = TENSOR_VALUE_READS  # names of the calls that read values into Python
    # Messages of warnings the framework prints as it is imported, which say nothing about the model.
    import_warnings: tuple[str, ...] = ()

    @abstractmethod
    def intercept(self, model: Any, listener: OpListener, gradients: bool = False) -> AbstractContextManager:
        """While active, route every outermost op call and module entry/exit to `listener`, with
        gradients off (on, for a backward re-run, with `gradients`). A custom autograd function
        (torch `autograd.Function`, paddle `PyLayer`) is one op: its backward is its own. Everything
        it installs is removed on exit, also after an exception."""

    @abstractmethod
    def no_grad(self) -> AbstractContextManager:
        """Gradients off, nothing intercepted: for re-executing recorded calls."""

    def is_compiled_function(self, model: Any) -> bool:
        """Is `model` a function a compiler runs as one graph (whose tensors bisectr cannot reach)?"""
        return False

    @abstractmethod
    def internal_paths(self) -> tuple[str, ...]:
        """Directories of the framework's own Python code (not user source)."""

    def frame_role(self, filename: str, function: str) -> int:
        """`CALLER`, `API` or `PLUMBING`: what a frame running `function` of `filename` (a file
        under `internal_paths()`) is to the source line of an op no user code called. Asked once
        per code object."""
        return CALLER

    def _relative(self, filename: str) -> str:
        """`filename` relative to the directory of the framework's internal path holding it, '/'-separated."""
        for directory in self.internal_paths():
            if filename.startswith(directory):
                return filename[len(directory) :].replace(os.sep, "/")
        return filename

    def input_layout(self, op: str, position: int) -> tuple[int, ...] | None:
        """The permutation that brings input `position` of canonical op `op` from this
        framework's storage layout to the shared one (None: already shared)."""
        return None


class Autograd(ABC):
    """Gradients (what the backward pass needs, see `bisectr.search.backward`) and float64 runs."""

    @abstractmethod
    def enable_grad(self) -> AbstractContextManager:
        """Gradients on, nothing intercepted: for replaying one op's backward."""

    @abstractmethod
    def requires_grad(self, tensor: Any) -> bool:
        """Does a gradient reach this tensor (is it part of the autograd graph)?"""

    @abstractmethod
    def gradient_leaf(self, tensor: Any) -> Any:
        """A new leaf tensor with the values of `tensor`, requiring a gradient."""

    @abstractmethod
    def add_gradient_hook(self, tensor: Any, hook: Callable[[Any], Any]) -> None:
        """Call `hook(gradient)` when the whole gradient of `tensor` is known; what it returns
        (unless None) is handed on instead. The gradient may be None where none reaches the tensor
        (paddle: batch norm's statistics; torch: an output whose readers detach it)."""

    @abstractmethod
    def gradients(self, outputs: list[Any], upstream: list[Any], inputs: list[Any]) -> list[Any | None]:
        """The gradients of `inputs` (None where none reaches one) from `outputs` seeded with
        `upstream`, without touching any tensor's `.grad`."""

    def float64_model(self, model: Any) -> Any:
        """A copy of the model with every floating parameter and buffer in float64 (the model
        itself is left as it is: its recording refers to its tensors). Raises `CannotUpcast`."""
        raise CannotUpcast(f"the {self.name} adapter cannot run models in float64")

    def float64_tensor(self, tensor: Any, into: Any = None) -> Any:
        """A float64 copy of a floating tensor, cast into `into` where the framework can (a float64
        tensor of its shape on its device that nothing reads any more) and returned: a new large
        tensor costs the operating system's fresh pages, often more than the cast."""
        raise CannotUpcast(f"the {self.name} adapter cannot run models in float64")

    def cast(self, tensor: Any, dtype: str) -> Any:
        """`tensor` as the dtype named `dtype` (a new tensor, gradients passing through the cast): what a
        float64 run's op that runs at its recorded dtypes reads and gives (`interpreter.Float64Calls`)."""
        raise CannotUpcast(f"the {self.name} adapter cannot run models in float64")

    def narrowing_dtypes(self) -> tuple[tuple[Any, ...], Any]:
        """(its dtype objects below float64: float32, float16, bfloat16; its float64), for `float64_call`."""
        return (), None

    def float64_call(
        self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict
    ) -> tuple[Callable[..., Any], tuple, dict]:
        """Op `name` as a float64 run makes it: a cast down to float32, bfloat16 or float16 (a cast
        op, a dtype argument, also in a dict of options) kept at float64."""
        narrow, float64 = self.narrowing_dtypes()
        dtype_type = type(float64)

        def holds_dtype(value: Any) -> bool:
            return isinstance(value, dtype_type) or isinstance(value, dict) and any(map(holds_dtype, value.values()))

        if not narrow or not any(map(holds_dtype, (*args, *kwargs.values()))):
            return fn, args, kwargs  # the usual op: no dtype argument

        def widened(value: Any) -> Any:
            if isinstance(value, dict):
                return {key: widened(item) for key, item in value.items()}
            return float64 if isinstance(value, dtype_type) and value in narrow else value

        return fn, tuple(widened(a) for a in args), {key: widened(value) for key, value in kwargs.items()}

    def float64_defaults(self) -> AbstractContextManager:
        """While active, tensors created without a dtype are float64."""
        return nullcontext()


class Models(ABC):
    """The framework's models (modules, layers): what they are called, telling them apart from other
    objects, and what their BatchNorm statistics hold (see `bisectr.measure.leaves`)."""

    module_kind: str = ""  # what its models are called: "torch.nn.Module"
    # Its BatchNorm layers' names for their running statistics -> what they hold ("mean", "variance", "count").
    norm_statistics: dict[str, str] = {}

    def is_module(self, obj: Any) -> bool:
        """Is `obj` a model (module, layer) of this framework? Must not import the framework."""
        return False


class Adapter(Tensors, Interception, Autograd, Models):
    """One framework behind the interface the core uses, in facets: `Tensors`, `Interception`,
    `Autograd`, `Models`. A subclass with a `name` registers itself."""

    name: str = ""
    repro: ReproSnippets | None = None  # None: no standalone repro scripts for this framework

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            REGISTERED.append(cls)


class Training(ABC):
    """Optional: training steps (see `bisectr.training`), for an `Adapter` that also subclasses this."""

    @abstractmethod
    def copy_model(self, model: Any) -> Any:
        """A copy of the model to train (the model itself stays as recorded). Raises `CannotUpcast`."""

    @abstractmethod
    def clear_gradients(self, optimizer: Any) -> None:
        """Drop the gradients the optimizer's parameters hold."""

    def copy_values(self, into: Any, source: Any) -> None:
        """Copy `source`'s values into the parameter or buffer `into` (of the same shape and placement), cast to
        its dtype. Raises `CannotUpcast` where the framework cannot (a side it does not train on several processes)."""
        raise CannotUpcast(f"bisectr does not train {self.name} models on several processes")

    def waits_for_every_gradient(self, model: Any) -> bool:
        """Does the model's data-parallel wrapping wait, in the backward, for a gradient of every parameter on
        every rank (DDP without `find_unused_parameters`)? A rank whose forward leaves one out then hangs."""
        return False

    def unreached(self, loss: Any, parameters: dict[str, Any]) -> list[str]:
        """The names of `parameters` (name -> tensor) that the backward of `loss` would give no gradient."""
        return []

    def gathered(self, value: Any) -> list[Any]:
        """`value` from every rank of this process's group, by rank (a collective every rank runs)."""
        return [value]

    def snapshot(self, tensor: Any) -> Any:
        """A copy of the tensor's values as the model holds them (a shard stays a shard)."""
        return tensor.detach().clone()

    def backward(self, loss: Any) -> None:
        """Accumulate the gradients of `loss` into the parameters (torch and paddle spell it alike)."""
        loss.backward()

    def gradient(self, parameter: Any) -> np.ndarray | None:
        """The gradient a parameter holds (None: none)."""
        return None if parameter.grad is None else self.to_numpy(parameter.grad)

    def optimizer_step(self, optimizer: Any, scheduler: Any | None) -> None:
        """One optimizer step, then one step of its learning-rate scheduler."""
        optimizer.step()
        if scheduler is not None:
            scheduler.step()

    def optimizer_moments(self, optimizer: Any, parameter: Any) -> dict[str, np.ndarray]:
        """An Adam-style optimizer's moments of one parameter under shared names ("moment1",
        "moment2"); empty for an optimizer without them or before its first step."""
        return {}

    @abstractmethod
    def learning_rate(self, optimizer: Any) -> float:
        """The learning rate the optimizer's next step uses."""

    @abstractmethod
    def optimizer_settings(self, optimizer: Any) -> dict[str, Any]:
        """The optimizer's settings under shared names: optimizer, epsilon, beta1, beta2,
        weight_decay, weight_decay_kind ("decoupled" | "coupled (L2)" | None), amsgrad, gradient_clipping."""

    @abstractmethod
    def weight_decays(self, optimizer: Any, parameters: dict[str, Any]) -> dict[str, float]:
        """The weight decay coefficient the optimizer applies to each of `parameters` (name ->
        tensor), read from its parameter groups and exemption rules (0 for an exempt one)."""


class WeightConversion(ABC):
    """Optional: a model's weights by the layers holding them, for copying weights between frameworks
    (see `bisectr.weights`), for an `Adapter` that also subclasses this."""

    linear_layout: str = OUT_IN  # how its nn.Linear stores `weight`
    # Model libraries' layers that are linear layers but not nn.Linear: (top-level package, class name) -> layout.
    library_linears: dict[tuple[str, str], str] = {}

    @abstractmethod
    def named_modules(self, root: Any) -> Iterator[tuple[str, Any]]:
        """Every module under `root` (itself as ""), shared ones under each of their names."""

    @abstractmethod
    def linear_class(self) -> type:
        """Its nn.Linear."""

    def batch_norm_classes(self) -> tuple[type, ...]:
        """Its BatchNorm layers."""
        return ()

    def named_tensors(self, root: Any, persistent_only: bool = False) -> list[tuple[str, Any]]:
        """Every parameter and buffer under `root` by name, tied ones under each of their names;
        `persistent_only` leaves out the buffers its state dict does not hold (torch and paddle spell it alike)."""
        tensors = [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]
        if persistent_only:
            persistent = set(root.state_dict())
            tensors = [(name, tensor) for name, tensor in tensors if name in persistent]
        return tensors

    def weight_layout(self, owner: Any, local: str) -> str | None:
        """`OUT_IN` / `IN_OUT` for the weight matrix `local` of a linear layer `owner` (its own
        nn.Linear, or a model library's layer that is one), decided by the owner's type; None else."""
        if local != "weight":
            return None
        if isinstance(owner, self.linear_class()):
            return self.linear_layout
        kind = type(owner)
        return self.library_linears.get((kind.__module__.partition(".")[0], kind.__name__))

    def norm_statistic(self, owner: Any, local: str) -> str | None:
        """What the running statistic `local` of a BatchNorm layer `owner` holds (its adapter's
        `Models.norm_statistics`); None for anything else."""
        statistic = self.norm_statistics.get(local)
        return statistic if statistic is not None and isinstance(owner, self.batch_norm_classes()) else None


@dataclass(frozen=True)
class GraphNode:
    """A node of a compiled module's graph, as its compiler captured it (`CompiledProbe.capture_graphs`)."""

    op: str  # named as the adapter names recorded ops ("Tensor.mul", "nn.functional.gelu")
    source: str  # "path:line" of the model's code it was traced from ("" where the compiler kept none)
    code: str


@dataclass(frozen=True)
class CompilerStep:
    """A step of a compiler (`CompiledProbe.bisect_compiler`): a backend, or one of its subsystems."""

    backend: str
    subsystem: str | None = None  # the backend's subsystem, where the bisection narrowed it to one
    applied_to: str = ""  # the op the subsystem was applied to ("aten.mean.dim"), where the compiler names one
    adds: str = ""  # what the backend adds to the one before it, for a step that is a whole backend


class CompiledProbe(ABC):
    """One compiled module's call, probed on the inputs it was recorded with (`CompiledGraphs.probe_compiled`).
    Modules are named by path from the compiled module ("": itself). Each probe that compiles does so once,
    afresh, with the call's own compiler settings. Errors are relative (the largest difference over the
    largest magnitude, of each output); an error of the compiled module is its outputs against its eager ones."""

    backend: str  # the compiler backend's name

    @abstractmethod
    def rounding(self) -> float:
        """The eager module's own rounding: its float32 outputs against a float64 copy's."""

    @abstractmethod
    def called_children(self, path: str) -> list[str]:
        """The paths of module `path`'s submodules that are called, in order (a container's items in its place)."""

    @abstractmethod
    def error_compiled(self, path: str, kept_eager: list[str]) -> tuple[float, bool]:
        """The error with only module `path` compiled, the modules `kept_eager` run eagerly inside it; and
        whether the compiler captured any graph of the code it compiled."""

    @abstractmethod
    def capture_graphs(self, path: str) -> list[list[GraphNode]]:
        """The graphs the compiler captures of module `path`'s code, each as its nodes in order (the graphs
        are kept for `cuttable_nodes` and `cut_error`, until the next capture)."""

    @abstractmethod
    def cuttable_nodes(self, graph: int) -> list[int]:
        """The positions in captured graph `graph` of the nodes a cut can end at: those it computes whose eager
        value is floating (their eager values are kept for `cut_error`)."""

    @abstractmethod
    def cut_error(self, graph: int, node: int) -> tuple[float, float]:
        """Captured graph `graph` cut after its node at position `node` and compiled: the node's compiled value
        against its eager value in float64, and its eager float32 value against the same (its rounding)."""

    @abstractmethod
    def executed_lines(self, files: set[str]) -> set[str]:
        """The "path:line"s of `files` that the eager module's run executes."""

    @abstractmethod
    def bisect_compiler(self, path: str, good_below: float) -> tuple[CompilerStep | None, int]:
        """The compiler step that makes the difference of module `path` compiled alone, a try being good
        where its error stays below `good_below` (None: no single step does), and the compiles it took. A
        compiler that cannot be bisected gives its backend as the step, compiling nothing."""

    @abstractmethod
    def modules_of_class(self, path: str) -> tuple[str, list[str]]:
        """The class name of module `path`, and the paths of every module of that class."""


@dataclass(frozen=True)
class DeterminismFixes:
    """How a model stops its runs from differing, in its framework's words: one sentence each."""

    seed: str  # a random op drawing from an unseeded generator
    zeros: str  # memory made uninitialised (`empty`) and read before written
    kernel: str  # a kernel that is not deterministic


class Determinism(ABC):
    """Optional: what makes a side's runs differ and the settings that change its numbers
    (`bisectr.search.repeat`), for an `Adapter` that also subclasses this."""

    fixes: DeterminismFixes

    @abstractmethod
    def numerics_settings(self) -> dict[str, str]:
        """The settings in effect now that change the framework's numbers, and its versions. Shared names
        where frameworks share the idea and its values ("tf32 matmul": "on" | "off", "autocast": "off" |
        "<device> <dtype>", "default dtype"); every other name starts with the framework's ("torch threads",
        its flags), so that only sides of one framework compare them."""

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's default random generators (every device's)."""

    def in_training(self, model: Any, path: str) -> bool:
        """Is the module at `path` ("": `model`) in training mode (torch and paddle spell it alike)?"""
        module = model
        for name in filter(None, path.split(".")):
            module = getattr(module, name, None)
        return bool(getattr(module, "training", False))

    def eval_mode(self, model: Any) -> bool:
        """Put `model` in eval mode (its dropout off); False where it is no module (torch and paddle spell it alike)."""
        if not self.is_module(model):
            return False
        model.eval()
        return True


class CompiledGraphs(ABC):
    """Optional facet of an adapter whose framework compiles modules into graphs (their calls recorded as
    `COMPILED_OP`): the primitives of the search inside a compiled module's call (`bisectr.search.compiled`)."""

    @abstractmethod
    def probe_compiled(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> CompiledProbe | None:
        """The compiled module's call that the recorded op `fn` makes, probed on `args`/`kwargs` (its eager
        outputs computed now); None where `fn` is no compiled module's call. Every probe is slow."""


Facet = TypeVar("Facet", Training, WeightConversion, CompiledGraphs, Determinism)


def facet(adapter: Adapter, interface: type[Facet]) -> Facet:
    """`adapter` as the optional interface `interface` (`Training`, `WeightConversion`, `CompiledGraphs`,
    `Determinism`); a TypeError
    naming the framework and what it lacks where its adapter does not implement it."""
    if not isinstance(adapter, interface):
        missing = ", ".join(sorted(interface.__abstractmethods__))
        raise TypeError(f"the {adapter.name} adapter does not implement {interface.__name__} ({missing})")
    return adapter
