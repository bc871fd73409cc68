"""The float64 runs of a side: the recorded calls executed in float64 (`Float64Interpreter`) and the model's
own code run in float64 (`Float64Listener`), with what both share: the float64 copies of the model's leaves
(`Float64Copies`) and how each op is called in float64 (`Float64Calls`, which the fp64 oracle's replays use too).
`float64_outputs` is the float64 check's forward; its backward is `gradient.float64_gradients`."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Iterable

import numpy as np

from ..adapters import Adapter, CannotUpcast
from ..capture.modelfile import BuiltSide
from ..capture.recording import output_pairs
from ..capture.structure import call_tensors, iter_tensors, map_tensors
from ..capture.trace import OpNode, Trace, float64_dtype, is_floating
from ..errors import UserModelError
from ..leafref import leaf_kind
from ..capture.calls import RecordedCalls, run_op
from .interpreter import Interpreter, UnfaithfulReplay, execution_plan

# The leaves a float64 run upcasts: the model's parameters and buffers, and its inputs.
UPCAST_LEAVES = ("param", "buffer", "input")


@dataclass
class Float64Run:
    """What a float64 run gave (outputs by key, or gradients by leaf name), and the ops that still
    ran below float64 in it."""

    values: dict[str, Any]
    narrow_ops: list[str]


class Float64Interpreter(Interpreter):
    """The recorded forward again in float64, what `Float64Listener` computes by running the
    model's code: a floating parameter, buffer or input is read as a float64 copy (of
    `leaf_values[leaf name]` where given, `Float64Copies`) made where first read, and released after
    its last read like every tensor; each op is called as `Float64Calls` calls it in the float64 check
    (`float64_calls.narrow`: the ops that still ran below float64). Raises `UnfaithfulReplay` where a call makes
    another shape than recorded."""

    def __init__(self, adapter: Adapter, trace: Trace, recorded: RecordedCalls, leaf_values: dict[str, np.ndarray]):
        super().__init__(adapter, trace, recorded.calls)
        self.leaves = recorded.leaves
        self.copies = Float64Copies(adapter, leaf_values)
        self.float64_calls = Float64Calls(adapter, trace, fall_back=True)

    def outputs(self) -> dict[str, np.ndarray]:
        adapter = self.adapter
        with adapter.no_grad(), adapter.float64_defaults():
            self.run_releasing(*execution_plan(self.trace, set(self.trace.outputs.values())))
            return {key: adapter.to_numpy(self.fetch(tid)) for key, tid in self.trace.outputs.items()}

    def fetch(self, tid: int) -> Any:
        tensor = self.env.get(tid)
        if tensor is None:  # a leaf: every op output read later is in `env`
            info = self.trace.tensors[tid]
            tensor = self.leaves[tid][0]
            if is_floating(info.dtype) and leaf_kind(info.leaf) in UPCAST_LEAVES:
                tensor = self.copies.make(tensor, info.leaf)
            self.env[tid] = tensor
        return tensor

    def run_node(self, index: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
        op, adapter = self.trace.ops[index], self.adapter
        inputs = call_tensors(args, kwargs, adapter.is_tensor) if op.inplace else []
        _, produced, _ = run_op(adapter, self.float64_calls.of(op, fn), args, kwargs, inputs)
        if len(produced) != len(op.outputs) or any(
            tuple(t.shape) != tuple(self.trace.tensors[tid].shape) for t, tid in zip(produced, op.outputs)
        ):
            raise UnfaithfulReplay(f"op {index} ({op.framework_op}) made other tensors in float64 than recorded")
        self.copies.note_outputs(produced)
        return produced

    def release(self, tid: int) -> None:
        tensor = self.env.pop(tid, None)
        if tensor is not None:
            self.copies.release(tensor)


class Float64Listener:
    """Runs the model's own code in float64 with no float64 copy of the model: an op reading a
    floating parameter or buffer reads a float64 copy made for it (of `leaf_values[name]` where
    given, `Float64Copies`), released after it; each op is called as `Float64Calls` calls it in the
    float64 check (`calls.narrow`: the ops that still ran below float64), the `trace` recorded giving
    the dtypes of an op that cannot run in float64, as the code follows the recording op for op. With
    `gradients` each leaf's copy is made once and kept in `upcast` (a parameter's a leaf requiring a
    gradient, the parameter's own float64 gradient)."""

    def __init__(
        self, adapter: Adapter, model: Any, trace: Trace, leaf_values: dict[str, np.ndarray], gradients: bool = False
    ):
        self.adapter = adapter
        self.trace = trace
        self.leaves = {
            id(t): (name, t) for name, t in adapter.named_leaves(model) if is_floating(adapter.dtype_name(t))
        }
        self.copies = Float64Copies(adapter, leaf_values)
        self.calls = Float64Calls(adapter, trace, fall_back=True)
        self.gradients = gradients
        self.upcast: dict[str, Any] = {}  # leaf name -> its float64 copy, with `gradients`
        self.modules: list[str] = []
        self.op_count = 0  # the ops run so far, counted as a recording counts them
        self._upcasting = False  # the ops that make a copy are bisectr's, not the model's

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self._upcasting:
            return fn(*args, **kwargs)
        args = map_tensors(args, self._is_model_leaf, self._float64)
        kwargs = map_tensors(kwargs, self._is_model_leaf, self._float64)
        inputs = call_tensors(args, kwargs, self.adapter.is_tensor)
        versions = [self.adapter.version(t) for t in inputs]
        result = self.calls.call(
            name, self.modules[-1] if self.modules else "", self._recorded(name), fn, *args, **kwargs
        )
        outputs = iter_tensors(result, self.adapter.is_tensor)
        if outputs or any(
            self.adapter.version(t) != v for t, v in zip(inputs, versions)
        ):  # an op, as a recording counts them
            self.op_count += 1
        if not self.gradients:
            self.copies.note_outputs(outputs)
            for tensor in iter_tensors((args, kwargs), self.adapter.is_tensor):
                self.copies.release(tensor)
        return result

    def enter_module(self, path: str) -> None:
        self.modules.append(path)

    def exit_module(self) -> None:
        self.modules.pop()

    def _recorded(self, name: str) -> OpNode | None:
        """The recording's op this call is, where the model's code still follows the recording."""
        ops = self.trace.ops
        recorded = ops[self.op_count] if self.op_count < len(ops) else None
        return recorded if recorded is not None and recorded.framework_op == name else None

    def parameter_names(self) -> list[str]:
        return [name for name, _ in self.leaves.values() if leaf_kind(name) == "param"]

    def _is_model_leaf(self, obj: Any) -> bool:
        entry = self.leaves.get(id(obj))
        return entry is not None and entry[1] is obj

    def _float64(self, tensor: Any) -> Any:
        adapter = self.adapter
        name = self.leaves[id(tensor)][0]
        if name in self.upcast:
            return self.upcast[name]
        self._upcasting = True
        try:
            copy = self.copies.make(tensor, name)
            if self.gradients and leaf_kind(name) == "param" and adapter.requires_grad(tensor):
                copy = adapter.gradient_leaf(copy)
        finally:
            self._upcasting = False
        if self.gradients:
            self.upcast[name] = copy
        return copy


