"""The trace: one forward pass as plain data.

A trace is a list of ops in execution order plus a table of tensors. Every tensor
has a stable integer id (`tid`); an op lists the tids it read and wrote. Leaves
(model inputs, parameters, buffers, constants) are tensors with no producer.
`Trace.graph` turns this into a `networkx.DiGraph` keyed by op index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable

import networkx as nx
import numpy as np

from ..adapters import Reductions, Tensors
from ..serial import number, plain_number
from ..leafref import leaf_kind

FINGERPRINT_SIZE = 16


@dataclass(slots=True, frozen=True)
class TensorStats:
    """A tensor's statistics over its finite values (all 0 where it has none), and its NaN and Inf counts."""

    min: float
    max: float
    mean: float
    absmax: float
    std: float
    nan: int = 0
    inf: int = 0

    def to_json(self) -> dict:
        data = _shallow_dict(self)
        if not all(map(math.isfinite, data.values())):
            data = {key: plain_number(x) for key, x in data.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> TensorStats:
        if str in set(map(type, data.values())):
            data = {key: number(x) for key, x in data.items()}
        return cls(**data)


# A plain tensor made from a shard: each process's own part of a value spread over several (its
# values are the first process's), never compared with a whole tensor.
LOCAL_PART = "local part"
# Any other plain tensor whose values differ from process to process (the first process's are kept).
RANKS_DIFFER = "differs by rank"

PENDING_STATS = TensorStats(0.0, 0.0, 0.0, 0.0, 0.0)  # a tensor's until its batch is described (`StatsBatch`)


@dataclass(slots=True)  # one per tensor of a trace: no per-instance __dict__
class TensorInfo:
    tid: int
    shape: tuple[int, ...]
    dtype: str
    stats: TensorStats
    fingerprint: list[float]
    producer: int | None = None  # op index, None for a leaf
    leaf: str | None = None  # "input:x", "param:blocks.0.w", "buffer:..", "const:..."
    stored: bool = False
    # How a side on several processes held it: a distributed tensor's placements ("Shard(dim=2)"),
    # or LOCAL_PART; None where one process holds it whole.
    placement: str | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nonfinite(self) -> int:
        """How many of its values are NaN or Inf."""
        return int(self.stats.nan + self.stats.inf)

    def to_json(self) -> dict:
        data = _shallow_dict(self)
        if not all(map(math.isfinite, self.fingerprint)):  # a NaN or Inf among its values
            data["fingerprint"] = [plain_number(x) for x in self.fingerprint]
        data["stats"] = self.stats.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict) -> "TensorInfo":
        info = cls(**{**data, "shape": tuple(data["shape"]), "stats": TensorStats.from_json(data["stats"])})
        if type(info.fingerprint) is list and str in set(map(type, info.fingerprint)):
            info.fingerprint = [number(x) for x in info.fingerprint]
        return info


@dataclass(slots=True)
class OpNode:
    index: int
    framework_op: str
    op: str  # canonical name, shared by all frameworks
    module: str
    source: str  # "path:line" of the user's code that called the op, else of the framework's own (library_source)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    inplace: bool = False
    # True where no user code called the op and `source` is the framework's line that did
    # (a layer's forward): a model that is one framework layer. False in traces written before.
    library_source: bool = False
    # Floating dtypes the op computes in that its tensors do not show: a compiled module's parameters
    # and buffers, read inside its compiled code (its rounding is theirs).
    inner_dtypes: list[str] = field(default_factory=list)

    @property
    def data_inputs(self) -> list[int]:
        """The tensors whose values the op computes from: a cast reads any other (`x.type_as(y)`) for its dtype."""
        return self.inputs[:1] if self.op == "cast" else self.inputs

    def to_json(self) -> dict:
        return _shallow_dict(self)

    @classmethod
    def from_json(cls, data: dict) -> "OpNode":
        return cls(**data)


def _shallow_dict(record: Any) -> dict:
    """A slotted dataclass's fields as a dict; shallow, where `dataclasses.asdict` deep-copies (40x slower on a
    big trace)."""
    return {name: getattr(record, name) for name in record.__slots__}


