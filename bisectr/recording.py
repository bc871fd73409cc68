"""Recording, patched re-runs and single-op replay, over any adapter.

This is bisectr's interpreter: the one place where framework calls are executed
on bisectr's behalf. `Recorder` builds a `Trace` from a forward pass (and a
`Recording` of the calls it made); `PatchedRerun` runs the same forward again,
checks it follows the recording op for op, and substitutes given values for
chosen tensors; `rerun_recorded` gets the same answer by executing the recorded
calls instead of the model's code; `replay_op` calls one recorded op again on
substituted (optionally float64) inputs.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .adapters import Adapter
from .adapters.base import API, CALLER
from .errors import TraceMismatchError
from .ops import canonical_op
from .store import TensorWriter
from .structure import call_tensors, flatten_outputs, iter_tensors, map_tensors
from .trace import OpNode, StatsBatch, TensorInfo, Trace, fingerprint, is_floating

_BISECTR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep

# What a frame is to an op's source line (`Recorder._source`), decided once per code object.
_USER, _STOP, _SKIP, _LIBRARY_CALLER, _LIBRARY_API = range(5)


# An unpatched op whose values move by more than this (relative to the tensor's largest
# magnitude) between recording and re-run is not deterministic: dropout or other randomness.
VALUE_DRIFT = 1e-3


@dataclass(frozen=True, slots=True)
class Slot:
    """Stands for the tensor `tid` inside a recorded call's arguments."""

    tid: int


