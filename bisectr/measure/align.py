"""Aligning two traces op by op.

The result pairs candidate ops with reference ops (1:1), groups what is left into
N:M blocks where the frameworks decompose differently, and pairs tensors
(candidate tid -> reference tid, with a layout transform where needed).

How, in four passes, each near-linear in the number of ops:
1. **Anchors.** Each op gets a key: canonical op, output shape and the layer
   numbers in its module path (`blocks.31.attn` -> (31,)). Ops with the same key
   are paired in order, each with the closest-valued unused counterpart among its
   neighbours in the group (so q/k/v projections computed in another order still
   pair by value). Keys with different counts on the two sides are left for pass 3.
2. **Backbone.** The longest increasing chain of anchors (by reference position)
   is the backbone; an anchor off it is kept only if it sits between its backbone
   neighbours (locally reordered independent ops), otherwise dropped. Two anchors
   that cross where one op reads the other's output (add then scale against scale
   then add) are both dropped, their ops left to a block.
3. **Gaps.** Between consecutive backbone anchors the remaining ops of each side are
   matched by a small dynamic program on (canonical op, output size, values). Where
   the gap pairings of one piece of code run many times (a decoding loop's cache
   write) disagree, the gaps are matched once more, each occurrence leaning to the
   reference code its clearest-valued occurrences paired with.
4. **Blocks.** Runs of ops still unmatched form N:M blocks. A block is matched when
   every tensor it hands to later ops finds a reference tensor of the same size and
   close values among the reference block's outputs or the block inputs' partners;
   one that does not is merged with the run that reads what it hands on.

Users can pin modules that the aligner cannot pair by itself
(`ALIGN_MODULES = {"candidate.path": "reference.path"}` in the model file): ops
under a pinned pair are aligned only with each other.
"""

from __future__ import annotations

import bisect as _bisect
import itertools
import re
from collections import Counter
from functools import lru_cache
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

import numpy as np

from ..capture.ops import REDUCING_COLLECTIVES
from ..capture.trace import LOCAL_PART, RANKS_DIFFER, OpNode, TensorInfo, Trace, fingerprint, is_floating
from ..leafref import leaf_kind
from .metrics import BLOCKING, blocked, rounded_to

NEIGHBOURHOOD = 8  # how far apart in a key group two paired occurrences may be
VALUE_MATCH = 0.1  # the largest value distance at which a tensor is paired on values alone
SAME_LAYOUT = 1e-3  # tensors of equal shapes this close are taken to share their layout
CLEARLY_CLOSER = 0.1  # an out-of-order occurrence wins only when this many times closer in value
MAX_PERMUTED_DIMS = 5
MAX_GAP_CELLS = 250_000  # gap DP size above which gaps are matched greedily
SAME_MODULE = 0.5  # what a gap's pairing gains for two ops of the same module path, beside their similarity
USUAL_PARTNER = 0.5  # what it gains where the reference op's code is where the candidate op's code usually pairs
_LAYER_NUMBER = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")

# A layout transform: the permutation that turns the reference tensor's values into
# the candidate's layout (None: same layout, or a plain reshape of the same data).
Permutation = tuple[int, ...] | None
# Which input of an op is stored in which layout: (framework, canonical op, input
# position) -> permutation to the shared layout. Torch keeps Linear weights as
# (out, in), paddle as (in, out).
InputLayout = Callable[[str, str, int], Permutation]


