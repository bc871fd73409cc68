"""The one interpreter over a recorded graph, as `torch.fx.Interpreter` runs a graph module.

A recording (`Recording`) keeps each op's call (`Call`: the function, its arguments with a
`Slot` for each tensor) and the leaf tensors it read. `Interpreter.run(indices)` executes calls in order: every slot is filled by
`fetch(tid)`, `run_node` calls the op, `store` keeps what it made. The ways bisectr runs ops
again are overrides of these three:

- `ValuesInterpreter`: ops on given values for the inputs they do not compute (one op, or a block), upcast
  to float64 where asked: the per-op evidence and its float64 oracle, operator substitution.
- `VJPInterpreter`: the same with gradients on, its inputs leaves: the backward of an op or a block.
- `PatchedInterpreter`: the recorded forward with patches, running only the ops whose values are
  needed and releasing tensors after their last use.

What a patch does to a run is `Patches`, shared with the re-run of the model's own code
(`recording.PatchedRerun`, for forwards the recorded calls cannot stand in for): leaves and op
outputs replaced, and every value no patch can have reached checked against the recording.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable

import numpy as np

from ..adapters import Adapter, CannotUpcast, Tensors
from ..errors import PathDeparture, TraceMismatchError
from .ops import UNINITIALISED
from .structure import call_tensors, iter_tensors, map_tensors
from .trace import OpNode, Trace, device_reductions, fingerprint, float64_dtype, is_floating
from ..leafref import leaf_kind

# An unpatched op whose values move by more than this (relative to the tensor's largest
# magnitude) between recording and re-run is not deterministic: dropout or other randomness.
VALUE_DRIFT = 1e-3

# The leaves a float64 run upcasts: the model's parameters and buffers, and its inputs.
UPCAST_LEAVES = ("param", "buffer", "input")


@dataclass(frozen=True, slots=True)
class Slot:
    """Stands for the tensor `tid` inside a recorded call's arguments."""

    tid: int


@dataclass
class Call:
    """A recorded op's call: what the interpreter runs again."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    device: str = ""  # where its outputs live
    layouts: tuple = ()  # how each output is spread over processes (`Adapter.layout`), where any is
    # (position, tid) of each slot in the usual call, whose slots are all plain positional
    # arguments (None otherwise): filling them needs no walk through the arguments.
    flat_slots: list[tuple[int, int]] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not any(isinstance(a, (tuple, list, dict)) for a in self.args) and not iter_tensors(self.kwargs, _is_slot):
            self.flat_slots = [(i, a.tid) for i, a in enumerate(self.args) if isinstance(a, Slot)]

    def filled(self, fetch: Callable[[int], Any]) -> tuple[tuple, dict]:
        """The call's arguments and keyword arguments with each `Slot` replaced by `fetch(tid)`."""
        if self.flat_slots is None:
            return fill_slots(self.args, fetch), fill_slots(self.kwargs, fetch)
        args = list(self.args)
        for position, tid in self.flat_slots:
            args[position] = fetch(tid)
        return tuple(args), self.kwargs