@dataclass
class Call:
    """What `replay_op` needs to call a recorded op again."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    device: str = ""  # where its outputs live


@dataclass
class Recording:
    """What a side keeps in memory from its recording: each op's call, and each leaf tensor
    read (tid -> (tensor, its version when first read)); `value_reads` counts the calls that
    brought tensor values into Python (`.item()`, `if t:`), whose results later calls have baked in."""

    calls: list[Call] = field(default_factory=list)
    leaves: dict[int, tuple[Any, int]] = field(default_factory=dict)
    value_reads: int = 0
    # False once executing the calls made tensors of other shapes or dtypes than recorded:
    # state around the calls (autocast) or data-dependent shapes shaped the forward.
    faithful: bool = True

    def replayable(self, adapter: Adapter) -> bool:
        """Can the recorded calls stand in for the model's code? Not after a value read (a patch
        could change what was read), once a leaf has been changed in place, or once they have
        been found unfaithful."""
        return self.faithful and not self.value_reads and all(adapter.version(t) == v for t, v in self.leaves.values())


class UnfaithfulReplay(Exception):
    """Executing the recorded calls did not make the tensors the recording made."""


@dataclass
class RecordOptions:
    store_values: bool = True
    # With store_values, keep only op outputs under these module path prefixes ("" = all).
    keep_modules: tuple[str, ...] = ()


class TensorIds:
    """Stable integer ids for live tensors. Python object ids are reused after a tensor
    is freed, so each entry keeps a weak reference to check it still names the same object."""

    def __init__(self):
        self._by_object: dict[int, tuple[weakref.ref, int]] = {}
        self.count = 0

    def lookup(self, tensor: Any) -> int | None:
        entry = self._by_object.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        return entry[1]

    def assign(self, tensor: Any, tid: int | None = None) -> int:
        if tid is None:
            tid = self.count
        self.count = max(self.count, tid + 1)
        self._by_object[id(tensor)] = (weakref.ref(tensor), tid)
        return tid


def run_op(adapter: Adapter, fn: Callable[..., Any], args: tuple, kwargs: dict,
           inputs: list[Any]) -> tuple[Any, list[Any], set[int]]:
    """Run one framework op on `args` and `kwargs` (whose tensors are `inputs`). Returns its result,
    the tensors it wrote (what it returned, plus the input it changed in place) and the object id of
    the one changed in place. Views share their base's version counter, so only the first changed
    input counts as written. What the op raises is marked as the op's (the user's or the framework's
    error), so that it is not mistaken for a failure of bisectr itself."""
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
    written = next((t for t, v in zip(inputs, versions) if adapter.version(t) != v), None)
    if written is None:
        return result, produced, set()
    if all(written is not t for t in produced):
        produced.append(written)
    return result, produced, {id(written)}


class _Session:
    """Shared by recording and re-running: module stack, tensor ids."""

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        self.ids = TensorIds()
        self.modules: list[str] = []
        self.op_count = 0

    def enter_module(self, path: str) -> None:
        self.modules.append(path)

    def exit_module(self) -> None:
        if self.modules:
            self.modules.pop()

    def adopt_root(self, module: Any, prefix: str) -> None:
        """See `OpListener.adopt_root`: only a recording names leaves."""

    def input_tids(self, tensors: list[Any]) -> list[int]:
        tids = []
        for tensor in tensors:
            tid = self.ids.lookup(tensor)
            if tid is None:
                tid = self.ids.assign(tensor)
                self.on_new_leaf(tid, tensor)
            tids.append(tid)
        return tids

    def on_new_leaf(self, tid: int, tensor: Any) -> None:
        """A tensor no recorded op produced (parameter, input, constant) is first read."""

class Recorder(_Session):
    """Listener that turns a forward pass into a `Trace` (and `Call`s for replay)."""

    def __init__(self, adapter: Adapter, model: Any, inputs: list[tuple[str, Any]], trace: Trace,
                 writer: TensorWriter | None, options: RecordOptions):
        super().__init__(adapter)
        self.trace = trace
        self.writer = writer
        self._leaf_names: dict[int, tuple[weakref.ref, str]] = {}
        for key, value in inputs:
            if adapter.is_tensor(value):
                self._leaf_names[id(value)] = (weakref.ref(value), f"input:{key}")
        for name, tensor in adapter.named_leaves(model):
            self._leaf_names.setdefault(id(tensor), (weakref.ref(tensor), name))
        self.options = options
        self.recording = Recording()
        self._adapter_dir = os.path.dirname(os.path.abspath(sys.modules[type(adapter).__module__].__file__)) + os.sep
        self._framework = adapter.internal_paths()
        self._internal = self._framework + (_BISECTR_DIR, self._adapter_dir, _STDLIB_DIR)
        self._frame_kinds: dict[Any, int] = {}  # code object -> _USER, _STOP, ...
        self._stats = StatsBatch()

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        inputs = call_tensors(args, kwargs, self.adapter.is_tensor)
        input_tids = self.input_tids(inputs)
        result, produced, mutated = run_op(self.adapter, fn, args, kwargs, inputs)
        if not produced:
            if name in self.adapter.value_reads:
                self.recording.value_reads += 1
            return result
        index = self.op_count
        self.op_count += 1
        module = self.modules[-1] if self.modules else ""
        keep = self._keeps(module)
        output_tids = [self._record_tensor(tensor, index, None, keep) for tensor in produced]
        source, library = self._source()
        self.trace.ops.append(OpNode(index, name, canonical_op(name), module, source,
                                     input_tids, output_tids, bool(mutated), library))
        slots = {id(t): Slot(tid) for t, tid in zip(inputs, input_tids)}
        slot = lambda t: slots[id(t)]  # noqa: E731
        self.recording.calls.append(Call(fn, map_tensors(args, self.adapter.is_tensor, slot),
                                         map_tensors(kwargs, self.adapter.is_tensor, slot), self.adapter.device_name(produced[0])))
        return result

    def on_new_leaf(self, tid: int, tensor: Any) -> None:
        self.recording.leaves[tid] = (tensor, self.adapter.version(tensor))
        self._describe(tid, tensor, producer=None, leaf=self.leaf_name(tensor), store=self.options.store_values)

    def adopt_root(self, module: Any, prefix: str) -> None:
        for name, tensor in self.adapter.named_leaves(module):
            kind, _, path = name.partition(":")
            self._leaf_names.setdefault(id(tensor), (weakref.ref(tensor), f"{kind}:{prefix}.{path}" if prefix else name))

    def leaf_name(self, tensor: Any) -> str:
        entry = self._leaf_names.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return f"const:{self.op_count}"

    def _keeps(self, module: str) -> bool:
        if not self.options.store_values:
            return False
        prefixes = self.options.keep_modules
        return not prefixes or any(module == p or module.startswith(p + ".") for p in prefixes)

    def _record_tensor(self, tensor: Any, producer: int, leaf: str | None, store: bool) -> int:
        tid = self.ids.assign(tensor)
        self._describe(tid, tensor, producer, leaf, store)
        return tid

    def _describe(self, tid: int, tensor: Any, producer: int | None, leaf: str | None, store: bool) -> None:
        values = self.adapter.to_numpy(tensor)
        stored = store and self.writer is not None
        if stored:
            self.writer.write(tid, values)
        info = TensorInfo(tid, tuple(values.shape), self.adapter.dtype_name(tensor), {}, [], producer, leaf, stored)
        self.trace.tensors[tid] = info
        self._stats.add(info, values)

    def finish(self, outputs: list[tuple[str, Any]]) -> None:
        """Mark the model's outputs, name the floating parameters and buffers no op read, and
        complete every tensor's statistics."""
        self._record_outputs(outputs)
        read = set(self.trace.leaves)
        unread = {name for ref, name in self._leaf_names.values() if name.startswith(("param:", "buffer:"))
                  and name not in read and ref() is not None and is_floating(self.adapter.dtype_name(ref()))}
        self.trace.unread_leaves = sorted(unread)
        self._stats.flush()

    def _record_outputs(self, outputs: list[tuple[str, Any]]) -> None:
        for key, tensor in outputs:
            tid = self.ids.lookup(tensor)
            if tid is None:
                tid = self.ids.assign(tensor)
                self.on_new_leaf(tid, tensor)
            info = self.trace.tensors[tid]
            if not info.stored and self.writer is not None:
                self.writer.write(tid, self.adapter.to_numpy(tensor))
                info.stored = True
            self.trace.outputs[key] = tid

    def _source(self) -> tuple[str, bool]:
        """("path:line", is it the framework's own?) of the code that called this op: the innermost
        frame of the user's code, else, where no user code called it (a model that is one framework
        layer, nn.TransformerEncoder), the framework's own line that did: the innermost frame that
        calls an op (a layer's forward), else the innermost public function passing the call on
        (see `Adapter.frame_role`). The walk stops at bisectr's own frames."""
        frame = sys._getframe(2)
        kinds = self._frame_kinds
        caller = api = None
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = kinds[code] = self._frame_kind(code)
            if kind == _USER:
                return f"{code.co_filename}:{frame.f_lineno}", False
            if kind == _STOP:
                break
            if kind == _LIBRARY_CALLER:
                if caller is None:
                    caller = frame
            elif kind == _LIBRARY_API and api is None:
                api = frame
            frame = frame.f_back
        found = caller if caller is not None else api
        if found is None:
            return "", False
        return f"{found.f_code.co_filename}:{found.f_lineno}", True

    def _frame_kind(self, code: Any) -> int:
        filename = code.co_filename
        if filename.startswith(_BISECTR_DIR) and not filename.startswith(self._adapter_dir):
            return _STOP
        if filename.startswith(self._framework):
            role = self.adapter.frame_role(filename, code.co_name)
            return _LIBRARY_CALLER if role == CALLER else _LIBRARY_API if role == API else _SKIP
        if filename.startswith(self._internal) or filename.startswith("<"):
            return _SKIP
        return _USER


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
    """What one backward pass of a side computed (see `bisectr.backward`)."""

    tensors: dict[int, np.ndarray]  # op output tid -> the gradient reaching it (absent: none reaches it)
    leaves: dict[int, np.ndarray | None]  # parameter or floating input tid -> its gradient (None: frozen, or unused)
    loss: float | None = None  # the side's loss, where the model file defines one


