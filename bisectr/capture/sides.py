"""Where a side's model runs: the live handle a search re-runs and replays through.

A side runner records the forward pass (`record`) and answers requests about it (`run`): a
re-run with patches, a replay of ops or of their backward, a backward pass, the float64 runs,
a recorded call, a training step, the questions of the search inside a compiled module's call
(`compiled`). `LocalSide` keeps the model in this process; a runner in another process
(`--isolate`) sends the same requests to its worker, so the analysis and the search never know
where a model lives. `Sides` holds both runners with the traces they recorded; a run record
(`runrecord.RunRecord`) never does.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from ..adapters import Adapter, CannotUpcast
from ..adapters.base import CompiledGraphs, CompiledProbe, OpListener
from ..errors import InterceptionFailure, ModelFileError, UnreadableTensorError, UnrecordedOutputError, UserModelError
from .compiled import CloseCompiled, CompiledQuestion, OpenCompiled, answer_compiled
from .interpreter import (Float64Calls, Float64Copies, Float64Interpreter, Gradients, Recording, RerunResult, UnfaithfulReplay,
                          ValuesInterpreter, VJPInterpreter, rerun_recorded)
from .modelfile import BuiltSide, load_module, loss_of, module_name
from .recording import GradientRerun, PatchedRerun, RecordOptions, Recorder, output_pairs
from .store import TensorWriter
from .trainer import Trainer
from .structure import call_tensors, iter_tensors, map_tensors
from .trace import OpNode, TensorInfo, Trace, is_floating, read_live
from ..leafref import LeafRef, leaf_kind


# -- what a side is asked ------------------------------------------------------------------
@dataclass
class Rerun:
    """Run again, following the recording, with `patches` (tid -> values, or a `Shift`) swapped in
    (see `interpreter.Patches`); the values of the tids in `capture` come back too. -> `RerunResult`"""

    patches: dict[int, Any]
    capture: frozenset[int] = frozenset()


@dataclass
class Replay:
    """Ops `indices` (one op, or a block in op order) called again on `values` (tid -> array) for
    every input they do not compute, upcast to float64 if asked. -> tid -> values of what they computed"""

    indices: list[int]
    values: dict[int, np.ndarray]
    float64: bool = False


@dataclass
class ReplayVJP:
    """The backward of ops `indices` on `values` for their external inputs, from `upstream` (tid ->
    the gradient reaching an output; None: none does); see `interpreter.VJPInterpreter`.
    -> tid -> the gradient of each floating external input (None: none reaches it)"""

    indices: list[int]
    values: dict[int, np.ndarray]
    upstream: dict[int, np.ndarray | None]
    float64: bool = False


@dataclass
class Backward:
    """Forward and backward again, following the recording, from the loss or from `seeds` (output
    key -> gradient), with `gradient_patches` (tid -> gradient) handed on instead of the own, on
    `activations` (tid -> values) in place of its own forward's (see `GradientRerun`). -> `Gradients`"""

    seeds: dict[str, np.ndarray]
    gradient_patches: dict[int, np.ndarray] = field(default_factory=dict)
    activations: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Float64Outputs:
    """The outputs of a float64 copy of the model (with `leaf_values`, leaf name -> values, in place
    of its own) on float64 inputs, keyed like the trace's outputs, and the ops that still ran below
    float64. -> `Float64Run`; raises `CannotUpcast` saying why the side cannot run in float64"""

    leaf_values: dict[str, np.ndarray]


@dataclass
class Float64Gradients:
    """The gradients of the parameters and floating inputs (by leaf name) of a float64 copy of the
    model (with `leaf_values`), as `Backward` computes them. -> `Float64Run`; raises `CannotUpcast`"""

    seeds: dict[str, np.ndarray]
    leaf_values: dict[str, np.ndarray]


@dataclass
class LeafValue:
    """The values of parameter or buffer `tid` as the model holds them (a run does not copy them).
    -> array"""

    tid: int


@dataclass
class RecordedCall:
    """The recorded call of op `index` (function and arguments). -> `Call`, or None where op `index`
    has none (the model's code was re-run)"""

    index: int


@dataclass
class TrainStep:
    """One optimizer step (steps counted from 1) of the side's trainer at `width` bits (32: a copy of
    the model as built; 64: a float64 copy), made by its first step from the model file's optimizer,
    batches and loss (the outputs against `seeds`, output key -> gradient, where it defines no loss).
    -> `StepFacts`"""

    width: int
    number: int
    seeds: dict[str, np.ndarray]


