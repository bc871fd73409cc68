"""The forward again with patches: values that replace a tensor, or shifts added to it.

`PatchedInterpreter` executes the recorded calls, running only the ops whose values are needed and
releasing tensors after their last use; `PatchedRerun` runs the model's own code instead, for forwards
the recorded calls cannot stand in for, checking it follows the recording op for op. Both hand each op's
outputs to `Patches`: leaves and op outputs replaced, and every value no patch can have reached checked
against the recording. `rerun` picks between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..adapters import Adapter, Tensors
from ..capture.modelfile import BuiltSide, intercepted_forward
from ..capture.ops import UNINITIALISED
from ..capture.recording import ForwardSession, output_pairs, poison, poison_for
from ..capture.structure import call_tensors, map_tensors
from ..capture.trace import OpNode, Trace, device_reductions, fingerprint
from ..errors import PathDeparture, TraceMismatchError
from ..capture.calls import RecordedCalls, run_op
from .interpreter import Interpreter, UnfaithfulReplay, execution_plan

# An unpatched op whose values move by more than this (relative to the tensor's largest
# magnitude) between recording and re-run is not deterministic: dropout or other randomness.
VALUE_DRIFT = 1e-3


@dataclass(frozen=True)
class PassOn:
    """A patch that makes a tensor the values of tensor `source` as the re-run computes them (as
    every process of a distributed run takes them: `Adapter.shared_numpy`): ops the reference lacks,
    taken out where the reference passes its value on unchanged. `source` is made before the tensor."""

    source: int
    shape: tuple[int, ...]


# A shift this many times the value it leads to (and past 1) leaves none of the re-run's own digits in the sum.
SWAMPING = 1e3


@dataclass
class Shift:
    """A patch that adds `delta` to what the re-run computes instead of replacing it: an op's own
    difference taken out (or put in) while whatever reaches the op in this re-run stays, as when
    every occurrence of a difference is taken out at once. Where the sum is not finite, or the shift is
    so much larger than `fallback` that the sum would keep nothing of the values (a mask's -1e9 taken out of
    a score), `fallback` stands in."""

    delta: np.ndarray
    fallback: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.delta.shape

    def applied_to(self, values: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            shifted = (values + self.delta).astype(values.dtype)
        if self.fallback is None:
            return shifted
        with np.errstate(invalid="ignore", over="ignore"):
            swamped = np.abs(self.delta) > SWAMPING * np.maximum(np.abs(self.fallback), 1.0)
        return np.where(np.isfinite(shifted) & ~swamped, shifted, self.fallback).astype(values.dtype)


@dataclass
class RerunResult:
    outputs: dict[str, np.ndarray]
    captured: dict[int, np.ndarray] = field(default_factory=dict)


class Patches:
    """What patches (tid -> values, or a `Shift`) do to a run following a recording: leaves are
    replaced where read, op outputs as they are made (written in place for in-place ops);
    `capture` names tids whose run values to keep. Values no patch can have reached must be the
    recorded ones (`check`); `tainted` are the tids a patch may have changed. In a run with
    `gradients` on, an op output keeps its autograd graph (the patch is added to it as a difference)."""

    def __init__(
        self,
        adapter: Adapter,
        trace: Trace,
        patches: dict[int, Any],
        capture: Iterable[int] = (),
        gradients: bool = False,
    ):
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
        else checked (where `check`) against the recording; patched; captured. Memory the op leaves
        uninitialised is poisoned: where the model reads it, the run departs from the recording."""
        if op.op in UNINITIALISED:
            poison(self.adapter, tensor, poison_for(self.trace.tensors[tid]))
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
            raise TraceMismatchError(
                f"the patch for tensor {tid} has shape {tuple(patch.shape)}, the tensor {tuple(shape)}"
            )
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
        where = (
            ""
            if op is None
            else f" ({op.framework_op} in {op.module or '(top level)'}" + (f" at {op.source})" if op.source else ")")
        )
        cause = (
            "The forward is not deterministic (dropout or randomness in training mode? data-dependent control flow?)"
        )
        if self.gradients:
            cause = (
                "The forward is not deterministic, or takes another path with gradients on than without (a reentrant "
                "gradient checkpoint that applies only with gradients on: use use_reentrant=False)"
            )
        error = PathDeparture if path else TraceMismatchError
        return error(
            f"the {self.trace.side} re-run departed from its recording at op {index}{where}: it {what}. {cause}"
        )


