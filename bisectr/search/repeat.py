"""A side that does not repeat itself: the first op whose outputs differ between two of its runs, why,
and the fix.

A side whose re-run departs from its recording is recorded once more (`RecordAgain`), its uninitialised
memory poisoned as every re-run's is (`capture.recording.poison_for`). The two recordings are of the same code, so
their ops pair by position: the first op whose outputs differ (by statistics and fingerprint; memory
left uninitialised is not compared) is where the runs part, every op before it having computed the same
values. What it is says why:

- **random**: the op draws from a random generator (`capture.ops.RANDOM`): dropout on, noise, a shuffle;
- **uninitialized**: it reads memory an op left uninitialised (`empty`), directly or through views and
  in-place writes of it;
- **other**: it reads a parameter, buffer, input or constant that changed between the runs (a forward
  that updates its own state, a value drawn outside the framework), or the second run called another op;
- **kernel**: none of these: the same inputs gave other outputs.
"""

from __future__ import annotations

from ..adapters import Determinism, DeterminismFixes, adapter_named
from ..capture.ops import DROPOUT, RANDOM, UNINITIALISED
from ..capture.trace import OpNode, TensorInfo, Trace, read_live
from ..leafref import LeafRef
from ..measure.live import LiveRun
from ..measure.result import Nondeterminism, OpSite
from ..sides.runner import DrawsRandom, RecordAgain

# Ops through which memory left uninitialised reaches a reader unchanged in every value it had.
_PASSES_MEMORY_ON = frozenset(
    {
        "view",
        "reshape",
        "transpose",
        "permute",
        "getitem",
        "narrow",
        "select",
        "slice",
        "expand",
        "unsqueeze",
        "squeeze",
        "flatten",
        "contiguous",
        "t",
        "as_strided",
        "split",
        "chunk",
        "unbind",
    }
)


# In-place ops that write into a tensor without reading what it held.
_WRITES = frozenset({"setitem", "copy", "fill", "zero", "index_put", "index_copy"})


def not_repeated(live: LiveRun, role: str) -> Nondeterminism | None:
    """Where and why side `role`, whose re-run departed from its recording, does not repeat itself;
    None where a second recording computes every value the first did (the recorded calls, not the
    model's code, differ when run again). An op the vocabulary does not call random, that reads
    what it read before, is replayed twice from one seed (`DrawsRandom`): where that repeats it, it
    draws from the framework's generators (a fused op with dropout inside), else its kernel differs."""
    first = live.run.traces[role]
    found = first_difference(first, live.ask(role, RecordAgain()))
    if found is None or found.cause != "kernel":
        return found
    op = first.ops[found.op.index]
    try:
        values = {tid: first.value(tid) for tid in op.inputs if not read_live(first.tensors[tid].leaf)}
    except KeyError:  # its inputs' values were not stored: the kernel is not told from a random draw
        return found
    draws, training = live.ask(role, DrawsRandom(op.index, values))
    return _random(first, op, found.difference, "eval" if training else "seed") if draws else found


def first_difference(first: Trace, again: Trace) -> Nondeterminism | None:
    """The first op whose outputs differ between two recordings of the same side, with its cause and
    fix; None where none does."""
    for op, other in zip(first.ops, again.ops):
        if op.framework_op != other.framework_op or len(op.outputs) != len(other.outputs):
            return _other_path(first, op, f"the second run called {other.framework_op} here")
        if op.op in UNINITIALISED:
            continue
        moved = [
            _moved(first.tensors[a], again.tensors[b])
            for a, b in zip(op.outputs, other.outputs)
            if not _same(first.tensors[a], again.tensors[b])
        ]
        if moved and not _carries_uninitialised(first, op):
            changed = [
                first.tensors[a].leaf
                for a, b in zip(op.inputs, other.inputs)
                if first.tensors[a].leaf is not None and not _same(first.tensors[a], again.tensors[b])
            ]
            return _diagnosed(first, op, max(moved), changed[0] if changed else None)
    if len(first.ops) != len(again.ops):
        op = first.ops[min(len(first.ops), len(again.ops)) - 1]
        return _other_path(first, op, f"the second run made {len(again.ops)} ops, the first {len(first.ops)}")
    return None


def _site(op: OpNode) -> OpSite:
    return OpSite(op.index, op.framework_op, op.module, op.source)


def _fixes(trace: Trace) -> DeterminismFixes:
    """How the side's framework says each fix."""
    adapter = adapter_named(trace.framework)
    return adapter.fixes if isinstance(adapter, Determinism) else _GENERIC_FIXES


_GENERIC_FIXES = DeterminismFixes(
    "seed the generator it draws from", "write the memory before it is read", "use deterministic kernels"
)


