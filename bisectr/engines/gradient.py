"""Gradients again: the backward of recorded ops on given values (`VJPInterpreter`, `replay_vjp`), and the
side's whole backward pass through its own code following the recording (`GradientRerun`, `backward`), also
in float64 (`float64_gradients`, with the float64 engine's `Float64Listener`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ..adapters import Adapter, CannotUpcast
from ..capture.modelfile import BuiltSide, intercepted_forward, loss_of
from ..capture.recording import output_pairs
from ..capture.structure import map_tensors
from ..capture.trace import Trace, float64_dtype, is_floating
from ..errors import ModelFileError, UserModelError
from ..leafref import LeafRef, leaf_kind
from .float64 import Float64Calls, Float64Listener, Float64Run, float64_inputs
from ..capture.calls import Call, RecordedCalls
from .interpreter import Interpreter
from .patched import Patches, PatchedRerun


@dataclass
class Gradients:
    """What one backward pass of a side computed (see `bisectr.search.backward`)."""

    tensors: dict[int, np.ndarray]  # op output tid -> the gradient reaching it (absent: none reaches it)
    leaves: dict[int, np.ndarray | None]  # parameter or floating input tid -> its gradient (None: frozen, or unused)
    loss: float | None = None  # the side's loss, where the model file defines one
    # op output tid -> a fingerprint of this process's values of a gradient its framework says every process
    # holds alike (a DTensor placed Replicate): on a side on several processes, the ranks' must be equal.
    replicated: dict[int, str] = field(default_factory=dict)


class VJPInterpreter(Interpreter):
    """Ops run with gradients on, each reading what the ones before computed, else `values` (the
    block's external inputs), made into leaves (one per tensor: ops reading it twice sum both
    gradients). With `float64` the floating inputs are upcast and each op is called as `Float64Calls`
    calls it (one that cannot run in float64 raises `CannotUpcast`): the fp64 oracle of the block's backward."""

    def __init__(
        self, adapter: Adapter, trace: Trace, calls: list[Call], values: dict[int, np.ndarray], float64: bool = False
    ):
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
            tensor = self.adapter.from_numpy(
                self.values[tid], float64_dtype(dtype) if self.float64 else dtype, self.trace.device, self.layout(tid)
            )
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
        seeded = [
            (env[tid], gradient)
            for tid, gradient in upstream.items()
            if gradient is not None and tid in env and adapter.requires_grad(env[tid])
        ]
        if not seeded or not self.leaves:
            return dict.fromkeys(self.leaves)
        upstream_tensors = [
            adapter.from_numpy(g, adapter.dtype_name(t), self.trace.device, adapter.layout(t)) for t, g in seeded
        ]
        grads = adapter.gradients([t for t, _ in seeded], upstream_tensors, list(self.leaves.values()))
        return {tid: None if g is None else adapter.to_numpy(g) for tid, g in zip(self.leaves, grads)}


class GradientRerun(PatchedRerun):
    """A re-run with gradients on (`Adapter.intercept(..., gradients=True)`), following the
    recording as `PatchedRerun` does, that hooks every op output a gradient reaches: the hook
    keeps the gradient in `gradients` and hands on `gradient_patches[tid]` instead where given.
    `leaves` are the leaf tensors read, by tid, for their gradients. `patched` are the patched op
    outputs: the backward starts from them too, so that a patch reaches the ops before a tensor
    whose readers all cut the gradient (a `detach`), where no gradient would call its hook.

    `activations` (tid -> values) replace op outputs in the forward while keeping the graph: the
    backward then runs through the side's own ops, each at the values given. The gradients of `reduced`
    (tid -> "sum" or "mean") are reduced over the ranks (`Adapter.reduced_over_ranks`) and handed on so."""

    with_gradients = True

    def __init__(
        self,
        adapter: Adapter,
        trace: Trace,
        gradient_patches: dict[int, np.ndarray],
        activations: dict[int, np.ndarray] | None = None,
        reduced: dict[int, str] | None = None,
    ):
        super().__init__(adapter, trace, activations or {})
        self.gradient_patches = Patches(adapter, trace, gradient_patches)
        self.reduced = reduced or {}
        self.gradients: dict[int, np.ndarray] = {}
        self.replicated: dict[int, str] = {}
        self.leaves: dict[int, Any] = {}
        self.patched: list[Any] = []

    def on_output(self, tid: int, tensor: Any) -> None:
        if self.adapter.requires_grad(tensor) and is_floating(self.trace.tensors[tid].dtype):
            self.adapter.add_gradient_hook(tensor, self._hook(tid, tensor))
            if tid in self.gradient_patches.patches:
                self.patched.append(tensor)

    def on_new_leaf(self, tid: int, tensor: Any) -> None:
        super().on_new_leaf(tid, tensor)
        self.leaves[tid] = tensor

    def _hook(self, tid: int, tensor: Any) -> Callable[[Any], Any]:
        adapter = self.adapter
        dtype, device, layout = adapter.dtype_name(tensor), adapter.device_name(tensor), adapter.layout(tensor)

        def hook(gradient: Any) -> Any:
            if gradient is None:  # none reaches it (see `Adapter.add_gradient_hook`)
                return None
            handed_on = adapter.reduced_over_ranks(gradient, self.reduced[tid]) if tid in self.reduced else None
            self.gradients[tid] = adapter.to_numpy(gradient if handed_on is None else handed_on)
            if adapter.replicated(gradient):
                self.replicated[tid] = fingerprint(self.gradients[tid])
            if tid in self.gradient_patches.patches:
                return adapter.from_numpy(self.gradient_patches.values(tid, gradient), dtype, device, layout)
            return handed_on

        return hook