class PatchedRerun(_Session):
    """Listener for a re-run that follows a recorded trace and swaps in given values.

    `patches` maps a tid of the recording to the values it should hold: op outputs
    are replaced as they are produced (written in place for in-place ops), leaves
    are replaced where they are read. `capture` names tids whose re-run values to keep.
    """

    with_gradients = False  # the recording ran without gradients; a re-run with them may take another path

    def __init__(self, adapter: Adapter, trace: Trace, patches: dict[int, np.ndarray], capture: Iterable[int] = ()):
        super().__init__(adapter)
        self.trace = trace
        self.patches = patches
        self.capture = set(capture)
        self.captured: dict[int, np.ndarray] = {}
        self._leaf_substitutes: dict[int, Any] = {}
        self.tainted: set[int] = set(patches)  # tids a patch may have changed

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        inputs = call_tensors(args, kwargs, self.adapter.is_tensor)
        input_tids = self.input_tids(inputs)
        if any(tid in self.patches and self.trace.tensors[tid].producer is None for tid in input_tids):
            args, kwargs, inputs = self._patch_leaves(args, kwargs, inputs, input_tids)
        result, produced, mutated = run_op(self.adapter, fn, args, kwargs, inputs)
        if not produced:
            return result
        expected = self._expected_op(name)
        self.op_count += 1
        if len(produced) != len(expected.outputs):
            raise self._departure(expected, name, f"{len(produced)} outputs instead of {len(expected.outputs)}")
        replacements: dict[int, Any] = {}
        untouched = not any(tid in self.tainted for tid in input_tids)
        for tensor, tid in zip(produced, expected.outputs):
            if untouched:
                _check_reproduced(self.adapter, self.trace, tensor, tid, expected)
            else:
                self.tainted.add(tid)
            if tid in self.patches:
                replacements[id(tensor)] = tensor = self.substitute(tid, tensor, id(tensor) in mutated)
            self.ids.assign(tensor, tid)
            self.on_output(tid, tensor)
        if replacements:
            result = map_tensors(result, self.adapter.is_tensor, lambda t: replacements.get(id(t), t))
        return result

    def substitute(self, tid: int, tensor: Any, in_place: bool) -> Any:
        """What the re-run goes on with in place of op output `tensor`, which has a patch."""
        return _patched(self.adapter, self.patches, tid, tensor, in_place)

    def on_output(self, tid: int, tensor: Any) -> None:
        """An op of the re-run produced `tensor`, recorded as `tid` (patched already, if asked)."""
        if tid in self.capture:
            self.captured[tid] = self.adapter.to_numpy(tensor)

    def on_new_leaf(self, tid: int, tensor: Any) -> None:
        if tid not in self.trace.tensors or self.trace.tensors[tid].producer is not None:
            raise self._departure(None, "", "reads a tensor the recording did not read at this point")

    def _patch_leaves(self, args: tuple, kwargs: dict, inputs: list[Any], tids: list[int]):
        substitutes = {}
        for tensor, tid in zip(inputs, tids):
            if tid in self.patches and self.trace.tensors[tid].producer is None:
                if tid not in self._leaf_substitutes:
                    self._leaf_substitutes[tid] = _patched(self.adapter, self.patches, tid, tensor, in_place=False)
                substitutes[id(tensor)] = self._leaf_substitutes[tid]
        swap = lambda t: substitutes.get(id(t), t)  # noqa: E731
        args = map_tensors(args, self.adapter.is_tensor, swap)
        kwargs = map_tensors(kwargs, self.adapter.is_tensor, swap)
        return args, kwargs, call_tensors(args, kwargs, self.adapter.is_tensor)

    def _expected_op(self, name: str) -> OpNode:
        if self.op_count >= len(self.trace.ops):
            raise self._departure(None, name, "runs more ops than the recording")
        expected = self.trace.ops[self.op_count]
        if expected.framework_op != name:
            raise self._departure(expected, name, f"calls {name} where the recording called {expected.framework_op}")
        return expected

    def _departure(self, expected: OpNode | None, name: str, what: str) -> TraceMismatchError:
        return _departure_error(self.trace, expected.index if expected is not None else self.op_count, expected, what,
                                self.with_gradients)

    def finish(self, outputs: list[tuple[str, Any]]) -> RerunResult:
        if self.op_count != len(self.trace.ops):
            raise TraceMismatchError(
                f"the {self.trace.side} re-run ran {self.op_count} ops, the recording {len(self.trace.ops)}: "
                "the forward is not deterministic (dropout in training mode? data-dependent control flow?)"
            )
        return RerunResult({key: self.adapter.to_numpy(t) for key, t in outputs}, self.captured)