def _diagnosed(trace: Trace, op: OpNode, difference: float, changed_leaf: str | None) -> Nondeterminism:
    """The op where the runs part, with the cause its kind and what it reads give, and the fix."""
    if op.op in RANDOM:
        return _random(trace, op, difference, "eval" if op.op in DROPOUT else "seed")
    empty = _uninitialised_read(trace, op)
    if empty is not None:
        made = trace.ops[empty]
        where = made.source or made.module or f"op {empty}"
        return Nondeterminism(
            trace.side,
            _site(op),
            "uninitialized",
            f"{made.framework_op} at {where} leaves memory that this op reads uninitialised: {_fixes(trace).zeros}",
            difference,
            reads=f"op {empty} ({made.framework_op})",
        )
    if changed_leaf is not None:
        return Nondeterminism(
            trace.side, _site(op), "other", _changed_leaf_fix(changed_leaf), difference, reads=changed_leaf
        )
    return Nondeterminism(trace.side, _site(op), "kernel", _fixes(trace).kernel, difference)


def _other_path(trace: Trace, op: OpNode, what: str) -> Nondeterminism:
    """The second run took another path at `op` (`what` it did) with no value differing before."""
    fix = (
        f"{what}: make the forward's control flow depend on its inputs alone (seed Python's and numpy's "
        "generators where a branch draws from them)"
    )
    return Nondeterminism(trace.side, _site(op), "other", fix, None)


def _random(trace: Trace, op: OpNode, difference: float | None, fixable: str) -> Nondeterminism:
    """An op that draws from the framework's random generators: dropout on (`fixable` "eval"), or an unseeded draw."""
    if fixable == "eval":
        fix = f"put the {trace.side} model in eval mode (model.eval()) in the model file: its dropout is on"
    else:
        fix = _fixes(trace).seed
    return Nondeterminism(trace.side, _site(op), "random", fix, difference, fixable=fixable)


def _changed_leaf_fix(leaf: str) -> str:
    ref = LeafRef.parse(leaf)
    if ref.kind in ("param", "buffer"):
        return (
            f"the forward changes its {ref.kind} {ref.name} each time it runs (a running statistic, a counter): "
            "put the model in eval mode, or keep the update out of the forward"
        )
    if ref.kind == "input":
        return f"the forward writes into its input {ref.name}: copy the input before changing it"
    return (
        "a value the forward makes outside the framework's ops (numpy, Python's random, the time) differs between "
        "runs: seed numpy and Python (np.random.seed, random.seed), or make it once when the model is built"
    )


def _carries_uninitialised(trace: Trace, op: OpNode) -> bool:
    """Does `op` only hand on memory left uninitialised, reading none of it (a view of it, a write into part
    of it)? Its outputs differ where that memory does; the op that reads it comes later."""
    return (op.op in _PASSES_MEMORY_ON or op.op in _WRITES) and _uninitialised_read(trace, op) is not None


def _uninitialised_read(trace: Trace, op: OpNode) -> int | None:
    """The op that left uninitialised the memory `op` reads, directly or through views and in-place writes of it."""
    pending, seen = list(op.inputs), set()
    while pending:
        tid = pending.pop()
        producer = trace.tensors[tid].producer
        if producer is None or producer in seen:
            continue
        seen.add(producer)
        made = trace.ops[producer]
        if made.op in UNINITIALISED:
            return producer
        if made.inplace or made.op in _PASSES_MEMORY_ON:
            pending.extend(made.inputs)
    return None


def _same(a: TensorInfo, b: TensorInfo) -> bool:
    """Do two recordings of a tensor hold the same values (NaN where NaN)? By shape, statistics and fingerprint."""
    return (
        a.shape == b.shape and a.dtype == b.dtype and _equal(a.stats, b.stats) and _equal(a.fingerprint, b.fingerprint)
    )


def _equal(a, b) -> bool:
    return a == b or _as_numbers(a) == _as_numbers(b)


def _as_numbers(values) -> list:
    """NaN as a string, so that NaN equals NaN."""
    values = values if isinstance(values, list) else [getattr(values, name) for name in values.__slots__]
    return [("nan" if x != x else x) for x in values]


def _moved(a: TensorInfo, b: TensorInfo) -> float:
    """How far tensor `b` lies from `a`, relative to `a`'s largest magnitude: over their fingerprints and statistics."""
    if a.shape != b.shape or len(a.fingerprint) != len(b.fingerprint):
        return float("inf")
    pairs = list(zip(a.fingerprint, b.fingerprint)) + [
        (a.stats.mean, b.stats.mean),
        (a.stats.absmax, b.stats.absmax),
        (a.stats.std, b.stats.std),
    ]
    largest = max(abs(a.stats.absmax), 1e-30)
    return max((abs(x - y) for x, y in pairs if x == x and y == y), default=0.0) / largest
