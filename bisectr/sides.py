"""Where a side's model runs: the live handle a search re-runs and replays through.

A side runner records the forward pass, re-runs it with patches and replays single
ops. `LocalSide` keeps the model in this process; a runner in another process
(`--isolate`) offers the same methods, so the analysis and the search never know
where a model lives. `Sides` holds both runners with the traces they recorded; a run
record (`record.RunRecord`) never does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from .adapters import Adapter, CannotUpcast
from .errors import ModelFileError, UserModelError
from .modelfile import Side, run_user_code
from .recording import (Call, GradientRerun, Gradients, PatchedRerun, RecordOptions, Recorder, Recording, RerunResult,
                        UnfaithfulReplay, output_pairs, replay_op, replay_vjp, rerun_recorded)
from .store import TensorWriter
from .structure import iter_tensors, map_tensors
from .trace import Trace, is_floating


class SideRunner(Protocol):
    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        """Record one forward pass, writing tensor values through `writer`; `watch`: see `record_side`."""

    def rerun(self, trace: Trace, patches: dict[int, np.ndarray], capture: set[int] | frozenset) -> RerunResult:
        """Run again, following `trace`, with `patches` (tid -> values) swapped in."""

    def replay(self, trace: Trace, index: int, values: dict[int, np.ndarray], float64: bool) -> list[np.ndarray]:
        """Call op `index` again on `values` for its inputs (upcast to float64 if asked)."""

    def call(self, index: int) -> Call | None:
        """The recorded call of op `index`, where it is available in this process."""

    def replay_vjp(self, trace: Trace, indices: list[int], values: dict[int, np.ndarray], upstream: dict[int, np.ndarray | None],
                   float64: bool = False) -> dict[int, np.ndarray | None]:
        """The backward of ops `indices` (see `replay_vjp`)."""

    def float64_outputs(self, leaf_values: dict[str, np.ndarray]) -> "Float64Run":
        """The outputs of a float64 copy of the model (with `leaf_values`, leaf name -> values, in
        place of its own) on float64 inputs, keyed like the trace's outputs, and the ops that still
        ran below float64; raises `CannotUpcast` saying why the side cannot run in float64."""

    def backward(self, trace: Trace, seeds: dict[str, np.ndarray], gradient_patches: dict[int, np.ndarray],
                 activations: dict[int, np.ndarray]) -> Gradients:
        """Run forward and backward again, following `trace`, from the loss or from `seeds` (output
        key -> gradient), with `gradient_patches` (tid -> gradient) handed on instead of the own, on
        `activations` (tid -> values) in place of its own forward's (see `GradientRerun`)."""

    def float64_gradients(self, seeds: dict[str, np.ndarray], leaf_values: dict[str, np.ndarray]) -> "Float64Run":
        """The gradients of the parameters and floating inputs (by leaf name) of a float64 copy of
        the model (with `leaf_values`), as `backward` computes them; raises `CannotUpcast`."""


# Called as a recording starts with a function returning the number of ops recorded so far (read
# from another thread by a progress display: the recording itself pays nothing for it).
Watch = Callable[[Callable[[], int]], None]


def record_side(side: Side, writer: TensorWriter | None, options: RecordOptions,
                watch: Watch | None = None) -> tuple[Trace, Recording]:
    """Record one side's forward pass: its trace, and the calls and leaves that replays need."""
    items = side.input_items()
    device, dtype = side.adapter.describe(side.model, [value for _, value in items])
    trace = Trace(side.role, side.adapter.name, device, dtype)
    recorder = Recorder(side.adapter, side.model, items, trace, writer, options)
    if watch is not None:
        watch(lambda: recorder.op_count)
    with side.adapter.intercept(side.model, recorder):
        outputs = side.forward()
    pairs = output_pairs(side.adapter, outputs)
    if not pairs:
        raise ModelFileError(f"{side.model_file}: the {side.role} model returned no tensors (got {type(outputs).__name__})")
    recorder.finish(pairs)
    return trace, recorder.recording


