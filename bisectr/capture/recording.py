"""Recording a forward pass: `Recorder` builds a `Trace` from it and the `RecordedCalls` it made (what
`bisectr.engines` runs again). `ForwardSession` is what recording shares with the listeners that re-run
the model's code (in `bisectr.engines`)."""

from __future__ import annotations

import math
import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..adapters import Adapter, Determinism, Tensors
from ..adapters.base import API, CALLER
from .calls import Call, RecordedCalls, Slot, run_op
from ..errors import UnreadableTensorError
from .ops import SHARING_COLLECTIVES, canonical_op
from .store import TensorWriter
from .structure import call_tensors, flatten_outputs, map_tensors
from .trace import (
    LOCAL_PART,
    PENDING_STATS,
    OpNode,
    StatsBatch,
    TensorInfo,
    Trace,
    device_reductions,
    is_floating,
    is_model_leaf,
    reduced_stats,
)
from ..leafref import LeafRef

_BISECTR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep

# What a frame is to an op's source line (`Recorder._source`), decided once per code object.
_USER, _STOP, _SKIP, _LIBRARY_CALLER, _LIBRARY_API = range(5)


@dataclass
class RecordOptions:
    store_values: bool = True
    # With store_values, keep only op outputs under these module path prefixes ("" = all).
    keep_modules: tuple[str, ...] = ()
    # With store_values, op outputs are stored until they would pass this many bytes, then none
    # (None: no limit); the search fetches what it needs of the rest (`bisectr.search.window`).
    value_budget: int | None = None
    # Op index -> the value to fill the memory that op leaves uninitialised with, as a re-run fills it
    # (`engines.patched.Patches`, `poison_for`).
    poison: dict[int, float] = field(default_factory=dict)


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


class ForwardSession:
    """What a listener following a forward pass keeps, recording it or re-running it: module stack, tensor ids."""

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


def depends_on_floating(trace: Trace, tid: int) -> bool:
    """Is tensor `tid` floating, or made from a floating tensor? A value read from one that is not (a
    mask made from integer positions) reads the same in every re-run: patches and float64 runs
    change floating values only."""
    return trace.reaches(tid, lambda info: is_floating(info.dtype))