class Float64Copies:
    """The float64 copies of a model's leaves for one float64 run (of `leaf_values[leaf name]` in
    place of a leaf's own values where given). A copy is cast into the memory of the last one of
    its shape released, where one is kept: a new large tensor costs the operating system's fresh
    pages, more than the cast (a 1280x8192 float32 weight here: 30 ms into a new tensor, 16 ms into
    a released one). A released copy is kept only if no op output starts inside its memory (a view
    of it, or the copy written in place, which could still read it), and the kept ones hold at most
    `KEPT_LARGEST` times the largest copy made (about a transformer layer's weights), the oldest
    dropped first."""

    KEPT_LARGEST = 4

    def __init__(self, adapter: Adapter, leaf_values: dict[str, np.ndarray]):
        self.adapter = adapter
        self.leaf_values = leaf_values
        self.reusable: dict[
            int, tuple[Any, tuple, range]
        ] = {}  # id(copy) -> (copy, its key, its addresses), of live copies
        self.kept: OrderedDict[int, tuple[Any, tuple, int]] = (
            OrderedDict()
        )  # id(copy) -> (copy, its key, its bytes), released in this order
        self.kept_by_key: dict[tuple, deque[int]] = {}  # (shape, device, layout) -> ids of kept copies, oldest first
        self.kept_bytes = self.largest = 0

    def make(self, tensor: Any, leaf: str) -> Any:
        """A float64 copy of the leaf `tensor` named `leaf`."""
        adapter = self.adapter
        key = (tuple(tensor.shape), adapter.device_name(tensor), adapter.layout(tensor))
        size = 8 * math.prod(key[0])
        values = self.leaf_values.get(leaf)
        if values is not None:
            copy = adapter.from_numpy(values.astype(np.float64), "float64", key[1], key[2])
        else:
            kept = self.kept_by_key.get(key)
            copy = adapter.float64_tensor(tensor, self._take(kept.pop()) if kept else None)
        start = adapter.data_address(copy)
        self.reusable[id(copy)] = (copy, key, range(start, start + size))
        self.largest = max(self.largest, size)
        return copy

    def note_outputs(self, outputs: Iterable[Any]) -> None:
        """Op outputs were made: a copy that one of them may view is not kept."""
        if not self.reusable:
            return
        for address in map(self.adapter.data_address, outputs):
            viewed = [key for key, (_, _, addresses) in self.reusable.items() if address in addresses]
            for key in viewed:
                del self.reusable[key]

    def release(self, tensor: Any) -> None:
        """No later op reads `tensor`: keep it for the next copy of its shape if it is a reusable copy."""
        entry = self.reusable.pop(id(tensor), None)
        if entry is None:
            return
        _, key, addresses = entry
        self.kept[id(tensor)] = (tensor, key, len(addresses))
        self.kept_by_key.setdefault(key, deque()).append(id(tensor))
        self.kept_bytes += len(addresses)
        while self.kept_bytes > self.KEPT_LARGEST * self.largest:
            oldest = next(iter(self.kept))
            self.kept_by_key[self.kept[oldest][1]].popleft()
            self._take(oldest)

    def _take(self, copy_id: int) -> Any:
        """Remove a kept copy (already out of `kept_by_key`) and give it."""
        copy, _, size = self.kept.pop(copy_id)
        self.kept_bytes -= size
        return copy