@dataclass
class Recording:
    """What a side keeps in memory from its recording: each op's call, and each leaf tensor
    read (tid -> (tensor, its version when first read)); `value_reads` counts the calls that
    brought values a patch could change into Python (`.item()`, `if t:` of a floating tensor or one
    made from one), whose results later calls have baked in."""

    calls: list[Call] = field(default_factory=list)
    leaves: dict[int, tuple[Any, int]] = field(default_factory=dict)
    value_reads: int = 0
    # False once executing the calls made tensors of other shapes or dtypes than recorded:
    # state around the calls (autocast) or data-dependent shapes shaped the forward.
    faithful: bool = True
    # This process's own values of the local parts it recorded (`trace.LOCAL_PART`): the trace holds
    # the first process's.
    local_parts: dict[int, np.ndarray] = field(default_factory=dict)

    def own_values(self, values: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """`values` with this process's own values for the local parts among them."""
        return {tid: self.local_parts.get(tid, array) for tid, array in values.items()}

    def replayable(self, adapter: Tensors) -> bool:
        """Can the recorded calls stand in for the model's code? Not after a value read (a patch
        could change what was read), once a leaf has been changed in place, or once they have
        been found unfaithful."""
        return self.faithful and not self.value_reads and all(adapter.version(t) == v for t, v in self.leaves.values())


@dataclass(frozen=True)
class PassOn:
    """A patch that makes a tensor the values of tensor `source` as the re-run computes them (as
    every process of a distributed run takes them: `Adapter.shared_numpy`): ops the reference lacks,
    taken out where the reference passes its value on unchanged. `source` is made before the tensor."""

    source: int
    shape: tuple[int, ...]


@dataclass
class Shift:
    """A patch that adds `delta` to what the re-run computes instead of replacing it: an op's own
    difference taken out (or put in) while whatever reaches the op in this re-run stays, as when
    every occurrence of a difference is taken out at once. Where the sum is not finite,
    `fallback` stands in."""

    delta: np.ndarray
    fallback: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.delta.shape

    def applied_to(self, values: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            shifted = (values + self.delta).astype(values.dtype)
        return shifted if self.fallback is None else np.where(np.isfinite(shifted), shifted, self.fallback).astype(values.dtype)


@dataclass
class RerunResult:
    outputs: dict[str, np.ndarray]
    captured: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Gradients:
    """What one backward pass of a side computed (see `bisectr.search.backward`)."""

    tensors: dict[int, np.ndarray]  # op output tid -> the gradient reaching it (absent: none reaches it)
    leaves: dict[int, np.ndarray | None]  # parameter or floating input tid -> its gradient (None: frozen, or unused)
    loss: float | None = None  # the side's loss, where the model file defines one


class UnfaithfulReplay(Exception):
    """Executing the recorded calls did not make the tensors the recording made."""


def run_op(adapter: Tensors, fn: Callable[..., Any], args: tuple, kwargs: dict,
           inputs: list[Any]) -> tuple[Any, list[Any], set[int]]:
    """Run one framework op on `args` and `kwargs` (whose tensors are `inputs`). Returns its result,
    the tensors it wrote (what it returned, plus the inputs it changed in place: see `_written`) and
    the object ids of those changed in place. What the op raises is marked as the op's (the user's
    or the framework's error), so that it is not mistaken for a failure of bisectr itself."""
    versions = [adapter.version(t) for t in inputs]
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        exc.raised_by_op = True
        raise
    if adapter.is_tensor(result):
        produced = [result]
    else:
        produced = list({id(t): t for t in iter_tensors(result, adapter.is_tensor)}.values())
    written = _written(adapter, inputs, versions)
    produced += [t for t in written if all(t is not p for p in produced)]
    return result, produced, {id(t) for t in written}


# Bytes per element, for telling a view from another tensor (1 for any dtype not named).
_ITEM_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2}


def _written(adapter: Tensors, inputs: list[Any], versions: list[int]) -> list[Any]:
    """The inputs an op changed in place: those whose version moved, less the views of one before
    them (a view shares its base's version counter: the write is one). A collective that fills a
    list of tensors (`all_gather`) writes each of them."""
    changed = [t for t, v in zip(inputs, versions) if adapter.version(t) != v]
    if len(changed) < 2:
        return changed
    written: list[Any] = []
    spans: list[tuple[int, int]] = []
    for tensor in changed:
        start = adapter.data_address(tensor)
        end = start + max(math.prod(tensor.shape), 1) * _ITEM_BYTES.get(adapter.dtype_name(tensor), 1)
        if any(tensor is t for t in written) or any(first < end and start < last for first, last in spans):
            continue
        written.append(tensor)
        spans.append((start, end))
    return written


def execution_plan(trace: Trace, wanted: set[int], replaced: set[int] = frozenset(),
                   capture: set[int] = frozenset()) -> tuple[list[int], dict[int, set[int]]]:
    """The ops to run to make the tids `wanted`, in order, and for each the tids no later one reads.
    An op runs if it writes in place (an alias may see the write), if one of its outputs is to be
    captured, or if a tid that is needed and not `replaced` (a patch stands in) comes out of it; its
    inputs are then needed."""
    needed = set(wanted).difference(replaced)
    read_later = set(wanted)
    plan, releases = [], {}
    for op in reversed(trace.ops):
        if op.inplace or not needed.isdisjoint(op.outputs) or not capture.isdisjoint(op.outputs):
            plan.append(op.index)
            inputs = set(op.inputs)
            releases[op.index] = inputs - read_later
            read_later |= inputs
            needed |= inputs.difference(replaced)
    plan.reverse()
    return plan, releases


def fill_slots(arguments: tuple | dict, fetch: Callable[[int], Any]) -> tuple | dict:
    """A recorded call's arguments with each `Slot` replaced by `fetch(tid)`."""
    return map_tensors(arguments, _is_slot, lambda slot: fetch(slot.tid))


def _is_slot(obj: Any) -> bool:
    return isinstance(obj, Slot)


class Interpreter:
    """Runs recorded calls of one trace in op order; subclasses override `fetch`, `run_node`, `store`."""

    def __init__(self, adapter: Tensors, trace: Trace, calls: list[Call]):
        self.adapter = adapter
        self.trace = trace
        self.calls = calls
        self.env: dict[int, Any] = {}  # tid -> what later ops read

    def run(self, indices: Iterable[int]) -> None:
        for index in indices:
            self.step(index)

    def run_releasing(self, plan: list[int], releases: dict[int, set[int]]) -> None:
        """Run the ops of `plan`, dropping each tensor after the last op that reads it (`execution_plan`)."""
        for index in plan:
            self.step(index)
            for tid in releases[index]:
                self.release(tid)

    def release(self, tid: int) -> None:
        """No later op reads `tid`."""
        self.env.pop(tid, None)

    def step(self, index: int) -> None:
        """Run op `index` on what `fetch` gives for its inputs, and `store` what it made."""
        call = self.calls[index]
        args, kwargs = call.filled(self.fetch)
        self.store(index, self.run_node(index, call.fn, args, kwargs))

    def fetch(self, tid: int) -> Any:
        return self.env[tid]

    def layout(self, tid: int) -> Any:
        """How op output `tid` was spread over processes when recorded (None: held whole, or a leaf)."""
        producer = self.trace.tensors[tid].producer
        layouts = self.calls[producer].layouts if producer is not None else ()
        return layouts[self.trace.ops[producer].outputs.index(tid)] if layouts else None

    def run_node(self, index: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
        _, produced, _ = run_op(self.adapter, fn, args, kwargs, call_tensors(args, kwargs, self.adapter.is_tensor))
        return produced

    def store(self, index: int, produced: list[Any]) -> None:
        self.env.update(zip(self.trace.ops[index].outputs, produced))


class ValuesInterpreter(Interpreter):
    """Ops run on `values` (tid -> array) for the inputs they do not compute, each input made
    afresh from its values in its recorded dtype, or in float64 with `float64` (the fp64 oracle:
    every op of a block reads float64 inputs). A parameter missing from `values` is read where the
    model holds it (`leaves`: tid -> (tensor, version), as `Recording.leaves`), upcast with
    `float64`: a layer's weights are not copied through the host for each op replayed.
    `computed` holds the values of every tensor the ops made. With `float64` each op is called as
    `Float64Calls` calls it: one that cannot run in float64 raises `CannotUpcast` (no oracle)."""

    def __init__(self, adapter: Adapter, trace: Trace, calls: list[Call], values: dict[int, np.ndarray], float64: bool = False,
                 leaves: dict[int, tuple[Any, int]] | None = None):
        super().__init__(adapter, trace, calls)
        self.computed = dict(values)
        self.float64 = float64
        self.float64_calls = Float64Calls(adapter, trace, fall_back=False)
        self.leaves = leaves or {}

    def run(self, indices: Iterable[int]) -> None:
        indices = list(indices)
        for index in indices:  # an op writing in place into a model's tensor writes into a copy
            op = self.trace.ops[index]
            if op.inplace:
                self.computed.update((tid, self.adapter.to_numpy(self.leaves[tid][0]))
                                     for tid in op.inputs if tid not in self.computed and tid in self.leaves)
        super().run(indices)

    def fetch(self, tid: int) -> Any:
        values = self.computed.get(tid)
        if values is None:
            return self._live_parameter(tid)
        dtype = self.trace.tensors[tid].dtype
        return self.adapter.from_numpy(values, float64_dtype(dtype) if self.float64 else dtype, self.trace.device, self.layout(tid))

    def _live_parameter(self, tid: int) -> Any:
        """The parameter as the model holds it (with `float64`, upcast once per replay)."""
        tensor = self.env.get(tid)
        if tensor is None:
            tensor = self.leaves[tid][0]
            if self.float64 and is_floating(self.trace.tensors[tid].dtype):
                tensor = self.adapter.float64_tensor(tensor)
            self.env[tid] = tensor
        return tensor

    def run_node(self, index: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
        if self.float64:
            fn = self.float64_calls.of(self.trace.ops[index], fn)
        return super().run_node(index, fn, args, kwargs)

    def store(self, index: int, produced: list[Any]) -> None:
        self.computed.update((tid, self.adapter.to_numpy(t)) for tid, t in zip(self.trace.ops[index].outputs, produced))


class VJPInterpreter(Interpreter):
    """Ops run with gradients on, each reading what the ones before computed, else `values` (the
    block's external inputs), made into leaves (one per tensor: ops reading it twice sum both
    gradients). With `float64` the floating inputs are upcast and each op is called as `Float64Calls`
    calls it (one that cannot run in float64 raises `CannotUpcast`): the fp64 oracle of the block's backward."""

    def __init__(self, adapter: Adapter, trace: Trace, calls: list[Call], values: dict[int, np.ndarray], float64: bool = False):
        super().__init__(adapter, trace, calls)
        self.values = values
        self.float64 = float64
        self.float64_calls = Float64Calls(adapter, trace, fall_back=False)
        self.leaves: dict[int, Any] = {}

    def fetch(self, tid: int) -> Any:
        if tid in self.env:
            return self.env[tid]
        dtype = self.trace.tensors[tid].dtype
        if not is_floating(dtype):
            return self.adapter.from_numpy(self.values[tid], dtype, self.trace.device, self.layout(tid))
        if tid not in self.leaves:
            tensor = self.adapter.from_numpy(self.values[tid], float64_dtype(dtype) if self.float64 else dtype, self.trace.device,
                                             self.layout(tid))
            self.leaves[tid] = self.adapter.gradient_leaf(tensor)
        return self.leaves[tid]

    def run_node(self, index: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
        if self.float64:
            fn = self.float64_calls.of(self.trace.ops[index], fn)
        return super().run_node(index, fn, args, kwargs)

    def gradients(self, upstream: dict[int, np.ndarray | None]) -> dict[int, np.ndarray | None]:
        """The gradients of the leaves (tid -> values; None where none reaches one) from the outputs
        in `upstream` (tid -> the gradient reaching it; None: none does)."""
        adapter, env = self.adapter, self.env
        seeded = [(env[tid], gradient) for tid, gradient in upstream.items()
                  if gradient is not None and tid in env and adapter.requires_grad(env[tid])]
        if not seeded or not self.leaves:
            return dict.fromkeys(self.leaves)
        upstream_tensors = [adapter.from_numpy(g, adapter.dtype_name(t), self.trace.device, adapter.layout(t)) for t, g in seeded]
        grads = adapter.gradients([t for t, _ in seeded], upstream_tensors, list(self.leaves.values()))
        return {tid: None if g is None else adapter.to_numpy(g) for tid, g in zip(self.leaves, grads)}


class Float64Interpreter(Interpreter):
    """The recorded forward again in float64, what `sides.Float64Listener` computes by running the
    model's code: a floating parameter, buffer or input is read as a float64 copy (of
    `leaf_values[leaf name]` where given, `Float64Copies`) made where first read, and released after
    its last read like every tensor; each op is called as `Float64Calls` calls it in the float64 check
    (`float64_calls.narrow`: the ops that still ran below float64). Raises `UnfaithfulReplay` where a call makes
    another shape than recorded."""

    def __init__(self, adapter: Adapter, trace: Trace, recording: Recording, leaf_values: dict[str, np.ndarray]):
        super().__init__(adapter, trace, recording.calls)
        self.leaves = recording.leaves
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
        if len(produced) != len(op.outputs) or \
                any(tuple(t.shape) != tuple(self.trace.tensors[tid].shape) for t, tid in zip(produced, op.outputs)):
            raise UnfaithfulReplay(f"op {index} ({op.framework_op}) made other tensors in float64 than recorded")
        self.copies.note_outputs(produced)
        return produced

    def release(self, tid: int) -> None:
        tensor = self.env.pop(tid, None)
        if tensor is not None:
            self.copies.release(tensor)


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
        self.reusable: dict[int, tuple[Any, tuple, range]] = {}  # id(copy) -> (copy, its key, its addresses), of live copies
        self.kept: OrderedDict[int, tuple[Any, tuple, int]] = OrderedDict()  # id(copy) -> (copy, its key, its bytes), released in this order
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
    over the recorded calls, `sides.Float64Listener` over the model's code) and the fp64 oracle's
    replays (`ValuesInterpreter`, `VJPInterpreter`). A cast below float64 (a cast op, a dtype argument)
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

    def call(self, name: str, module: str, recorded: OpNode | None, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call op `name` of `module` (`recorded`: the recording's op it is, None where unknown) as this
        float64 run calls it, and return its result."""
        where = f"{name} in {module}" if module else name
        wide_fn, wide_args, wide_kwargs = self.adapter.float64_call(name, fn, args, kwargs)
        try:
            result = wide_fn(*wide_args, **wide_kwargs)
        except Exception as exc:
            raised = _said(exc)
            result, ran_at = self._at_recorded_dtypes(where, recorded, fn, args, kwargs, raised)
            self.fallen_back[where] = f"run at {', '.join(ran_at) or 'its recorded dtypes'}: in float64 it raised {raised}"
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

    def _at_recorded_dtypes(self, where: str, recorded: OpNode | None, fn: Callable[..., Any], args: tuple, kwargs: dict,
                            raised: str) -> tuple[Any, list[str]]:
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
            raise CannotUpcast(f"{cannot}, and it writes in place: it cannot run at its recorded dtypes on a copy") from None
        recorded_dtypes = {id(t): self.trace.tensors[tid].dtype for t, tid in zip(tensors, recorded.inputs)}

        def narrowed(tensor: Any) -> Any:
            return self._cast(tensor, recorded_dtypes[id(tensor)])

        def widened(tensor: Any) -> Any:
            return self._cast(tensor, float64_dtype(adapter.dtype_name(tensor)))

        try:
            result = fn(*map_tensors(args, adapter.is_tensor, narrowed), **map_tensors(kwargs, adapter.is_tensor, narrowed))
            result = map_tensors(result, adapter.is_tensor, widened)
        except Exception as exc:
            raise CannotUpcast(f"{cannot}, nor at its recorded dtypes (it raised {_said(exc)})") from None
        below_float64 = {dtype for dtype in recorded_dtypes.values() if is_floating(dtype) and dtype != float64_dtype(dtype)}
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


class Patches:
    """What patches (tid -> values, or a `Shift`) do to a run following a recording: leaves are
    replaced where read, op outputs as they are made (written in place for in-place ops);
    `capture` names tids whose run values to keep. Values no patch can have reached must be the
    recorded ones (`check`); `tainted` are the tids a patch may have changed. In a run with
    `gradients` on, an op output keeps its autograd graph (the patch is added to it as a difference)."""

    def __init__(self, adapter: Adapter, trace: Trace, patches: dict[int, Any], capture: Iterable[int] = (),
                 gradients: bool = False):
        self.adapter = adapter
        self.trace = trace
        self.patches = patches
        self.capture = set(capture)
        self.captured: dict[int, np.ndarray] = {}
        self.tainted: set[int] = set(patches)
        self.applied: set[int] = set()  # the tids whose patch went into the run
        self.gradients = gradients
        self._leaves: dict[int, Any] = {}
        self._passed: dict[int, np.ndarray | None] = {p.source: None for p in patches.values() if isinstance(p, PassOn)}

    def leaf(self, tid: int, tensor: Any) -> Any:
        """Leaf `tid` as the run reads it: its patch where it has one (made once, a new tensor)."""
        if tid not in self.patches:
            return tensor
        if tid not in self._leaves:
            self._leaves[tid] = self.patched(tid, tensor, in_place=False, keep_graph=False)
        return self._leaves[tid]

    def output(self, op: OpNode, tid: int, tensor: Any, reached: bool, check: bool, in_place: bool) -> Any:
        """Op output `tid` as the run goes on with it: tainted where a patch reached the op's inputs,
        else checked (where `check`) against the recording; patched; captured."""
        if reached:
            self.tainted.add(tid)
        elif check:
            self.check(op, tid, tensor)
        if tid in self.patches:
            tensor = self.patched(tid, tensor, in_place, keep_graph=self.gradients)
        if tid in self._passed:
            self._passed[tid] = np.array(self.adapter.shared_numpy(tensor))
        if tid in self.capture:  # a copy: a later in-place op may write into the tensor
            self.captured[tid] = np.array(self.adapter.to_numpy(tensor))
        return tensor

    def patch(self, tid: int, shape: Iterable[int]) -> Any:
        """The patch for `tid`, which must have the tensor's `shape`."""
        patch = self.patches[tid]
        if tuple(patch.shape) != tuple(shape):
            raise TraceMismatchError(f"the patch for tensor {tid} has shape {tuple(patch.shape)}, the tensor {tuple(shape)}")
        return patch

    def values(self, tid: int, tensor: Any) -> np.ndarray:
        patch = self.patch(tid, tensor.shape)
        if isinstance(patch, PassOn):
            return self._passed[patch.source].reshape(patch.shape)
        return patch.applied_to(self.adapter.shared_numpy(tensor)) if isinstance(patch, Shift) else patch

    def patched(self, tid: int, tensor: Any, in_place: bool, keep_graph: bool) -> Any:
        """`tensor` with the patch for `tid` in it: written into it where an op wrote it in place
        (its aliases see the write), added as a difference where the graph is kept, else a new
        tensor of its dtype and device."""
        adapter = self.adapter
        values = self.values(tid, tensor)
        self.applied.add(tid)
        if in_place:
            adapter.assign(tensor, values)
            return tensor
        if keep_graph and adapter.requires_grad(tensor):
            change = values - adapter.to_numpy(tensor)
            return tensor + adapter.like(tensor, change)
        return adapter.like(tensor, values)

    def check(self, op: OpNode, tid: int, tensor: Any) -> None:
        """An op no patch can have influenced must compute what it computed when recorded (an op
        returning uninitialised memory computes nothing)."""
        if op.op in UNINITIALISED:
            return
        recorded = self.trace.tensors[tid]
        now = live_fingerprint(self.adapter, tensor)
        if len(now) != len(recorded.fingerprint):
            raise self.departure(op.index, op, "produces a tensor of another size")
        allowed = VALUE_DRIFT * max(recorded.stats.absmax, 1e-30)
        # Sixteen numbers: plain Python beats numpy's per-call cost. NaN == NaN counts as reproduced.
        if not all(a == b or abs(a - b) <= allowed or (a != a and b != b) for a, b in zip(now, recorded.fingerprint)):
            raise self.departure(op.index, op, "computes other values from the same inputs")

    def departure(self, index: int, op: OpNode | None, what: str, path: bool = False) -> TraceMismatchError:
        """The error for a re-run that departs from its recording at op `index`: a `PathDeparture` where it
        took another path (`path`), else one that computed other values."""
        where = "" if op is None else \
            f" ({op.framework_op} in {op.module or '(top level)'}" + (f" at {op.source})" if op.source else ")")
        cause = "The forward is not deterministic (dropout or randomness in training mode? data-dependent control flow?)"
        if self.gradients:
            cause = ("The forward is not deterministic, or takes another path with gradients on than without (a reentrant "
                     "gradient checkpoint that applies only with gradients on: use use_reentrant=False)")
        error = PathDeparture if path else TraceMismatchError
        return error(f"the {self.trace.side} re-run departed from its recording at op {index}{where}: it {what}. {cause}")


class PatchedInterpreter(Interpreter):
    """The recorded forward again with `patches`, what `recording.PatchedRerun` computes by running
    the model's code. Only the ops whose values are needed run (`plan`): not an op whose outputs are
    all patched (the patches stand in), nor one whose outputs nothing reads; tensors are released
    after their last use. What no patch can reach is checked where it meets patched values and at
    the outputs (`check_every_op`: after every op, to name the first op that departs). Raises
    `UnfaithfulReplay` where a call makes another shape or dtype than recorded."""

    def __init__(self, adapter: Adapter, trace: Trace, recording: Recording, patches: dict[int, Any],
                 capture: Iterable[int], check_every_op: bool):
        super().__init__(adapter, trace, recording.calls)
        self.leaves = recording.leaves  # tid -> (the leaf tensor read when recording, its version)
        self.patching = Patches(adapter, trace, patches, capture)
        self.check_every_op = check_every_op
        self.wanted = set(trace.outputs.values())
        self.checked: set[int] = set()
        # What `run_node` learnt of the op it ran, for `store`: did a patch reach its inputs, and
        # which output it wrote in place.
        self._reached = False
        self._mutated: set[int] = set()

    def result(self) -> RerunResult:
        with self.adapter.no_grad():
            self.run_releasing(*self.plan())
            outputs = {key: self.adapter.to_numpy(self.fetch(tid)) for key, tid in self.trace.outputs.items()}
        return RerunResult(outputs, self.patching.captured)

    def plan(self) -> tuple[list[int], dict[int, set[int]]]:
        replaced = {tid for tid, patch in self.patching.patches.items() if not isinstance(patch, (Shift, PassOn))}
        return execution_plan(self.trace, self.wanted, replaced, self.patching.capture)

    def fetch(self, tid: int) -> Any:
        tensor = self.env.get(tid)
        if tensor is None:
            info = self.trace.tensors[tid]
            if info.producer is None:
                tensor = self.patching.leaf(tid, self.leaves[tid][0])
            else:  # produced by an op that was not run: all its outputs are patched
                tensor = self.adapter.from_numpy(self.patching.patch(tid, info.shape), info.dtype, self.calls[info.producer].device,
                                                 self.layout(tid))
            self.env[tid] = tensor
        return tensor

    def run_node(self, index: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
        op, adapter = self.trace.ops[index], self.adapter
        self._reached = not self.patching.tainted.isdisjoint(op.inputs)
        if self._reached and not self.check_every_op:  # values no patch reached meet patched ones here
            for tid in op.inputs:
                if tid not in self.patching.tainted and tid not in self.checked and self.trace.tensors[tid].producer is not None:
                    self._check(tid, self.env[tid])
        inputs = call_tensors(args, kwargs, adapter.is_tensor) if op.inplace else []
        _, produced, self._mutated = run_op(adapter, fn, args, kwargs, inputs)
        if len(produced) != len(op.outputs):
            raise UnfaithfulReplay(f"op {index} ({op.framework_op}) made {len(produced)} outputs, recorded {len(op.outputs)}")
        for tensor, tid in zip(produced, op.outputs):
            info = self.trace.tensors[tid]
            if tuple(tensor.shape) != tuple(info.shape) or adapter.dtype_name(tensor) != info.dtype:
                raise UnfaithfulReplay(f"op {index} ({op.framework_op}) made a {adapter.dtype_name(tensor)} tensor of "
                                       f"shape {tuple(tensor.shape)}, recorded {info.dtype} {tuple(info.shape)}")
        return produced

    def store(self, index: int, produced: list[Any]) -> None:
        op = self.trace.ops[index]
        for tensor, tid in zip(produced, op.outputs):
            check = not self._reached and (self.check_every_op or tid in self.wanted or tid in self.patching.capture)
            if check:
                self.checked.add(tid)
            self.env[tid] = self.patching.output(op, tid, tensor, self._reached, check, id(tensor) in self._mutated)

    def _check(self, tid: int, tensor: Any) -> None:
        self.checked.add(tid)
        self.patching.check(self.trace.ops[self.trace.tensors[tid].producer], tid, tensor)


def live_fingerprint(adapter: Tensors, tensor: Any) -> list[float]:
    """`fingerprint` of a live tensor, read where it lives (an accelerator's copies only those values)."""
    reductions = device_reductions(adapter, tensor)
    return fingerprint(adapter.to_numpy(tensor)) if reductions is None else reductions.picked


def rerun_recorded(adapter: Adapter, trace: Trace, recording: Recording, patches: dict[int, Any],
                   capture: Iterable[int] = ()) -> RerunResult:
    """What `recording.PatchedRerun` computes for the same patches, by executing the recorded calls
    (`PatchedInterpreter`); where a value no patch reached departs from the recording, run again checking
    every op, to name the first op that departs."""
    try:
        return PatchedInterpreter(adapter, trace, recording, patches, capture, check_every_op=False).result()
    except TraceMismatchError as departed:
        PatchedInterpreter(adapter, trace, recording, patches, capture, check_every_op=True).result()
        raise departed