class Recorder(ForwardSession):
    """Listener that turns a forward pass into a `Trace` (and `Call`s for replay)."""

    def __init__(
        self,
        adapter: Adapter,
        model: Any,
        inputs: list[tuple[str, Any]],
        trace: Trace,
        writer: TensorWriter | None,
        options: RecordOptions,
    ):
        super().__init__(adapter)
        self.trace = trace
        self.writer = writer
        self._leaf_names: dict[int, tuple[weakref.ref, str]] = {}
        for key, value in inputs:
            if adapter.is_tensor(value):
                self._leaf_names[id(value)] = (weakref.ref(value), str(LeafRef("input", str(key))))
        for name, tensor in adapter.named_leaves(model):
            self._leaf_names.setdefault(id(tensor), (weakref.ref(tensor), name))
        self.options = options
        self.recorded = RecordedCalls()
        self._adapter_dir = os.path.dirname(os.path.abspath(sys.modules[type(adapter).__module__].__file__)) + os.sep
        self._framework = adapter.internal_paths()
        self._internal = self._framework + (_BISECTR_DIR, self._adapter_dir, _STDLIB_DIR)
        self._frame_kinds: dict[Any, int] = {}  # code object -> _USER, _STOP, ...
        self._stats = StatsBatch()
        self._budget_left = options.value_budget
        self._sharded: set[int] = set()  # tids of sharded distributed tensors and local parts

    def call(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        inputs = call_tensors(args, kwargs, self.adapter.is_tensor)
        input_tids = self.input_tids(inputs)
        result, produced, mutated = run_op(self.adapter, fn, args, kwargs, inputs)
        if not produced:
            if name in self.adapter.value_reads and any(depends_on_floating(self.trace, tid) for tid in input_tids):
                self.recorded.value_reads += 1
            return result
        index = self.op_count
        self.op_count += 1
        if index == 0 and isinstance(self.adapter, Determinism):  # as the forward runs: its autocast is on
            self.trace.settings = self.adapter.numerics_settings()
        module = self.modules[-1] if self.modules else ""
        keep = self._keeps(module)
        for tensor in produced:
            self._refuse_unreadable(tensor, f"op {index} ({name}) returned")
        op = canonical_op(name)
        if index in self.options.poison:
            for tensor in produced:
                poison(self.adapter, tensor, self.options.poison[index])
        output_tids = [self._record_tensor(tensor, index, None, keep) for tensor in produced]
        self._place(input_tids, output_tids, produced, shared=op in SHARING_COLLECTIVES)
        source, library = self._source()
        inner = getattr(fn, "inner_dtypes", None)  # see `OpNode.inner_dtypes`
        self.trace.ops.append(
            OpNode(
                index,
                name,
                op,
                module,
                source,
                input_tids,
                output_tids,
                bool(mutated),
                library,
                inner() if inner else [],
            )
        )
        slots = {id(t): Slot(tid) for t, tid in zip(inputs, input_tids)}
        slot = lambda t: slots[id(t)]  # noqa: E731
        layouts = tuple(self.adapter.layout(tensor) for tensor in produced)
        self.recorded.calls.append(
            Call(
                fn,
                map_tensors(args, self.adapter.is_tensor, slot),
                map_tensors(kwargs, self.adapter.is_tensor, slot),
                self.adapter.device_name(produced[0]),
                layouts if any(layouts) else (),
            )
        )
        return result

    def _place(self, input_tids: list[int], output_tids: list[int], produced: list[Any], shared: bool = False) -> None:
        """Note how distributed outputs are placed; a plain output made from a shard is a local part, unless
        a collective made it the same on every process (`shared`)."""
        from_shard = not shared and not self._sharded.isdisjoint(input_tids)
        for tid, tensor in zip(output_tids, produced):
            placement = self.adapter.placement(tensor)
            if placement is None and from_shard:
                placement = LOCAL_PART
            if placement == LOCAL_PART:
                self.recorded.local_parts[tid] = np.array(self.adapter.to_numpy(tensor))
            if placement == LOCAL_PART or self.adapter.sharded(tensor):
                self._sharded.add(tid)
            self.trace.tensors[tid].placement = placement

    def on_new_leaf(self, tid: int, tensor: Any) -> None:
        self.recorded.leaves[tid] = (tensor, self.adapter.version(tensor))
        leaf = self.leaf_name(tensor)
        ref = LeafRef.parse(leaf)
        self._refuse_unreadable(tensor, f"its {ref.kind} {ref.name!r} is")
        # Parameters and buffers stay in the model (read live, see `Trace.leaf_reader`): a run keeps their statistics.
        self._describe(
            tid, tensor, producer=None, leaf=leaf, store=self.options.store_values and not is_model_leaf(leaf)
        )
        self._place([], [tid], [tensor])

    def _refuse_unreadable(self, tensor: Any, what: str) -> None:
        unreadable = self.adapter.unreadable(tensor)
        if unreadable is not None:
            raise UnreadableTensorError(
                f"{what} a {unreadable}, whose values bisectr cannot read as one array; give "
                "the side plain tensors (a DTensor's `.full_tensor()`, or the model unsharded)"
            )

    def adopt_root(self, module: Any, prefix: str) -> None:
        for name, tensor in self.adapter.named_leaves(module):
            ref = LeafRef.parse(name)
            self._leaf_names.setdefault(
                id(tensor), (weakref.ref(tensor), str(LeafRef(ref.kind, f"{prefix}.{ref.name}")) if prefix else name)
            )

    def leaf_name(self, tensor: Any) -> str:
        entry = self._leaf_names.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return str(LeafRef("const", str(self.op_count)))

    def _keeps(self, module: str) -> bool:
        if not self.options.store_values or self._budget_left is not None and self._budget_left < 0:
            return False
        prefixes = self.options.keep_modules
        return not prefixes or any(module == p or module.startswith(p + ".") for p in prefixes)

    def _within_budget(self, nbytes: int) -> bool:
        """Is there room for an op output of `nbytes`? Once there is not, no later op output is stored
        either: the values kept are those of the forward's first ops."""
        if self._budget_left is None:
            return True
        self._budget_left -= nbytes
        return self._budget_left >= 0

    def _record_tensor(self, tensor: Any, producer: int, leaf: str | None, store: bool) -> int:
        tid = self.ids.assign(tensor)
        self._describe(tid, tensor, producer, leaf, store)
        return tid

    def _describe(self, tid: int, tensor: Any, producer: int | None, leaf: str | None, store: bool) -> None:
        """Describe a tensor (shape, dtype, statistics, fingerprint) and store its values where asked.
        A tensor on an accelerator is described there: only what is stored is copied to the host."""
        reductions = device_reductions(self.adapter, tensor)
        store = store and self.writer is not None
        values = self.adapter.to_numpy(tensor) if store or reductions is None else None
        stored = store and (producer is None or self._within_budget(values.nbytes))
        if stored:
            self.writer.write(tid, values)
        info = TensorInfo(
            tid, tuple(tensor.shape), self.adapter.dtype_name(tensor), PENDING_STATS, [], producer, leaf, stored
        )
        self.trace.tensors[tid] = info
        if reductions is None:
            self._stats.add(info, values)
        else:
            info.stats, info.fingerprint = reduced_stats(reductions), reductions.picked

    def finish(self, outputs: list[tuple[str, Any]]) -> None:
        """Mark the model's outputs, name the floating parameters and buffers no op read, and
        complete every tensor's statistics."""
        self._record_outputs(outputs)
        read = set(self.trace.leaves)
        unread = {
            name
            for ref, name in self._leaf_names.values()
            if is_model_leaf(name)
            and name not in read
            and ref() is not None
            and is_floating(self.adapter.dtype_name(ref()))
        }
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


def poison_for(recorded: TensorInfo) -> float:
    """What to fill memory an op left uninitialised with in a run after its recording: a power of two beyond every
    value it held when recorded (even where that memory held an earlier run's poison), so that a read of it shows."""
    return 2.0 ** (math.ceil(math.log2(max(recorded.stats.absmax, 2048.0))) + 1)


def poison(adapter: Tensors, tensor: Any, value: float) -> None:
    """Fill floating `tensor`, memory an op left uninitialised, with `value`."""
    if is_floating(adapter.dtype_name(tensor)):
        adapter.assign(tensor, np.full(tuple(tensor.shape), value, np.float64))


def output_pairs(adapter: Tensors, outputs: Any) -> list[tuple[str, Any]]:
    return flatten_outputs(outputs, adapter.is_tensor)
