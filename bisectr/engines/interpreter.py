"""What every engine that runs recorded calls again shares, as `torch.fx.Interpreter` runs a graph module.

The recording keeps each op's call (`capture.calls`). `Interpreter.run(indices)` executes calls in order:
every slot is filled by `fetch(tid)`, `run_node` calls the op, `store` keeps what it made. Each kind of
re-run in `bisectr.engines` overrides these three; `execution_plan` picks the ops a run needs and when each
tensor can go.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable


from ..adapters import Tensors
from ..capture.structure import call_tensors
from ..capture.calls import Call, run_op
from ..capture.trace import Trace


class UnfaithfulReplay(Exception):
    """Executing the recorded calls did not make the tensors the recording made."""


def execution_plan(
    trace: Trace, wanted: set[int], replaced: set[int] = frozenset(), capture: set[int] = frozenset()
) -> tuple[list[int], dict[int, set[int]]]:
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