class LocalSide:
    """A side whose model lives in this process.

    A re-run executes the recorded calls (`rerun_recorded`: the same results, several
    times faster, and only the ops a cut leaves to compute) where the recording can stand
    in for the model (see `Recording.replayable`), and the model's own code otherwise
    (`PatchedRerun`), also once the recorded calls turn out not to stand in (autocast).
    """

    def __init__(self, side: Side):
        self.side = side
        self.recording = Recording()

    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        trace, self.recording = record_side(self.side, writer, options, watch)
        return trace

    def rerun(self, trace: Trace, patches: dict[int, np.ndarray], capture: set[int] | frozenset = frozenset()) -> RerunResult:
        adapter = self.side.adapter
        if self.recording.replayable(adapter):
            try:
                return rerun_recorded(adapter, trace, self.recording, patches, capture)
            except UnfaithfulReplay:
                self.recording.faithful = False
        return self.rerun_model(trace, patches, capture)

    def rerun_model(self, trace: Trace, patches: dict[int, np.ndarray], capture: set[int] | frozenset = frozenset()) -> RerunResult:
        """A re-run of the model's own code (see `PatchedRerun`)."""
        side = self.side
        listener = PatchedRerun(side.adapter, trace, patches, capture)
        with side.adapter.intercept(side.model, listener):
            outputs = side.forward()
        return listener.finish(output_pairs(side.adapter, outputs))

    def replay(self, trace: Trace, index: int, values: dict[int, np.ndarray], float64: bool = False) -> list[np.ndarray]:
        dtypes = {tid: trace.tensors[tid].dtype for tid in trace.ops[index].inputs}
        return replay_op(self.side.adapter, self.recording.calls[index], values, dtypes, trace.device, float64)

    def replay_vjp(self, trace: Trace, indices: list[int], values: dict[int, np.ndarray], upstream: dict[int, np.ndarray | None],
                   float64: bool = False) -> dict[int, np.ndarray | None]:
        calls = [self.recording.calls[i] for i in indices]
        return replay_vjp(self.side.adapter, trace, calls, indices, values, upstream, float64)

    def call(self, index: int) -> Call | None:
        calls = self.recording.calls
        return calls[index] if index < len(calls) else None

    def float64_outputs(self, leaf_values: dict[str, np.ndarray]) -> Float64Run:
        side, adapter = self.side, self.side.adapter
        model = _float64_model(adapter, side.model, leaf_values)
        inputs = map_tensors(side.inputs, adapter.is_tensor,
                             lambda t: adapter.float64_tensor(t) if is_floating(adapter.dtype_name(t)) else t)
        listener = Float64Listener(adapter)
        try:
            with adapter.intercept(model, listener), adapter.float64_defaults():
                outputs = replace(side, model=model, inputs=inputs).forward()
        except UserModelError as exc:
            raise CannotUpcast(f"its float64 forward raised: {str(exc).rsplit(' raised ', 1)[-1]}") from None
        values = {key: adapter.to_numpy(tensor) for key, tensor in output_pairs(adapter, outputs)}
        narrow = next((key for key, v in values.items() if v.dtype.kind == "f" and v.dtype != np.float64), None)
        if narrow is not None:
            raise CannotUpcast(f"its output {narrow!r} stays {values[narrow].dtype} (a dtype fixed inside the forward)")
        return Float64Run(values, listener.narrow_ops())

    def backward(self, trace: Trace, seeds: dict[str, np.ndarray], gradient_patches: dict[int, np.ndarray],
                 activations: dict[int, np.ndarray]) -> Gradients:
        side, adapter = self.side, self.side.adapter
        listener = GradientRerun(adapter, trace, gradient_patches, activations)
        differentiated = _with_gradient_inputs(side, side.inputs)
        with adapter.intercept(side.model, listener, gradients=True):
            outputs = differentiated.forward()
        listener.finish(output_pairs(adapter, outputs))
        leaves = {tid: tensor for tid, tensor in listener.leaves.items()
                  if (trace.tensors[tid].leaf or "").startswith(("param:", "input:")) and is_floating(trace.tensors[tid].dtype)}
        grads, loss = _backward(side, outputs, seeds, leaves, listener.patched)
        return Gradients(listener.gradients, grads, loss)

    def float64_gradients(self, seeds: dict[str, np.ndarray], leaf_values: dict[str, np.ndarray]) -> Float64Run:
        side, adapter = self.side, self.side.adapter
        model = _float64_model(adapter, side.model, leaf_values)
        inputs = map_tensors(side.inputs, adapter.is_tensor,
                             lambda t: adapter.float64_tensor(t) if is_floating(adapter.dtype_name(t)) else t)
        upcast = _with_gradient_inputs(replace(side, model=model), inputs)
        leaves = {name: tensor for name, tensor in adapter.named_leaves(model) if name.startswith("param:")}
        leaves.update((f"input:{key}", t) for key, t in upcast.input_items() if adapter.is_tensor(t) and adapter.requires_grad(t))
        listener = Float64Listener(adapter)
        try:
            with adapter.intercept(model, listener, gradients=True), adapter.float64_defaults():
                outputs = upcast.forward()
            with adapter.enable_grad():
                grads, _ = _backward(upcast, outputs, seeds, leaves)
        except UserModelError as exc:
            raise CannotUpcast(f"its float64 backward raised: {str(exc).rsplit(' raised ', 1)[-1]}") from None
        return Float64Run(grads, listener.narrow_ops())


