"""A run whose models are loaded, as the searches use it: what was recorded and aligned, the sides'
runners that re-run it, and where progress is told.

A `RunRecord` is plain data (what a run directory holds); a `LiveRun` adds the handle re-runs go
through. Every search, the float64 check and the fetching of values the recording did not keep take
one; a run reopened from disk has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..sides.runner import Replay, Request, Rerun, RerunResult, SideRunner
from ..capture.trace import read_live
from .runrecord import RunRecord


def _silent(message: str) -> None:
    pass


@dataclass
class LiveRun:
    """`run` with both sides' runners (`runners[role]`), telling its progress to `say`."""

    run: RunRecord
    runners: dict[str, SideRunner]
    say: Callable[[str], None] = field(default=_silent, repr=False)

    def ask(self, role: str, request: Request) -> Any:
        """One side's answer to a request (see `bisectr.sides.runner`)."""
        return self.runners[role].run(request)

    def rerun(
        self, role: str, patches: dict[int, Any], capture: frozenset[int] = frozenset(), every_op: bool = False
    ) -> RerunResult:
        """One side's model re-run with `patches` (tid -> values), keeping the values of `capture` (`every_op`:
        see `Rerun`)."""
        return self.ask(role, Rerun(patches, capture, every_op))

    def replay(
        self, role: str, indices: list[int], values: dict[int, np.ndarray], float64: bool = False
    ) -> dict[int, np.ndarray]:
        """`Replay` of ops `indices`, each input that is neither in `values` nor computed by an op
        before it read from the trace (the model's parameters: by the side, where the model holds
        them); returns `values` with every tensor the ops computed (a new dict)."""
        trace = self.run.traces[role]
        computed = dict(values)
        made = {tid for index in indices for tid in trace.ops[index].outputs}
        for index in indices:
            for tid in trace.ops[index].inputs:
                if tid not in computed and tid not in made and not read_live(trace.tensors[tid].leaf):
                    computed[tid] = trace.value(tid)
        computed.update(self.ask(role, Replay(indices, computed, float64)))
        return computed