@dataclass
class StepValues:
    """One parameter's gradient, update or Adam moment ("gradient", "update", "moment1", "moment2") after
    the last step of the trainer at `width`. -> float64 array, or None where it has none"""

    width: int
    measure: str
    parameter: str


@dataclass
class TrainerSettings:
    """The optimizer settings of the trainer at `width`, and each parameter's weight decay. -> (dict, dict)"""

    width: int


Request = (Rerun | Replay | ReplayVJP | Backward | Float64Outputs | Float64Gradients | LeafValue | RecordedCall | TrainStep
           | StepValues | TrainerSettings | OpenCompiled | CloseCompiled | CompiledQuestion)


class SideRunner(Protocol):
    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        """Record one forward pass, writing tensor values through `writer`; `watch`: see `record_side`."""

    def run(self, request: Request) -> Any:
        """Answer `request` about the recorded forward (each request says what it returns)."""


# Called as a recording starts with a function returning the number of ops recorded so far (read
# from another thread by a progress display: the recording itself pays nothing for it).
Watch = Callable[[Callable[[], int]], None]


def record_side(side: BuiltSide, writer: TensorWriter | None, options: RecordOptions,
                watch: Watch | None = None) -> tuple[Trace, Recording]:
    """Record one side's forward pass: its trace, and the calls and leaves that replays need."""
    items = side.input_items()
    device, dtype = side.adapter.describe(side.model, [value for _, value in items])
    trace = Trace(side.role, side.adapter.name, device, dtype)
    recorder = Recorder(side.adapter, side.model, items, trace, writer, options)
    if watch is not None:
        watch(lambda: recorder.op_count)
    try:
        outputs = intercepted_forward(side, recorder)
    except UnreadableTensorError as exc:
        raise UnreadableTensorError(f"{side.model_file}: in the {side.role} model returned by {side.function}(), {exc}") from None
    pairs = output_pairs(side.adapter, outputs)
    if not pairs:
        raise ModelFileError(f"{side.model_file}: the {side.role} model returned no tensors (got {type(outputs).__name__})")
    recorder.finish(pairs)
    if writer is not None:
        writer.raise_failure()  # an op the failed write cut short computed nothing that was recorded
    _refuse_unrecorded_outputs(side, trace)
    return trace, recorder.recording


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
        raise InterceptionFailure(f"{side.model_file}: the {side.role} model returned by {side.function}() runs without "
                                  f"bisectr but raised under its interception: {error.raised}"
                                  ) from error.__context__


def _is_input_or_weight(info: TensorInfo) -> bool:
    return leaf_kind(info.leaf) in ("input", "param", "buffer")


def _refuse_unrecorded_outputs(side: BuiltSide, trace: Trace) -> None:
    """Fail closed: a verdict speaks only of what was recorded. A side whose floating outputs no
    recorded op computed from its inputs or parameters is refused."""
    where = f"{side.model_file}: the {side.role} model returned by {side.function}()"
    elsewhere = ("computed outside what bisectr sees (in another process, loaded from a file, copied from numpy); "
                 "bisectr compares only the framework ops it records in its own process")
    if not trace.ops:
        raise UnrecordedOutputError(f"{where} ran no {side.adapter.name} op that bisectr could record: its outputs were "
                                    f"{elsewhere}. Give {side.function}() a model that computes its outputs here")
    unseen = [key for key, tid in trace.outputs.items()
              if is_floating(trace.tensors[tid].dtype) and not trace.reaches(tid, _is_input_or_weight)]
    if unseen:
        raise UnrecordedOutputError(f"{where} returned {', '.join(map(repr, unseen))}, which no recorded op computed from "
                                    f"its inputs or parameters ({len(trace.ops)} ops recorded): {'they were' if len(unseen) > 1 else 'it was'} "
                                    f"{elsewhere}")