def _float64_model(adapter: Adapter, model: Any, leaf_values: dict[str, np.ndarray]) -> Any:
    """A float64 copy of the model, with `leaf_values` (leaf name -> values) in place of its own."""
    upcast = adapter.float64_model(model)
    for name, tensor in adapter.named_leaves(upcast):
        if name in leaf_values:
            adapter.assign(tensor, leaf_values[name].astype(np.float64))
    return upcast


@dataclass
class Float64Run:
    """What a float64 run gave (outputs by key, or gradients by leaf name), and the ops that still
    ran below float64 in it."""

    values: dict[str, Any]
    narrow_ops: list[str]


class Float64Listener:
    """Runs each op of a float64 run with its casts below float64 kept at float64
    (`Adapter.float64_call`), and counts the ops whose floating outputs still come out lower."""

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        self.modules: list[str] = []
        self.narrow: dict[str, int] = {}

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        fn, args, kwargs = self.adapter.float64_call(name, fn, args, kwargs)
        result = fn(*args, **kwargs)
        dtypes = {self.adapter.dtype_name(t) for t in iter_tensors(result, self.adapter.is_tensor)}
        if any(is_floating(d) and d != "float64" for d in dtypes):
            where = f"{name} in {self.modules[-1]}" if self.modules and self.modules[-1] else name
            self.narrow[where] = self.narrow.get(where, 0) + 1
        return result

    def enter_module(self, path: str) -> None:
        self.modules.append(path)

    def exit_module(self) -> None:
        self.modules.pop()

    def narrow_ops(self) -> list[str]:
        return [f"{where} (x{count})" if count > 1 else where for where, count in self.narrow.items()]


def _with_gradient_inputs(side: Side, inputs: tuple | dict) -> Side:
    """`side` run on `inputs` with each floating tensor a new leaf requiring a gradient: the gradient
    reaching the inputs is the backward's last word, and compared with the parameters'."""
    adapter = side.adapter
    return replace(side, inputs=map_tensors(inputs, adapter.is_tensor,
                                            lambda t: adapter.gradient_leaf(t) if is_floating(adapter.dtype_name(t)) else t))


def _backward(side: Side, outputs: Any, seeds: dict[str, np.ndarray], parameters: dict,
              patched: list[Any] = ()) -> tuple[dict, float | None]:
    """The gradients of `parameters` (key -> parameter or input tensor; None for one no gradient
    reaches) from the side's loss of `outputs`, or from `seeds` on its outputs; and the loss.
    The `patched` tensors are roots too, with a zero gradient their hooks replace."""
    adapter = side.adapter
    loss = None
    if side.loss is not None:
        value = loss_of(side, outputs)
        roots, upstream = [value], [adapter.from_numpy(np.ones(value.shape), adapter.dtype_name(value), adapter.device_name(value))]
        loss = float(adapter.to_numpy(value).reshape(()))
    else:
        seeded = [(key, t) for key, t in output_pairs(adapter, outputs) if key in seeds and adapter.requires_grad(t)]
        roots = [t for _, t in seeded]
        upstream = [adapter.from_numpy(seeds[key], adapter.dtype_name(t), adapter.device_name(t)) for key, t in seeded]
    for tensor in patched:
        if not any(tensor is root for root in roots):  # paddle refuses a root given twice
            roots.append(tensor)
            upstream.append(adapter.from_numpy(np.zeros(tensor.shape), adapter.dtype_name(tensor), adapter.device_name(tensor)))
    reached = [key for key, tensor in parameters.items() if adapter.requires_grad(tensor)]
    if not roots or not reached:
        raise ModelFileError(f"{side.model_file}: no gradient reaches any parameter or input of the {side.role} model "
                             "(every parameter frozen and no floating input, or the forward runs without gradients): "
                             "a backward pass has nothing to compare")
    grads = dict.fromkeys(parameters)
    for key, grad in zip(reached, adapter.gradients(roots, upstream, [parameters[k] for k in reached])):
        grads[key] = None if grad is None else adapter.to_numpy(grad)
    return grads, loss


