"""Replays of recorded ops on given values: one op or a block, each input made afresh from its values
(upcast to float64 where asked: the per-op evidence and its float64 oracle, operator substitution)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from ..adapters import Adapter
from ..capture.trace import Trace, float64_dtype, is_floating
from .float64 import Float64Calls
from ..capture.calls import Call, RecordedCalls
from .interpreter import Interpreter


class ValuesInterpreter(Interpreter):
    """Ops run on `values` (tid -> array) for the inputs they do not compute, each input made
    afresh from its values in its recorded dtype, or in float64 with `float64` (the fp64 oracle:
    every op of a block reads float64 inputs). A parameter missing from `values` is read where the
    model holds it (`leaves`: tid -> (tensor, version), as `RecordedCalls.leaves`), upcast with
    `float64`: a layer's weights are not copied through the host for each op replayed.
    `computed` holds the values of every tensor the ops made. With `float64` each op is called as
    `Float64Calls` calls it: one that cannot run in float64 raises `CannotUpcast` (no oracle)."""

    def __init__(
        self,
        adapter: Adapter,
        trace: Trace,
        calls: list[Call],
        values: dict[int, np.ndarray],
        float64: bool = False,
        leaves: dict[int, tuple[Any, int]] | None = None,
    ):
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
                self.computed.update(
                    (tid, self.adapter.to_numpy(self.leaves[tid][0]))
                    for tid in op.inputs
                    if tid not in self.computed and tid in self.leaves
                )
        super().run(indices)

    def fetch(self, tid: int) -> Any:
        values = self.computed.get(tid)
        if values is None:
            return self._live_parameter(tid)
        dtype = self.trace.tensors[tid].dtype
        return self.adapter.from_numpy(
            values, float64_dtype(dtype) if self.float64 else dtype, self.trace.device, self.layout(tid)
        )

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


def replay(
    adapter: Adapter,
    trace: Trace,
    recorded: RecordedCalls,
    indices: list[int],
    values: dict[int, np.ndarray],
    float64: bool = False,
) -> dict[int, np.ndarray]:
    """What ops `indices` compute (tid -> values) on `values` for the inputs they do not compute
    (see `ValuesInterpreter`)."""
    replayed = ValuesInterpreter(adapter, trace, recorded.calls, recorded.own_values(values), float64, recorded.leaves)
    replayed.run(indices)
    return {tid: replayed.computed[tid] for index in indices for tid in trace.ops[index].outputs}
