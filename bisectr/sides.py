"""Where a side's model runs: what `Run` asks of it once it has been recorded.

A side runner records the forward pass, re-runs it with patches and replays single
ops. `LocalSide` keeps the model in this process; a runner in another process
(`--isolate`) offers the same four methods, so the analysis and the search never
know where a model lives.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .errors import ModelFileError
from .modelfile import Side
from .recording import Call, PatchedRerun, RecordOptions, Recorder, RerunResult, output_pairs, replay_op
from .store import TensorWriter
from .trace import Trace


class SideRunner(Protocol):
    def record(self, writer: TensorWriter | None, options: RecordOptions) -> Trace:
        """Record one forward pass, writing tensor values through `writer`."""

    def rerun(self, trace: Trace, patches: dict[int, np.ndarray], capture: set[int] | frozenset) -> RerunResult:
        """Run again, following `trace`, with `patches` (tid -> values) swapped in."""

    def replay(self, trace: Trace, index: int, values: dict[int, np.ndarray], float64: bool) -> list[np.ndarray]:
        """Call op `index` again on `values` for its inputs (upcast to float64 if asked)."""

    def call(self, index: int) -> Call | None:
        """The recorded call of op `index`, where it is available in this process."""


def record_side(side: Side, writer: TensorWriter | None, options: RecordOptions) -> tuple[Trace, list[Call]]:
    """Record one side's forward pass: its trace, and the calls that replay needs."""
    items = side.input_items()
    device, dtype = side.adapter.describe(side.model, [value for _, value in items])
    trace = Trace(side.role, side.adapter.name, device, dtype)
    recorder = Recorder(side.adapter, side.model, items, trace, writer, options)
    with side.adapter.intercept(side.model, recorder):
        outputs = side.forward()
    pairs = output_pairs(side.adapter, outputs)
    if not pairs:
        raise ModelFileError(f"{side.model_file}: the {side.role} model returned no tensors (got {type(outputs).__name__})")
    recorder.finish(pairs)
    return trace, recorder.calls


class LocalSide:
    """A side whose model lives in this process."""

    def __init__(self, side: Side):
        self.side = side
        self.calls: list[Call] = []

    def record(self, writer: TensorWriter | None, options: RecordOptions) -> Trace:
        trace, self.calls = record_side(self.side, writer, options)
        return trace

    def rerun(self, trace: Trace, patches: dict[int, np.ndarray], capture: set[int] | frozenset = frozenset()) -> RerunResult:
        side = self.side
        listener = PatchedRerun(side.adapter, trace, patches, capture)
        with side.adapter.intercept(side.model, listener):
            outputs = side.forward()
        return listener.finish(output_pairs(side.adapter, outputs))

    def replay(self, trace: Trace, index: int, values: dict[int, np.ndarray], float64: bool = False) -> list[np.ndarray]:
        dtypes = {tid: trace.tensors[tid].dtype for tid in trace.ops[index].inputs}
        return replay_op(self.side.adapter, self.calls[index], values, dtypes, trace.device, float64)

    def call(self, index: int) -> Call | None:
        return self.calls[index] if index < len(self.calls) else None