class LocalSide:
    """A side whose model lives in this process.

    A re-run executes the recorded calls (`interpreter.rerun_recorded`: the same results, several
    times faster, and only the ops a cut leaves to compute) where the recording can stand in for
    the model (see `Recording.replayable`), and the model's own code otherwise (`PatchedRerun`),
    also once the recorded calls turn out not to stand in (autocast).
    """

    def __init__(self, side: BuiltSide):
        self.side = side
        self.recording = Recording()
        self.trace: Trace | None = None
        self.trainers: dict[int, Trainer] = {}  # by width (`TrainStep`)
        self.compiled: CompiledProbe | None = None  # the compiled call `OpenCompiled` made ready

    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        self.trace, self.recording = record_side(self.side, writer, options, watch)
        return self.trace

    def run(self, request: Request) -> Any:
        adapter, trace, calls = self.side.adapter, self.trace, self.recording.calls
        match request:
            case Rerun(patches, capture):
                return self.rerun(patches, capture)
            case Replay(indices, values, float64):
                replay = ValuesInterpreter(adapter, trace, calls, self.recording.own_values(values), float64, self.recording.leaves)
                replay.run(indices)
                return {tid: replay.computed[tid] for index in indices for tid in trace.ops[index].outputs}
            case ReplayVJP(indices, values, upstream, float64):
                vjp = VJPInterpreter(adapter, trace, calls, self.recording.own_values(values), float64)
                with adapter.enable_grad():
                    vjp.run(indices)
                return vjp.gradients(upstream)
            case Backward(seeds, gradient_patches, activations):
                return self.backward(seeds, gradient_patches, activations)
            case Float64Outputs(leaf_values):
                return self.float64_outputs(leaf_values)
            case Float64Gradients(seeds, leaf_values):
                return self.float64_gradients(seeds, leaf_values)
            case LeafValue(tid):
                return adapter.to_numpy(self.recording.leaves[tid][0])
            case RecordedCall(index):
                return calls[index] if index < len(calls) else None
            case TrainStep(width, number, seeds):
                return self._trainer(width, seeds).step(number)
            case StepValues(width, measure, parameter):
                return self.trainers[width].read(measure, parameter)
            case TrainerSettings(width):
                return self.trainers[width].settings(), self.trainers[width].weight_decays()
            case OpenCompiled(index, values):
                self.compiled = self._probe_compiled(index, values)
                return None if self.compiled is None else (self.compiled.backend, self.compiled.rounding())
            case CloseCompiled():
                self.compiled = None
                return None
            case CompiledQuestion():
                return answer_compiled(self.compiled, request)
        raise TypeError(f"not a side request: {request!r}")

    def _probe_compiled(self, index: int, values: dict[int, np.ndarray]) -> CompiledProbe | None:
        """Op `index`'s call probed on its recorded inputs, `values` for those that are no parameter."""
        adapter, calls = self.side.adapter, self.recording.calls
        if not isinstance(adapter, CompiledGraphs):
            raise TypeError(f"the {adapter.name} adapter cannot search inside compiled code (it is no CompiledGraphs)")
        recording = self.recording
        replay = ValuesInterpreter(adapter, self.trace, calls, recording.own_values(values), leaves=recording.leaves)
        args, kwargs = calls[index].filled(replay.fetch)
        return adapter.probe_compiled(calls[index].fn, args, kwargs)

    def _trainer(self, width: int, seeds: dict[str, np.ndarray]) -> Trainer:
        """The trainer at `width`, made at its first step (from the model file as the side was built from it)."""
        if width not in self.trainers:
            side = self.side
            module = sys.modules.get(module_name(side.model_file)) or load_module(side.model_file)
            self.trainers[width] = Trainer(side, module, seeds, float64=width == 64)
        return self.trainers[width]

    def rerun(self, patches: dict[int, Any], capture: frozenset[int] = frozenset()) -> RerunResult:
        adapter, recording = self.side.adapter, self.recording
        if recording.replayable(adapter):
            try:
                return rerun_recorded(adapter, self.trace, recording, patches, capture)
            except UnfaithfulReplay:
                recording.faithful = False
        return self.rerun_model(patches, capture)

    def rerun_model(self, patches: dict[int, Any], capture: frozenset[int] = frozenset()) -> RerunResult:
        """A re-run of the model's own code (see `PatchedRerun`)."""
        side = self.side
        listener = PatchedRerun(side.adapter, self.trace, patches, capture)
        outputs = intercepted_forward(side, listener)
        return listener.finish(output_pairs(side.adapter, outputs))

    def float64_outputs(self, leaf_values: dict[str, np.ndarray]) -> Float64Run:
        """The side's outputs in float64: the recorded calls executed in float64 where they can stand in
        for the model's code and run (`Float64Interpreter`), else the model's code under `Float64Listener`,
        which also says why a forward cannot run in float64."""
        _refuse_plain_function(self.side)
        values, calls = self.float64_replay(leaf_values) or self.float64_forward(leaf_values)
        narrowed = next((key for key, v in values.items() if v.dtype.kind == "f" and v.dtype != np.float64), None)
        if narrowed is not None:
            raise CannotUpcast(f"its output {narrowed!r} stays {values[narrowed].dtype} (a dtype fixed inside the forward)")
        return Float64Run(values, calls.narrow_ops())

    def float64_replay(self, leaf_values: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Float64Calls] | None:
        adapter = self.side.adapter
        if not self.recording.replayable(adapter):
            return None
        replay = Float64Interpreter(adapter, self.trace, self.recording, leaf_values)
        try:
            return replay.outputs(), replay.float64_calls
        except UnfaithfulReplay:
            return None

    def float64_forward(self, leaf_values: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Float64Calls]:
        side, adapter = self.side, self.side.adapter
        listener = Float64Listener(adapter, side.model, self.trace, leaf_values)
        upcast = replace(side, inputs=_float64_inputs(side))
        try:
            with adapter.intercept(side.model, listener), adapter.float64_defaults():
                outputs = upcast.forward()
        except UserModelError as exc:
            raise CannotUpcast(f"its float64 forward raised: {exc.raised}") from None
        return {key: adapter.to_numpy(tensor) for key, tensor in output_pairs(adapter, outputs)}, listener.calls

    def backward(self, seeds: dict[str, np.ndarray], gradient_patches: dict[int, np.ndarray],
                 activations: dict[int, np.ndarray]) -> Gradients:
        side, adapter, trace = self.side, self.side.adapter, self.trace
        listener = GradientRerun(adapter, trace, gradient_patches, activations)
        differentiated = _with_gradient_inputs(side, side.inputs)
        outputs = intercepted_forward(differentiated, listener, gradients=True)
        listener.finish(output_pairs(adapter, outputs))
        leaves = {tid: tensor for tid, tensor in listener.leaves.items()
                  if leaf_kind(trace.tensors[tid].leaf) in ("param", "input") and is_floating(trace.tensors[tid].dtype)}
        grads, loss = _backward(side, outputs, seeds, leaves, listener.patched)
        return Gradients(listener.gradients, grads, loss)

    def float64_gradients(self, seeds: dict[str, np.ndarray], leaf_values: dict[str, np.ndarray]) -> Float64Run:
        side, adapter = self.side, self.side.adapter
        upcast = _with_gradient_inputs(side, _float64_inputs(side))
        listener = Float64Listener(adapter, side.model, self.trace, leaf_values, gradients=True)
        try:
            with adapter.intercept(side.model, listener, gradients=True), adapter.float64_defaults():
                outputs = upcast.forward()
            leaves = {name: copy for name, copy in listener.upcast.items() if leaf_kind(name) == "param"}
            leaves.update((str(LeafRef("input", str(key))), t) for key, t in upcast.input_items() if adapter.is_tensor(t) and adapter.requires_grad(t))
            with adapter.enable_grad():
                grads, _ = _backward(upcast, outputs, seeds, leaves)
        except UserModelError as exc:
            raise CannotUpcast(f"its float64 backward raised: {exc.raised}") from None
        grads.update((name, None) for name in listener.parameter_names() if name not in grads)  # no op read it
        return Float64Run(grads, listener.calls.narrow_ops())


