"""The calls a recording keeps: each op's function with its arguments, a `Slot` standing for each tensor,
and the leaf tensors it read (`RecordedCalls`); and running one op (`run_op`), as the recording does and
every engine that runs the calls again (`bisectr.engines`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..adapters import Tensors
from .structure import iter_tensors, map_tensors


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
class RecordedCalls:
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


def run_op(
    adapter: Tensors, fn: Callable[..., Any], args: tuple, kwargs: dict, inputs: list[Any]
) -> tuple[Any, list[Any], set[int]]:
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
_ITEM_BYTES = {
    "float64": 8,
    "int64": 8,
    "complex64": 8,
    "float32": 4,
    "int32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
}


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


def fill_slots(arguments: tuple | dict, fetch: Callable[[int], Any]) -> tuple | dict:
    """A recorded call's arguments with each `Slot` replaced by `fetch(tid)`."""
    return map_tensors(arguments, _is_slot, lambda slot: fetch(slot.tid))


def _is_slot(obj: Any) -> bool:
    return isinstance(obj, Slot)