class GradientRerun(PatchedRerun):
    """A re-run with gradients on (`Adapter.intercept(..., gradients=True)`), following the
    recording as `PatchedRerun` does, that hooks every op output a gradient reaches: the hook
    keeps the gradient in `gradients` and hands on `gradient_patches[tid]` instead where given.
    `leaves` are the leaf tensors read, by tid, for their gradients. `patched` are the patched op
    outputs: the backward starts from them too, so that a patch reaches the ops before a tensor
    whose readers all cut the gradient (a `detach`), where no gradient would call its hook.

    `activations` (tid -> values) replace op outputs in the forward while keeping the graph: the
    backward then runs through the side's own ops, each at the values given."""

    with_gradients = True

    def __init__(self, adapter: Adapter, trace: Trace, gradient_patches: dict[int, np.ndarray],
                 activations: dict[int, np.ndarray] | None = None):
        super().__init__(adapter, trace, activations or {})
        self.gradient_patches = gradient_patches
        self.gradients: dict[int, np.ndarray] = {}
        self.leaves: dict[int, Any] = {}
        self.patched: list[Any] = []

    def substitute(self, tid: int, tensor: Any, in_place: bool) -> Any:
        if in_place or not self.adapter.requires_grad(tensor):
            return super().substitute(tid, tensor, in_place)
        adapter = self.adapter
        change = _patch_values(adapter, self.patches, tid, tensor) - adapter.to_numpy(tensor)
        return tensor + adapter.from_numpy(change, adapter.dtype_name(tensor), adapter.device_name(tensor))

    def on_output(self, tid: int, tensor: Any) -> None:
        if self.adapter.requires_grad(tensor) and is_floating(self.trace.tensors[tid].dtype):
            self.adapter.add_gradient_hook(tensor, self._hook(tid, tensor))
            if tid in self.gradient_patches:
                self.patched.append(tensor)

    def on_new_leaf(self, tid: int, tensor: Any) -> None:
        super().on_new_leaf(tid, tensor)
        self.leaves[tid] = tensor

    def _hook(self, tid: int, tensor: Any) -> Callable[[Any], Any]:
        adapter = self.adapter
        dtype, device = adapter.dtype_name(tensor), adapter.device_name(tensor)

        def hook(gradient: Any) -> Any:
            if gradient is None:  # paddle calls hooks of outputs no gradient reaches (batch norm's statistics) with None
                return None
            self.gradients[tid] = adapter.to_numpy(gradient)
            if tid in self.gradient_patches:
                return adapter.from_numpy(_patch_values(adapter, self.gradient_patches, tid, gradient), dtype, device)
            return None

        return hook


