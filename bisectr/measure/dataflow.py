"""Aligning two traces by the data that flows through them, for ports whose module tree, names, fusions and op
order are their own.

Where `align` pairs ops by what they are and where they run, this pairs tensors by what they hold, and the ops
between paired tensors become the blocks an op's evidence is judged on:

1. **Leaves by content.** A candidate parameter or buffer pairs with the reference leaf holding the same values:
   as stored, transposed, or rounded to the candidate's dtype (a checkpoint saved in bfloat16).
2. **Checkpoints.** In candidate order, the output of each op that computes (not a layout op) is paired with a
   reference tensor by, in turn:
   - **values**: a tensor of the same size and statistics whose values agree in some layout, produced after
     the partners of what the op read (where a port agrees with its reference, whatever its op order);
   - **weights**: an op reading a paired weight (a projection, an embedding) pairs with what the reference
     computes from that weight's partner, once it has read the partners of every leaf the op reads (where the
     values part, after a mistake, the weights still say which op is which);
   - **data flow**: an op of the same kind as a reference op reading the partners of its inputs (a residual add,
     a softmax of paired scores).
   The model outputs pair as the run pairs them.
3. **Blocks.** Each checkpoint's cone, the ops that compute it from earlier checkpoints and leaves, is paired
   with the cone of its partner; cones that share ops merge. A cone of one op on each side, of the same kind, is
   an op pair; any other is an N:M block, judged as one op.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np

from ..capture.trace import TensorInfo, Trace, is_floating
from ..leafref import leaf_kind
from ..adapters import input_layout
from .align import (
    COMMUTATIVE_OPS,
    LAYOUT_OPS,
    Alignment,
    Block,
    OpPair,
    PairEvidence,
    TensorPair,
    broadcasts,
    layout_of,
    leaf_transform,
)
from .analysis import axis_order, is_constant, same_values
from .metrics import BLOCKING, rounded_to
from .numerics import noise_floor

# The largest value distance (relative to their magnitude) at which two tensors pair on values alone: rounding
# grown over a deep float32 model stays well below it; a coarser dtype widens it (`_value_tolerance`).
SAME_VALUES = 1e-3
# Ops that only move or select data: data flow looks through them, and the outputs of those that lay data out anew
# are never checkpoints (a cast or a dropout can compute: a downscaling dropout, a cast to a narrower dtype).
MOVES_DATA = LAYOUT_OPS | {"getitem", "cast", "dropout", "split", "chunk", "unbind"}
LAYS_OUT = MOVES_DATA - {"cast", "dropout"}
# The largest value distance at which what the candidate computes from the partners of what the reference computes
# from pairs by that frontier: a norm's epsilon or a constant a little off, not a tensor scaled by another factor.
FRONTIER_NEAR = 0.1
MAX_STEPS = 6  # ops followed from a weight's first reader to what the reference computes from it
MAX_FRONTIER_SWEEPS = 4  # passes of pairing by frontier, each followed by a sweep over the ops
# Ops that consume a weight whole (a projection, a lookup, a norm): what one computes from paired weights is what
# the reference computes from their partners. A weight an elementwise op reads (a norm's scale written out, as
# y + y * w where the reference computes y * (1 + w)) says less: its products pair by values only.
READS_WEIGHTS = frozenset(
    {
        "linear",
        "matmul",
        "bmm",
        "addmm",
        "baddbmm",
        "einsum",
        "grouped_mm",
        "conv1d",
        "conv2d",
        "conv3d",
        "embedding",
        "layer_norm",
        "rms_norm",
        "group_norm",
        "batch_norm",
        "instance_norm",
    }
)


# Candidate ops called again on given values for the tensors they read (`LiveRun.replay`): tid -> values computed.
Replay = Callable[[list[int], dict[int, np.ndarray]], dict[int, np.ndarray]]


def align_by_dataflow(
    reference: Trace, candidate: Trace, output_pairs: list[tuple[int, int]], replay: Replay | None = None
) -> Alignment:
    """The alignment of `candidate` to `reference` by data flow (see the module docstring); `output_pairs`:
    (candidate tid, reference tid) of the outputs the run compares; `replay`: the candidate's ops run again on
    given values (a live run), without which tensors are not paired by frontier."""
    flow = _Flow(reference, candidate, replay)
    flow.pair_inputs()
    flow.pair_leaves()
    flow.pair_outputs(output_pairs)
    flow.sweep()
    return flow.alignment()


class _Flow:
    def __init__(self, reference: Trace, candidate: Trace, replay: Replay | None = None):
        self.reference, self.candidate = reference, candidate
        self.replay = replay
        self.readers = {"reference": reference.consumers(), "candidate": candidate.consumers()}
        self.pairs: dict[int, TensorPair] = {}  # candidate tid -> its partner
        self.how: dict[int, str] = {}  # candidate tid -> what paired it: "input", "leaf", "value", "weight", ...
        self.claimed: set[tuple] = set()  # (reference tensor, part) paired with a candidate op's output
        # Candidate leaves fusing several reference leaves (q, k and v in one): the axis of their rows, and the
        # (reference leaf, its row) each row holds.
        self.gathered: dict[int, tuple[int, list[tuple[int, int]]]] = {}
        self._rows: dict[bytes, tuple[int, int, int]] | None = None
        self._activation_ops: dict[str, set[int]] = {}
        self._tables: list[TensorInfo] | None = None
        self.by_size: dict[int, list[TensorInfo]] = defaultdict(list)  # reference op outputs by size
        for info in reference.tensors.values():
            if info.producer is not None and is_floating(info.dtype):
                self.by_size[info.size].append(info)

    # -- seeds ---------------------------------------------------------------------------------------------------
    def pair_inputs(self) -> None:
        """Model inputs of the same name, else of the same values, else holding the same values in another order of
        their axes (a decoding step's cache, kept (batch, position, head, dim) on one side and (batch, head,
        position, dim) on the other)."""
        reference_inputs = {t.leaf: t for t in self.reference.tensors.values() if leaf_kind(t.leaf) == "input"}
        for info in self.candidate.tensors.values():
            if leaf_kind(info.leaf) != "input":
                continue
            partner = reference_inputs.get(info.leaf) or next(
                (r for r in reference_inputs.values() if r.size == info.size and r.fingerprint == info.fingerprint),
                None,
            )
            if partner is not None and partner.size == info.size:
                self._pair(info.tid, partner.tid, None, "input")
            elif is_floating(info.dtype) and self.candidate.has_value(info.tid):
                values = self.candidate.value(info.tid)
                tolerance = _value_tolerance(info.dtype, info.dtype)
                for reference in reference_inputs.values():
                    taken = any(pair.reference == reference.tid for pair in self.pairs.values())
                    if taken or reference.size != info.size or not self.reference.has_value(reference.tid):
                        continue
                    order = axis_order(self.reference.value(reference.tid), values, tolerance)
                    if order is not None:
                        self._pair(info.tid, reference.tid, order, "input")
                        break

    def pair_leaves(self) -> None:
        """Each floating candidate parameter or buffer with the reference leaf holding its values (as stored,
        transposed, or rounded to the candidate's dtype), where exactly one does; else with the one holding them
        as a slice of its rows or columns (a port's q projection from a fused q/k/v one)."""
        index: dict[tuple, list[tuple[int, tuple[int, ...] | None]]] = defaultdict(list)
        references = [
            info
            for info in self.reference.tensors.values()
            if info.producer is None and _is_weight(info) and self.reference.has_value(info.tid)
        ]
        for info in references:
            for key, transform in _content_keys(self.reference.value(info.tid), info.dtype):
                index[key].append((info.tid, transform))
        for info in self.candidate.tensors.values():
            if info.producer is not None or not _is_weight(info) or not self.candidate.has_value(info.tid):
                continue
            values = self.candidate.value(info.tid)
            if values.size > 1 and is_constant(values):
                continue  # a constant tells nothing by its values (a norm's weight at one)
            found = {hit for hit in index.get(_key(values), []) if self.reference.tensors[hit[0]].size == info.size}
            if len({tid for tid, _ in found}) == 1:
                ref_tid, transform = sorted(found, key=lambda hit: hit[1] is not None)[0]
                self._pair(info.tid, ref_tid, self._read_as(info.tid, ref_tid, transform), "leaf")
                continue
            slices = [
                (ref.tid, found)
                for ref in references
                if ref.size > info.size and (found := _slice_of(values, self.reference.value(ref.tid))) is not None
            ]
            if len(slices) == 1:
                ref_tid, (part, transform) = slices[0]
                self._pair(info.tid, ref_tid, transform, "leaf", part)
                continue
            gathered = _gathered(values, self._rows_index(references))
            if gathered is None:
                continue
            axis, held = gathered
            sources = {(leaf, along) for leaf, along, _ in held}
            if len(sources) == 1 and values.ndim == 2:  # rows of one leaf, not all of them (per head)
                ((leaf, along),) = sources
                order = tuple(row for _, _, row in held)
                if len(set(order)) < len(order):
                    continue  # rows repeated (kv heads widened by a converter): the ops reading it say how it lies
                if len(order) == self.reference.tensors[leaf].shape[along]:
                    # all its rows in another order (gates swapped, a rotary's layout): paired as the ops read it,
                    # the comparison says how they lie
                    self._pair(info.tid, leaf, self._read_as(info.tid, leaf, None), "leaf")
                    continue
                part = (along, min(order), max(order) + 1)
                self._pair(info.tid, leaf, (1, 0) if axis != along else None, "leaf", part, order)
            elif len(sources) > 1:
                self.gathered[info.tid] = (axis, [(leaf, row) for leaf, _, row in held])

    def _read_as(self, cand_tid: int, ref_tid: int, found: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """The layout a leaf pair takes: the one its values were found in, but for a square matrix the one that the
        first ops reading the two leaves imply (torch's Linear keeps (out, in), paddle's (in, out)), where they are
        one kind of op: a converter that skipped one square transpose holds the reference's values as stored."""
        shape = self.candidate.tensors[cand_tid].shape
        if len(shape) != 2 or shape[0] != shape[1]:
            return found
        readers = {
            role: next(iter(self.readers[role].get(tid, [])), None)
            for role, tid in (("candidate", cand_tid), ("reference", ref_tid))
        }
        if None in readers.values():
            return found
        cand_op, ref_op = self.candidate.ops[readers["candidate"]], self.reference.ops[readers["reference"]]
        if cand_op.op != ref_op.op:
            return found
        implied = leaf_transform(
            self.candidate,
            self.reference,
            cand_op,
            ref_op,
            cand_op.inputs.index(cand_tid),
            ref_op.inputs.index(ref_tid),
            input_layout,
        )
        return implied

    def _rows_index(self, references: list[TensorInfo]) -> dict[bytes, tuple[int, int, int]]:
        """Each row of every reference matrix along each axis (its output features, for torch's Linear: axis 0;
        paddle's: axis 1), by its bytes -> (reference leaf, axis, row); and every vector's values, element by
        element, by their bytes -> (reference leaf, 0, position)."""
        if self._rows is None:
            self._rows = {}
            for info in references:
                values = np.ascontiguousarray(self.reference.value(info.tid), dtype=np.float32)
                if values.ndim == 2:
                    for axis, oriented in ((0, values), (1, values.T)):
                        for row, data in enumerate(np.ascontiguousarray(oriented)):
                            self._rows.setdefault(data.tobytes(), (info.tid, axis, row))
                elif values.ndim == 1:
                    for position, data in enumerate(values):
                        self._rows.setdefault(b"v" + data.tobytes(), (info.tid, 0, position))
        return self._rows

    def pair_outputs(self, output_pairs: list[tuple[int, int]]) -> None:
        for cand_tid, ref_tid in output_pairs:
            cand_info, ref_info = self.candidate.tensors[cand_tid], self.reference.tensors[ref_tid]
            if cand_info.producer is not None and cand_info.size == ref_info.size:
                transform, _ = layout_of(self.reference, self.candidate, cand_tid, ref_tid)
                self._pair(cand_tid, ref_tid, transform, "output")

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def sweep(self) -> None:
        """Pair what each computing op of the candidate makes, in candidate order (see the module docstring); then,
        while that pairs more, what is computed from the same paired tensors and weights (`_by_frontier`)."""
        self._sweep_ops()
        for _ in range(MAX_FRONTIER_SWEEPS):
            if not self._pair_by_frontier():
                break
            self._sweep_ops()

    def _sweep_ops(self) -> None:
        for op in self.candidate.ops:
            if op.op in LAYS_OUT:
                continue
            for position, tid in enumerate(op.outputs):
                info = self.candidate.tensors[tid]
                if tid in self.pairs or not is_floating(info.dtype):
                    continue
                floor = self._floor(op.inputs)
                found = (
                    self._by_table(op, info)
                    or self._by_values(info, floor, op.op)
                    or self._by_weights(op, position, info)
                    or self._by_data_flow(op, position, info)
                    or self._by_sum(op, info)
                    or self._by_partial_flow(op, position, info)
                )
                if found is not None and is_floating(self.reference.tensors[found[0]].dtype):
                    self._pair(tid, *found)
                elif position == 0:
                    self._pair_split_of_fused(op, info)

    def _pair_by_frontier(self) -> bool:
        """Pair each candidate tensor computed from a set of paired tensors and weights (its frontier) that nothing
        computed from that same set reads (the last of what that set makes: a norm written out as y + y * w, not
        y * w) with the one reference tensor of its size made so from their partners (`y * (1 + w)`). Tensors made
        from no parameter (position tables, masks) are not in any frontier. Whether it paired any."""
        candidate = self._frontiers(self.candidate, set(self.pairs))
        reference = self._frontiers(self.reference, {pair.reference for pair in self.pairs.values()})
        wanted: dict[frozenset, list[int]] = defaultdict(list)
        for tid, frontier in reference.items():
            if frontier and self._last_of_its_frontier(self.reference, tid, reference):
                wanted[frontier].append(tid)
        paired = False
        for tid, frontier in candidate.items():
            info = self.candidate.tensors[tid]
            if tid in self.pairs or not frontier or not self._last_of_its_frontier(self.candidate, tid, candidate):
                continue
            if self.candidate.ops[info.producer].op in MOVES_DATA:
                continue
            partners = self._partners_of(frontier)
            if partners is None:
                continue
            fitting = [
                r
                for r in wanted.get(partners, [])
                if self.reference.tensors[r].size == info.size and (r, None) not in self.claimed
            ]
            if len(fitting) == 1 and self._computes_the_same(tid, fitting[0]):
                self._pair(tid, fitting[0], None, "frontier")
                paired = True
        return paired

    def _computes_the_same(self, tid: int, ref_tid: int) -> bool:
        """Do the candidate's ops computing `tid` from paired tensors compute `ref_tid`'s values, or values near them
        (a norm with another epsilon), when fed their partners' (so that only what computes alike pairs by frontier:
        not a q scaled early against the reference's unscaled q)?"""
        if self.replay is None or not self.reference.has_value(ref_tid):
            return False
        cone = sorted(_cone(self.candidate, self.candidate.tensors[tid].producer, set(self.pairs)))
        values = {}
        for t in {t for i in cone for t in self.candidate.ops[i].inputs}:
            pair = self.pairs.get(t)
            if pair is not None and self.candidate.tensors[t].producer is not None:
                if not self.reference.has_value(pair.reference):
                    return False
                values[t] = pair.reference_in_candidate_layout(
                    self.reference.value(pair.reference), self.candidate.tensors[t].shape
                )
        try:
            computed = self.replay(cone, values)
        except Exception:  # ops that cannot run on substituted values pair by nothing but their values
            return False
        return same_values(computed[tid], self.reference.value(ref_tid), FRONTIER_NEAR)

    def _partners_of(self, tids: frozenset) -> frozenset | None:
        """The reference tensors paired with `tids` (a fused leaf: the leaves it holds rows of); None where one has
        none."""
        partners: set[int] = set()
        for t in tids:
            if t in self.pairs:
                partners.add(self.pairs[t].reference)
            elif t in self.gathered:
                partners |= {leaf for leaf, _ in self.gathered[t][1]}
            else:
                return None
        return frozenset(partners)

    def _frontiers(self, trace: Trace, stops: set[int]) -> dict[int, frozenset]:
        """Each floating op output computed from parameters -> the tensors in `stops` and parameters it is
        computed from, back to those."""
        activations = self._activations(trace)
        found: dict[int, frozenset] = {}
        for op in trace.ops:
            if op.index not in activations:
                continue
            frontier: set[int] = set()
            for t in op.data_inputs:
                info = trace.tensors[t]
                if t in stops or (info.producer is None and leaf_kind(info.leaf) == "param"):
                    frontier.add(t)
                elif t in found:
                    frontier |= found[t]
            frozen = frozenset(frontier)
            for t in op.outputs:
                if is_floating(trace.tensors[t].dtype) and t not in stops:
                    found[t] = frozen
        return found

    def _last_of_its_frontier(self, trace: Trace, tid: int, frontiers: dict[int, frozenset]) -> bool:
        """Does nothing read `tid` to make a tensor of the same frontier (is it the last such set makes)?"""
        frontier = frontiers[tid]
        for reader in self.readers[trace.side].get(tid, []):
            if any(frontiers.get(out) == frontier for out in trace.ops[reader].outputs):
                return False
        return True

    def _floor(self, inputs: list[int]) -> int:
        """The latest reference op that made a partner of what these inputs are computed from (back to paired
        tensors: -1 where none is): what they make comes after."""
        stops = set(self.pairs)
        frontier = set()
        for tid in inputs:
            if tid in stops:
                frontier.add(tid)
            elif self.candidate.tensors[tid].producer is not None:
                cone = _cone(self.candidate, self.candidate.tensors[tid].producer, stops)
                frontier |= {t for i in cone for t in self.candidate.ops[i].inputs if t in stops}
        producers = [self.reference.tensors[self.pairs[t].reference].producer for t in frontier]
        return max((p for p in producers if p is not None), default=-1)

    def _by_values(self, info: TensorInfo, floor: int, op: str) -> tuple[int, tuple[int, ...] | None, str] | None:
        """The reference tensor made after `floor` holding `info`'s values in some layout: the closest, of
        those as close the one an op of the same kind made, then the earliest."""
        best = None
        masked = _holds_mask(info)
        for ref_info in self.by_size.get(info.size, []):
            tolerance = _value_tolerance(info.dtype, ref_info.dtype)
            if ref_info.producer <= floor or masked != _holds_mask(ref_info):
                continue
            if masked:  # a mask's blocking values would swamp any distance: compared whole, blocked alike
                if not (self.candidate.has_value(info.tid) and self.reference.has_value(ref_info.tid)):
                    continue
                if not same_values(self.candidate.value(info.tid), self.reference.value(ref_info.tid), tolerance):
                    continue
                transform, distance = None, 0.0
            else:
                if not _stats_agree(info, ref_info, tolerance):
                    continue
                transform, distance = layout_of(self.reference, self.candidate, info.tid, ref_info.tid)
                if distance > tolerance:
                    continue
            same_kind = self.reference.ops[ref_info.producer].op == op
            key = (round(distance, 3), not same_kind, ref_info.producer)
            if best is None or key < best[0]:
                best = (key, ref_info.tid, transform)
        return None if best is None else (best[1], best[2], "value")

    def _by_table(self, op, info: TensorInfo) -> tuple | None:
        """A tensor computed from no parameter (a position table, a mask) with the reference's of the same values: as
        a whole, expanded, a mask blocking the same positions (-1e9 against -inf), or a slice of it (rotary tables
        of half a head against the reference's of a whole one)."""
        if op.index in self._activations(self.candidate) or not self.candidate.has_value(info.tid):
            return None
        values = self.candidate.value(info.tid)
        # A constant (the zeros of a one-position step's angles or mask) tells nothing by its values: only a
        # reference op of its own kind making them pairs with it.
        constant = is_constant(values)
        for ref_info in self.by_size_tables():
            if not self.reference.has_value(ref_info.tid):
                continue
            if constant and self.reference.ops[ref_info.producer].op != op.op:
                continue
            reference = self.reference.value(ref_info.tid)
            if ref_info.size == info.size:
                if same_values(values, reference):
                    return ref_info.tid, None, "table"
                continue
            if ref_info.size < info.size:
                if broadcasts(ref_info.shape, info.shape) and same_values(
                    values, np.broadcast_to(reference, info.shape)
                ):
                    return ref_info.tid, None, "table"
                continue
            for part in _slices(ref_info.shape, info.size):
                if same_values(values, np.take(reference, range(part[1], part[2]), axis=part[0])):
                    return ref_info.tid, None, "table", part
        return None

    def by_size_tables(self) -> list[TensorInfo]:
        """The reference's floating op outputs computed from no parameter."""
        if self._tables is None:
            activations = self._activations(self.reference)
            self._tables = [
                info
                for info in self.reference.tensors.values()
                if info.producer is not None and info.producer not in activations and is_floating(info.dtype)
            ]
        return self._tables

    def _by_weights(self, op, position: int, info: TensorInfo) -> tuple[int, tuple[int, ...] | None, str] | None:
        """What the reference computes from the partners of the weights `op` reads: the chain of ops from their
        first reader on, which must read no weight but partners of those `op` and the unpaired ops feeding it read
        (a projection and its bias; a norm written out, its scale and its shift, against one `layer_norm`)."""
        if position != 0 or op.op not in READS_WEIGHTS:
            return None
        own = self._weights_read(self.candidate, {op.index})
        read = self._weights_read(self.candidate, _cone(self.candidate, op.index, set(self.pairs)))
        if not own or any(t not in self.pairs for t in own):
            return None
        allowed = set().union(*(self._partners_of(frozenset({t})) or set() for t in read))
        reached = self._reference_made_from(
            {self.pairs[t].reference for t in own}, allowed, op.op, self._floor(op.inputs)
        )
        if reached is None:
            return None
        part, rows = self._part_made(own, reached)
        if (reached, part) in self.claimed:
            return None  # a port computing twice from weights the reference reads once: its values must say which
        ref_info = self.reference.tensors[reached]
        count = (len(rows) if rows is not None else part[2] - part[1]) if part is not None else None
        size = ref_info.size if part is None else ref_info.size // ref_info.shape[part[0]] * count
        if size != info.size:
            return None
        transform = layout_of(self.reference, self.candidate, info.tid, reached)[0] if part is None else None
        return reached, transform, "weight", part, rows

    def _part_made(self, weights: set[int], reached: int) -> tuple[tuple[int, int, int] | None, tuple[int, ...] | None]:
        """Where the candidate's weights are rows of the reference's (a q projection from a fused q/k/v one): the
        part of what the reference made from them that the candidate's op makes, along the axis as long as the
        weight's rows, and which of them where they are not one run (per head); (None, None) where they are whole."""
        parts = [self.pairs[t] for t in weights if self.pairs[t].part is not None]
        if not parts:
            return None, None
        pair = max(parts, key=lambda p: len(self.reference.tensors[p.reference].shape))
        axis, start, stop = pair.part
        count = self.reference.tensors[pair.reference].shape[axis]
        fitting = [k for k, n in enumerate(self.reference.tensors[reached].shape) if n == count]
        if not fitting:
            return None, None
        return (fitting[-1], start, stop), pair.rows

    def _pair_split_of_fused(self, op, info: TensorInfo) -> None:
        """Where `op` reads weights fusing several reference leaves along its output features (q, k and v in one
        projection) and one op splits what it makes along them: each part with what the reference computes from
        the leaves whose rows it holds."""
        fused = [t for t in op.inputs if t in self.gathered]
        readers = self.readers["candidate"].get(info.tid, [])
        if (
            op.op not in READS_WEIGHTS
            or not fused
            or len(readers) != 1
            or self.candidate.ops[readers[0]].op not in ("split", "chunk", "unbind")
        ):
            return
        splitter = self.candidate.ops[readers[0]]
        features = info.shape[-1]
        sizes = [self.candidate.tensors[t].shape[-1] for t in splitter.outputs]
        if sum(sizes) != features or any(
            self.candidate.tensors[t].shape[:-1] != info.shape[:-1] for t in splitter.outputs
        ):
            return
        held = {t: self._features_held(t, features) for t in fused}
        if any(h is None for h in held.values()):
            return
        start = 0
        for tid, size in zip(splitter.outputs, sizes):
            sources = {t: h[start : start + size] for t, h in held.items()}
            start += size
            leaves = {leaf for rows in sources.values() for leaf, _ in rows}
            weight_rows = next(rows for t, rows in sources.items() if self.candidate.tensors[t].shape[-1] != 1)
            if tid in self.pairs or len({leaf for leaf, _ in weight_rows}) != 1:
                continue
            reached = self._reference_made_from(leaves, leaves, op.op, self._floor(op.inputs))
            if reached is None:
                continue
            first, last = weight_rows[0][1], weight_rows[-1][1]
            if [row for _, row in weight_rows] != list(range(first, last + 1)):
                continue
            rows = self.reference.tensors[weight_rows[0][0]].shape
            count = max(rows) if len(rows) == 2 else rows[0]
            part = None
            if last - first + 1 != count:
                fitting = [k for k, n in enumerate(self.reference.tensors[reached].shape) if n == count]
                if not fitting:
                    continue
                part = (fitting[-1], first, last + 1)
            if (reached, part) not in self.claimed and is_floating(self.reference.tensors[reached].dtype):
                self._pair(tid, reached, None, "weight", part)

    def _features_held(self, tid: int, features: int) -> list[tuple[int, int]] | None:
        """(reference leaf, row) of each output feature a gathered candidate leaf holds, where its rows run along
        the output features (`features` of them)."""
        axis, rows = self.gathered[tid]
        shape = self.candidate.tensors[tid].shape
        return rows if shape[axis] == features else None

    def _weights_read(self, trace: Trace, ops: set[int]) -> set[int]:
        """The parameters and buffers (floating, more than one value) that `ops` read, as they are or through ops that
        only move data (`x @ w.T`)."""
        found = set()
        for i in ops:
            for t in trace.ops[i].inputs:
                while trace.tensors[t].producer is not None:
                    producer = trace.ops[trace.tensors[t].producer]
                    if producer.op not in LAYS_OUT or not producer.inputs:
                        break
                    t = producer.inputs[0]
                info = trace.tensors[t]
                if info.producer is None and _is_weight(info) and leaf_kind(info.leaf) in ("param", "buffer"):
                    found.add(t)
        return found

    def _reference_made_from(self, leaves: set[int], allowed: set[int], kind: str, floor: int) -> int | None:
        """The reference tensor made from `leaves`: from the op that first reads one of them (one of `kind` made
        after `floor` where there is one: a tied embedding's weight is read by the lookup and by the head), on
        through the ops reading what it made, until every leaf has been read and an op that computes made it;
        None where that chain reads a weight outside `allowed`."""
        readers = sorted({r for leaf in leaves for r in self.readers["reference"].get(leaf, [])})
        if not readers:
            return None
        fitting = [r for r in readers if self.reference.ops[r].op == kind and r > floor] or [
            r for r in readers if r > floor
        ]
        first = self.reference.ops[(fitting or readers)[0]]
        chain = [first.index]
        pending, tid = set(leaves) - set(first.inputs), first.outputs[0]
        for _ in range(MAX_STEPS):
            if not pending and self.reference.ops[self.reference.tensors[tid].producer].op not in MOVES_DATA:
                return tid if self._weights_read(self.reference, set(chain)) <= allowed else None
            after = self.readers["reference"].get(tid, [])
            following = next((r for r in after if pending & set(self.reference.ops[r].inputs)), None)
            if following is None and len(after) == 1:
                following = after[0]
            if following is None or not self.reference.ops[following].outputs:
                return None
            chain.append(following)
            pending -= set(self.reference.ops[following].inputs)
            tid = self.reference.ops[following].outputs[0]
        return None

    def _by_data_flow(self, op, position: int, info: TensorInfo) -> tuple[int, tuple[int, ...] | None, str] | None:
        """The output of the reference op of the same kind reading the partners of every floating input of `op`
        (through ops that only move data, on either side)."""
        floating = [t for t in op.inputs if is_floating(self.candidate.tensors[t].dtype)]
        sources = self._sources(self.candidate, floating)
        if not sources or any(t not in self.pairs for t in sources):
            return None
        reach = [self._reference_readers(self.pairs[t].reference) for t in sources]
        common = set.intersection(*reach) if reach else set()
        partners = {self.pairs[t].reference for t in sources}
        same_kind = [
            r
            for r in sorted(common)
            if self.reference.ops[r].op == op.op
            and position < len(self.reference.ops[r].outputs)
            and self.reference.tensors[self.reference.ops[r].outputs[position]].size == info.size
        ]
        fitting = [r for r in same_kind if self._reads_only(r, partners)]
        if op.op not in COMMUTATIVE_OPS and len(sources) > 1:
            fitting = [r for r in fitting if self._in_order(r, sources)]
        if not fitting:
            fitting = self._reading_more(op, same_kind, sources)
        if not fitting:
            return None
        ref_tid = self.reference.ops[fitting[0]].outputs[position]
        transform = (
            self._carried_transform(sources)
            if self.candidate.tensors[info.tid].shape != (self.reference.tensors[ref_tid].shape)
            else None
        )
        return ref_tid, transform, "flow"

    def _by_sum(self, op, info: TensorInfo) -> tuple[int, tuple[int, ...] | None, str] | None:
        """The reference sum of the partners of what `op`'s sum adds (a residual stream added up in another
        order: x + attn + mlp against mlp + attn + x)."""
        if op.op != "add":
            return None
        summands = self._summands(self.candidate, op.outputs[0], set(self.pairs))
        if summands is None or len(summands) < 2:
            return None
        partners = [self.pairs[t].reference for t in summands]
        wanted = sorted(partners)
        atoms = {pair.reference for pair in self.pairs.values()}
        for ref_tid in self._sums_reading(partners):
            skipped: list[int] = []
            found = self._summands(self.reference, ref_tid, atoms, unpaired=2, skipped=skipped)
            if found is None or sorted(found) != wanted or self.reference.tensors[ref_tid].size != info.size:
                continue
            later = {
                self.candidate.ops[r].op
                for r in self._candidate_readers(info.tid)
                if len([t for t in self.candidate.ops[r].inputs if is_floating(self.candidate.tensors[t].dtype)]) == 1
            }
            if any(self.reference.ops[i].op in later for i in skipped):
                continue  # the candidate scales the sum where the reference scales a summand: another order
            return ref_tid, None, "sum"
        return None

    def _candidate_readers(self, tid: int) -> set[int]:
        """Candidate ops reading `tid`, or what ops that only move data made of it."""
        found, pending = set(), [tid]
        while pending:
            for reader in self.readers["candidate"].get(pending.pop(), []):
                found.add(reader)
                if self.candidate.ops[reader].op in MOVES_DATA:
                    pending.extend(self.candidate.ops[reader].outputs)
        return found

    def _sums_reading(self, tids: list[int]) -> list[int]:
        """Outputs of the reference's additions that add up any of `tids` (through further additions and ops that
        only move data), in op order."""
        found, pending, seen = set(), [(t, 2) for t in tids], set(tids)
        while pending:
            tid, unpaired = pending.pop()
            for reader in self.readers["reference"].get(tid, []):
                op = self.reference.ops[reader]
                through = op.op == "add" or op.op in MOVES_DATA
                if through or unpaired > 0:
                    if op.op == "add":
                        found.add(op.outputs[0])
                    for out in op.outputs:
                        if out not in seen:
                            seen.add(out)
                            pending.append((out, unpaired if through else unpaired - 1))
        return sorted(found)

    def _summands(
        self, trace: Trace, tid: int, atoms: set[int], unpaired: int = 0, skipped: list[int] | None = None
    ) -> list[int] | None:
        """What a chain of additions adds up, down to tensors in `atoms` (through ops that only move data, and up
        to `unpaired` ops of one floating operand that are not, listed in `skipped`: the reference scaling the
        embedding the candidate adds as it is); None where it adds anything else."""
        if tid in atoms:
            return [tid]
        producer = trace.tensors[tid].producer
        op = trace.ops[producer] if producer is not None else None
        if op is None:
            return None
        if op.op == "add" and len(op.inputs) == 2:
            parts = [self._summands(trace, t, atoms, unpaired, skipped) for t in op.inputs]
            return None if None in parts else parts[0] + parts[1]
        if op.op in MOVES_DATA and op.inputs:
            return self._summands(trace, op.inputs[0], atoms, unpaired, skipped)
        activations = self._activations(trace)
        operands = [t for t in op.inputs if trace.tensors[t].producer in activations]
        if unpaired > 0 and len(operands) == 1:
            if skipped is not None:
                skipped.append(op.index)
            return self._summands(trace, operands[0], atoms, unpaired - 1, skipped)
        return None

    def _activations(self, trace: Trace) -> set[int]:
        """`Trace.activations` of `trace`, computed once."""
        if trace.side not in self._activation_ops:
            self._activation_ops[trace.side] = trace.activations()
        return self._activation_ops[trace.side]

    def _by_partial_flow(self, op, position: int, info: TensorInfo) -> tuple | None:
        """Where an addition or product reads one paired tensor and one the search has no partner for (a residual
        stream added to a branch that differs): the one reference op of its kind reading the partner whose other
        operand pairs with nothing either."""
        if op.op not in COMMUTATIVE_OPS or position != 0:
            return None
        floating = [t for t in op.inputs if is_floating(self.candidate.tensors[t].dtype)]
        sources = self._sources(self.candidate, floating)
        paired = [t for t in sources if t in self.pairs]
        if not paired or len(paired) == len(sources) or len(sources) != 2:
            return None
        partners = {self.pairs[t].reference for t in paired}
        taken = {pair.reference for pair in self.pairs.values()}
        fitting = []
        for r in sorted(set.intersection(*(self._reference_readers(p) for p in partners))):
            ref_op = self.reference.ops[r]
            others = set(self._sources(self.reference, ref_op.inputs)) - partners
            if (
                ref_op.op == op.op
                and ref_op.outputs
                and self.reference.tensors[ref_op.outputs[0]].size == info.size
                and others
                and not others & taken
            ):
                fitting.append(ref_op.outputs[0])
        return (fitting[0], None, "flow") if len(fitting) == 1 else None

    def _reading_more(self, op, same_kind: list[int], sources: list[int]) -> list[int]:
        """The one reference op of `same_kind` reading the partners of `sources` where `op` reads them, and besides
        them only what ops made that the candidate has no partner for (the reference dividing a pooled sum by the
        count of kept positions, a port by the full length): the op itself is where they differ."""
        taken = {pair.reference for pair in self.pairs.values()}
        fitting = []
        for r in same_kind:
            ref_op = self.reference.ops[r]
            floating = [t for t in ref_op.inputs if is_floating(self.reference.tensors[t].dtype)]
            origins = [set(self._sources(self.reference, [t])) for t in floating]
            held = [
                next((k for k, found in enumerate(origins) if self.pairs[s].reference in found), None) for s in sources
            ]
            extra = set(self._sources(self.reference, floating)) - {self.pairs[s].reference for s in sources}
            if None in held or not extra or taken & extra:
                continue
            if any(self.reference.tensors[t].producer is None for t in extra):
                continue  # a weight the candidate reads elsewhere (paddle's bias added in an op of its own)
            if op.op not in COMMUTATIVE_OPS and held != [op.inputs.index(t) for t in self._first_readers(op, sources)]:
                continue
            fitting.append(r)
        return fitting if len(fitting) == 1 else []

    def _first_readers(self, op, sources: list[int]) -> list[int]:
        """For each of `sources`, the input of `op` it is read through."""
        return [next(t for t in op.inputs if self._sources(self.candidate, [t]) == [s]) for s in sources]

    def _reads_only(self, ref_op: int, partners: set[int]) -> bool:
        """Does reference op `ref_op` read no floating tensor but `partners` (through ops that only move data)? A
        convolution reading its bias is not the candidate's reading none (paddle adds it in an op of its own)."""
        floating = [t for t in self.reference.ops[ref_op].inputs if is_floating(self.reference.tensors[t].dtype)]
        extra = set(self._sources(self.reference, floating)) - partners
        return not any(
            self.reference.tensors[t].producer is not None
            or leaf_kind(self.reference.tensors[t].leaf) in ("param", "buffer")
            for t in extra
        )

    def _in_order(self, ref_op: int, sources: list[int]) -> bool:
        """Does the reference op read its inputs' data in the order the candidate's sources have it?"""
        order = []
        for tid in self.reference.ops[ref_op].inputs:
            origins = set(self._sources(self.reference, [tid]))
            hit = next((k for k, s in enumerate(sources) if self.pairs[s].reference in origins), None)
            if hit is not None:
                order.append(hit)
        return order == sorted(order)

    def _carried_transform(self, sources: list[int]) -> tuple[int, ...] | None:
        transforms = {self.pairs[t].transform for t in sources}
        return transforms.pop() if len(transforms) == 1 else None

    def _reference_readers(self, tid: int) -> set[int]:
        """Reference ops reading `tid`, or what ops that only move data made of it."""
        found, pending, seen = set(), [tid], {tid}
        while pending:
            for reader in self.readers["reference"].get(pending.pop(), []):
                found.add(reader)
                if self.reference.ops[reader].op in MOVES_DATA:
                    for out in self.reference.ops[reader].outputs:
                        if out not in seen:
                            seen.add(out)
                            pending.append(out)
        return found

    def _sources(self, trace: Trace, tids: list[int]) -> list[int]:
        """Each tensor followed back through ops that only move data to what they moved (paired tensors of the
        candidate stop there)."""
        sources = []
        for tid in tids:
            while True:
                info = trace.tensors[tid]
                if trace is self.candidate and tid in self.pairs or info.producer is None:
                    break
                producer = trace.ops[info.producer]
                if producer.op not in MOVES_DATA or not producer.inputs:
                    break
                tid = producer.inputs[0]
            if tid not in sources:
                sources.append(tid)
        return sources

    def _pair(
        self,
        cand_tid: int,
        ref_tid: int,
        transform: tuple[int, ...] | None,
        how: str,
        part: tuple[int, int, int] | None = None,
        rows: tuple[int, ...] | None = None,
    ) -> None:
        held = self.reference.tensors[ref_tid].shape
        if part is not None:
            count = len(rows) if rows is not None else part[2] - part[1]
            held = tuple(count if k == part[0] else n for k, n in enumerate(held))
        expanded = broadcasts(held, self.candidate.tensors[cand_tid].shape)
        self.pairs[cand_tid] = TensorPair(
            cand_tid, ref_tid, transform, 1.0, how, broadcast=expanded, part=part, rows=rows
        )
        self.how[cand_tid] = how
        if self.candidate.tensors[cand_tid].producer is not None:
            self.claimed.add((ref_tid, part))

    # -- blocks --------------------------------------------------------------------------------------------------
    def alignment(self) -> Alignment:
        """Op pairs and blocks from the checkpoints' cones (see the module docstring). What several cones would
        share (position tables a port computes once for every layer) is a block of its own, with no partner."""
        checkpoints = [t for t in sorted(self.pairs) if self.candidate.tensors[t].producer is not None]
        partners = [self.pairs[t].reference for t in checkpoints]
        stops = set(self.pairs)
        frontier = {pair.reference for pair in self.pairs.values()}
        shared = _shared_ops(self.candidate, checkpoints, stops)
        shared_ref = _shared_ops(self.reference, partners, frontier)
        stops |= {t for i in shared for t in self.candidate.ops[i].outputs}
        frontier |= {t for i in shared_ref for t in self.reference.ops[i].outputs}
        # An op making a checkpoint ends the cones reading its other non-floating outputs (the indices `topk`
        # returns); its other floating outputs (the k and v parts of a fused projection's split) stay in cones.
        stops |= _other_outputs(self.candidate, checkpoints)
        frontier |= _other_outputs(self.reference, partners)
        cones = {
            t: (
                _cone(self.candidate, self.candidate.tensors[t].producer, stops),
                _cone(self.reference, self.reference.tensors[self.pairs[t].reference].producer, frontier),
            )
            for t in checkpoints
        }
        pairs, blocks = [], []
        for group in _merged(cones):
            cand_ops = sorted(set().union(*(cones[t][0] for t in group)))
            ref_ops = sorted(set().union(*(cones[t][1] for t in group)))
            if len(cand_ops) == 1 and len(ref_ops) == 1 and self._same_op(cand_ops[0], ref_ops[0]):
                pairs.append(self._op_pair(cand_ops[0], ref_ops[0], group))
            else:
                blocks.append(Block(cand_ops, ref_ops, matched=True))
        covered = {i for b in blocks for i in b.candidate} | {p.candidate for p in pairs}
        covered_ref = {i for b in blocks for i in b.reference} | {p.reference for p in pairs}
        for region in _connected(self.candidate, sorted(shared - covered)):
            blocks.append(Block(region, [], matched=False))
        left = [op.index for op in self.candidate.ops if op.index not in covered and op.index not in shared]
        left_ref = [op.index for op in self.reference.ops if op.index not in covered_ref | shared_ref]
        for region in _connected(self.reference, sorted(shared_ref - covered_ref)):
            blocks.append(Block([], region, matched=False))
        if left or left_ref:
            blocks.append(Block(left, left_ref, matched=False))
        blocks.sort(key=lambda b: b.candidate[0] if b.candidate else 1 << 62)
        pairs.sort(key=lambda p: p.candidate)
        return Alignment(pairs, blocks, dict(self.pairs))

    def _same_op(self, cand_index: int, ref_index: int) -> bool:
        return self.candidate.ops[cand_index].op == self.reference.ops[ref_index].op

    def _op_pair(self, cand_index: int, ref_index: int, group: list[int]) -> OpPair:
        cand_op, ref_op = self.candidate.ops[cand_index], self.reference.ops[ref_index]
        how = self.how[group[0]]
        shape = list(self.candidate.tensors[cand_op.outputs[0]].shape) if cand_op.outputs else []
        return OpPair(
            cand_index,
            ref_index,
            1.0 if how == "value" else 0.7,
            PairEvidence(f"flow:{how}", cand_op.op, cand_op.module, ref_op.module, shape, 0.0),
        )


def _other_outputs(trace: Trace, tids: list[int]) -> set[int]:
    """The non-floating outputs of the ops making `tids`."""
    return {
        out
        for t in tids
        if trace.tensors[t].producer is not None
        for out in trace.ops[trace.tensors[t].producer].outputs
        if not is_floating(trace.tensors[out].dtype)
    }


def _cone(trace: Trace, producer: int | None, stop: set[int]) -> set[int]:
    """The ops that compute op `producer`'s outputs from tensors in `stop` and leaves: it and the producers of
    what it reads, back to those."""
    if producer is None:
        return set()
    cone, pending = {producer}, [producer]
    while pending:
        index = pending.pop()
        for tid in trace.ops[index].data_inputs:
            source = trace.tensors[tid].producer
            if source is not None and tid not in stop and source not in cone:
                cone.add(source)
                pending.append(source)
    return cone


def _slices(shape: tuple[int, ...], size: int) -> list[tuple[int, int, int]]:
    """The contiguous slices (axis, start, stop) of a tensor of `shape` holding `size` values: along one axis, in
    equal parts."""
    whole = int(np.prod(shape)) if shape else 1
    if size == 0 or whole == 0:
        return []
    found = []
    for axis, length in enumerate(shape):
        if whole % size or length * size % whole:
            continue
        part = length * size // whole
        if 0 < part < length and length % part == 0:
            found += [(axis, start, start + part) for start in range(0, length, part)]
    return found


def _shared_ops(trace: Trace, checkpoints: list[int], stops: set[int]) -> set[int]:
    """Ops the cones of several checkpoints would hold that compute from no parameter (position tables or a mask
    a port computes once for every layer), with what they compute from."""
    owners: dict[int, int] = {}
    shared = set()
    for t in checkpoints:
        for op in _cone(trace, trace.tensors[t].producer, stops):
            if owners.setdefault(op, t) != t:
                shared.add(op)
    weighted = trace.activations()
    tables = [i for i in shared if i not in weighted]
    return set().union(*(_cone(trace, i, stops) for i in tables)) - weighted if tables else set()


def _connected(trace: Trace, ops: list[int]) -> list[list[int]]:
    """`ops` grouped where one reads what another made."""
    parent = {i: i for i in ops}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in ops:
        for tid in trace.ops[i].inputs:
            producer = trace.tensors[tid].producer
            if producer in parent:
                parent[root(i)] = root(producer)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in ops:
        groups[root(i)].append(i)
    return list(groups.values())


def _merged(cones: dict[int, tuple[set[int], set[int]]]) -> list[list[int]]:
    """Checkpoints grouped where their cones share a candidate op (union-find): each candidate op is in one block.
    A reference op may be in several (one the candidate lacks, whose output the reference reads twice)."""
    parent = {t: t for t in cones}

    def root(t: int) -> int:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for side in (0,):
        owner: dict[int, int] = {}
        for t, cone in cones.items():
            for op in cone[side]:
                if op in owner:
                    parent[root(t)] = root(owner[op])
                else:
                    owner[op] = t
    groups: dict[int, list[int]] = defaultdict(list)
    for t in cones:
        groups[root(t)].append(t)
    return [sorted(g) for g in groups.values() if any(cones[t][0] for t in g)]


def _is_weight(info: TensorInfo) -> bool:
    return leaf_kind(info.leaf) in ("param", "buffer", "const") and is_floating(info.dtype) and info.size > 1


def _holds_mask(info: TensorInfo) -> bool:
    """Does the tensor hold a mask's blocking values (-inf, or a large negative constant)?"""
    return info.stats.inf > 0 or info.stats.min <= BLOCKING


def _value_tolerance(*dtypes: str) -> float:
    """`SAME_VALUES`, or 8 units of rounding of the coarsest of `dtypes` where that is more."""
    return max(SAME_VALUES, 8 * max(noise_floor(dtype) for dtype in dtypes))


def _stats_agree(a: TensorInfo, b: TensorInfo, tolerance: float) -> bool:
    scale = max(a.stats.absmax, b.stats.absmax, 1e-30)
    return all(
        abs(x - y) <= tolerance * scale
        for x, y in (
            (a.stats.mean, b.stats.mean),
            (a.stats.std, b.stats.std),
            (a.stats.absmax, b.stats.absmax),
            (a.stats.min, b.stats.min),
            (a.stats.max, b.stats.max),
        )
    )


def _slice_of(
    candidate: np.ndarray, reference: np.ndarray
) -> tuple[tuple[int, int, int], tuple[int, ...] | None] | None:
    """Where the candidate's values are a slice of the reference's rows or columns, contiguous: (the `part`, the
    `transform` after it) as `TensorPair` takes them; else None. Exactly, or once the reference's are rounded to
    bfloat16 or float16."""
    if candidate.ndim != reference.ndim or candidate.ndim not in (1, 2):
        return None
    for held in (reference, *(rounded_to(reference.astype(np.float32), d) for d in ("bfloat16", "float16"))):
        held = held.astype(candidate.dtype, copy=False)
        if candidate.ndim == 1:
            for start in np.flatnonzero(held == candidate[0]):
                if np.array_equal(held[start : start + candidate.size], candidate):
                    return (0, int(start), int(start) + candidate.size), None
            continue
        for axis in (0, 1):
            for transposed in (False, True):
                values = candidate.T if transposed else candidate
                rows = np.moveaxis(held, axis, 0)
                if rows.shape[1:] != values.shape[1:] or rows.shape[0] <= values.shape[0]:
                    continue
                for start in np.flatnonzero(np.all(rows == values[0], axis=1)):
                    if np.array_equal(rows[start : start + values.shape[0]], values):
                        stop = int(start) + values.shape[0]
                        return (axis, int(start), stop), ((1, 0) if (axis == 1) != transposed else None)
    return None


def _gathered(
    values: np.ndarray, rows: dict[bytes, tuple[int, int, int]]
) -> tuple[int, list[tuple[int, int, int]]] | None:
    """Where every row of a candidate matrix (along one axis), or every element of a vector, is a row (element) of
    some reference leaf: (that axis, the (reference leaf, its axis, row) each holds): rows of several leaves, or of
    one in another order or not all of them; else None."""
    data = np.ascontiguousarray(values, dtype=np.float32)
    if data.ndim == 1:
        held = [rows.get(b"v" + element.tobytes()) for element in data]
        return None if None in held or len({leaf for leaf, _, _ in held}) < 2 else (0, held)
    if data.ndim != 2:
        return None
    for axis in (0, 1):
        oriented = np.ascontiguousarray(data if axis == 0 else data.T)
        held = [rows.get(row.tobytes()) for row in oriented]
        if None not in held and len({(leaf, along) for leaf, along, _ in held}) >= 1:
            return axis, held
    return None


def _content_keys(values: np.ndarray, dtype: str) -> list[tuple[tuple, tuple[int, ...] | None]]:
    """Keys a reference leaf is found by: its values as stored (flat) and transposed where it is a matrix, each
    also rounded to bfloat16 and float16 (a checkpoint saved narrower)."""
    oriented = [(values, None)] + ([(values.T, (1, 0))] if values.ndim == 2 else [])
    keys = [(_key(v), transform) for v, transform in oriented]
    if dtype in ("float32", "float64"):
        for narrow in ("bfloat16", "float16"):
            keys += [(_key(rounded_to(v.astype(np.float32), narrow)), transform) for v, transform in oriented]
    return keys


def _lookup_keys(values: np.ndarray, dtype: str) -> list[tuple]:
    """Keys a candidate leaf looks for: its values (the reference's, rounded where the candidate's are)."""
    return [_key(values)]


def _key(values: np.ndarray) -> tuple:
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    return flat.size, hash(flat.tobytes())