def replay_vjp(
    adapter: Adapter,
    trace: Trace,
    recorded: RecordedCalls,
    indices: list[int],
    values: dict[int, np.ndarray],
    upstream: dict[int, np.ndarray | None],
    float64: bool = False,
) -> dict[int, np.ndarray | None]:
    """The backward of ops `indices` on `values` for their external inputs, from `upstream` (see `VJPInterpreter`)."""
    vjp = VJPInterpreter(adapter, trace, recorded.calls, recorded.own_values(values), float64)
    with adapter.enable_grad():
        vjp.run(indices)
    return vjp.gradients(upstream)


def backward(
    side: BuiltSide,
    trace: Trace,
    seeds: dict[str, np.ndarray],
    gradient_patches: dict[int, np.ndarray],
    activations: dict[int, np.ndarray],
    reduced: dict[int, str] | None = None,
) -> Gradients:
    """The side's forward and backward again through its own code (see `GradientRerun`), from its loss or
    from `seeds`."""
    adapter = side.adapter
    listener = GradientRerun(adapter, trace, gradient_patches, activations, reduced)
    differentiated = with_gradient_inputs(side, side.inputs)
    outputs = intercepted_forward(differentiated, listener, gradients=True)
    listener.finish(output_pairs(adapter, outputs))
    leaves = {
        tid: tensor
        for tid, tensor in listener.leaves.items()
        if leaf_kind(trace.tensors[tid].leaf) in ("param", "input") and is_floating(trace.tensors[tid].dtype)
    }
    grads, loss = leaf_gradients(side, outputs, seeds, leaves, listener.patched)
    return Gradients(listener.gradients, grads, loss, listener.replicated)


def float64_gradients(
    side: BuiltSide, trace: Trace, seeds: dict[str, np.ndarray], leaf_values: dict[str, np.ndarray]
) -> Float64Run:
    """The gradients of the parameters and floating inputs (by leaf name) of the side's code run in float64
    under `Float64Listener` (with `leaf_values`), as `backward` computes them."""
    adapter = side.adapter
    upcast = with_gradient_inputs(side, float64_inputs(side))
    listener = Float64Listener(adapter, side.model, trace, leaf_values, gradients=True)
    try:
        with adapter.intercept(side.model, listener, gradients=True), adapter.float64_defaults():
            outputs = upcast.forward()
        leaves = {name: copy for name, copy in listener.upcast.items() if leaf_kind(name) == "param"}
        leaves.update(
            (str(LeafRef("input", str(key))), t)
            for key, t in upcast.input_items()
            if adapter.is_tensor(t) and adapter.requires_grad(t)
        )
        with adapter.enable_grad():
            grads, _ = leaf_gradients(upcast, outputs, seeds, leaves)
    except UserModelError as exc:
        raise CannotUpcast(f"its float64 backward raised: {exc.raised}") from None
    grads.update((name, None) for name in listener.parameter_names() if name not in grads)  # no op read it
    return Float64Run(grads, listener.calls.narrow_ops())


def with_gradient_inputs(side: BuiltSide, inputs: tuple | dict) -> BuiltSide:
    """`side` run on `inputs` with each floating tensor a new leaf requiring a gradient: the gradient
    reaching the inputs is the backward's last word, and compared with the parameters'."""
    adapter = side.adapter
    return replace(
        side,
        inputs=map_tensors(
            inputs, adapter.is_tensor, lambda t: adapter.gradient_leaf(t) if is_floating(adapter.dtype_name(t)) else t
        ),
    )


def leaf_gradients(
    side: BuiltSide, outputs: Any, seeds: dict[str, np.ndarray], parameters: dict, patched: list[Any] = ()
) -> tuple[dict, float | None]:
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
        if not any(
            tensor is root for root in roots
        ):  # its zero gradient adds nothing, and paddle refuses a root given twice
            roots.append(tensor)
            upstream.append(adapter.like(tensor, np.zeros(tensor.shape)))
    reached = [key for key, tensor in parameters.items() if adapter.requires_grad(tensor)]
    if not roots or not reached:
        raise ModelFileError(
            f"{side.model_file}: no gradient reaches any parameter or input of the {side.role} model "
            "(every parameter frozen and no floating input, or the forward runs without gradients): "
            "a backward pass has nothing to compare"
        )
    grads = dict.fromkeys(parameters)
    for key, grad in zip(reached, adapter.gradients(roots, upstream, [parameters[k] for k in reached])):
        grads[key] = None if grad is None else adapter.to_numpy(grad)
    return grads, loss


def fingerprint(values: np.ndarray | None) -> str:
    """A short digest of an array's bytes ("none" for None): to tell whether processes hold the same values."""
    if values is None:
        return "none"
    return hashlib.blake2b(np.ascontiguousarray(values).tobytes(), digest_size=8).hexdigest()