def _refuse_plain_function(side: BuiltSide) -> None:
    """A float64 run of a plain function is refused: bisectr cannot reach its parameters."""
    if not side.adapter.is_module(side.model):
        raise CannotUpcast("it is a plain function, whose tensors bisectr cannot reach")


def _float64_inputs(side: BuiltSide) -> tuple | dict:
    """The side's inputs with each floating tensor upcast to float64 (see `_refuse_plain_function`)."""
    adapter = side.adapter
    _refuse_plain_function(side)
    return map_tensors(side.inputs, adapter.is_tensor, lambda t: adapter.float64_tensor(t) if is_floating(adapter.dtype_name(t)) else t)


@dataclass
class Float64Run:
    """What a float64 run gave (outputs by key, or gradients by leaf name), and the ops that still
    ran below float64 in it."""

    values: dict[str, Any]
    narrow_ops: list[str]


class Float64Listener:
    """Runs the model's own code in float64 with no float64 copy of the model: an op reading a
    floating parameter or buffer reads a float64 copy made for it (of `leaf_values[name]` where
    given, `Float64Copies`), released after it; each op is called as `Float64Calls` calls it in the
    float64 check (`calls.narrow`: the ops that still ran below float64), the `trace` recorded giving
    the dtypes of an op that cannot run in float64, as the code follows the recording op for op. With
    `gradients` each leaf's copy is made once and kept in `upcast` (a parameter's a leaf requiring a
    gradient, the parameter's own float64 gradient)."""

    def __init__(self, adapter: Adapter, model: Any, trace: Trace, leaf_values: dict[str, np.ndarray], gradients: bool = False):
        self.adapter = adapter
        self.trace = trace
        self.leaves = {id(t): (name, t) for name, t in adapter.named_leaves(model) if is_floating(adapter.dtype_name(t))}
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
        result = self.calls.call(name, self.modules[-1] if self.modules else "", self._recorded(name), fn, *args, **kwargs)
        outputs = iter_tensors(result, self.adapter.is_tensor)
        if outputs or any(self.adapter.version(t) != v for t, v in zip(inputs, versions)):  # an op, as a recording counts them
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