class PatchedInterpreter(Interpreter):
    """The recorded forward again with `patches`, what `PatchedRerun` computes by running
    the model's code. Only the ops whose values are needed run (`plan`): not an op whose outputs are
    all patched (the patches stand in), nor one whose outputs nothing reads; tensors are released
    after their last use. What no patch can reach is checked where it meets patched values and at
    the outputs (`check_every_op`: after every op, to name the first op that departs). Raises
    `UnfaithfulReplay` where a call makes another shape or dtype than recorded."""

    def __init__(
        self,
        adapter: Adapter,
        trace: Trace,
        recorded: RecordedCalls,
        patches: dict[int, Any],
        capture: Iterable[int],
        check_every_op: bool,
    ):
        super().__init__(adapter, trace, recorded.calls)
        self.leaves = recorded.leaves  # tid -> (the leaf tensor read when recording, its version)
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
                tensor = self.adapter.from_numpy(
                    self.patching.patch(tid, info.shape), info.dtype, self.calls[info.producer].device, self.layout(tid)
                )
            self.env[tid] = tensor
        return tensor

    def run_node(self, index: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
        op, adapter = self.trace.ops[index], self.adapter
        self._reached = not self.patching.tainted.isdisjoint(op.inputs)
        if self._reached and not self.check_every_op:  # values no patch reached meet patched ones here
            for tid in op.inputs:
                if (
                    tid not in self.patching.tainted
                    and tid not in self.checked
                    and self.trace.tensors[tid].producer is not None
                ):
                    self._check(tid, self.env[tid])
        inputs = call_tensors(args, kwargs, adapter.is_tensor) if op.inplace else []
        _, produced, self._mutated = run_op(adapter, fn, args, kwargs, inputs)
        if len(produced) != len(op.outputs):
            raise UnfaithfulReplay(
                f"op {index} ({op.framework_op}) made {len(produced)} outputs, recorded {len(op.outputs)}"
            )
        for tensor, tid in zip(produced, op.outputs):
            info = self.trace.tensors[tid]
            if tuple(tensor.shape) != tuple(info.shape) or adapter.dtype_name(tensor) != info.dtype:
                raise UnfaithfulReplay(
                    f"op {index} ({op.framework_op}) made a {adapter.dtype_name(tensor)} tensor of "
                    f"shape {tuple(tensor.shape)}, recorded {info.dtype} {tuple(info.shape)}"
                )
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


def rerun_recorded(
    adapter: Adapter,
    trace: Trace,
    recorded: RecordedCalls,
    patches: dict[int, Any],
    capture: Iterable[int] = (),
    every_op: bool = False,
) -> RerunResult:
    """What `PatchedRerun` computes for the same patches (which checks every op), by executing the recorded
    calls (`PatchedInterpreter`, checking every op with `every_op`); where a value no patch reached departs
    from the recording, run again checking every op, to name the first op that departs."""
    try:
        return PatchedInterpreter(adapter, trace, recorded, patches, capture, check_every_op=every_op).result()
    except TraceMismatchError as departed:
        PatchedInterpreter(adapter, trace, recorded, patches, capture, check_every_op=True).result()
        raise departed


class PatchedRerun(ForwardSession):
    """Listener for a re-run of the model's code that follows a recorded trace, op for op, and
    hands each op's outputs to `Patches` (patched, checked, captured; see `Patches`).

    A patch may change a data-dependent decision (a router's top-k, a mask made from values) so that the
    code takes another path than recorded. Once every tensor asked for is captured, nothing ahead needs the
    recording's numbering: the run goes on free (`free`), patched leaves still swapped in where read, op
    output patches ahead left out, and its outputs are read by key."""

    with_gradients = False  # the recording ran without gradients; a re-run with them may take another path

    def __init__(self, adapter: Adapter, trace: Trace, patches: dict[int, Any], capture: Iterable[int] = ()):
        super().__init__(adapter)
        self.trace = trace
        self.patching = Patches(adapter, trace, patches, capture, gradients=self.with_gradients)
        self.free = False

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self.free:
            return self._free_call(fn, args, kwargs)
        inputs = call_tensors(args, kwargs, self.adapter.is_tensor)
        try:
            input_tids = self.input_tids(inputs)
        except PathDeparture as departure:
            self._go_free(departure)
            return self._free_call(fn, args, kwargs)
        if any(tid in self.patching.patches for tid in input_tids):
            args, kwargs, inputs = self._patch_leaves(args, kwargs, inputs, input_tids)
        result, produced, mutated = run_op(self.adapter, fn, args, kwargs, inputs)
        if not produced:
            return result
        try:
            return self._follow(name, result, produced, mutated, input_tids)
        except PathDeparture as departure:
            self._go_free(departure)
            return result

    def _follow(self, name: str, result: Any, produced: list[Any], mutated: set[int], input_tids: list[int]) -> Any:
        """Hand what the op produced to `Patches` as the recording's op at this point (departures raise)."""
        expected = self._expected_op(name)
        self.op_count += 1
        if len(produced) != len(expected.outputs):
            raise self.patching.departure(
                expected.index, expected, f"{len(produced)} outputs instead of {len(expected.outputs)}", path=True
            )
        reached = not self.patching.tainted.isdisjoint(input_tids)
        if reached and any(
            tuple(t.shape) != tuple(self.trace.tensors[tid].shape) for t, tid in zip(produced, expected.outputs)
        ):
            raise self.patching.departure(
                expected.index, expected, "makes a tensor of another shape from patched values", path=True
            )
        replacements: dict[int, Any] = {}
        for tensor, tid in zip(produced, expected.outputs):
            went_on = self.patching.output(expected, tid, tensor, reached, check=True, in_place=id(tensor) in mutated)
            if went_on is not tensor:
                replacements[id(tensor)] = went_on
            self.ids.assign(went_on, tid)
            self.on_output(tid, went_on)
        if replacements:
            result = map_tensors(result, self.adapter.is_tensor, lambda t: replacements.get(id(t), t))
        return result

    def _go_free(self, departure: PathDeparture) -> None:
        """Leave the recorded path (see the class docstring), or raise `departure` where the run may not."""
        if not self._may_go_free():
            raise departure
        self.free = True

    def _may_go_free(self) -> bool:
        """Can the run leave the recorded path: a patch took it there, and no tensor asked for is still ahead?
        Op output patches still ahead are not placed: the ops there compute from the patched values before them."""
        patching = self.patching
        return not self.with_gradients and bool(patching.applied) and patching.capture <= patching.captured.keys()

    def _free_call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """An op off the recorded path: run as called, patched leaves swapped in where read."""
        inputs = call_tensors(args, kwargs, self.adapter.is_tensor)
        tids = [self.ids.lookup(t) for t in inputs]
        if any(tid in self.patching.patches for tid in tids if tid is not None):
            known = [(t, tid) for t, tid in zip(inputs, tids) if tid is not None]
            args, kwargs, inputs = self._patch_leaves(args, kwargs, [t for t, _ in known], [tid for _, tid in known])
        return run_op(self.adapter, fn, args, kwargs, inputs)[0]

    def on_output(self, tid: int, tensor: Any) -> None:
        """An op of the re-run produced `tensor`, recorded as `tid` (patched already, if asked)."""

    def on_new_leaf(self, tid: int, tensor: Any) -> None:
        if tid not in self.trace.tensors or self.trace.tensors[tid].producer is not None:
            raise self.patching.departure(
                self.op_count, None, "reads a tensor the recording did not read at this point", path=True
            )

    def _patch_leaves(self, args: tuple, kwargs: dict, inputs: list[Any], tids: list[int]):
        leaves = {tid for tid in tids if tid in self.patching.patches and self.trace.tensors[tid].producer is None}
        if not leaves:
            return args, kwargs, inputs
        substitutes = {id(t): self.patching.leaf(tid, t) for t, tid in zip(inputs, tids) if tid in leaves}
        swap = lambda t: substitutes.get(id(t), t)  # noqa: E731
        args = map_tensors(args, self.adapter.is_tensor, swap)
        kwargs = map_tensors(kwargs, self.adapter.is_tensor, swap)
        return args, kwargs, call_tensors(args, kwargs, self.adapter.is_tensor)

    def _expected_op(self, name: str) -> OpNode:
        if self.op_count >= len(self.trace.ops):
            raise self.patching.departure(self.op_count, None, "runs more ops than the recording", path=True)
        expected = self.trace.ops[self.op_count]
        if expected.framework_op != name:
            raise self.patching.departure(
                expected.index, expected, f"calls {name} where the recording called {expected.framework_op}", path=True
            )
        return expected

    def finish(self, outputs: list[tuple[str, Any]]) -> RerunResult:
        if not self.free and self.op_count != len(self.trace.ops):
            raise TraceMismatchError(
                f"the {self.trace.side} re-run ran {self.op_count} ops, the recording {len(self.trace.ops)}: "
                "the forward is not deterministic (dropout in training mode? data-dependent control flow?)"
            )
        return RerunResult({key: self.adapter.to_numpy(t) for key, t in outputs}, self.patching.captured)


def rerun(
    side: BuiltSide,
    trace: Trace,
    recorded: RecordedCalls,
    patches: dict[int, Any],
    capture: frozenset[int] = frozenset(),
    every_op: bool = False,
) -> RerunResult:
    """The forward again with `patches`: the recorded calls executed (`rerun_recorded`: the same results,
    several times faster, and only the ops a cut leaves to compute; checking every op with `every_op`) where
    they can stand in for the model (see `RecordedCalls.replayable`), and the model's own code otherwise
    (`rerun_model`), also once the recorded calls turn out not to stand in (autocast), and for a side seeded
    before each run (`BuiltSide.seed`), whose random ops draw what they drew only in the model's own run."""
    if side.seed is None and recorded.replayable(side.adapter):
        try:
            return rerun_recorded(side.adapter, trace, recorded, patches, capture, every_op)
        except UnfaithfulReplay:
            recorded.faithful = False
    return rerun_model(side, trace, patches, capture)


def rerun_model(
    side: BuiltSide, trace: Trace, patches: dict[int, Any], capture: frozenset[int] = frozenset()
) -> RerunResult:
    """A re-run of the model's own code (see `PatchedRerun`)."""
    listener = PatchedRerun(side.adapter, trace, patches, capture)
    outputs = intercepted_forward(side, listener)
    return listener.finish(output_pairs(side.adapter, outputs))
