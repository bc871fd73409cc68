"""Loading a model file and building its two sides.

A model file defines zero-argument functions (by default `reference()` and
`candidate()`), each returning `(model, inputs)`; `inputs` is a tuple of
positional arguments or a dict of keyword arguments. Its `NPROC` (function name ->
N) says which functions build a side that runs on N ranks. `intercepted_forward` runs a
side's forward with a listener seeing its ops.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from ..adapters import Adapter, Determinism, adapter_for, registered
from ..adapters.base import OpListener
from ..errors import BisectrError, InterceptionFailure, ModelFileError, UserModelError

# bisectr's code that runs the user's model: what it raises is bisectr's own, and its frames are not the user's.
_BISECTR_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), package) + os.sep
    for package in ("capture", "engines", "sides")
)
_ADAPTERS_DIR = os.path.dirname(os.path.abspath(sys.modules[Adapter.__module__].__file__))


@dataclass
class SideFix:
    """What `--fix-nondeterminism` changes in a side before it is recorded (see `bisectr.search.repeat`)."""

    eval_mode: bool = False  # its model put in eval mode: its dropout off
    seed: int | None = None  # its framework's random generators seeded before every run of the model

    def described(self) -> list[str]:
        """What it changes, in words."""
        return (["model put in eval mode (dropout off)"] if self.eval_mode else []) + (
            [f"random generators seeded with {self.seed} before each run"] if self.seed is not None else []
        )


@dataclass
class BuiltSide:
    """One side as its model file's function built it: the model, its inputs and its framework's adapter."""

    role: str  # "reference" or "candidate"
    function: str
    model_file: Path
    model: Any
    inputs: tuple | dict
    adapter: Adapter
    # The model file's `<function>_loss(outputs)`, else `<role>_loss(outputs)` (`candidate_loss`): a
    # scalar to start this side's backward pass from (see `bisectr.search.backward`); None: a fixed random gradient.
    loss: Callable[[Any], Any] | None = None
    seed: int | None = None  # the framework's random generators are seeded with it before each run (`SideFix`)

    def apply(self, fix: SideFix) -> None:
        """Make `fix`'s changes to the side."""
        if fix.eval_mode and not (isinstance(self.adapter, Determinism) and self.adapter.eval_mode(self.model)):
            raise ModelFileError(
                f"{self.model_file}: {self.function}() returned no {self.adapter.module_kind}, which bisectr could "
                "put in eval mode"
            )
        self.seed = fix.seed

    def input_items(self) -> list[tuple[str, Any]]:
        if isinstance(self.inputs, dict):
            return [(str(k), v) for k, v in self.inputs.items()]
        return [(str(i), v) for i, v in enumerate(self.inputs)]

    def forward(self) -> Any:
        """Run the model once; the user's exceptions become `UserModelError`."""
        call = (
            (lambda: self.model(**self.inputs)) if isinstance(self.inputs, dict) else (lambda: self.model(*self.inputs))
        )
        if self.seed is not None:
            self.adapter.seed(self.seed)
        return run_user_code(
            call,
            f"{self.model_file}: the {self.role} model returned by {self.function}() raised",
            self.adapter.internal_paths(),
        )


def intercepted_forward(side: BuiltSide, listener: OpListener, gradients: bool = False) -> Any:
    """`side.forward()` with `listener` seeing its ops. A model that raises only under bisectr's
    interception fails by bisectr's fault, never the user's: it is run once more on its own to tell."""
    adapter = side.adapter
    try:
        with adapter.intercept(side.model, listener, gradients=gradients):
            return side.forward()
    except UserModelError as error:
        try:
            with adapter.enable_grad() if gradients else adapter.no_grad():
                side.forward()
        except UserModelError:
            raise error from None
        raise InterceptionFailure(
            f"{side.model_file}: the {side.role} model returned by {side.function}() runs without "
            f"bisectr but raised under its interception: {error.raised}"
        ) from error.__context__


def run_user_code(fn: Callable[[], Any], context: str, hidden_paths: tuple[str, ...] = ()) -> Any:
    try:
        return fn()
    except BisectrError:
        raise
    except Exception as exc:  # the user's own error, shown with the user's frames only
        if _raised_by_bisectr(exc):
            raise
        raise UserModelError(f"{context} {type(exc).__name__}: {exc}", user_frames(exc, hidden_paths)) from None


def _raised_by_bisectr(exc: BaseException) -> bool:
    """Did the exception start in bisectr's own code (a bug to report, not the user's)?"""
    if getattr(exc, "raised_by_op", False):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(_BISECTR_DIRS)


def user_frames(exc: BaseException, hidden_paths: tuple[str, ...] = ()) -> str:
    """The traceback of `exc`, and of the exceptions that caused it (an import error's root
    cause), without bisectr's frames or the framework's internals."""
    hidden = (*_BISECTR_DIRS, _ADAPTERS_DIR, *hidden_paths)
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    parts = []
    for link in reversed(chain):
        frames = [
            f for f in traceback.extract_tb(link.__traceback__) if not os.path.abspath(f.filename).startswith(hidden)
        ]
        parts.append("".join(traceback.format_list(frames) + traceback.format_exception_only(type(link), link)))
    return "Traceback (user code):\n" + "\nwhich caused:\n".join(parts)


def load_module(model_file: str | os.PathLike) -> ModuleType:
    path = Path(model_file)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    if path.suffix != ".py":
        raise ModelFileError(f"{path}: a model file is a Python file (.py)")
    name = module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserModelError(
            f"{path}: importing the model file raised {type(exc).__name__}: {exc}", user_frames(exc)
        ) from None
    return module