def _with_gradient_inputs(side: BuiltSide, inputs: tuple | dict) -> BuiltSide:
    """`side` run on `inputs` with each floating tensor a new leaf requiring a gradient: the gradient
    reaching the inputs is the backward's last word, and compared with the parameters'."""
    adapter = side.adapter
    return replace(side, inputs=map_tensors(inputs, adapter.is_tensor,
                                            lambda t: adapter.gradient_leaf(t) if is_floating(adapter.dtype_name(t)) else t))


def _backward(side: BuiltSide, outputs: Any, seeds: dict[str, np.ndarray], parameters: dict,
              patched: list[Any] = ()) -> tuple[dict, float | None]:
    """The gradients of `parameters` (key -> parameter or input tensor; None for one no gradient
    reaches) from the side's loss of `outputs`, or from `seeds` on its outputs; and the loss.
    The `patched` tensors are roots too, with a zero gradient their hooks replace."""
    adapter = side.adapter
    loss = None
    if side.loss is not None:
        value = loss_of(side, outputs)
        roots, upstream = [value], [adapter.like(value, np.ones(value.shape))]
        loss = float(adapter.to_numpy(value).reshape(()))
    else:
        seeded = [(key, t) for key, t in output_pairs(adapter, outputs) if key in seeds and adapter.requires_grad(t)]
        roots = [t for _, t in seeded]
        upstream = [adapter.like(t, seeds[key]) for key, t in seeded]
    for tensor in patched:
        if not any(tensor is root for root in roots):  # its zero gradient adds nothing, and paddle refuses a root given twice
            roots.append(tensor)
            upstream.append(adapter.like(tensor, np.zeros(tensor.shape)))
    reached = [key for key, tensor in parameters.items() if adapter.requires_grad(tensor)]
    if not roots or not reached:
        raise ModelFileError(f"{side.model_file}: no gradient reaches any parameter or input of the {side.role} model "
                             "(every parameter frozen and no floating input, or the forward runs without gradients): "
                             "a backward pass has nothing to compare")
    grads = dict.fromkeys(parameters)
    for key, grad in zip(reached, adapter.gradients(roots, upstream, [parameters[k] for k in reached])):
        grads[key] = None if grad is None else adapter.to_numpy(grad)
    return grads, loss


@dataclass
class Sides:
    """Both sides' runners, with the model file they came from and the traces they recorded."""

    model_file: Path
    runners: dict[str, SideRunner]
    traces: dict[str, Trace]

    def __post_init__(self) -> None:
        for role, trace in self.traces.items():
            trace.leaf_reader = partial(_leaf_value, self.runners[role])

    def run(self, role: str, request: Request) -> Any:
        """Ask one side's runner (see the requests above)."""
        return self.runners[role].run(request)

    def replay(self, role: str, indices: list[int], values: dict[int, np.ndarray], float64: bool = False) -> dict[int, np.ndarray]:
        """`Replay` of ops `indices`, each input that is neither in `values` nor computed by an op
        before it read from the trace (the model's parameters: by the side, where the model holds
        them); returns `values` with every tensor the ops computed (a new dict)."""
        trace = self.traces[role]
        computed = dict(values)
        made = {tid for index in indices for tid in trace.ops[index].outputs}
        for index in indices:
            for tid in trace.ops[index].inputs:
                if tid not in computed and tid not in made and not read_live(trace.tensors[tid].leaf):
                    computed[tid] = trace.value(tid)
        computed.update(self.run(role, Replay(indices, computed, float64)))
        return computed


def _leaf_value(runner: SideRunner, tid: int) -> np.ndarray:
    return runner.run(LeafValue(tid))