def _check_reproduced(adapter: Adapter, trace: Trace, tensor: Any, tid: int, op: OpNode) -> None:
    """An op no patch can have influenced must compute what it computed when recorded."""
    recorded = trace.tensors[tid]
    now = fingerprint(adapter.to_numpy(tensor))
    if len(now) != len(recorded.fingerprint):
        raise _departure_error(trace, op.index, op, "produces a tensor of another size")
    allowed = VALUE_DRIFT * max(recorded.stats["absmax"], 1e-30)
    # Sixteen numbers: plain Python beats numpy's per-call cost. NaN == NaN counts as reproduced.
    if not all(a == b or abs(a - b) <= allowed or (a != a and b != b) for a, b in zip(now, recorded.fingerprint)):
        raise _departure_error(trace, op.index, op, "computes other values from the same inputs")


def _departure_error(trace: Trace, index: int, op: OpNode | None, what: str, gradients: bool = False) -> TraceMismatchError:
    where = "" if op is None else \
        f" ({op.framework_op} in {op.module or '(top level)'}" + (f" at {op.source})" if op.source else ")")
    cause = "The forward is not deterministic (dropout or randomness in training mode? data-dependent control flow?)"
    if gradients:
        cause = ("The forward is not deterministic, or takes another path with gradients on than without (a reentrant "
                 "gradient checkpoint that applies only with gradients on: use use_reentrant=False)")
    return TraceMismatchError(f"the {trace.side} re-run departed from its recording at op {index}{where}: it {what}. {cause}")


def _checked_patch(patches: dict[int, np.ndarray], tid: int, shape: Iterable[int]) -> np.ndarray:
    values = patches[tid]
    if tuple(values.shape) != tuple(shape):
        raise TraceMismatchError(f"the patch for tensor {tid} has shape {tuple(values.shape)}, the tensor {tuple(shape)}")
    return values


def _patch_values(adapter: Adapter, patches: dict[int, np.ndarray], tid: int, tensor: Any) -> np.ndarray:
    patch = _checked_patch(patches, tid, tensor.shape)
    return patch.applied_to(adapter.to_numpy(tensor)) if isinstance(patch, Shift) else patch


def _patched(adapter: Adapter, patches: dict[int, np.ndarray], tid: int, tensor: Any, in_place: bool) -> Any:
    """`tensor` with the patch for `tid` in it: written into it where an op wrote it in place
    (its aliases see the write), else as a new tensor of its dtype and device."""
    values = _patch_values(adapter, patches, tid, tensor)
    if in_place:
        adapter.assign(tensor, values)
        return tensor
    return adapter.from_numpy(values, adapter.dtype_name(tensor), adapter.device_name(tensor))