@dataclass
class TensorPair:
    candidate: int
    reference: int
    transform: Permutation
    confidence: float
    how: str  # "op", "input", "block"
    # The candidate holds the reference's data repeated along size-1 dimensions (one side
    # expands position embeddings to the batch, the other lets broadcasting do it).
    broadcast: bool = False
    # The candidate holds a slice of the reference (one part of a fused parameter): (axis, start,
    # stop) of the reference's values, taken before `transform`.
    part: tuple[int, int, int] | None = None
    # Where the candidate holds rows of the reference along `part`'s axis that are not one run (a port's q projection
    # from a fused one laid out per head): which, in the candidate's order; `part` spans them.
    rows: tuple[int, ...] | None = None

    def held(self) -> list[int] | range:
        """The reference's positions along `part`'s axis that the candidate holds, in its order."""
        axis, start, stop = self.part
        return list(self.rows) if self.rows is not None else range(start, stop)

    def reference_in_candidate_layout(self, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        if self.part is not None:
            values = np.take(values, self.held(), axis=self.part[0])
        if self.transform is not None:
            values = np.transpose(values, self.transform)
        if self.broadcast:
            values = np.broadcast_to(values, shape)
        return np.ascontiguousarray(values).reshape(shape)

    def candidate_into_reference(self, values: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """`reference`'s values with the candidate's in their place: all of them, or where the candidate holds a
        slice of the reference (`part`), that slice."""
        if self.part is None:
            return self.candidate_in_reference_layout(values, reference.shape)
        axis = self.part[0]
        whole = np.array(reference, copy=True)
        index: list = [slice(None)] * whole.ndim
        index[axis] = self.held()
        held = whole[tuple(index)]
        if self.broadcast:
            padded = (1,) * (values.ndim - held.ndim) + tuple(held.shape)
            values = values[tuple(slice(0, 1) if r == 1 else slice(None) for r in padded)]
        if self.transform is not None:
            values = np.transpose(values.reshape(np.transpose(held, self.transform).shape), np.argsort(self.transform))
        whole[tuple(index)] = values.reshape(held.shape)
        return whole

    def candidate_in_reference_layout(self, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        if self.part is not None:
            raise ValueError(
                f"candidate tensor {self.candidate} holds a slice of reference tensor {self.reference}: "
                "it has no layout of the whole"
            )
        if self.broadcast:
            padded = (1,) * (values.ndim - len(shape)) + tuple(shape)
            values = values[tuple(slice(0, 1) if r == 1 else slice(None) for r in padded)]
        if self.transform is not None:
            values = np.transpose(values, np.argsort(self.transform))
        return np.ascontiguousarray(values).reshape(shape)


def broadcasts(reference: tuple[int, ...], candidate: tuple[int, ...]) -> bool:
    """Is `candidate` the shape of `reference` expanded along some of its size-1 dimensions?"""
    if len(reference) > len(candidate) or reference == candidate:
        return False
    padded = (1,) * (len(candidate) - len(reference)) + tuple(reference)
    return all(r == c or r == 1 for r, c in zip(padded, candidate))


@dataclass
class PairEvidence:
    """Why two ops were paired."""

    how: str  # "anchor" | "gap" | "pin"
    op: str
    candidate_module: str
    reference_module: str
    shape: list[int]  # the candidate output's
    value_distance: float


@dataclass
class OpPair:
    candidate: int
    reference: int
    confidence: float
    evidence: PairEvidence


@dataclass
class Block:
    candidate: list[int]
    reference: list[int]
    matched: bool


@dataclass
class LeafPair:
    """A candidate parameter or buffer and the reference leaf it holds (see `leaves`)."""

    candidate: str  # leaf names as traced: "param:NAME" / "buffer:NAME"
    reference: str
    layout: str  # how the reference's values are laid out in the candidate's: "as stored", "transposed", "slice ..."
    how: str  # what paired them: "op" (read by paired ops), "block" (read in a matched block), "values", "name"
    status: Literal["equal", "rounded", "different", "unknown"] = "unknown"  # "unknown": values not stored
    description: str = ""  # what differs, for a different pair
    max_rel: float | None = None  # max abs difference / max abs of the reference's values
    # A part of a fused candidate parameter (q, k and v in one qkv_proj; a rank's shard of them):
    # the positions along `axis` of the candidate's values that hold rows of the reference leaf (its
    # values transposed first where `transposed`), and the reference row each holds (`rows`; a row
    # held at several positions where the candidate repeats it, kv heads for grouped-query attention;
    # None in runs saved before: position i holds row i modulo the reference's row count).
    slots: list[int] | None = None
    axis: int = 0
    transposed: bool = False
    rows: list[int] | None = None

    def reference_rows(self, reference_count: int) -> list[int]:
        """The reference row each of `slots` holds."""
        return self.rows if self.rows is not None else [i % reference_count for i in range(len(self.slots or []))]


@dataclass
class UnpairedLeaf:
    side: str
    name: str
    reason: str


@dataclass
class LeafPairing:
    pairs: list[LeafPair] = field(default_factory=list)
    unpaired: list[UnpairedLeaf] = field(default_factory=list)
    summary: str = ""  # what the comparison found, in one sentence


@dataclass
class Alignment:
    pairs: list[OpPair] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    tensors: dict[int, TensorPair] = field(default_factory=dict)  # candidate tid -> pair
    leaves: LeafPairing = field(default_factory=LeafPairing)

    def reference_of(self, candidate_op: int) -> int | None:
        return self._by_candidate().get(candidate_op)

    def _by_candidate(self) -> dict[int, int]:
        return {p.candidate: p.reference for p in self.pairs}

    def partnered_ops(self) -> set[int]:
        """Candidate ops with a partner: paired 1:1 or inside a matched block that holds reference ops."""
        return {p.candidate for p in self.pairs} | {
            i for b in self.blocks if b.matched and b.reference for i in b.candidate
        }

    def aligned_ops(self, side: str) -> set[int]:
        """Ops paired 1:1 or inside a matched block."""
        attr = "candidate" if side == "candidate" else "reference"
        aligned = {getattr(p, attr) for p in self.pairs}
        for block in self.blocks:
            if block.matched:
                aligned.update(getattr(block, attr))
        return aligned


@lru_cache(maxsize=65536)
def layer_numbers(module: str) -> tuple[int, ...]:
    return tuple(int(n) for n in _LAYER_NUMBER.findall(module))


def value_distance(a: TensorInfo, b: TensorInfo) -> float:
    """0 for identical fingerprints, about 1 for unrelated data, 2 for opposite sign."""
    if a.size != b.size or len(a.fingerprint) != len(b.fingerprint):
        return 2.0
    return fingerprint_distance(a.fingerprint, b.fingerprint, max(a.stats.absmax, b.stats.absmax, 1e-30))


def fingerprint_distance(a: list[float], b: list[float], scale: float) -> float:
    """The largest difference of two fingerprints relative to `scale`, capped at 2."""
    worst = 0.0
    for x, y in zip(a, b):  # 16 numbers: plain Python beats numpy here
        difference = abs(x - y)
        worst = max(worst, scale if difference != difference else difference)  # NaN counts as unrelated
    return min(worst / scale, 2.0)


def _output_partners(reference: Trace, candidate: Trace) -> dict[int, int]:
    """Candidate output tid -> the reference output it is compared with: by key, then the rest in order
    (as the run pairs the outputs), where the sizes agree."""
    rest = [k for k in reference.outputs if k not in candidate.outputs]
    keyed = [(k, k) for k in candidate.outputs if k in reference.outputs]
    keyed += zip([k for k in candidate.outputs if k not in reference.outputs], rest)
    return {
        candidate.outputs[c]: reference.outputs[r]
        for c, r in keyed
        if candidate.tensors[candidate.outputs[c]].size == reference.tensors[reference.outputs[r]].size
    }


class _TracePair:
    """Both traces with the per-op facts the passes keep asking for."""

    def __init__(self, reference: Trace, candidate: Trace):
        self.traces = {"reference": reference, "candidate": candidate}
        self.use_layers = all(any(layer_numbers(op.module) for op in t.ops) for t in self.traces.values())
        self.readers = {side: trace.consumers() for side, trace in self.traces.items()}
        self.parts = parts_of_values(candidate, self.readers["candidate"]) | _made_from_reordered_shards(
            reference, candidate
        )
        self.output_partner = _output_partners(reference, candidate)

    def key(self, side: str, op: OpNode) -> tuple:
        trace = self.traces[side]
        shape = trace.tensors[op.outputs[0]].shape if op.outputs else ()
        layers = layer_numbers(op.module) if self.use_layers else ()
        return op.op, shape, layers

    def output(self, side: str, op: OpNode) -> TensorInfo | None:
        return self.traces[side].tensors[op.outputs[0]] if op.outputs else None

    def distance(self, cand_op: OpNode, ref_op: OpNode) -> float:
        a, b = self.output("candidate", cand_op), self.output("reference", ref_op)
        return 2.0 if a is None or b is None else value_distance(a, b)


def align_traces(
    reference: Trace, candidate: Trace, pins: dict[str, str] | None = None, input_layout: InputLayout | None = None
) -> Alignment:
    """Align `candidate` to `reference`; `pins` maps candidate module paths to reference ones."""
    both = _TracePair(reference, candidate)
    pairs: dict[int, tuple[int, str, float]] = {}  # cand op -> (ref op, how, distance)
    pinned_cand: set[int] = set()
    pinned_ref: set[int] = set()
    for cand_prefix, ref_prefix in (pins or {}).items():
        cand_ops = [op for op in candidate.ops if _under(op.module, cand_prefix)]
        ref_ops = [op for op in reference.ops if _under(op.module, ref_prefix)]
        pinned_cand.update(op.index for op in cand_ops)
        pinned_ref.update(op.index for op in ref_ops)
        pairs.update(
            {c: (r, "pin", d) for c, (r, _, d) in _align_sequences(both, cand_ops, ref_ops, use_layers=False).items()}
        )
    rest_cand = [op for op in candidate.ops if op.index not in pinned_cand and not _makes_parts(both, op)]
    rest_ref = [op for op in reference.ops if op.index not in pinned_ref]
    pairs.update(_align_sequences(both, rest_cand, rest_ref, use_layers=both.use_layers))
    _follow_data_flow(both, pairs)
    _drop_layout_pairs_that_cannot_correspond(both, pairs)
    _drop_pairs_whose_parameter_is_read_later(both, pairs)
    _drop_output_pairs_that_outputs_contradict(both, pairs)

    alignment = Alignment()
    for cand_index in sorted(pairs):
        ref_index, how, distance = pairs[cand_index]
        cand_op, ref_op = candidate.ops[cand_index], reference.ops[ref_index]
        alignment.pairs.append(
            OpPair(
                cand_index,
                ref_index,
                _confidence(both, cand_op, ref_op, distance),
                PairEvidence(
                    how,
                    cand_op.op,
                    cand_op.module,
                    ref_op.module,
                    list(both.output("candidate", cand_op).shape) if cand_op.outputs else [],
                    distance,
                ),
            )
        )
    _pair_op_tensors(both, alignment, input_layout)
    _form_blocks(both, alignment)
    return alignment


def _makes_parts(both: _TracePair, op: OpNode) -> bool:
    """Does the candidate op compute each process's own part of a value (never a whole tensor to pair)?"""
    return bool(op.outputs) and all(t in both.parts for t in op.outputs)


def parts_of_values(trace: Trace, readers: dict[int, list[int]]) -> set[int]:
    """Op outputs that are each process's own part of a value: local parts of a shard, and values that
    differ by rank and go only into a collective's sum (partial sums, a bias added to one)."""
    parts: set[int] = set()
    for op in reversed(trace.ops):  # readers before what they read
        for tid in op.outputs:
            placement = trace.tensors[tid].placement
            summed = (
                placement == RANKS_DIFFER
                and tid in readers
                and all(
                    trace.ops[r].op in REDUCING_COLLECTIVES or all(t in parts for t in trace.ops[r].outputs)
                    for r in readers[tid]
                )
            )
            if placement == LOCAL_PART or summed:
                parts.add(tid)
    return parts


def _made_from_reordered_shards(reference: Trace, candidate: Trace) -> set[int]:
    """Sharded outputs made from a parameter packed for the ranks (`packed_leaves`): only each rank's part
    of it is in an order of the reference's, so what is made from it, until it is whole again, pairs as the
    ranks' parts."""
    reordered = set(packed_leaves(reference, candidate))
    made = set()
    for op in candidate.ops:
        if not reordered.isdisjoint(op.inputs):
            sharded = {t for t in op.outputs if sharded_axis(candidate.tensors[t].placement) is not None}
            reordered |= sharded
            made |= sharded
    return made


def packed_leaves(reference: Trace, candidate: Trace) -> dict[int, tuple[str, int, tuple[int, ...]]]:
    """Candidate leaves packed for the ranks -> (kind, axis, order). Where most sharded leaves of one name (up
    to layer numbers) hold the same-named reference leaf's rows along the sharded dim in one other order (a
    fused gate/up projection each rank's part of which holds its own gate rows and up rows), that order is
    the model's layout for every leaf of that name (`packed_orders`); these are the leaves that hold it."""
    sharded = _sharded_leaves(reference, candidate)
    orders = _leaf_orders(reference, candidate, sharded)
    layouts = _packed(orders, sharded)
    return {tid: found for tid, found in orders.items() if layouts.get(found[0]) == found[1:]}


def packed_orders(reference: Trace, candidate: Trace) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Each kind of leaf packed for the ranks (see `packed_leaves`) -> (axis, order of the reference's rows)."""
    sharded = _sharded_leaves(reference, candidate)
    return _packed(_leaf_orders(reference, candidate, sharded), sharded)


def _packed(
    orders: dict[int, tuple[str, int, tuple[int, ...]]], sharded: dict[int, tuple[str, int, int]]
) -> dict[str, tuple[int, tuple[int, ...]]]:
    counts = Counter(kind for kind, _, _ in sharded.values())
    packed = {}
    for kind, count in counts.items():
        held = Counter((axis, order) for k, axis, order in orders.values() if k == kind)
        if held:
            layout, holders = held.most_common(1)[0]
            if holders >= 2 and 2 * holders > count:
                packed[kind] = layout
    return packed


def _leaf_orders(
    reference: Trace, candidate: Trace, sharded: dict[int, tuple[str, int, int]]
) -> dict[int, tuple[str, int, tuple[int, ...]]]:
    """The `sharded` leaves holding their reference leaf's rows in another order -> (kind, axis, order)."""
    found = {}
    for tid, (kind, ref_tid, axis) in sharded.items():
        if candidate.has_value(tid) and reference.has_value(ref_tid):
            order = row_order(reference.value(ref_tid), candidate.value(tid), axis, candidate.tensors[tid].dtype)
            if order is not None and order != sorted(order):
                found[tid] = (kind, axis, tuple(order))
    return found


def _sharded_leaves(reference: Trace, candidate: Trace) -> dict[int, tuple[str, int, int]]:
    """Candidate leaves sharded along one dim with a reference leaf of the same name (or of the name a
    wrapper's prefix ends in) -> (kind: the name up to layer numbers, reference tid, sharded axis)."""
    reference_leaves = reference.leaves
    found = {}
    for tid, info in candidate.tensors.items():
        axis = sharded_axis(info.placement)
        if axis is None or info.leaf is None:
            continue
        kind, _, name = info.leaf.partition(":")
        names = name.split(".")
        ref_tid = next(
            (
                reference_leaves[leaf]
                for k in range(len(names))
                if (leaf := f"{kind}:{'.'.join(names[k:])}") in reference_leaves
            ),
            None,
        )
        if ref_tid is not None:
            found[tid] = (layerless(info.leaf), ref_tid, axis % len(info.shape))
    return found


def up_to_numbers(name: str) -> str:
    """`name` with every number as `#`: the same parameter or module of every layer (`h.#.attn`, `blocks.#.ln#`)."""
    return re.sub(r"\d+", "#", name)


def layerless(name: str) -> str:
    """`name` up to layer numbers: `model.layers.#.mlp.gate_up_proj.weight`."""
    return re.sub(r"\.\d+\.", ".#.", name)


def sharded_axis(placement: str | None) -> int | None:
    dims = set(re.findall(r"Shard\(dim=(-?\d+)\)", placement or ""))
    return int(dims.pop()) if len(dims) == 1 else None


def row_order(reference: np.ndarray, candidate: np.ndarray, axis: int, dtype: str | None = None) -> list[int] | None:
    """The reference's slice along `axis` each of the candidate's holds (bit for bit as they are, or in float32
    once rounded to the candidate's `dtype` where it is given), where it holds each of them once; else None."""
    if reference.shape != candidate.shape:
        return None
    if dtype is not None:
        reference, candidate = rounded_to(reference.astype(np.float32), dtype), candidate.astype(np.float32)
    ref_rows = np.moveaxis(reference, axis, 0).reshape(reference.shape[axis], -1)
    cand_rows = np.moveaxis(candidate, axis, 0).reshape(candidate.shape[axis], -1)
    where = {row.tobytes(): i for i, row in enumerate(ref_rows)}
    order = [where.get(row.tobytes(), -1) for row in cand_rows]
    return order if sorted(order) == list(range(len(ref_rows))) else None


# Ops that only move their first input's data (or view it in another shape): two of them
# correspond only if the data they move does.
LAYOUT_OPS = frozenset({"transpose", "reshape", "expand", "copy", "contiguous"})


def _follow_data_flow(both: _TracePair, pairs: dict[int, tuple[int, str, float]]) -> None:
    """Re-pair layout ops by the data they move: a candidate layout op reading output k of a paired
    op pairs with the reference's layout op of the same kind reading output k of its partner, its
    pair swapped with the candidate op that held it. Paired by order alone, q, k and v, viewed in
    another order on each side, rotate: values tell them apart only while the forward agrees.
    In candidate order, so that a re-paired op's readers follow it."""
    candidate, reference = both.traces["candidate"], both.traces["reference"]
    cand_of = {r: c for c, (r, _, _) in pairs.items()}
    for c in sorted(pairs):
        cand_op = candidate.ops[c]
        if cand_op.op not in LAYOUT_OPS or not cand_op.inputs:
            continue
        cand_in = candidate.tensors[cand_op.inputs[0]]
        if cand_in.producer not in pairs:
            continue
        ref_producer = reference.ops[pairs[cand_in.producer][0]]
        position = candidate.ops[cand_in.producer].outputs.index(cand_in.tid)
        if position >= len(ref_producer.outputs):
            continue
        expected = ref_producer.outputs[position]
        current = reference.ops[pairs[c][0]]
        if current.inputs and current.inputs[0] == expected:
            continue
        readers = [reference.ops[r] for r in both.readers["reference"].get(expected, [])]
        moved = next(
            (
                r
                for r in readers
                if r.op == cand_op.op
                and r.inputs[0] == expected
                and r.index in cand_of
                and r.outputs
                and cand_op.outputs
                and reference.tensors[r.outputs[0]].shape == candidate.tensors[cand_op.outputs[0]].shape
            ),
            None,
        )
        if moved is None:
            continue
        other = cand_of[moved.index]
        pairs[c], pairs[other] = pairs[other], pairs[c]
        cand_of[moved.index], cand_of[current.index] = c, other


# Ops that move or select their first input's data (layout ops, slices, casts): two of them are the
# same step only if they take and make the same shapes from the same data.
DATA_MOVING_OPS = LAYOUT_OPS | {"getitem", "cast"}


def _drop_layout_pairs_that_cannot_correspond(both: _TracePair, pairs: dict[int, tuple[int, str, float]]) -> None:
    """Unpair data-moving ops (`DATA_MOVING_OPS`) that cannot be the same step: the shapes they take
    and make differ, or their inputs come from ops paired elsewhere. `k.transpose(-1, -2)` of a
    hand-written attention is not `nn.MultiheadAttention`'s batch-first transpose of the layer's
    input, whatever their names and sizes; a port's `positions.float()` is not the reference's
    `inv_freq.to(float32)`; the rotary's slice of 4 key heads is not the slice that repeats 2 of them.
    In candidate order, so that a dropped pair's readers are judged without it."""
    candidate, reference = both.traces["candidate"], both.traces["reference"]
    cand_of = {r: c for c, (r, _, _) in pairs.items()}
    for c in sorted(pairs):
        r = pairs[c][0]
        cand_op, ref_op = candidate.ops[c], reference.ops[r]
        if cand_op.op not in DATA_MOVING_OPS or not cand_op.inputs or not ref_op.inputs:
            continue
        cand_in, ref_in = candidate.tensors[cand_op.inputs[0]], reference.tensors[ref_op.inputs[0]]
        same_shapes = (
            cand_in.shape == ref_in.shape
            and candidate.tensors[cand_op.outputs[0]].shape == reference.tensors[ref_op.outputs[0]].shape
        )
        cand_from, ref_from = cand_in.producer, ref_in.producer
        # A slice or a cast may read what an op the reference lacks made (an extra scale before a norm's cast):
        # only a candidate input made by an op paired elsewhere rules it out.
        paired_elsewhere = (cand_from is not None and cand_from in pairs and pairs[cand_from][0] != ref_from) or (
            cand_op.op in LAYOUT_OPS and ref_from is not None and ref_from in cand_of and cand_of[ref_from] != cand_from
        )
        if paired_elsewhere or not same_shapes:
            del pairs[c]
            del cand_of[r]


def _drop_pairs_whose_parameter_is_read_later(both: _TracePair, pairs: dict[int, tuple[int, str, float]]) -> None:
    """Unpair ops where one side reads a parameter that the other side's op does not, but a later
    op of that side does: paddle's `conv2d` adds its bias in ops of its own (reshape, add), torch's
    takes it in the call. The step is one op against several, a block for `_form_blocks`."""
    traces = both.traces
    first_reader = {side: _first_parameter_readers(traces[side]) for side in traces}
    for c in sorted(pairs):
        ops = {"candidate": c, "reference": pairs[c][0]}
        read = {side: _parameters_read(traces[side], ops[side]) for side in ops}
        for side, other in (("candidate", "reference"), ("reference", "candidate")):
            if any(first_reader[side].get(name, -1) > ops[side] for name in read[other] - read[side]):
                del pairs[c]
                break


def _drop_output_pairs_that_outputs_contradict(both: _TracePair, pairs: dict[int, tuple[int, str, float]]) -> None:
    """Unpair an op making a candidate output from a reference op that does not make the reference output it
    is compared with: the reference goes on computing (a final soft-cap the candidate lacks), and the op
    belongs in a block with the reference's ops up to that output."""
    candidate, reference = both.traces["candidate"], both.traces["reference"]
    for cand_index, (ref_index, _, _) in list(pairs.items()):
        cand_outputs, ref_outputs = candidate.ops[cand_index].outputs, reference.ops[ref_index].outputs
        partners = [both.output_partner[t] for t in cand_outputs if t in both.output_partner]
        if partners and not set(partners) <= set(ref_outputs):
            del pairs[cand_index]


def _parameters_read(trace: Trace, index: int) -> set[str]:
    return {leaf for leaf in (trace.tensors[t].leaf for t in trace.ops[index].inputs) if leaf_kind(leaf) == "param"}


def _first_parameter_readers(trace: Trace) -> dict[str, int]:
    """Parameter name -> the first op that reads it."""
    first: dict[str, int] = {}
    for op in trace.ops:
        for name in _parameters_read(trace, op.index):
            first.setdefault(name, op.index)
    return first


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _confidence(both: _TracePair, cand_op: OpNode, ref_op: OpNode, distance: float) -> float:
    same_layers = layer_numbers(cand_op.module) == layer_numbers(ref_op.module)
    closeness = 1.0 / (1.0 + 1e3 * distance)  # 1 for equal values, ~0.5 at 1e-3 apart
    return round(0.5 + 0.3 * closeness + 0.2 * same_layers, 3)


def _align_sequences(
    both: _TracePair, cand_ops: list[OpNode], ref_ops: list[OpNode], use_layers: bool
) -> dict[int, tuple[int, str, float]]:
    anchors = _anchors(both, cand_ops, ref_ops, use_layers)
    backbone, extra = _backbone(anchors)
    crossed = _crossing_dataflow(both, backbone + extra)
    backbone, extra = [a for a in backbone if a not in crossed], [a for a in extra if a not in crossed]
    anchored = {
        c: (r, "anchor", both.distance(both.traces["candidate"].ops[c], both.traces["reference"].ops[r]))
        for c, r in backbone + extra
    }
    crossed_cands = {c for c, _ in crossed}
    cand_positions = [op.index for op in cand_ops if op.index not in crossed_cands]
    ref_positions = [op.index for op in ref_ops]
    bounds = [(-1, -1)] + backbone + [(10**18, 10**18)]
    unpaired_ref = {r for _, r in crossed}  # crossed ops stay unpaired

    def with_gaps(usual: dict[tuple, tuple]) -> dict[int, tuple[int, str, float]]:
        pairs = dict(anchored)
        matched_ref = {r for r, _, _ in pairs.values()} | unpaired_ref
        for (c0, r0), (c1, r1) in zip(bounds, bounds[1:]):
            gap_cand = [candidate for candidate in _between(cand_positions, c0, c1) if candidate not in pairs]
            gap_ref = [reference for reference in _between(ref_positions, r0, r1) if reference not in matched_ref]
            if gap_cand and gap_ref:
                for c, r, d in _match_gap(both, gap_cand, gap_ref, usual):
                    pairs[c] = (r, "gap", d)
                    matched_ref.add(r)
        return pairs

    pairs = with_gaps({})
    usual = _usual_partners(both, pairs)
    return with_gaps(usual) if usual else pairs


def code_place(op: OpNode) -> tuple:
    """Where an op comes from, the same in every layer and every call: its op, line and module up to layer numbers."""
    return op.op, op.source, layerless(op.module + ".")


def _usual_partners(both: _TracePair, pairs: dict[int, tuple[int, str, float]]) -> dict[tuple, tuple]:
    """For each piece of candidate code run more than once whose gap pairings disagree, the reference
    code its occurrences pair with, weighted by how closely their values agree: a greedy decoding
    loop's cache write pairs by value while the tokens agree, and keeps that pairing once they part."""
    votes: dict[tuple, Counter] = {}
    gap_places: dict[tuple, set[tuple]] = {}
    candidate, reference = both.traces["candidate"], both.traces["reference"]
    for c, (r, how, distance) in pairs.items():
        place, partner = code_place(candidate.ops[c]), code_place(reference.ops[r])
        votes.setdefault(place, Counter())[partner] += 1.0 / (1.0 + 1e3 * distance)
        if how == "gap":
            gap_places.setdefault(place, set()).add(partner)
    return {place: votes[place].most_common(1)[0][0] for place, partners in gap_places.items() if len(partners) > 1}


def _between(sorted_positions: list[int], low: int, high: int) -> list[int]:
    start = _bisect.bisect_right(sorted_positions, low)
    stop = _bisect.bisect_left(sorted_positions, high)
    return sorted_positions[start:stop]


def _anchors(
    both: _TracePair, cand_ops: list[OpNode], ref_ops: list[OpNode], use_layers: bool
) -> list[tuple[int, int]]:
    groups: dict[tuple, tuple[list[OpNode], list[OpNode]]] = {}
    for side, ops in (("candidate", cand_ops), ("reference", ref_ops)):
        for op in ops:
            key = both.key(side, op)
            if not use_layers:
                key = key[:2]
            groups.setdefault(key, ([], []))[0 if side == "candidate" else 1].append(op)
    anchors = []
    for cand_group, ref_group in groups.values():
        if len(cand_group) == len(ref_group):
            anchors.extend(_pair_group(both, cand_group, ref_group))
    anchors.sort()
    return anchors


def _pair_group(both: _TracePair, cand_group: list[OpNode], ref_group: list[OpNode]) -> list[tuple[int, int]]:
    """Pair the k-th occurrence with the k-th, unless an unused occurrence near k is clearly
    closer in value (q/k/v projections computed in another order). Values decide only
    clearly: downstream of a real bug every occurrence is far from every other."""
    used = [False] * len(ref_group)
    pairs = []
    for k, cand_op in enumerate(cand_group):
        window = [
            j for j in range(max(0, k - NEIGHBOURHOOD), min(len(ref_group), k + NEIGHBOURHOOD + 1)) if not used[j]
        ]
        if not window:
            continue
        distance = {j: both.distance(cand_op, ref_group[j]) for j in window}
        best = min(window, key=lambda j: (distance[j], abs(j - k)))
        in_order = min(window, key=lambda j: abs(j - k))
        if distance[best] > CLEARLY_CLOSER * distance[in_order]:
            best = in_order
        used[best] = True
        pairs.append((cand_op.index, ref_group[best].index))
    return pairs


def _crossing_dataflow(both: _TracePair, anchors: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Anchors two of which cross where one op reads the other's output (the candidate adds a mask, then
    scales; the reference scales, then adds): their partners cannot read each other's in turn, so
    neither pairing holds, and those ops are left to be compared together as a block."""
    reference_of = dict(anchors)
    candidate_of = {r: c for c, r in anchors}
    crossed: set[tuple[int, int]] = set()
    for role, partner_of in (("candidate", reference_of), ("reference", candidate_of)):
        trace = both.traces[role]
        for index, partner in partner_of.items():
            for tid in trace.ops[index].inputs:
                producer = trace.tensors[tid].producer
                if producer is not None and producer in partner_of and partner_of[producer] > partner:
                    pair, producer_pair = (index, partner), (producer, partner_of[producer])
                    crossed |= {pair, producer_pair} if role == "candidate" else {pair[::-1], producer_pair[::-1]}
    return crossed


def _backbone(anchors: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Split anchors (sorted by candidate index) into the longest increasing chain by
    reference index, and the off-chain anchors that lie between their chain neighbours."""
    tails: list[int] = []  # reference index ending the best chain of each length
    tail_at: list[int] = []
    previous = [-1] * len(anchors)
    for i, (_, r) in enumerate(anchors):
        length = _bisect.bisect_left(tails, r)
        if length == len(tails):
            tails.append(r)
            tail_at.append(i)
        else:
            tails[length] = r
            tail_at[length] = i
        previous[i] = tail_at[length - 1] if length > 0 else -1
    chain = []
    i = tail_at[-1] if tail_at else -1
    while i >= 0:
        chain.append(i)
        i = previous[i]
    chain.reverse()
    on_chain = set(chain)
    backbone = [anchors[i] for i in chain]
    extra = []
    chain_cands = [c for c, _ in backbone]
    for i, (c, r) in enumerate(anchors):
        if i in on_chain:
            continue
        k = _bisect.bisect_left(chain_cands, c)
        low = backbone[k - 1][1] - NEIGHBOURHOOD if k > 0 else -1
        high = backbone[k][1] + NEIGHBOURHOOD if k < len(backbone) else 10**18
        if low < r < high:
            extra.append((c, r))
    return backbone, extra


def _match_gap(
    both: _TracePair, gap_cand: list[int], gap_ref: list[int], usual: dict[tuple, tuple]
) -> list[tuple[int, int, float]]:
    """Best order-preserving matching of two short op runs (same canonical op and output size)."""
    cand_ops = [both.traces["candidate"].ops[i] for i in gap_cand]
    ref_ops = [both.traces["reference"].ops[i] for i in gap_ref]

    def similarity(c: OpNode, r: OpNode) -> float | None:
        a, b = both.output("candidate", c), both.output("reference", r)
        if c.op != r.op or a is None or b is None or a.size != b.size:
            return None
        return 2.0 - value_distance(a, b)

    def gain(c: OpNode, r: OpNode) -> float | None:
        """What pairing c with r adds: one, its similarity, a share for the same module (of two
        multiplies where the reference has one, the one in the module the reference's is in), and one
        for the reference code the candidate's usually pairs with (`_usual_partners`)."""
        s = similarity(c, r)
        if s is None:
            return None
        usual_partner = usual.get(code_place(c)) == code_place(r)
        return 1.0 + s + (SAME_MODULE if c.module == r.module else 0.0) + (USUAL_PARTNER if usual_partner else 0.0)

    n, m = len(cand_ops), len(ref_ops)
    if n * m > MAX_GAP_CELLS:
        return _match_gap_greedy(cand_ops, ref_ops, similarity)
    score = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            g = gain(cand_ops[i - 1], ref_ops[j - 1])
            best = max(score[i - 1, j], score[i, j - 1])
            if g is not None:
                best = max(best, score[i - 1, j - 1] + g)
            score[i, j] = best
    matches = []
    i, j = n, m
    while i > 0 and j > 0:
        s = similarity(cand_ops[i - 1], ref_ops[j - 1])
        if s is not None and np.isclose(score[i, j], score[i - 1, j - 1] + gain(cand_ops[i - 1], ref_ops[j - 1])):
            matches.append((cand_ops[i - 1].index, ref_ops[j - 1].index, 2.0 - s))
            i, j = i - 1, j - 1
        elif score[i - 1, j] >= score[i, j - 1]:
            i -= 1
        else:
            j -= 1
    return matches[::-1]


def _match_gap_greedy(cand_ops: list[OpNode], ref_ops: list[OpNode], similarity) -> list[tuple[int, int, float]]:
    matches, j = [], 0
    for c in cand_ops:
        for k in range(j, min(len(ref_ops), j + NEIGHBOURHOOD)):
            s = similarity(c, ref_ops[k])
            if s is not None:
                matches.append((c.index, ref_ops[k].index, 2.0 - s))
                j = k + 1
                break
    return matches


def _pair_op_tensors(both: _TracePair, alignment: Alignment, input_layout: InputLayout | None) -> None:
    """Outputs of paired ops pair by position, a floating tensor only with a floating one (a float mask is not
    the boolean one another library casts); leaf inputs pair by position among same-sized inputs."""
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    for pair in alignment.pairs:
        cand_op, ref_op = candidate.ops[pair.candidate], reference.ops[pair.reference]
        for c_tid, r_tid in zip(cand_op.outputs, ref_op.outputs):
            c_info, r_info = candidate.tensors[c_tid], reference.tensors[r_tid]
            if is_floating(c_info.dtype) != is_floating(r_info.dtype):
                continue
            c_shape, r_shape = c_info.shape, r_info.shape
            if c_info.size == r_info.size or broadcasts(r_shape, c_shape):
                alignment.tensors.setdefault(
                    c_tid, TensorPair(c_tid, r_tid, None, pair.confidence, "op", broadcast=broadcasts(r_shape, c_shape))
                )
        for (ci, c_tid), (ri, r_tid) in _paired_leaf_inputs(candidate, reference, cand_op, ref_op):
            c_info, r_info = candidate.tensors[c_tid], reference.tensors[r_tid]
            if c_info.size != r_info.size or c_tid in alignment.tensors:
                continue
            transform = leaf_transform(candidate, reference, cand_op, ref_op, ci, ri, input_layout)
            alignment.tensors[c_tid] = TensorPair(c_tid, r_tid, transform, pair.confidence, "input")


def _paired_leaf_inputs(
    candidate: Trace, reference: Trace, cand_op: OpNode, ref_op: OpNode
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The two ops' leaf inputs, ((position, tid) on the candidate, on the reference), paired: by argument
    position where both run one op with as many arguments (an input made by an op on one side, a leaf on the
    other, as a DTensor's conversion makes it, keeps the weights after it in place); else in order."""

    def is_leaf(trace: Trace, tid: int) -> bool:
        return trace.tensors[tid].producer is None

    if cand_op.op == ref_op.op and len(cand_op.inputs) == len(ref_op.inputs):
        return [
            ((i, c_tid), (i, r_tid))
            for i, (c_tid, r_tid) in enumerate(zip(cand_op.inputs, ref_op.inputs))
            if is_leaf(candidate, c_tid) and is_leaf(reference, r_tid)
        ]
    cand_leaves = [(i, t) for i, t in enumerate(cand_op.inputs) if is_leaf(candidate, t)]
    ref_leaves = [(i, t) for i, t in enumerate(ref_op.inputs) if is_leaf(reference, t)]
    return list(zip(cand_leaves, ref_leaves))


def leaf_transform(
    candidate: Trace,
    reference: Trace,
    cand_op: OpNode,
    ref_op: OpNode,
    ci: int,
    ri: int,
    input_layout: InputLayout | None,
) -> Permutation:
    """The layout change from the reference leaf to the candidate leaf, decided by the op's
    semantics in each framework (never by shape: a square weight looks the same either way)."""
    if input_layout is None:
        return None
    to_shared_cand = input_layout(candidate.framework, cand_op.op, ci)
    to_shared_ref = input_layout(reference.framework, ref_op.op, ri)
    if to_shared_cand == to_shared_ref:
        return None
    # ref -> shared layout -> candidate layout
    ref_perm = to_shared_ref or tuple(range(len(reference.tensors[ref_op.inputs[ri]].shape)))
    cand_perm = to_shared_cand or tuple(range(len(ref_perm)))
    inverse_cand = tuple(int(i) for i in np.argsort(cand_perm))
    return tuple(ref_perm[i] for i in inverse_cand)


def _form_blocks(both: _TracePair, alignment: Alignment) -> None:
    """Group unpaired ops into blocks between paired ones and pair the tensors they hand on.
    A block whose floating hand-ons find no partner (an attention kernel's internals, say) is
    merged with the next run of unpaired ops when that run reads them, until they do; one read by a
    later run only (k/v projections with more heads than the reference's, read where the reference
    repeats its heads) is merged with that run when together they hand on tensors that pair."""
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    paired_ref_of = {p.candidate: p.reference for p in alignment.pairs}
    paired_refs = set(paired_ref_of.values())
    runs = consecutive_runs([op.index for op in candidate.ops if op.index not in paired_ref_of])
    run_at = {index: position for position, run in enumerate(runs) for index in run}
    unpaired_ref = [op.index for op in reference.ops if op.index not in paired_refs]
    paired_cands = sorted(paired_ref_of)
    blocks: list[Block] = []
    waiting: list[tuple[Block, set[int]]] = []  # unmatched blocks, with the later runs that read their hand-ons
    pending: list[int] = []
    for position, run in enumerate(runs):
        pending += run
        block, unpartnered = _block_for(both, alignment, pending, paired_cands, paired_ref_of, unpaired_ref)
        for earlier in [w for w in waiting if position in w[1]]:
            claimed = {r for b in blocks for r in b.reference}
            merged, _ = _block_for(
                both,
                alignment,
                earlier[0].candidate + pending,
                paired_cands,
                paired_ref_of,
                [r for r in unpaired_ref if r not in claimed],
            )
            if merged.matched:
                waiting.remove(earlier)
                block = merged
                break
        reading = {
            run_at[reader]
            for tid in unpartnered
            for reader in both.readers["candidate"].get(tid, [])
            if reader in run_at
        }
        if block.matched or position + 1 not in reading:
            later = {r for r in reading if r > position}
            if block.matched or not later:
                blocks.append(block)
            else:
                waiting.append((block, later))
            pending = []
    blocks += [block for block, _ in waiting]
    blocks = [part for block in blocks for part in _narrowed(both, alignment, block)]
    blocks.sort(key=lambda block: block.candidate[0])
    claimed = {r for b in blocks for r in b.reference}
    leftover = [r for r in unpaired_ref if r not in claimed]
    if leftover:
        blocks.append(Block([], leftover, matched=False))
    alignment.blocks = blocks


def _narrowed(both: _TracePair, alignment: Alignment, block: Block) -> list[Block]:
    """A matched block split into sub-blocks where its first ops hand the rest only tensors that pair
    with the reference block's (by value, or as the same attention mask): the mask made before a
    fused attention, a router before its experts. Each part is judged on its own."""
    if not block.matched:
        return [block]
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    readers = both.readers["candidate"]
    options = [t for r in block.reference for t in reference.ops[r].outputs]
    found: dict[int, int | None] = {}  # candidate tid -> its partner among `options`, once looked for

    def partner_of(c_tid: int) -> int | None:
        if c_tid in alignment.tensors:
            return alignment.tensors[c_tid].reference
        if c_tid in both.parts:  # a process's own part of a value pairs with no whole tensor
            return None
        if c_tid not in found:
            partner = _partner_by_value(both, c_tid, options) or _partner_by_mask(both, c_tid, options)
            # Of reference tensors holding the same values (a norm's output before and after a weight of
            # ones), the last: the ops between them belong to the first part.
            found[c_tid] = (
                partner
                if partner is None
                else max(
                    (
                        r
                        for r in options
                        if value_distance(reference.tensors[r], reference.tensors[partner]) == 0
                        and reference.tensors[r].shape == reference.tensors[partner].shape
                    ),
                    default=partner,
                )
            )
        return found[c_tid]

    for end in range(1, len(block.candidate)):
        first = block.candidate[:end]
        partners: dict[int, int] = {}
        for c_tid in handed_on(candidate, first, readers):
            partner = partner_of(c_tid)
            if partner is None and (is_floating(candidate.tensors[c_tid].dtype) or c_tid in both.parts):
                break
            if partner is not None:
                partners[c_tid] = partner
        else:
            made = [
                reference.tensors[r].producer
                for r in partners.values()
                if reference.tensors[r].producer in block.reference
            ]
            if not made or max(made) >= block.reference[-1]:
                continue
            for c_tid, partner in partners.items():
                if c_tid not in alignment.tensors:
                    alignment.tensors[c_tid] = _block_pair(reference, candidate, c_tid, partner)
            split = max(made)
            head = Block(first, [r for r in block.reference if r <= split], True)
            rest = Block(block.candidate[end:], [r for r in block.reference if r > split], True)
            return [head, *_narrowed(both, alignment, rest)]
    return [block]


def consecutive_runs(indices: list[int]) -> list[list[int]]:
    """Maximal runs of consecutive indices, in order."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def _block_for(
    both: _TracePair,
    alignment: Alignment,
    cand_ops: list[int],
    paired_cands: list[int],
    paired_ref_of: dict[int, int],
    unpaired_ref: list[int],
) -> tuple[Block, set[int]]:
    """The block of `cand_ops`, and its floating hand-ons that found no partner."""
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    first = _bisect.bisect_left(paired_cands, cand_ops[0])
    last = _bisect.bisect_right(paired_cands, cand_ops[-1])
    ref_low = paired_ref_of[paired_cands[first - 1]] if first > 0 else -1
    ref_high = paired_ref_of[paired_cands[last]] if last < len(paired_cands) else len(reference.ops)
    ref_ops = _between(unpaired_ref, min(ref_low, ref_high), max(ref_low, ref_high))
    # Values may match a tensor made inside the reference block, or one that the block's
    # inputs are paired with (an extra copy or cast on the candidate side).
    options = [t for r in ref_ops for t in reference.ops[r].outputs]
    options += [
        alignment.tensors[t].reference for i in cand_ops for t in candidate.ops[i].inputs if t in alignment.tensors
    ]
    unpartnered: set[int] = set()
    unpaired = set(unpaired_ref)
    for c_tid in handed_on(candidate, cand_ops, both.readers["candidate"]):
        if c_tid in both.parts:
            unpartnered.add(c_tid)
            continue
        floating = is_floating(candidate.tensors[c_tid].dtype)
        found = (
            lambda: _partner_by_consumer(both, alignment, c_tid, paired_ref_of),
            lambda: both.output_partner.get(c_tid),
            lambda: _partner_by_value(both, c_tid, options),
            lambda: _partner_by_mask(both, c_tid, options),
        )
        partner = next(
            (
                r
                for r in (find() for find in found)
                if r is not None and is_floating(reference.tensors[r].dtype) == floating
            ),
            None,
        )  # a floating tensor's partner is floating (a float mask is not the boolean one another library casts)
        producer = reference.tensors[partner].producer if partner is not None else None
        if producer in unpaired and producer not in ref_ops:
            # The two sides order the block's ops differently (paddle's MLP computes `up` before the
            # activation of `gate`, Hugging Face's after): the partner's unpaired producer belongs here.
            ref_ops = sorted({*ref_ops, producer})
        if partner is None:
            # Integer and boolean hand-ons (indices, masks, shapes) are structure, and so is
            # a scalar the reference passes as a Python number: a block is matched when the
            # values it passes on are.
            if floating and not _constant_argument(both, c_tid, paired_ref_of):
                unpartnered.add(c_tid)
        elif c_tid not in alignment.tensors:
            alignment.tensors[c_tid] = _block_pair(reference, candidate, c_tid, partner)
    return Block(list(cand_ops), ref_ops, not unpartnered), unpartnered


def _block_pair(reference: Trace, candidate: Trace, c_tid: int, r_tid: int) -> TensorPair:
    """The pair of a tensor a block hands on with its partner, in the layout their values say."""
    transform, distance = layout_of(reference, candidate, c_tid, r_tid)
    expanded = broadcasts(reference.tensors[r_tid].shape, candidate.tensors[c_tid].shape)
    return TensorPair(c_tid, r_tid, transform, round(1.0 - distance / 2, 3), "block", expanded)


COMMUTATIVE_OPS = frozenset({"add", "mul", "maximum", "minimum"})


def _partner_by_consumer(
    both: _TracePair, alignment: Alignment, c_tid: int, paired_ref_of: dict[int, int]
) -> int | None:
    """The reference tensor in the same argument position of a paired op that reads `c_tid` (any
    position of a commutative op: `x + attn` against `attn + x`, the closest in values), not one
    that another argument of that op is paired with already, nor a copy of one (Hugging Face's
    `hidden_states.to(torch.float32)` of a float32 residual holds the residual's values)."""
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    info = candidate.tensors[c_tid]
    for reader in both.readers["candidate"].get(c_tid, []):
        if reader not in paired_ref_of:
            continue
        cand_inputs, ref_inputs = candidate.ops[reader].inputs, reference.ops[paired_ref_of[reader]].inputs
        taken = {alignment.tensors[t].reference for t in cand_inputs if t != c_tid and t in alignment.tensors}
        copies = {(reference.tensors[t].shape, tuple(reference.tensors[t].fingerprint)) for t in taken}
        taken |= {
            t for t in ref_inputs if (reference.tensors[t].shape, tuple(reference.tensors[t].fingerprint)) in copies
        }
        for position, tid in enumerate(cand_inputs):
            if tid != c_tid:
                continue
            others = (
                [p for p in range(len(ref_inputs)) if p != position]
                if candidate.ops[reader].op in COMMUTATIVE_OPS
                else []
            )
            fitting = [
                reference.tensors[ref_inputs[p]]
                for p in [position, *others]
                if p < len(ref_inputs) and ref_inputs[p] not in taken
            ]
            fitting = [
                partner for partner in fitting if partner.size == info.size or broadcasts(partner.shape, info.shape)
            ]
            if fitting:  # the argument's own position wins a tie
                return min(fitting, key=lambda partner: value_distance(info, partner)).tid
    return None


def _constant_argument(both: _TracePair, c_tid: int, paired_ref_of: dict[int, int]) -> bool:
    """Every reader of `c_tid` is paired with a reference op that takes no tensor in its
    place (`paddle.arange` reads three `full` scalars, `torch.arange(0, n)` none)."""
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    readers = both.readers["candidate"].get(c_tid, [])
    return bool(readers) and all(
        reader in paired_ref_of
        and candidate.ops[reader].inputs.index(c_tid) >= len(reference.ops[paired_ref_of[reader]].inputs)
        for reader in readers
    )


def _partner_by_value(both: _TracePair, c_tid: int, options: list[int]) -> int | None:
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    info = candidate.tensors[c_tid]
    fits = [r for r in options if reference.tensors[r].size == info.size and reference.tensors[r].dtype == info.dtype]
    scored = [(layout_of(reference, candidate, c_tid, r)[1], r) for r in fits]
    best = min(scored, default=None)
    return best[1] if best is not None and best[0] <= VALUE_MATCH else None


def _partner_by_mask(both: _TracePair, c_tid: int, options: list[int]) -> int | None:
    """The reference's attention mask that a candidate mask stands for, made in another way (-1e9
    against -inf) or wrongly (blocking the keys the other keeps): the only reference mask of its size
    among `options`, or of several, the one blocking the most keys alike (their values at hand)."""
    reference, candidate = both.traces["reference"], both.traces["candidate"]
    info = candidate.tensors[c_tid]
    if not (is_floating(info.dtype) and _may_be_mask(info)):
        return None
    masks = [r for r in options if reference.tensors[r].size == info.size and _may_be_mask(reference.tensors[r])]
    if len(masks) <= 1 or not (candidate.has_value(c_tid) and all(map(reference.has_value, masks))):
        return masks[0] if len(masks) == 1 else None
    mask = blocked(candidate.value(c_tid))
    if mask is None:
        return None
    best: tuple[int, int] | None = None  # (keys blocked alike, reference tid)
    for r_tid in masks:
        other = blocked(reference.value(r_tid))
        if other is not None:
            alike = int(np.count_nonzero(other.reshape(-1) == mask.reshape(-1)))
            best = max(best or (alike, r_tid), (alike, r_tid))
    return best[1] if best is not None else None


def _may_be_mask(info: TensorInfo) -> bool:
    """Blocking values among its own (its stats count -inf apart) and nothing above 0 but rounding."""
    return (info.stats.inf > 0 or info.stats.min <= BLOCKING) and info.stats.max <= 1e-6 * max(info.stats.absmax, 1.0)


def settle_layouts(reference: Trace, candidate: Trace, alignment: Alignment) -> None:
    """Decide the layout of the tensors paired inside blocks whose reference values were not at
    hand when the traces were aligned (a run with a value budget), now that they are."""
    for c_tid, pair in alignment.tensors.items():
        if pair.how == "block" and pair.transform is None and reference.has_value(pair.reference):
            transform, distance = layout_of(reference, candidate, c_tid, pair.reference)
            if transform is not None:
                alignment.tensors[c_tid] = replace(pair, transform=transform, confidence=round(1.0 - distance / 2, 3))


def layout_of(reference: Trace, candidate: Trace, c_tid: int, r_tid: int) -> tuple[Permutation, float]:
    """How the reference tensor's data is laid out in the candidate tensor (same data in
    another order: `k.transpose(-1, -2)` on one side, `matmul(..., transpose_y=True)` on
    the other), and the value distance in that layout. Decided on the reference's values."""
    c_info, r_info = candidate.tensors[c_tid], reference.tensors[r_tid]
    plain = value_distance(c_info, r_info)
    rank = len(r_info.shape)
    # Equal shapes can still hide a transpose (a square (seq, head_dim) block of k against k^T).
    if (
        (c_info.shape == r_info.shape and plain <= SAME_LAYOUT)
        or rank > MAX_PERMUTED_DIMS
        or not reference.has_value(r_tid)
    ):
        return None, plain
    identity = tuple(range(rank))
    permutations = [
        p
        for p in itertools.permutations(range(rank))
        if p != identity and tuple(r_info.shape[i] for i in p) == c_info.shape
    ]
    best: tuple[float, Permutation] = (plain, None)
    values = reference.value(r_tid)
    scale = max(c_info.stats.absmax, r_info.stats.absmax, 1e-30)
    for permutation in permutations:
        distance = fingerprint_distance(fingerprint(np.transpose(values, permutation)), c_info.fingerprint, scale)
        best = min(best, (distance, permutation), key=lambda item: item[0])
    return best[1], best[0]


def handed_on(trace: Trace, run: list[int], readers: dict[int, list[int]]) -> list[int]:
    """Tensors produced inside `run` that ops after it (or the model outputs) read."""
    produced = {t for i in run for t in trace.ops[i].outputs}
    inside = set(run)
    outputs = set(trace.outputs.values())
    return sorted(t for t in produced if t in outputs or any(r not in inside for r in readers.get(t, [])))