def loss_of(side: Side, outputs: Any) -> Any:
    """The side's loss of its `outputs`: what its loss function returns, checked to be one value."""
    adapter = side.adapter
    value = run_user_code(lambda: side.loss(outputs), f"{side.model_file}: {side.role}_loss() raised")
    if not adapter.is_tensor(value) or int(np.prod(value.shape)) != 1:
        raise ModelFileError(f"{side.model_file}: {side.role}_loss() returned {type(value).__name__}, not a "
                             f"{adapter.name} tensor holding one value")
    return value


@dataclass
class Sides:
    """Both sides' runners, with the model file they came from and the traces they recorded."""

    model_file: Path
    runners: dict[str, SideRunner]
    traces: dict[str, Trace]

    def rerun(self, role: str, patches: dict[int, np.ndarray], capture: set[int] | frozenset = frozenset()) -> RerunResult:
        """Run one side again with `patches` (tid -> values) swapped in; see `PatchedRerun`."""
        return self.runners[role].rerun(self.traces[role], patches, capture)

    def replay(self, role: str, index: int, values: dict[int, np.ndarray], float64: bool = False) -> list[np.ndarray]:
        """Call op `index` of one side again on `values` (tid -> array) for its inputs; see `replay_op`."""
        return self.runners[role].replay(self.traces[role], index, values, float64)

    def replay_ops(self, role: str, indices: list[int], values: dict[int, np.ndarray],
                   float64: bool = False) -> dict[int, np.ndarray]:
        """Replay ops `indices` of one side in order, as `torch.fx.Interpreter` runs nodes: each reads
        what the ones before computed, else `values`, else its recorded inputs. Returns `values`
        with every tensor the ops computed (a new dict)."""
        trace = self.traces[role]
        computed = dict(values)
        for index in indices:
            inputs = {tid: computed[tid] if tid in computed else trace.value(tid) for tid in trace.ops[index].inputs}
            computed.update(zip(trace.ops[index].outputs, self.replay(role, index, inputs, float64)))
        return computed

    def call(self, role: str, index: int) -> Call | None:
        """The recorded call of op `index` (function and arguments)."""
        return self.runners[role].call(index)

    def float64_outputs(self, role: str, leaf_values: dict[str, np.ndarray]) -> Float64Run:
        return self.runners[role].float64_outputs(leaf_values)

    def backward(self, role: str, seeds: dict[str, np.ndarray], gradient_patches: dict[int, np.ndarray] | None = None,
                 activations: dict[int, np.ndarray] | None = None) -> Gradients:
        """One side's forward and backward again, with `gradient_patches` handed on, on `activations`
        in place of its own; see `SideRunner.backward`."""
        return self.runners[role].backward(self.traces[role], seeds, gradient_patches or {}, activations or {})

    def float64_gradients(self, role: str, seeds: dict[str, np.ndarray], leaf_values: dict[str, np.ndarray]) -> Float64Run:
        return self.runners[role].float64_gradients(seeds, leaf_values)

    def replay_vjp(self, role: str, indices: list[int], values: dict[int, np.ndarray], upstream: dict[int, np.ndarray | None],
                   float64: bool = False) -> dict[int, np.ndarray | None]:
        """The backward of ops `indices` (one op or a block) on `values` for their external inputs from
        `upstream` (tid -> gradient) for their outputs; see `replay_vjp`."""
        return self.runners[role].replay_vjp(self.traces[role], indices, values, upstream, float64)