def module_name(model_file: Path) -> str:
    """The name `load_module` gives the model file's module in `sys.modules`."""
    return f"bisectr_model_{abs(hash(str(model_file.resolve())))}"


def build_side(module: ModuleType, model_file: Path, role: str, function: str) -> BuiltSide:
    factory = getattr(module, function, None)
    if factory is None:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        raise ModelFileError(
            f"{model_file}: defines no function {function}() for the {role} side"
            f" (functions defined: {', '.join(defined) or 'none'})"
        )
    if not callable(factory):
        raise ModelFileError(f"{model_file}: {function} is not a function")
    built = run_user_code(
        partial(_built_on_ranks_or_not, factory, model_file, role, function), f"{model_file}: {function}() raised"
    )
    side = side_of(role, built, model_file, function, f"{function}() returned")
    name = next((n for n in (f"{function}_loss", f"{role}_loss") if hasattr(module, n)), None)
    if name is not None:
        side.loss = getattr(module, name)
        if not callable(side.loss):
            raise ModelFileError(f"{model_file}: {name} is not a function")
    return side


def declared_nproc(module: ModuleType, model_file: Path, function: str) -> int:
    """How many ranks the model file's `NPROC` gives `function` (1 where it names none)."""
    declared = getattr(module, "NPROC", {})
    if not isinstance(declared, dict):
        raise ModelFileError(
            f"{model_file}: NPROC is a {_describe(declared)}, not a dict from function name to a number of ranks"
        )
    nproc = declared.get(function, 1)
    if not isinstance(nproc, int) or isinstance(nproc, bool):
        raise ModelFileError(f"{model_file}: NPROC[{function!r}] is {nproc!r}, not a number of ranks")
    return nproc


# What a launcher (torchrun, paddle.distributed.launch) sets for each rank, and what a distributed
# framework says where no launcher started the process.
_RANK_VARIABLES = frozenset(
    {
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PADDLE_TRAINER_ID",
        "PADDLE_TRAINERS_NUM",
        "PADDLE_TRAINER_ENDPOINTS",
    }
)
_NO_PROCESS_GROUP = ("Default process group has not been initialized", "environment variable MASTER_ADDR expected")


def _built_on_ranks_or_not(factory: Callable[[], Any], model_file: Path, role: str, function: str) -> Any:
    """`factory()`; where it fails for want of the ranks a launcher would have started, a one-line
    error naming the flag that starts them."""
    try:
        return factory()
    except Exception as exc:
        missing = exc.args[0] if isinstance(exc, KeyError) and exc.args and exc.args[0] in _RANK_VARIABLES else None
        if missing is None and not any(text in str(exc) for text in _NO_PROCESS_GROUP):
            raise
        what = f"reads {missing}, which a launcher sets for each rank" if missing else "needs a process group"
        raise ModelFileError(
            f"{model_file}: {function}() builds a side on several ranks ({what}) but the {role} side "
            f"runs on one process: pass --{role}-nproc N, or declare it in the model file: "
            f"NPROC = {{{function!r}: N}}"
        ) from None


def side_of(role: str, built: Any, model_file: Path, function: str, given: str) -> BuiltSide:
    """A side from what its function returned (`given` says where that came from, in messages):
    `(model, inputs)` with a callable model and a tuple or dict of inputs, in a known framework."""
    if not (isinstance(built, tuple) and len(built) == 2):
        raise ModelFileError(f"{model_file}: {given} {_describe(built)}, not (model, inputs)")
    model, inputs = built
    if not callable(model):
        raise ModelFileError(f"{model_file}: {given} a model that is not callable: {_describe(model)}")
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, (tuple, dict)):
        raise ModelFileError(
            f"{model_file}: {given} inputs that are neither a tuple of positional arguments "
            f"nor a dict of keyword arguments: {_describe(inputs)}"
        )
    values = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
    adapter = adapter_for(model, values)
    if adapter is None:
        raise ModelFileError(
            f"{model_file}: cannot tell the framework of the {role} side: {given} "
            f"a {_describe(model)} and inputs {[_describe(v) for v in values]}; "
            f"expected a {' / '.join(a.module_kind for a in registered())}, or "
            f"{' / '.join(a.name for a in registered())} tensors as inputs"
        )
    if adapter.is_compiled_function(model):
        raise ModelFileError(
            f"{model_file}: the {role} model returned by {function}() is a compiled function: bisectr "
            "records a compiled module's call as one op and searches inside it, but cannot reach a "
            "function's tensors. Compile a module instead (`torch.compile(module)`), or give it the "
            "function uncompiled"
        )
    return BuiltSide(role, function, model_file, model, inputs, adapter)


def load_sides(
    model_file: str | os.PathLike, reference: str = "reference", candidate: str = "candidate"
) -> tuple[BuiltSide, BuiltSide]:
    path = Path(model_file)
    module = load_module(path)
    return build_side(module, path, "reference", reference), build_side(module, path, "candidate", candidate)


def _describe(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


def loss_of(side: BuiltSide, outputs: Any) -> Any:
    """The side's loss of its `outputs`: what its loss function returns, checked to be one value."""
    adapter = side.adapter
    value = run_user_code(lambda: side.loss(outputs), f"{side.model_file}: {side.role}_loss() raised")
    if not adapter.is_tensor(value) or int(np.prod(value.shape)) != 1:
        raise ModelFileError(
            f"{side.model_file}: {side.role}_loss() returned {type(value).__name__}, not a "
            f"{adapter.name} tensor holding one value"
        )
    return value