@dataclass
class Trace:
    """One side's recorded forward pass."""

    side: str
    framework: str
    device: str
    dtype: str
    ops: list[OpNode] = field(default_factory=list)
    tensors: dict[int, TensorInfo] = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=dict)  # flattened output key -> tid
    unread_leaves: list[str] = field(default_factory=list)  # floating parameters and buffers no op read
    # The settings that change the framework's numbers as its first op ran (`Determinism.numerics_settings`).
    settings: dict[str, str] = field(default_factory=dict)
    # Reads a stored tensor's values; set by the store. None in a trace without values.
    value_reader: Callable[[int], np.ndarray] | None = field(default=None, repr=False)
    # Reads a parameter's or buffer's values from the live model (set by `sides.recorded_through`): a run does not
    # copy them. None once the model is gone (a run reopened from disk).
    leaf_reader: Callable[[int], np.ndarray] | None = field(default=None, repr=False)
    # Op outputs the recording did not store, fetched since by a re-run of the live model (`bisectr.search.window`);
    # saving the run stores them.
    fetched: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _graph: nx.DiGraph | None = field(default=None, repr=False)

    @property
    def leaves(self) -> dict[str, int]:
        return {t.leaf: t.tid for t in self.tensors.values() if t.leaf is not None}

    def value(self, tid: int) -> np.ndarray:
        info = self.tensors[tid]
        if info.stored and self.value_reader is not None:
            return self.value_reader(tid)
        if tid in self.fetched:
            return self.fetched[tid]
        if self.leaf_reader is not None and is_model_leaf(info.leaf):
            return self.leaf_reader(tid)
        if is_model_leaf(info.leaf):
            raise KeyError(
                f"values of {info.leaf} are in the model, which this run no longer has (a run keeps a "
                "parameter's statistics, not its values)"
            )
        raise KeyError(f"values of tensor {tid} ({info.leaf or 'op output'}) were not stored")

    def has_value(self, tid: int) -> bool:
        info = self.tensors[tid]
        return (
            (self.value_reader is not None and info.stored)
            or tid in self.fetched
            or (self.leaf_reader is not None and is_model_leaf(info.leaf))
        )

    def dtypes_of(self, indices: list[int]) -> list[str]:
        """The dtypes ops `indices` compute in: their tensors' and those only their code shows
        (`OpNode.inner_dtypes`)."""
        return [self.tensors[t].dtype for i in indices for t in self.ops[i].inputs + self.ops[i].outputs] + [
            d for i in indices for d in self.ops[i].inner_dtypes
        ]

    def first_reads(self) -> dict[int, int]:
        """tid -> the index of the first op reading it."""
        first: dict[int, int] = {}
        for op in self.ops:
            for tid in op.inputs:
                first.setdefault(tid, op.index)
        return first

    def reaches(self, tid: int, holds: Callable[[TensorInfo], bool]) -> bool:
        """Does `holds` hold for tensor `tid` or for any tensor the recorded ops computed it from?"""
        pending, seen = [tid], {tid}
        while pending:
            info = self.tensors[pending.pop()]
            if holds(info):
                return True
            if info.producer is not None:
                fresh = [t for t in self.ops[info.producer].inputs if t not in seen]
                pending.extend(fresh)
                seen.update(fresh)
        return False

    def activations(self) -> set[int]:
        """Ops computing the model's activations: from its inputs and its parameters both (the embedding of its
        tokens and all that follows), or from a floating input (the hidden states a layer is given), not tables made
        of only one of them (a mask from the input's attention mask, a position bias from a parameter, a rotary
        table from neither)."""
        from_input: set[int] = set()
        from_parameter: set[int] = set()
        from_data: set[int] = set()
        for op in self.ops:
            for tid in op.inputs:
                info = self.tensors[tid]
                if info.producer is None:
                    kind = leaf_kind(info.leaf)
                    if kind == "input":
                        from_input.add(op.index)
                        if is_floating(info.dtype):
                            from_data.add(op.index)
                    elif kind == "param":
                        from_parameter.add(op.index)
                else:
                    for made_from in (from_input, from_parameter, from_data):
                        if info.producer in made_from:
                            made_from.add(op.index)
        return (from_input & from_parameter) | from_data

    def made_by(self, tid: int) -> set[int]:
        """The ops that computed tensor `tid`: its producer and, in turn, those of what it read."""
        ops: set[int] = set()
        pending = [tid]
        while pending:
            producer = self.tensors[pending.pop()].producer
            if producer is not None and producer not in ops:
                ops.add(producer)
                pending.extend(self.ops[producer].inputs)
        return ops

    def producer_op(self, tid: int) -> OpNode | None:
        producer = self.tensors[tid].producer
        return None if producer is None else self.ops[producer]

    def consumers(self) -> dict[int, list[int]]:
        """tid -> indices of the ops that read it."""
        readers: dict[int, list[int]] = {}
        for op in self.ops:
            for tid in op.inputs:
                readers.setdefault(tid, []).append(op.index)
        return readers

    @property
    def graph(self) -> nx.DiGraph:
        if self._graph is None:
            self._graph = self._build_graph()
        return self._graph

    def _build_graph(self) -> nx.DiGraph:
        graph = nx.DiGraph()
        for op in self.ops:
            graph.add_node(
                op.index,
                kind="op",
                index=op.index,
                op=op.op,
                framework_op=op.framework_op,
                module=op.module,
                source=op.source,
                library_source=op.library_source,
                inplace=op.inplace,
                inputs=[self.tensors[t].to_json() for t in op.inputs],
                outputs=[self.tensors[t].to_json() for t in op.outputs],
            )
        for info in self.tensors.values():
            if info.leaf is not None:
                graph.add_node(info.leaf, kind="leaf", tensor=info.to_json())
        for op in self.ops:
            for tid in op.inputs:
                info = self.tensors[tid]
                source = info.producer if info.producer is not None else info.leaf
                if source is not None:
                    graph.add_edge(source, op.index, tid=tid)
        return graph

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "framework": self.framework,
            "device": self.device,
            "dtype": self.dtype,
            "ops": [op.to_json() for op in self.ops],
            "tensors": [t.to_json() for t in self.tensors.values()],
            "outputs": self.outputs,
            "unread_leaves": self.unread_leaves,
            "settings": self.settings,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Trace":
        return cls(
            side=data["side"],
            framework=data["framework"],
            device=data["device"],
            dtype=data["dtype"],
            ops=[OpNode.from_json(op) for op in data["ops"]],
            tensors={t["tid"]: TensorInfo.from_json(t) for t in data["tensors"]},
            outputs=data["outputs"],
            unread_leaves=data.get("unread_leaves", []),
            settings=data.get("settings", {}),
        )

    def check(self) -> None:
        """Raise ValueError naming the first field of a wrong type, or the first op, producer or
        output that names an op or tensor the trace does not hold: a trace read from a file is
        checked, so that a damaged one is refused there rather than failing later in a view."""
        for name in ("side", "framework", "device", "dtype"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: not a string")
        tids, op_count = self.tensors.keys(), len(self.ops)
        if not _are_indices(tids):
            raise ValueError("tensors: a tensor id is not a non-negative integer")
        for tid, info in self.tensors.items():
            # Values are checked through the set of their types: a Python loop per value costs as much as parsing
            # the JSON.
            if not (
                info.tid == tid
                and _are_indices(info.shape)
                and type(info.dtype) is str
                and type(info.stored) is bool
                and _NUMBER_TYPES.issuperset(map(type, _shallow_dict(info.stats).values()))
                and type(info.fingerprint) is list
                and _NUMBER_TYPES.issuperset(map(type, info.fingerprint))
                and (info.producer is None or type(info.producer) is int and 0 <= info.producer < op_count)
                and (info.leaf is None or type(info.leaf) is str)
            ):
                raise ValueError(f"tensor {tid}: a field has the wrong type or names no op of the trace")
        for position, op in enumerate(self.ops):
            named = op.inputs + op.outputs  # a TypeError unless both are lists (or both strings: checked next)
            if not (
                op.index == position
                and type(named) is list
                and _are_indices(named)
                and tids >= set(named)
                and type(op.framework_op) is str
                and type(op.op) is str
                and type(op.module) is str
                and type(op.source) is str
                and type(op.inplace) is bool
                and type(op.library_source) is bool
            ):
                raise ValueError(f"op {position}: a field has the wrong type or names no tensor of the trace")
        if not (
            type(self.outputs) is dict and _are_indices(self.outputs.values()) and tids >= set(self.outputs.values())
        ):
            raise ValueError("outputs: not a mapping of output keys to tensors of the trace")
        if not (type(self.unread_leaves) is list and all(type(name) is str for name in self.unread_leaves)):
            raise ValueError("unread_leaves: not a list of leaf names")
        if not (type(self.settings) is dict and all(type(v) is str for v in self.settings.values())):
            raise ValueError("settings: not an object of strings")


_NUMBER_TYPES = frozenset((int, float))
_INT_TYPE = frozenset((int,))


def _are_indices(values: Iterable[Any]) -> bool:
    """Are all `values` non-negative ints (bools are not)?"""
    return _INT_TYPE.issuperset(map(type, values)) and min(values, default=0) >= 0


def is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def is_model_leaf(leaf: str | None) -> bool:
    """A parameter or a buffer (of the model: not an input or a constant the forward made)."""
    return leaf_kind(leaf) in ("param", "buffer")


def read_live(leaf: str | None) -> bool:
    """Does a replay read this leaf where the model holds it, rather than as values? The model's
    parameters: a kernel may update a buffer in place unseen (batch norm's running statistics in
    training mode move no version counter), so buffers are handed to it as copies."""
    return leaf_kind(leaf) == "param"


def host_dtype(dtype: str) -> str:
    """The numpy dtype a tensor of `dtype` is held in on the host: numpy has no bfloat16, so an
    adapter's `to_numpy` widens it to float32."""
    return "float32" if dtype == "bfloat16" else dtype


def float64_dtype(dtype: str) -> str:
    """The dtype a float64 run gives a tensor of `dtype`: float64 for real floats, complex128 for complex."""
    if dtype.startswith("complex"):
        return "complex128"
    return "float64" if dtype.startswith(("float", "bfloat")) else dtype


def tensor_stats(values: np.ndarray) -> TensorStats:
    """min/max/mean/abs-max/std over the finite values, plus NaN and Inf counts.

    Runs on every recorded tensor and parameter, so it is kept to four cheap passes: min
    and max first (NaN propagates through them, so finiteness is only checked when one is
    not finite), then the sum and the sum of squares through BLAS (`_sum`, `np.dot`), in
    float64 where float32 sums could overflow (an attention mask of -3.4e38)."""
    if values.dtype.kind == "c":
        values = np.abs(values)
    elif values.dtype.kind != "f" or values.dtype.itemsize < 4:
        values = values.astype(np.float32 if values.dtype.kind == "f" else np.float64)
    flat = values.reshape(-1)
    nan_count = inf_count = 0
    if flat.size:
        low, high = float(flat.min()), float(flat.max())
        if not (math.isfinite(low) and math.isfinite(high)):
            nan_count = int(np.isnan(flat).sum())
            flat = flat[np.isfinite(flat)]
            inf_count = int(values.size - flat.size - nan_count)
            if flat.size:
                low, high = float(flat.min()), float(flat.max())
    if flat.size == 0:
        return _statistics(0.0, 0.0, 0.0, 0.0, nan_count, inf_count)
    if not _fits_float32_sums(max(abs(low), abs(high)), flat.size):
        flat = flat.astype(np.float64, copy=False)
    mean = _sum(flat) / flat.size
    variance = float(np.dot(flat, flat)) / flat.size - mean * mean
    return _statistics(low, high, mean, math.sqrt(max(variance, 0.0)), nan_count, inf_count)


_FLOAT32_SUM_LIMIT = 1e38  # below float32's largest value, 3.4e38


def _fits_float32_sums(absmax: float | np.ndarray, size: int | np.ndarray) -> bool | np.ndarray:
    """Can `size` values no larger than `absmax` be summed, and their squares summed, in float32?
    No partial sum exceeds `size * absmax**2`. False for NaN and Inf."""
    return absmax * absmax * size < _FLOAT32_SUM_LIMIT


def device_reductions(adapter: Tensors, tensor: Any) -> Reductions | None:
    """`Adapter.reductions` of a non-empty tensor off the host, at the fingerprint's positions; None
    for one on the host (or empty), which numpy describes."""
    size = math.prod(tuple(tensor.shape))
    if not size or adapter.on_host(tensor):
        return None
    return adapter.reductions(tensor, fingerprint_positions(size))


def reduced_stats(reduced: Reductions) -> TensorStats:
    """`tensor_stats` from the reductions a framework computed where the tensor lives."""
    if not reduced.finite:
        return _statistics(0.0, 0.0, 0.0, 0.0, reduced.nan, reduced.inf)
    mean = reduced.total / reduced.finite
    std = math.sqrt(max(reduced.squares / reduced.finite - mean * mean, 0.0))
    return _statistics(reduced.low, reduced.high, mean, std, reduced.nan, reduced.inf)


def _statistics(low: float, high: float, mean: float, std: float, nan: int = 0, inf: int = 0) -> TensorStats:
    return TensorStats(low, high, mean, max(abs(low), abs(high)), std, nan, inf)


_SUM_ROW = 1 << 16


def _sum(flat: np.ndarray) -> float:
    """Sum of a float vector: rows of 65536 summed by one BLAS matrix-vector product (float32
    accumulation within a row), the row sums added in float64."""
    rows = flat.size // _SUM_ROW
    head = flat[: rows * _SUM_ROW].reshape(rows, _SUM_ROW) @ _ones(flat.dtype.str) if rows else np.zeros(0)
    return float(head.sum(dtype=np.float64) + flat[rows * _SUM_ROW :].sum(dtype=np.float64))


@lru_cache(maxsize=4)
def _ones(dtype: str) -> np.ndarray:
    return np.ones(_SUM_ROW, dtype=dtype)


def fingerprint(values: np.ndarray) -> list[float]:
    """A few values at fixed flat positions: cheap evidence that two tensors hold the same data.
    Indexed in place, so a non-contiguous view is not copied."""
    if values.size == 0:
        return []
    if values.ndim == 0:
        return [float(values)]
    return values[_fingerprint_index(values.shape)].astype(np.float64).tolist()


@lru_cache(maxsize=4096)
def _fingerprint_index(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    return np.unravel_index(fingerprint_positions(math.prod(shape)), shape)


@lru_cache(maxsize=4096)
def fingerprint_positions(size: int) -> np.ndarray:
    return np.linspace(0, size - 1, num=min(FINGERPRINT_SIZE, size)).astype(np.int64)


class StatsBatch:
    """Fills in `TensorInfo.stats` and `.fingerprint` for many tensors at once.

    Every numpy call costs about a microsecond whatever its size, and describing a tensor
    takes a dozen: more than a small op itself costs. So small floating tensors (float32 and
    narrower) are copied into one float32 buffer as they arrive (a later in-place write cannot
    change what is described) and reduced segment by segment (`ufunc.reduceat`, pairwise sums)
    when the buffer fills or on `flush()`. Large tensors, other dtypes, and tensors holding NaN,
    Inf or values whose float32 sums would overflow go through `tensor_stats` one by one.
    """

    SMALL = 1 << 14  # elements; larger tensors are described at once
    CAPACITY = 1 << 18  # elements in the buffer (1 MB)

    def __init__(self):
        self._buffer = np.empty(self.CAPACITY, np.float32)
        self._used = 0
        self._queued: list[TensorInfo] = []
        self._starts: list[int] = []

    def add(self, info: TensorInfo, values: np.ndarray) -> None:
        size = values.size
        if size == 0 or size > self.SMALL or values.dtype.kind != "f" or values.dtype.itemsize > 4:
            info.stats, info.fingerprint = tensor_stats(values), fingerprint(values)
            return
        if self._used + size > self.CAPACITY:
            self.flush()
        np.copyto(self._buffer[self._used : self._used + size].reshape(values.shape), values)
        self._queued.append(info)
        self._starts.append(self._used)
        self._used += size

    def flush(self) -> None:
        if not self._queued:
            return
        data = self._buffer[: self._used]
        starts = np.array(self._starts)
        sizes = np.diff(starts, append=self._used)
        positions = [fingerprint_positions(int(size)) for size in sizes]
        picked = data[np.concatenate(positions) + np.repeat(starts, [len(p) for p in positions])].tolist()
        lows = np.minimum.reduceat(data, starts)
        highs = np.maximum.reduceat(data, starts)
        special = ~_fits_float32_sums(np.maximum(-lows, highs).astype(np.float64), sizes)  # also NaN and Inf
        one_by_one = {
            i: tensor_stats(data[self._starts[i] : self._starts[i] + sizes[i]])
            for i in np.flatnonzero(special).tolist()
        }
        with np.errstate(over="ignore", invalid="ignore"):  # only in the special segments, described already
            means = np.add.reduceat(data, starts).astype(np.float64) / sizes
            squares = np.multiply(data, data, out=data)  # the values are not needed any more
            variances = np.add.reduceat(squares, starts).astype(np.float64) / sizes - means * means
        stds = np.sqrt(np.maximum(variances, 0.0))
        offset = 0
        for i, (info, low, high, mean, std, count) in enumerate(
            zip(
                self._queued,
                lows.tolist(),
                highs.tolist(),
                means.tolist(),
                stds.tolist(),
                map(len, positions),
            )
        ):
            info.fingerprint = picked[offset : offset + count]
            offset += count
            info.stats = one_by_one.get(i) or _statistics(low, high, mean, std)
        self._queued, self._starts, self._used = [], [], 0