class Float64Calls:
    """How a float64 run calls each op, for every float64 run: the float64 check's (`Float64Interpreter`
    over the recorded calls, `Float64Listener` over the model's code) and the fp64 oracle's
    replays (`values.ValuesInterpreter`, `gradient.VJPInterpreter`). A cast below float64 (a cast op, a dtype argument)
    stays at float64 (`Adapter.float64_call`); `narrow` counts the ops, by op and module, whose floating
    outputs still come out below float64.

    An op that raises in float64 (one without a float64 kernel, as `torch._grouped_mm` on CPU) shows a
    limit of the framework, neither a bug of the model nor one of bisectr. In the float64 check
    (`fall_back`) it runs at the dtypes it was recorded with instead: its floating inputs cast down to
    them, its floating outputs cast back up to float64; it is counted in `narrow`, and `fallen_back` says
    why. Where it cannot (an op writing in place, one the recording does not name at this point), and
    in an oracle, which is float64 or nothing, `CannotUpcast` names the op and what it raised."""

    def __init__(self, adapter: Adapter, trace: Trace, fall_back: bool):
        self.adapter = adapter
        self.trace = trace
        self.fall_back = fall_back
        self.narrow: dict[str, int] = {}  # "op in module" -> how many of its calls ran below float64
        self.fallen_back: dict[str, str] = {}  # "op in module" -> the dtypes it ran at instead, and why

    def of(self, op: OpNode, fn: Callable[..., Any]) -> Callable[..., Any]:
        """The recorded op `op`, whose function is `fn`, as this float64 run calls it."""
        return partial(self.call, op.framework_op, op.module, op, fn)

    def call(
        self, name: str, module: str, recorded: OpNode | None, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """Call op `name` of `module` (`recorded`: the recording's op it is, None where unknown) as this
        float64 run calls it, and return its result."""
        where = f"{name} in {module}" if module else name
        wide_fn, wide_args, wide_kwargs = self.adapter.float64_call(name, fn, args, kwargs)
        try:
            result = wide_fn(*wide_args, **wide_kwargs)
        except Exception as exc:
            raised = _said(exc)
            result, ran_at = self._at_recorded_dtypes(where, recorded, fn, args, kwargs, raised)
            self.fallen_back[where] = (
                f"run at {', '.join(ran_at) or 'its recorded dtypes'}: in float64 it raised {raised}"
            )
            below_float64 = True
        else:
            dtypes = map(self.adapter.dtype_name, iter_tensors(result, self.adapter.is_tensor))
            below_float64 = any(dtype != float64_dtype(dtype) for dtype in dtypes)
        if below_float64:
            self.narrow[where] = self.narrow.get(where, 0) + 1
        return result

    def narrow_ops(self) -> list[str]:
        """The ops that ran below float64, each with how often where more than once, and why where it
        fell back to its recorded dtypes."""
        listed = []
        for where, count in self.narrow.items():
            notes = [f"x{count}"] if count > 1 else []
            if where in self.fallen_back:
                notes.append(self.fallen_back[where])
            listed.append(f"{where} ({'; '.join(notes)})" if notes else where)
        return listed

    def _at_recorded_dtypes(
        self, where: str, recorded: OpNode | None, fn: Callable[..., Any], args: tuple, kwargs: dict, raised: str
    ) -> tuple[Any, list[str]]:
        """The result of the op, which raised `raised` in float64, run at its recorded dtypes (see the
        class docstring), and those of them below float64."""
        adapter = self.adapter
        cannot = f"{where} cannot run in float64 (it raised {raised})"
        if not self.fall_back:
            raise CannotUpcast(cannot) from None
        tensors = call_tensors(args, kwargs, adapter.is_tensor)
        if recorded is None or len(tensors) != len(recorded.inputs):
            raise CannotUpcast(f"{cannot}, and the recording has no such op at this point to give its dtypes") from None
        if recorded.inplace:
            raise CannotUpcast(
                f"{cannot}, and it writes in place: it cannot run at its recorded dtypes on a copy"
            ) from None
        recorded_dtypes = {id(t): self.trace.tensors[tid].dtype for t, tid in zip(tensors, recorded.inputs)}

        def narrowed(tensor: Any) -> Any:
            return self._cast(tensor, recorded_dtypes[id(tensor)])

        def widened(tensor: Any) -> Any:
            return self._cast(tensor, float64_dtype(adapter.dtype_name(tensor)))

        try:
            result = fn(
                *map_tensors(args, adapter.is_tensor, narrowed), **map_tensors(kwargs, adapter.is_tensor, narrowed)
            )
            result = map_tensors(result, adapter.is_tensor, widened)
        except Exception as exc:
            raise CannotUpcast(f"{cannot}, nor at its recorded dtypes (it raised {_said(exc)})") from None
        below_float64 = {
            dtype for dtype in recorded_dtypes.values() if is_floating(dtype) and dtype != float64_dtype(dtype)
        }
        return result, sorted(below_float64)

    def _cast(self, tensor: Any, dtype: str) -> Any:
        """A floating `tensor` cast to `dtype`; an empty one (which may hold no memory) as it is."""
        adapter = self.adapter
        if not is_floating(dtype) or adapter.dtype_name(tensor) == dtype or math.prod(tensor.shape) == 0:
            return tensor
        return adapter.cast(tensor, dtype)


def _said(exc: Exception, most: int = 200) -> str:
    """What `exc` says, in one line of at most about `most` characters."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = text if len(text) <= most else text[:most] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _refuse_plain_function(side: BuiltSide) -> None:
    """A float64 run of a plain function is refused: bisectr cannot reach its parameters."""
    if not side.adapter.is_module(side.model):
        raise CannotUpcast("it is a plain function, whose tensors bisectr cannot reach")


def float64_inputs(side: BuiltSide) -> tuple | dict:
    """The side's inputs with each floating tensor upcast to float64 (see `_refuse_plain_function`)."""
    adapter = side.adapter
    _refuse_plain_function(side)
    return map_tensors(
        side.inputs, adapter.is_tensor, lambda t: adapter.float64_tensor(t) if is_floating(adapter.dtype_name(t)) else t
    )


def float64_outputs(
    side: BuiltSide, trace: Trace, recorded: RecordedCalls, leaf_values: dict[str, np.ndarray]
) -> Float64Run:
    """The side's outputs in float64: the recorded calls executed in float64 where they can stand in
    for the model's code and run (`float64_replay`), else the model's code under `Float64Listener`
    (`float64_forward`), which also says why a forward cannot run in float64."""
    _refuse_plain_function(side)
    values, calls = float64_replay(side.adapter, trace, recorded, leaf_values) or float64_forward(
        side, trace, leaf_values
    )
    narrowed = next((key for key, v in values.items() if v.dtype.kind == "f" and v.dtype != np.float64), None)
    if narrowed is not None:
        raise CannotUpcast(f"its output {narrowed!r} stays {values[narrowed].dtype} (a dtype fixed inside the forward)")
    return Float64Run(values, calls.narrow_ops())


def float64_replay(
    adapter: Adapter, trace: Trace, recorded: RecordedCalls, leaf_values: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], Float64Calls] | None:
    """The outputs of the recorded calls executed in float64 (`Float64Interpreter`), and how its ops were
    called; None where the recorded calls cannot stand in for the model's code."""
    if not recorded.replayable(adapter):
        return None
    replay = Float64Interpreter(adapter, trace, recorded, leaf_values)
    try:
        return replay.outputs(), replay.float64_calls
    except UnfaithfulReplay:
        return None


def float64_forward(
    side: BuiltSide, trace: Trace, leaf_values: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], Float64Calls]:
    """The outputs of the model's code run in float64 (`Float64Listener`), and how its ops were called."""
    adapter = side.adapter
    listener = Float64Listener(adapter, side.model, trace, leaf_values)
    upcast = replace(side, inputs=float64_inputs(side))
    try:
        with adapter.intercept(side.model, listener), adapter.float64_defaults():
            outputs = upcast.forward()
    except UserModelError as exc:
        raise CannotUpcast(f"its float64 forward raised: {exc.raised}") from None
    return {key: adapter.to_numpy(tensor) for key, tensor in output_pairs(adapter, outputs)}, listener.calls