def rerun_recorded(adapter: Adapter, trace: Trace, recording: Recording, patches: dict[int, np.ndarray],
                   capture: Iterable[int] = ()) -> RerunResult:
    """What `PatchedRerun` computes for the same patches, by executing the recorded calls
    instead of the model's code, as `torch.fx.Interpreter` runs a graph. Only the ops whose
    values are needed run: not an op whose outputs are all patched (the patches stand in),
    nor one whose outputs nothing reads. Tensors are released after their last use.
    As in `PatchedRerun`, what no patch can reach must reproduce its recorded values: checked
    where it meets patched values and at the outputs, and where that fails, op by op to name
    the first op that departs. Valid while `recording.replayable(adapter)`; raises
    `UnfaithfulReplay` where a call makes another shape or dtype than recorded."""
    try:
        return _execute_calls(adapter, trace, recording, patches, set(capture), check_every_op=False)
    except TraceMismatchError as departed:
        _execute_calls(adapter, trace, recording, patches, set(capture), check_every_op=True)
        raise departed


def _execute_calls(adapter: Adapter, trace: Trace, recording: Recording, patches: dict[int, np.ndarray],
                   capture: set[int], check_every_op: bool) -> RerunResult:
    wanted = set(trace.outputs.values())
    plan, releases = _replay_plan(trace, patches, wanted, capture)
    values: dict[int, Any] = {}
    captured: dict[int, np.ndarray] = {}
    tainted = set(patches)  # what a patch may have changed
    checked: set[int] = set()

    def read(tid: int) -> Any:
        tensor = values.get(tid)
        if tensor is not None:
            return tensor
        info = trace.tensors[tid]
        if info.producer is None:
            tensor = recording.leaves[tid][0]
            if tid in patches:
                tensor = _patched(adapter, patches, tid, tensor, in_place=False)
        else:  # produced by an op that was not run: all its outputs are patched
            device = recording.calls[info.producer].device
            tensor = adapter.from_numpy(_checked_patch(patches, tid, info.shape), info.dtype, device)
        values[tid] = tensor
        return tensor

    def check(tid: int, tensor: Any) -> None:
        checked.add(tid)
        _check_reproduced(adapter, trace, tensor, tid, trace.ops[trace.tensors[tid].producer])

    with adapter.no_grad():
        for index in plan:
            op, call = trace.ops[index], recording.calls[index]
            args, kwargs = _fill_slots(call.args, read), _fill_slots(call.kwargs, read)
            reached = not tainted.isdisjoint(op.inputs)
            if reached and not check_every_op:  # values no patch reached meet patched ones here
                for tid in op.inputs:
                    if tid not in tainted and tid not in checked and trace.tensors[tid].producer is not None:
                        check(tid, values[tid])
            inputs = call_tensors(args, kwargs, adapter.is_tensor) if op.inplace else []
            _, produced, mutated = run_op(adapter, call.fn, args, kwargs, inputs)
            if len(produced) != len(op.outputs):
                raise UnfaithfulReplay(f"op {index} ({op.framework_op}) made {len(produced)} outputs, recorded {len(op.outputs)}")
            for tensor, tid in zip(produced, op.outputs):
                info = trace.tensors[tid]
                if tuple(tensor.shape) != tuple(info.shape) or adapter.dtype_name(tensor) != info.dtype:
                    raise UnfaithfulReplay(f"op {index} ({op.framework_op}) made a {adapter.dtype_name(tensor)} tensor of "
                                           f"shape {tuple(tensor.shape)}, recorded {info.dtype} {tuple(info.shape)}")
                if reached:
                    tainted.add(tid)
                elif check_every_op or tid in wanted or tid in capture:
                    check(tid, tensor)
                if tid in patches:
                    tensor = _patched(adapter, patches, tid, tensor, id(tensor) in mutated)
                values[tid] = tensor
                if tid in capture:
                    captured[tid] = adapter.to_numpy(tensor)
            for tid in releases[index]:
                values.pop(tid, None)
        outputs = {key: adapter.to_numpy(read(tid)) for key, tid in trace.outputs.items()}
        return RerunResult(outputs, captured)


def _fill_slots(arguments: tuple | dict, read: Callable[[int], Any]) -> tuple | dict:
    """A recorded call's arguments with each `Slot` replaced by `read(tid)`."""
    return map_tensors(arguments, _is_slot, lambda slot: read(slot.tid))


def _replay_plan(trace: Trace, patches: dict[int, np.ndarray], wanted: set[int],
                 capture: set[int]) -> tuple[list[int], dict[int, set[int]]]:
    """The ops `rerun_recorded` runs, in order, and for each the tids no later one reads.
    An op runs if it writes in place (an alias may see the write), if one of its outputs is
    to be captured, or if a tid that is needed and not patched comes out of it; its inputs
    are then needed. `wanted` are read at the end."""
    replaced = {tid for tid, patch in patches.items() if not isinstance(patch, Shift)}
    needed = set(wanted).difference(replaced)  # to compute: read later, and not replaced by a patch
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


def _is_slot(obj: Any) -> bool:
    return isinstance(obj, Slot)


def replay_op(adapter: Adapter, call: Call, values: dict[int, np.ndarray], dtypes: dict[int, str],
              device: str, float64: bool = False) -> list[np.ndarray]:
    """Call a recorded op again on the given input values; returns its outputs in recorded order.

    With `float64`, every floating input is upcast, so the op runs as an fp64 oracle.
    """
    def materialize(slot: Any) -> Any:
        if not isinstance(slot, Slot):
            return slot
        dtype = dtypes[slot.tid]
        if float64 and dtype.startswith(("float", "bfloat")):
            dtype = "float64"
        return adapter.from_numpy(values[slot.tid], dtype, device)

    args = map_tensors(call.args, _is_slot, materialize)
    kwargs = map_tensors(call.kwargs, _is_slot, materialize)
    inputs = call_tensors(args, kwargs, adapter.is_tensor)
    _, produced, _ = run_op(adapter, call.fn, args, kwargs, inputs)
    return [adapter.to_numpy(t) for t in produced]


def replay_vjp(adapter: Adapter, trace: Trace, calls: list[Call], indices: list[int], values: dict[int, np.ndarray],
               upstream: dict[int, np.ndarray | None], float64: bool = False) -> dict[int, np.ndarray | None]:
    """The backward of recorded ops `indices` (one op, or a block in op order): the ops called again
    with gradients on, each reading what the ones before computed, else `values` (the block's
    external inputs, by tid); then the gradients of its floating external inputs (tid -> values;
    None where none reaches one) from the outputs in `upstream` (tid -> the gradient reaching it;
    None: none does). With `float64` the floating inputs are upcast and casts below float64 inside
    the block stay at float64 (`Adapter.float64_call`): the fp64 oracle of the block's backward."""
    leaves: dict[int, Any] = {}
    computed: dict[int, Any] = {}

    def materialize(slot: Any) -> Any:
        if not isinstance(slot, Slot):
            return slot
        if slot.tid in computed:
            return computed[slot.tid]
        dtype = trace.tensors[slot.tid].dtype
        if not is_floating(dtype):
            return adapter.from_numpy(values[slot.tid], dtype, trace.device)
        if slot.tid not in leaves:  # one leaf per tensor: ops reading it twice sum both gradients
            tensor = adapter.from_numpy(values[slot.tid], "float64" if float64 else dtype, trace.device)
            leaves[slot.tid] = adapter.gradient_leaf(tensor)
        return leaves[slot.tid]

    with adapter.enable_grad():
        for index, call in zip(indices, calls):
            args = map_tensors(call.args, _is_slot, materialize)
            kwargs = map_tensors(call.kwargs, _is_slot, materialize)
            fn = call.fn
            if float64:
                fn, args, kwargs = adapter.float64_call(trace.ops[index].framework_op, fn, args, kwargs)
            _, produced, _ = run_op(adapter, fn, args, kwargs, call_tensors(args, kwargs, adapter.is_tensor))
            computed.update(zip(trace.ops[index].outputs, produced))
    seeded = [(computed[tid], gradient) for tid, gradient in upstream.items()
              if gradient is not None and tid in computed and adapter.requires_grad(computed[tid])]
    if not seeded or not leaves:
        return dict.fromkeys(leaves)
    grads = adapter.gradients([t for t, _ in seeded], [adapter.from_numpy(g, adapter.dtype_name(t), trace.device) for t, g in seeded],
                              list(leaves.values()))
    return {tid: None if g is None else adapter.to_numpy(g) for tid, g in zip(leaves, grads)}


def output_pairs(adapter: Adapter, outputs: Any) -> list[tuple[str, Any]]:
    return flatten_outputs(outputs, adapter.is_tensor)
