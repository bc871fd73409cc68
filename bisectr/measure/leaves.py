"""Parameters and buffers: paired across layouts, compared, and described.

Most porting bugs live in converted weights, so the leaves (parameters and buffers, including
buffers a model computes as it is built: rotary tables, position ids, masks) are paired and
compared before any op is blamed.

**Pairing** follows the data: a candidate leaf pairs with the reference leaf that its paired op
reads at the same position (the alignment's pairs, with the layout the frameworks' op semantics
give), else with one read at the same place (the reference ops of the matched block or paired op
that reads it) whose values it holds as stored, transposed, or as a slice of a fused parameter
(GPT-2's `c_attn` split into q/k/v, or q/k/v fused into one), or repeated (kv heads expanded for
grouped-query attention), checked against where the candidate's ops read each part; else with a leaf of
the same size read there, in reading order; else with a leaf anywhere that holds the same values (in any
order), or failing that the same name. Every leaf read by either side is paired or listed as unpaired with
the reason.

**Comparison** of a pair, in the candidate's layout: `equal` (bit for bit), `rounded` (the
candidate's values are the reference's rounded to the candidate's lower-precision dtype, within
half an ulp: a bf16 or fp16 cast) or `different`, described: transposed, all zeros, all ones,
scaled by c, offset by c, rows or blocks permuted (which row or block each position holds), rows held
in another order than the ops read them, another leaf's values, or how far they differ.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterator

import numpy as np

from ..adapters import registered
from .align import (
    Alignment,
    LeafPair,
    LeafPairing,
    TensorPair,
    UnpairedLeaf,
    consecutive_runs,
    layerless,
    up_to_numbers,
    packed_orders,
    row_order,
)
from ..capture.trace import Trace, is_floating, is_model_leaf
from ..leafref import leaf_kind, leaf_name
from .metrics import rounded_to
from .numerics import SAME_VALUE_REACH

# Mantissa bits of the dtypes a cast may round to.
_MANTISSA_BITS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}
AS_STORED, TRANSPOSED = "as stored", "transposed"
# Where a fused candidate leaf holds a reference leaf's rows: position along its axis -> reference row.
Placed = dict[int, int]
UNREAD = "no op of the forward reads it"


@dataclass
class _Match:
    reference: int
    transform: tuple[int, ...] | None
    part: tuple[int, int, int] | None
    how: str


def pair_leaves(reference: Trace, candidate: Trace, alignment: Alignment) -> Alignment:
    """The alignment with its leaves paired (new `TensorPair`s for the pairs it lacked) and compared."""
    pairer = _Pairer(reference, candidate, alignment)
    matches = pairer.pair()
    tensors = dict(alignment.tensors)
    pairs = []
    for cand_tid, match in matches.items():
        if cand_tid not in tensors:
            tensors[cand_tid] = TensorPair(cand_tid, match.reference, match.transform, 1.0, "leaf", part=match.part)
        pairs.append(describe_pair(reference, candidate, tensors[cand_tid], match.how))
    fused = pairer.fused_parts(matches)
    pairs += [part for parts in fused.values() for part in parts]
    pairs = _packed_for_the_ranks(reference, candidate, pairs)
    reference_leaves = reference.leaves
    paired_refs = {m.reference for m in matches.values()} | {reference_leaves[p.reference] for p in pairs}
    unpaired = [
        UnpairedLeaf("candidate", candidate.tensors[t].leaf, pairer.reason_unpaired(t))
        for t in pairer.candidate_leaves
        if t not in matches and t not in fused
    ]
    unpaired += [
        UnpairedLeaf(
            "reference", reference.tensors[t].leaf, "no candidate leaf holds its values or is read where it is"
        )
        for t in pairer.reference_leaves
        if t not in paired_refs
    ]
    unpaired += [
        UnpairedLeaf(trace.side, name, UNREAD) for trace in (candidate, reference) for name in trace.unread_leaves
    ]
    return Alignment(
        alignment.pairs, alignment.blocks, tensors, LeafPairing(pairs, unpaired, _summary(pairs, unpaired))
    )


def with_leaves_of(alignment: Alignment, other: Alignment, candidate: Trace) -> Alignment:
    """`alignment` whose leaves the pairs of `other` (made on another alignment of the same runs) complete: a leaf
    `alignment` paired by its values keeps that pair, unless `other` holds it against the same reference leaf in
    the layout `alignment` found the same weight of the other layers in (a square weight a converter left
    untransposed); one it paired by where it is read (in a block as coarse as a whole layer) takes `other`'s, made
    where the ops reading it are paired more finely."""
    by_content = {
        name for name, tid in candidate.leaves.items() if getattr(alignment.tensors.get(tid), "how", None) == "leaf"
    }
    others: dict[str, list[LeafPair]] = {}
    for pair in other.leaves.pairs:
        others.setdefault(pair.candidate, []).append(pair)
    layouts: dict[str, list[str]] = {}
    for pair in alignment.leaves.pairs:
        layouts.setdefault(up_to_numbers(pair.candidate), []).append(pair.layout)

    def kept(pair: LeafPair) -> bool:
        if pair.candidate not in others:
            return True
        if pair.candidate not in by_content:
            return False
        instead = next((p for p in others[pair.candidate] if p.reference == pair.reference), None)
        if instead is None or instead.layout == pair.layout:
            return True
        siblings = layouts[up_to_numbers(pair.candidate)]
        return siblings.count(instead.layout) * 2 <= len(siblings)

    replaced = {pair.candidate for pair in alignment.leaves.pairs if not kept(pair)}
    pairs: list[LeafPair] = []
    for pair in alignment.leaves.pairs:
        if pair.candidate not in replaced:
            pairs.append(pair)
        elif pair.candidate in others:  # a leaf's pairs (a fused one has one per part) are taken together
            pairs.extend(others.pop(pair.candidate))
    tensors = dict(alignment.tensors)
    for name in replaced:
        tid = candidate.leaves[name]
        if tid in other.tensors:
            tensors[tid] = other.tensors[tid]  # the values a swap puts in, laid out as the pair taken says
    paired = {pair.candidate for pair in pairs} | {pair.reference for pair in pairs}
    unpaired = [leaf for leaf in alignment.leaves.unpaired if leaf.reason == UNREAD or leaf.name not in paired]
    return replace(alignment, tensors=tensors, leaves=LeafPairing(pairs, unpaired, _summary(pairs, unpaired)))


def _packed_for_the_ranks(reference: Trace, candidate: Trace, pairs: list[LeafPair]) -> list[LeafPair]:
    """`pairs` with each leaf of a kind packed for the ranks (`align.packed_orders`) compared with the
    reference's rows in that kind's order: the leaves holding it equal, one holding anything else different,
    the reference's rows in that order its fix."""
    orders = packed_orders(reference, candidate)
    if not orders:
        return pairs
    result = []
    for pair in pairs:
        kind = layerless(pair.candidate)
        if kind in orders and pair.slots is None and pair.layout == AS_STORED:
            axis, order = orders[kind]
            pair = _in_order(reference, candidate, pair, axis, list(order))
        result.append(pair)
    return result


def _in_order(reference: Trace, candidate: Trace, pair: LeafPair, axis: int, rows: list[int]) -> LeafPair:
    leaf = _fused_part(
        reference,
        candidate,
        candidate.leaves[pair.candidate],
        reference.leaves[pair.reference],
        axis,
        False,
        dict(enumerate(rows)),
    )
    size = math.gcd(*(len(run) for run in consecutive_runs(rows)))
    leaf.layout = (
        f"packed for the ranks: the reference's blocks of {size} along axis {axis} in order "
        f"{[rows[k] // size for k in range(0, len(rows), size)]}, as most leaves of its name hold them"
    )
    leaf.how = pair.how
    return leaf


def _summary(pairs: list[LeafPair], unpaired: list[UnpairedLeaf]) -> str:
    counts = {status: sum(p.status == status for p in pairs) for status in ("equal", "rounded", "different", "unknown")}
    text = f"{len(pairs)} leaves paired ({', '.join(f'{n} {s}' for s, n in counts.items() if n)})"
    unread = sum(leaf.reason == UNREAD for leaf in unpaired)
    if len(unpaired) > unread:
        text += f", {len(unpaired) - unread} unpaired"
    if unread:
        text += f", {unread} never read"
    different = [p for p in pairs if p.status == "different"]
    rounded = [p for p in pairs if p.status == "rounded"]
    if different:
        first = different[0]
        return f"{text}; first different: {leaf_name(first.candidate)} ({first.description})"
    if rounded:
        worst = max(p.max_rel or 0.0 for p in rounded)
        return (
            f"{text}; the candidate's weights are {'; '.join(sorted({p.description for p in rounded}))}, "
            f"max rel {worst:.2g}"
        )
    return text


def leaf_causes(pairing: LeafPairing, candidate: Trace) -> list[list[LeafPair]]:
    """The different leaves as causes, in the order the candidate first reads them: leaves that differ
    the same way (the same local name up to numbers and the same kind of description) are one cause,
    and so are causes held by the same layers (every BatchNorm's mean zeroed and variance set to one)."""
    first, leaves = candidate.first_reads(), candidate.leaves
    order = {p.candidate: first.get(leaves[p.candidate], 1 << 62) for p in pairing.pairs}
    by_key: dict[tuple[str, str], list[LeafPair]] = {}
    for pair in sorted((p for p in pairing.pairs if p.status == "different"), key=lambda p: order[p.candidate]):
        by_key.setdefault(cause_key(pair), []).append(pair)
    by_owners: dict[frozenset[str], list[LeafPair]] = {}
    for group in by_key.values():
        by_owners.setdefault(frozenset(p.candidate.rpartition(".")[0] for p in group), []).extend(group)
    causes = [sorted(group, key=lambda p: order[p.candidate]) for group in by_owners.values()]
    return sorted(causes, key=lambda group: order[group[0].candidate])


def describe_pair(reference: Trace, candidate: Trace, pair: TensorPair, how: str) -> LeafPair:
    ref_info, cand_info = reference.tensors[pair.reference], candidate.tensors[pair.candidate]
    leaf = LeafPair(cand_info.leaf, ref_info.leaf, layout_name(pair, ref_info.shape), how)
    if not (reference.has_value(pair.reference) and candidate.has_value(pair.candidate)):
        return leaf
    ref_values = reference.value(pair.reference)
    expected = pair.reference_in_candidate_layout(ref_values, cand_info.shape)
    leaf.status, leaf.description, leaf.max_rel = compare(
        expected, candidate.value(pair.candidate), cand_info.dtype, ref_info.dtype
    )
    if leaf.status == "different" and leaf.description.startswith("values differ"):
        other = _holder_of(reference, candidate.value(pair.candidate), exclude=pair.reference)
        if other is not None:
            leaf.description = f"holds the reference's {leaf_name(other)}"
    return leaf


def reference_values(
    reference: Trace, candidate: Trace, alignment: Alignment, pairs: list[LeafPair]
) -> dict[int, np.ndarray]:
    """Candidate leaf tid -> its values with the reference's in place of `pairs` (a part of a fused
    leaf fills its rows, the rest keeping the candidate's own)."""
    values: dict[int, np.ndarray] = {}
    candidate_leaves, reference_leaves = candidate.leaves, reference.leaves
    for pair in pairs:
        tid = candidate_leaves[pair.candidate]
        ref_values = reference.value(reference_leaves[pair.reference])
        if pair.slots is None:
            tensor_pair = alignment.tensors[tid]
            values[tid] = tensor_pair.reference_in_candidate_layout(ref_values, candidate.tensors[tid].shape)
            continue
        filled = values.get(tid)
        if filled is None:
            filled = values[tid] = np.array(candidate.value(tid), copy=True)
        index = [slice(None)] * filled.ndim
        index[pair.axis] = pair.slots
        oriented = ref_values.T if pair.transposed else ref_values
        filled[tuple(index)] = np.take(oriented, pair.reference_rows(oriented.shape[pair.axis]), axis=pair.axis)
    return values


def _fused_part(
    reference: Trace, candidate: Trace, cand_tid: int, ref_tid: int, axis: int, transposed: bool, placed: Placed
) -> LeafPair:
    cand_info, ref_info = candidate.tensors[cand_tid], reference.tensors[ref_tid]
    slots = sorted(placed)
    rows = [placed[p] for p in slots]
    count = _row_count(ref_info.shape, axis, transposed)
    copies = {rows.count(r) for r in set(rows)}
    held = "" if len(set(rows)) == count else f" (the reference's rows {_ranges(sorted(set(rows)))} of {count})"
    repeated = (
        "" if copies == {1} else f", each row {copies.pop()} times" if len(copies) == 1 else ", some rows repeated"
    )
    layout = f"rows {_ranges(slots)}{held}{repeated} of axis {axis} of the candidate's {list(cand_info.shape)}" + (
        ", transposed" if transposed else ""
    )
    leaf = LeafPair(
        cand_info.leaf, ref_info.leaf, layout, "block", slots=slots, axis=axis, transposed=transposed, rows=rows
    )
    if reference.has_value(ref_tid) and candidate.has_value(cand_tid):
        ref_values = reference.value(ref_tid)
        expected = np.take(ref_values.T if transposed else ref_values, rows, axis=axis)
        values = np.take(candidate.value(cand_tid), slots, axis=axis)
        leaf.status, leaf.description, leaf.max_rel = compare(expected, values, cand_info.dtype, ref_info.dtype)
    return leaf


def _row_count(shape: tuple[int, ...], axis: int, transposed: bool) -> int:
    """How many rows a reference leaf of `shape` has along `axis` (of its transpose, where `transposed`)."""
    return shape[:: -1 if transposed else 1][axis]


def _ranges(positions: list[int]) -> str:
    return ", ".join(f"{run[0]}:{run[-1] + 1}" for run in consecutive_runs(positions))


def layout_name(pair: TensorPair, reference_shape: tuple[int, ...]) -> str:
    words = []
    if pair.part is not None and pair.rows is not None:
        words.append(f"rows {_ranges(list(pair.rows))} of axis {pair.part[0]} of {list(reference_shape)}")
    elif pair.part is not None:
        axis, start, stop = pair.part
        words.append(f"slice {start}:{stop} of axis {axis} of {list(reference_shape)}")
    if pair.transform is not None and list(pair.transform) != sorted(pair.transform):
        words.append(TRANSPOSED if len(pair.transform) == 2 else f"permuted {list(pair.transform)}")
    return ", ".join(words) or AS_STORED


# -- comparing ----------------------------------------------------------------------------
def compare(
    reference: np.ndarray, candidate: np.ndarray, candidate_dtype: str, reference_dtype: str
) -> tuple[str, str, float]:
    """(status, description, max_rel) of a candidate leaf against the reference's values in its layout."""
    if reference.dtype == candidate.dtype and np.array_equal(reference.reshape(candidate.shape), candidate):
        return "equal", "", 0.0
    reference = reference.astype(np.float64).reshape(candidate.shape)
    candidate = candidate.astype(np.float64)
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    difference = np.abs(candidate - reference)
    max_abs = float(difference.max()) if difference.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    if max_abs == 0:
        return "equal", "", 0.0
    if _finer(reference_dtype, candidate_dtype) and np.all(difference <= half_ulp(reference, candidate_dtype)):
        return "rounded", f"the reference's rounded to {candidate_dtype}", max_rel
    for narrow in ("bfloat16", "float16"):  # a checkpoint saved narrower, loaded into a wider dtype
        if _finer(reference_dtype, narrow) and np.array_equal(
            candidate, rounded_to(reference.astype(np.float32), narrow)
        ):
            return "rounded", f"the reference's rounded to {narrow}, held in {candidate_dtype}", max_rel
    return "different", _difference(reference, candidate, candidate_dtype, max_rel), max_rel


def half_ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Half a unit in the last place of `dtype` at each of `values` (what rounding to it may move them)."""
    _, exponent = np.frexp(values)
    return np.ldexp(1.0, exponent - 2 - _MANTISSA_BITS[dtype]) * (1 + 2.0**-20)


def _finer(reference_dtype: str, candidate_dtype: str) -> bool:
    return _MANTISSA_BITS.get(reference_dtype, 0) > _MANTISSA_BITS.get(candidate_dtype, 99)


def _close(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    """Equal but for rounding in `dtype` (a few ulps of each value)."""
    tolerance = 8 * half_ulp(np.maximum(np.abs(a), np.abs(b)), dtype if dtype in _MANTISSA_BITS else "float32")
    return bool(np.all(np.abs(a - b) <= tolerance))


def _difference(reference: np.ndarray, candidate: np.ndarray, dtype: str, max_rel: float) -> str:
    nonfinite = int(np.count_nonzero(~np.isfinite(candidate)))
    if nonfinite:
        return f"holds {nonfinite} NaN/Inf"
    if not np.any(candidate):
        return "all zeros"
    if np.all(candidate == 1):
        return "all ones"
    if reference.ndim == 2 and reference.shape[0] == reference.shape[1] and _close(candidate, reference.T, dtype):
        return "transposed"
    nonzero = reference != 0
    if nonzero.any():
        factor = float(np.median(candidate[nonzero] / reference[nonzero]))
        if factor != 0 and _close(candidate, factor * reference, dtype):
            return f"scaled by {factor:.4g}"
    offset = float(np.median(candidate - reference))
    if _close(candidate, reference + offset, dtype):
        return f"offset by {offset:.4g}" + (" (1 + w)" if abs(offset - 1) < 1e-6 else "")
    permutation = _permutation(reference, candidate)
    if permutation is not None:
        return permutation
    bases = _rotary_base(reference), _rotary_base(candidate)
    if None not in bases:
        return f"a rotary table of another base: theta {bases[1]:.4g} where the reference's is {bases[0]:.4g}"
    return f"values differ (max rel {max_rel:.2g})"


def _permutation(reference: np.ndarray, candidate: np.ndarray) -> str | None:
    """'rows permuted' / 'blocks permuted: order [...]' when the candidate holds the reference's
    rows (along the first or the last axis) in another order."""
    for axis in sorted({0, reference.ndim - 1}):
        order = row_order(reference, candidate, axis)
        if order is None:
            continue
        runs = consecutive_runs(order)
        size = math.gcd(*(len(run) for run in runs))
        if size > 1 and all(run[0] % size == 0 for run in runs):
            blocks = [order[k] // size for k in range(0, len(order), size)]
            return f"blocks permuted along axis {axis}: the reference's blocks of {size} in order {blocks}"
        return _rows_permuted(order, axis)
    return None


def _rows_permuted(order: list[int], axis: int) -> str:
    """Which of the reference's rows each position holds: the same order within every block of the
    smallest size that has one (rows within each head permuted for another rotary convention)."""
    for size in range(2, len(order)):
        if len(order) % size == 0:
            pattern = [row - order[0] for row in order[:size]]
            if all(order[start + k] == start + pattern[k] for start in range(0, len(order), size) for k in range(size)):
                return (
                    f"rows permuted within each block of {size} along axis {axis}: "
                    f"each holds the reference's rows {_listed(pattern)}"
                )
    return f"rows permuted along axis {axis}: position i holds the reference's row {_listed(order)}"


def _listed(values: list[int], most: int = 32) -> str:
    return str(values) if len(values) <= most else f"[{', '.join(map(str, values[:most]))}, ...]"


def _rotary_base(values: np.ndarray) -> float | None:
    """theta, for the inverse frequencies of a rotary embedding (theta ** (-i / n), i = 0..n-1), else None."""
    if values.ndim != 1 or values.size < 3 or values[0] != 1 or np.any(values <= 0):
        return None
    ratios = values[1:] / values[:-1]
    if not np.allclose(ratios, ratios[0], rtol=1e-4) or ratios[0] >= 1:
        return None
    return float(ratios[0] ** -values.size)


def _holder_of(reference: Trace, values: np.ndarray, exclude: int) -> str | None:
    """The reference leaf (other than `exclude`) holding exactly these values, if one does."""
    for tid, info in reference.tensors.items():
        if (
            tid != exclude
            and info.producer is None
            and is_model_leaf(info.leaf)
            and info.size == values.size
            and reference.has_value(tid)
        ):
            if np.array_equal(reference.value(tid).reshape(values.shape), values):
                return info.leaf
    return None


# -- pairing ----------------------------------------------------------------------------
class _Pairer:
    def __init__(self, reference: Trace, candidate: Trace, alignment: Alignment):
        self.traces = {"reference": reference, "candidate": candidate}
        self.alignment = alignment
        self.candidate_leaves = _leaves(candidate)
        self.reference_leaves = _leaves(reference)
        self.readers = {role: trace.consumers() for role, trace in self.traces.items()}
        self.matches: dict[int, _Match] = {}
        self.reference_of = {p.candidate: [p.reference] for p in alignment.pairs}
        for block in alignment.blocks:
            if block.matched:
                self.reference_of.update((c, block.reference) for c in block.candidate)

    def pair(self) -> dict[int, _Match]:
        matches = self.matches = {}
        for cand_tid, pair in self.alignment.tensors.items():
            if cand_tid in self.candidate_leaves and pair.reference in self.reference_leaves:
                if self._by_values(cand_tid, pair.reference, "op") is None and self._rows_reordered(
                    cand_tid, pair.reference
                ):
                    continue
                matches[cand_tid] = _Match(pair.reference, pair.transform, pair.part, "op")
        for finder in (self._at_place_by_values, self._at_place_by_size, self._anywhere_by_values, self._by_name):
            taken = {m.reference for m in matches.values() if m.part is None}
            for cand_tid in self.candidate_leaves:
                if cand_tid not in matches:
                    match = finder(cand_tid, taken)
                    if match is not None:
                        matches[cand_tid] = match
                        if match.part is None:
                            taken.add(match.reference)
        self._consistent_layouts(matches)
        return matches

    def _consistent_layouts(self, matches: dict[int, _Match]) -> None:
        """A square weight's values fit either layout: where one was matched in another layout than
        the same parameter of the other layers (the same name up to layer numbers), it takes theirs,
        and its comparison then says it is transposed (a converter that skipped one transpose). Where
        those layers are split evenly (two layers), the layout that the model's matrices which are not
        square were matched in decides: their values leave no choice."""
        candidate = self.traces["candidate"]
        by_pattern: dict[str, list[int]] = {}
        for tid, match in matches.items():
            if match.how != "op":
                by_pattern.setdefault(up_to_numbers(candidate.tensors[tid].leaf), []).append(tid)
        decided = [
            (m.transform, m.part)
            for t, m in matches.items()
            if m.how != "op"
            and m.part is None
            and len(shape := candidate.tensors[t].shape) == 2
            and shape[0] != shape[1]
        ]
        for tids in by_pattern.values():
            layouts = [(matches[t].transform, matches[t].part) for t in tids]
            usual = max(set(layouts), key=layouts.count)
            if layouts.count(usual) * 2 == len(layouts) and decided:
                usual = max(set(decided), key=decided.count)
                if usual not in layouts:
                    continue
            elif layouts.count(usual) * 2 <= len(layouts):
                continue
            for tid in tids:
                shape = candidate.tensors[tid].shape
                if (matches[tid].transform, matches[tid].part) != usual and len(shape) == 2 and shape[0] == shape[1]:
                    matches[tid].transform, matches[tid].part = usual

    def fused_parts(self, matches: dict[int, _Match]) -> dict[int, list[LeafPair]]:
        """Candidate leaves that fuse or repeat reference leaves read at the same place (q, k and v in
        one qkv_proj, gate and up in one, kv heads repeated for grouped-query attention): candidate
        tid -> one part per reference leaf, found by matching the reference's rows among the
        candidate's; a reference leaf none of whose rows is found takes the positions no other leaf
        holds, when their count fits (a slice not copied). Each part is compared where the
        candidate's ops read it (`_read_slots`; where they do not say, where a sibling leaf laid out
        the same way is read, `_fill_unread`), so rows held in another order than the one read (q/k/v concatenated
        naively, kv heads tiled where the ops repeat them in place) are different, described by both."""
        reference, candidate = self.traces["reference"], self.traces["candidate"]
        taken = {m.reference for m in matches.values()}
        found: dict[int, tuple[int, bool, dict[int, Placed]]] = {}
        for cand_tid in self.candidate_leaves:
            if cand_tid in matches or not candidate.has_value(cand_tid):
                continue
            values = candidate.value(cand_tid)
            place = self._place(cand_tid)
            parents = {_parent(reference.tensors[t].leaf) for t in place}
            nearby = place + [
                t for t in self.reference_leaves if t not in place and _parent(reference.tensors[t].leaf) in parents
            ]
            options = [
                t
                for t in nearby
                if t not in taken
                and reference.has_value(t)
                and reference.tensors[t].size <= values.size
                and _same_kind(reference.tensors[t].leaf, candidate.tensors[cand_tid].leaf)
            ]
            laid_out = _rows_of(values, {t: reference.value(t) for t in options}, candidate.tensors[cand_tid].dtype)
            if laid_out is not None:
                found[cand_tid] = laid_out
                taken.update(laid_out[2])
        reads = {t: self._read_slots(t, axis, transposed, held) for t, (axis, transposed, held) in found.items()}
        self._fill_unread(found, reads)
        fused: dict[int, list[LeafPair]] = {}
        for cand_tid, (axis, transposed, held) in found.items():
            read = reads[cand_tid] or held
            parts = [
                _fused_part(reference, candidate, cand_tid, t, axis, transposed, placed) for t, placed in read.items()
            ]
            if read != held:
                text = self._misread(held, read, axis, transposed)
                for part in parts:
                    if part.status == "different":
                        part.description = text
            fused[cand_tid] = parts
        return fused

    def _misread(self, held: dict[int, Placed], read: dict[int, Placed], axis: int, transposed: bool) -> str:
        """How a fused or repeated leaf holds its reference leaves' rows in another order than its ops read them."""
        reference = self.traces["reference"]
        if len(read) == 1:
            ((tid, placed),) = read.items()
            size, held_blocks, read_blocks = _blocks(
                held[tid], placed, _row_count(reference.tensors[tid].shape, axis, transposed)
            )
            how = "repeated" if len(placed) > len(set(placed.values())) else "permuted"
            return (
                f"blocks {how} along axis {axis}: holds the reference's blocks of {size} in order {held_blocks} "
                f"where its ops read them in order {read_blocks}"
            )
        names = {t: _module_name(reference.tensors[t].leaf) for t in read}
        return (
            f"blocks permuted along axis {axis}: holds {_layout_text(held, names)} "
            f"where its ops read {_layout_text(read, names)}"
        )

    def _fill_unread(
        self, found: dict[int, tuple[int, bool, dict[int, Placed]]], reads: dict[int, dict[int, Placed] | None]
    ) -> None:
        """Leaves whose ops do not say where they are read take the read order of another: first of one
        of the same module's parent holding its rows at the same positions (the k projection, whose
        rotary embedding mixes values before the heads are repeated, read as the v projection next to
        it), then of one of the same name up to layer numbers made of as many rows of as many leaves,
        wherever it holds them (the later layers, whose inputs already differ, read as the first; a
        layer whose converter laid its heads out otherwise than the others is read as they are)."""
        candidate = self.traces["candidate"]
        names = {tid: candidate.tensors[tid].leaf for tid in found}

        def held_alike(a: dict[int, Placed], b: dict[int, Placed]) -> bool:
            return list(a.values()) == list(b.values())

        def sized_alike(a: dict[int, Placed], b: dict[int, Placed]) -> bool:
            return [len(p) for p in a.values()] == [len(p) for p in b.values()]

        rules = (
            (lambda a, b: _parent(a) == _parent(b), held_alike),
            (lambda a, b: up_to_numbers(a) == up_to_numbers(b), sized_alike),
        )
        filled = True
        while filled:  # a read order taken by one rule may be the one another rule gives on
            filled = False
            for same_place, alike in rules:
                for tid, (_, _, held) in found.items():
                    if reads[tid] is not None:
                        continue
                    for other, read in list(reads.items()):
                        if read is not None and same_place(names[tid], names[other]) and alike(found[other][2], held):
                            reads[tid] = dict(zip(held, read.values()))
                            filled = True
                            break

    def _read_slots(
        self, cand_tid: int, axis: int, transposed: bool, held: dict[int, Placed]
    ) -> dict[int, Placed] | None:
        """Where the candidate's own ops read each reference leaf's rows in the fused leaf: position c
        holds row r of a reference leaf when a tensor the candidate copies out of the fused op's
        output (by reshapes, splits, transposes, repeats) holds column c where the paired reference
        tensor holds column r of that leaf's op's output. Columns whose values the fused output
        holds more than once (rows the candidate repeats) are told apart by the reference row their
        values hold, its copies taken in the order they appear. None where the data does not say,
        or says something inconsistent."""
        reference, candidate = self.traces["reference"], self.traces["candidate"]
        fused_out = _output_columns(
            candidate, self.readers["candidate"], cand_tid, candidate.tensors[cand_tid].shape[axis]
        )
        if fused_out is None:
            return None
        rows = {t: _row_count(reference.tensors[t].shape, axis, transposed) for t in held}
        part_outs = {t: _output_columns(reference, self.readers["reference"], t, rows[t]) for t in held}
        read: dict[int, Placed] = {}
        positions = candidate.tensors[cand_tid].shape[axis]
        for copy in self._copies(fused_out):
            pair = self.alignment.tensors.get(copy.tid)
            if pair is None or pair.part is not None or not reference.has_value(pair.reference):
                continue
            if np.unique(copy.columns[copy.columns >= 0]).size == positions:
                continue  # the whole output rearranged: paired as recorded, it assumes the reference's column order
            ref_values = pair.reference_in_candidate_layout(
                reference.value(pair.reference), candidate.tensors[copy.tid].shape
            )
            for ref_tid, part_out in part_outs.items():
                if ref_tid in read or part_out is None:
                    continue
                wanted = part_out.columns_of(ref_values)
                if wanted is None:
                    continue
                holding = part_out.columns_near(candidate.value(copy.tid))
                votes = _row_per_position(copy.columns, wanted, holding, held[ref_tid])
                if votes is not None and len(votes) == len(held[ref_tid]) and max(votes.values()) < rows[ref_tid]:
                    read[ref_tid] = votes
        if not read:
            return None
        read = _with_the_rest(read, {t: len(placed) for t, placed in held.items() if t not in read}, positions)
        taken = [p for placed in read.values() for p in placed]
        if len(read) != len(held) or len(set(taken)) != len(taken):
            return None
        return {t: read[t] for t in held}

    def _copies(self, origin: "_Columns", depth: int = 3) -> Iterator["_Copy"]:
        """Candidate tensors up to `depth` ops after `origin` whose every value is one of its values,
        with the column of `origin` each element came from (-1 where a value is not unique there)."""
        trace, readers = self.traces["candidate"], self.readers["candidate"]
        frontier = [origin.tid]
        for _ in range(depth):
            reached = [out for tid in frontier for op in readers.get(tid, []) for out in trace.ops[op].outputs]
            frontier = []
            for tid in dict.fromkeys(reached):
                if trace.has_value(tid) and is_floating(trace.tensors[tid].dtype):
                    columns = origin.columns_of(trace.value(tid))
                    if columns is not None:
                        frontier.append(tid)
                        yield _Copy(tid, columns)

    def reason_unpaired(self, cand_tid: int) -> str:
        if not self._place(cand_tid):
            return "read only by ops that have no reference partner, next to no paired leaf"
        return "no reference leaf read at the same place has its values, or is the only one there of its size"

    def _place(self, cand_tid: int) -> list[int]:
        """Reference leaves read by the reference ops that correspond to the candidate leaf's readers;
        where none correspond, the partners of the leaves of its module's siblings (the k and v
        projections next to a q projection paired with a slice of a fused qkv)."""
        reference = self.traces["reference"]
        ops = [r for c in self.readers["candidate"].get(cand_tid, []) for r in self.reference_of.get(c, [])]
        seen: dict[int, None] = {}
        for index in ops:
            for tid in reference.ops[index].inputs:
                if tid in self.reference_leaves:
                    seen[tid] = None
        if not seen:
            parent = _parent(self.traces["candidate"].tensors[cand_tid].leaf)
            names = {tid: self.traces["candidate"].tensors[tid].leaf for tid in self.matches}
            seen.update((m.reference, None) for tid, m in self.matches.items() if _parent(names[tid]) == parent)
        return list(seen)

    def _at_place_by_values(self, cand_tid: int, taken: set[int]) -> _Match | None:
        for ref_tid in self._place(cand_tid):
            if ref_tid not in taken or self._larger(ref_tid, cand_tid):
                match = self._by_values(cand_tid, ref_tid, "block")
                if match is not None:
                    return match
        return None

    def _at_place_by_size(self, cand_tid: int, taken: set[int]) -> _Match | None:
        """The one reference leaf of its size and kind read there (with several, the data does not say which)."""
        cand_info = self.traces["candidate"].tensors[cand_tid]
        options = [
            ref_tid
            for ref_tid in self._place(cand_tid)
            if ref_tid not in taken
            and self.traces["reference"].tensors[ref_tid].size == cand_info.size
            and _same_kind(self.traces["reference"].tensors[ref_tid].leaf, cand_info.leaf)
        ]
        if len(options) != 1 or self._rows_reordered(cand_tid, options[0]):
            return None
        return _Match(
            options[0],
            _shape_transform(self.traces["reference"].tensors[options[0]].shape, cand_info.shape),
            None,
            "block",
        )

    def _rows_reordered(self, cand_tid: int, ref_tid: int) -> bool:
        """Does the candidate leaf hold the reference leaf's rows in another order (a fused qkv laid out per head):
        a layout `fused_parts` reads off its ops, not a leaf of other values."""
        candidate, reference = self.traces["candidate"], self.traces["reference"]
        if not (candidate.has_value(cand_tid) and reference.has_value(ref_tid)):
            return False
        values = candidate.value(cand_tid)
        return _rows_of(values, {ref_tid: reference.value(ref_tid)}, candidate.tensors[cand_tid].dtype) is not None

    def _anywhere_by_values(self, cand_tid: int, taken: set[int]) -> _Match | None:
        """A reference leaf anywhere holding the same values in some order, or those rounded as `_roundings` says
        (its layout then decided by shape, unless its rows are the reference's in another order: `fused_parts`), else
        one a slice of which they are (a rank's rows of a vocabulary-parallel embedding)."""
        candidate, reference = self.traces["candidate"], self.traces["reference"]
        cand_info = candidate.tensors[cand_tid]
        if not candidate.has_value(cand_tid):
            return None
        wanted = np.sort(candidate.value(cand_tid), axis=None)
        if not _informative(wanted):
            return None
        for ref_tid in self.reference_leaves:
            ref_info = reference.tensors[ref_tid]
            if ref_tid in taken or ref_info.size != cand_info.size or not reference.has_value(ref_tid):
                continue
            ordered = np.sort(reference.value(ref_tid), axis=None)
            if any(np.array_equal(rounded_to(ordered, dtype), wanted) for dtype in _roundings(cand_info.dtype)):
                match = self._by_values(cand_tid, ref_tid, "values")
                if match is None and self._rows_reordered(cand_tid, ref_tid):
                    return None
                return match or _Match(ref_tid, _shape_transform(ref_info.shape, cand_info.shape), None, "values")
        for ref_tid in self.reference_leaves:
            if (
                ref_tid not in taken
                and reference.tensors[ref_tid].size > cand_info.size
                and reference.has_value(ref_tid)
            ):
                match = self._by_values(cand_tid, ref_tid, "values")
                if match is not None:
                    return match
        return None

    def _by_name(self, cand_tid: int, taken: set[int]) -> _Match | None:
        cand_info = self.traces["candidate"].tensors[cand_tid]
        name = _plain_name(cand_info.leaf)
        for ref_tid in self.reference_leaves:
            ref_info = self.traces["reference"].tensors[ref_tid]
            other = _plain_name(ref_info.leaf)
            if (
                ref_tid not in taken
                and ref_info.size == cand_info.size
                and (name.endswith("." + other) or other.endswith("." + name) or name == other)
            ):
                return _Match(ref_tid, _shape_transform(ref_info.shape, cand_info.shape), None, "name")
        return None

    def _larger(self, ref_tid: int, cand_tid: int) -> bool:
        return self.traces["reference"].tensors[ref_tid].size > self.traces["candidate"].tensors[cand_tid].size

    def _by_values(self, cand_tid: int, ref_tid: int, how: str) -> _Match | None:
        """The layout in which the reference leaf's values (or a slice of them) are the candidate's, if one is."""
        candidate, reference = self.traces["candidate"], self.traces["reference"]
        if not (candidate.has_value(cand_tid) and reference.has_value(ref_tid)):
            return None
        cand_info, ref_info = candidate.tensors[cand_tid], reference.tensors[ref_tid]
        values, ref_values = candidate.value(cand_tid).astype(np.float64), reference.value(ref_tid).astype(np.float64)
        if not _informative(values):
            return None
        for transform, part in _layouts(ref_info.shape, cand_info.shape, ref_values, values):
            pair = TensorPair(cand_tid, ref_tid, transform, 1.0, "leaf", part=part)
            expected = pair.reference_in_candidate_layout(ref_values, cand_info.shape)
            if compare(expected, values, cand_info.dtype, ref_info.dtype)[0] != "different":
                return _Match(ref_tid, transform, part, how)
        return None


@dataclass
class _Copy:
    tid: int
    columns: np.ndarray  # per element, the column of the origin it holds (-1: not known)


class _Columns:
    """An op output's values, to tell for a tensor copied out of it which column each element came from."""

    def __init__(self, tid: int, values: np.ndarray):
        self.tid = tid
        keys = np.ascontiguousarray(values, dtype=np.float32).ravel().view(np.uint32)
        columns = np.arange(keys.size) % values.shape[-1]
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        lowest, highest = np.full(unique.size, keys.size), np.full(unique.size, -1)
        np.minimum.at(lowest, inverse, columns)
        np.maximum.at(highest, inverse, columns)
        in_one_column = lowest == highest  # a value repeated down one column (a repeated token) still names it
        self.all_keys = unique
        self.keys, self.columns = unique[in_one_column], columns[first][in_one_column]
        self.sorted_values = unique.view(np.float32).astype(np.float64)
        order = np.argsort(self.sorted_values)
        self.sorted_values = self.sorted_values[order]
        self.sorted_columns = np.where(in_one_column, columns[first], -1)[order]
        self.scale = float(np.abs(self.sorted_values).max(initial=0.0))

    def columns_of(self, values: np.ndarray) -> np.ndarray | None:
        """Per element of `values`, its column here (-1 where ambiguous); None unless every value is one of these."""
        keys = np.ascontiguousarray(values, dtype=np.float32).ravel().view(np.uint32)
        if keys.size == 0 or not np.all(np.isin(keys, self.all_keys)):
            return None
        if self.keys.size == 0:
            return np.full(keys.size, -1)
        at = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return np.where(self.keys[at] == keys, self.columns[at], -1)

    def columns_near(self, values: np.ndarray, tolerance: float = SAME_VALUE_REACH) -> np.ndarray | None:
        """As `columns_of`, for values computed again elsewhere (another device, another kernel): each value
        may lie within `tolerance` times the largest value here of one of these. A value within reach of
        values of several columns is ambiguous (-1); None unless every value is within reach of one."""
        exact = self.columns_of(values)
        if exact is not None:
            return exact
        flat = np.asarray(values, dtype=np.float64).ravel()
        if flat.size == 0 or self.sorted_values.size == 0:
            return None
        reach = tolerance * self.scale
        low = np.searchsorted(self.sorted_values, flat - reach, side="left")
        high = np.searchsorted(self.sorted_values, flat + reach, side="right")
        if np.any(high == low):
            return None
        found = self.sorted_columns[np.minimum(low, self.sorted_values.size - 1)].copy()
        for at in np.flatnonzero(high - low > 1):
            near = self.sorted_columns[low[at] : high[at]]
            found[at] = near[0] if np.all(near == near[0]) else -1
        return found


def _output_columns(trace: Trace, readers: dict[int, list[int]], leaf: int, rows: int) -> _Columns | None:
    """The output of the first op reading `leaf` whose last axis has `rows` entries (a projection's), as `_Columns`."""
    for op in readers.get(leaf, []):
        for tid in trace.ops[op].outputs:
            shape = trace.tensors[tid].shape
            if shape and shape[-1] == rows and trace.has_value(tid) and is_floating(trace.tensors[tid].dtype):
                return _Columns(tid, trace.value(tid))
    return None


def _row_per_position(
    columns: np.ndarray, wanted: np.ndarray, holding: np.ndarray | None, held: Placed
) -> Placed | None:
    """Fused leaf position -> the reference row the ops read there, from a copy's elements: `columns`
    (the position each came from, -1 where its value sits at several), `wanted` (the reference row
    the paired reference element came from) and `holding` (the reference row whose value each
    holds). A known position takes the row nine in ten of its elements want. The elements holding a
    row the leaf holds at several positions (`held`) want one row at all of them, or as many rows as
    there are positions, taken in the order they first appear. None where the elements say neither."""
    votes: Placed = {}
    known = (columns >= 0) & (wanted >= 0)
    for position in np.unique(columns[known]):
        want = wanted[known & (columns == position)]
        values, counts = np.unique(want, return_counts=True)
        if counts.max() < 0.9 * want.size:
            return None
        votes[int(position)] = int(values[counts.argmax()])
    if holding is None:
        return votes
    ambiguous = (columns < 0) & (wanted >= 0) & (holding >= 0)
    for row in np.unique(holding[ambiguous]):
        positions = sorted(p for p, r in held.items() if r == row)
        values, first, counts = np.unique(wanted[ambiguous & (holding == row)], return_index=True, return_counts=True)
        common = counts >= 0.1 * counts.max()
        in_order = [int(v) for v in values[common][np.argsort(first[common])]]
        if len(in_order) == 1:
            votes.update((p, in_order[0]) for p in positions)
        elif len(in_order) == len(positions):
            votes.update(zip(positions, in_order))
        else:
            return None
    return votes


def _layout_text(slots: dict[int, Placed], names: dict[int, str]) -> str:
    """'q_proj 0:64, k_proj 0:32, ...': which reference rows the positions hold, in position order."""
    at = sorted((position, tid, row) for tid, placed in slots.items() for position, row in placed.items())
    runs: list[tuple[int, int, int]] = []  # (tid, first row, last row)
    for _, tid, row in at:
        if runs and runs[-1][0] == tid and runs[-1][2] == row - 1:
            runs[-1] = (tid, runs[-1][1], row)
        else:
            runs.append((tid, row, row))
    return ", ".join(f"{names[tid]} {first}:{last + 1}" for tid, first, last in runs)


def _blocks(held: Placed, read: Placed, rows: int) -> tuple[int, list[int], list[int]]:
    """(block size, the reference's blocks in position order as held, as read) for one leaf's rows."""
    orders = [[placed[p] for p in sorted(placed)] for placed in (held, read)]
    size = math.gcd(rows, *(len(run) for order in orders for run in consecutive_runs(order)))
    return size, *([order[k] // size for k in range(0, len(order), size)] for order in orders)


def _module_name(leaf: str) -> str:
    """`q_proj` for `param:model.layers.0.self_attn.q_proj.weight`."""
    return leaf_name(leaf).rpartition(".")[0].rpartition(".")[2]


def _rows_of(
    values: np.ndarray, options: dict[int, np.ndarray], dtype: str
) -> tuple[int, bool, dict[int, Placed]] | None:
    """Where the reference leaves' rows are in the candidate's (of `dtype`), as `_rows_among` finds them:
    the reference's values rounded to `dtype` where it is narrower, else rounded to bfloat16 or float16
    (a checkpoint saved narrower, loaded into a wider dtype)."""
    for rounding in _roundings(dtype):
        laid_out = _rows_among(values, {tid: rounded_to(ref_values, rounding) for tid, ref_values in options.items()})
        if laid_out is not None:
            return laid_out
    return None


def _roundings(dtype: str) -> tuple[str, ...]:
    """The dtypes a candidate leaf of `dtype` may hold the reference's values rounded to: its own, and where it is
    wider, bfloat16 or float16 (a checkpoint saved narrower, loaded into a wider dtype)."""
    return (dtype, *(("bfloat16", "float16") if _finer(dtype, "float16") else ()))


def _rows_among(values: np.ndarray, options: dict[int, np.ndarray]) -> tuple[int, bool, dict[int, Placed]] | None:
    """(axis, transposed, reference tid -> where its rows are) when the reference leaves' rows (slices
    along one axis, each leaf as stored or transposed) are found among the candidate's: at least one
    leaf's completely, or every row of the candidate (a rank's shard of a fused weight); a leaf with no row
    found fills the positions left, in order, where it fits. A row the candidate holds several times (kv heads
    repeated for grouped-query attention) is placed at each of them. Of the axes and orientations where
    that holds, the one whose leaves cover the most positions (a square part, found whichever way it is
    read, does not decide the layout of the others)."""
    best: tuple[int, bool, dict[int, Placed]] | None = None
    covering = 0
    for axis in range(values.ndim):
        held: dict[bytes, list[int]] = {}
        for i in range(values.shape[axis]):
            held.setdefault(np.take(values, i, axis=axis).astype(np.float32).tobytes(), []).append(i)
        for transposed in (False, True) if values.ndim == 2 else (False,):
            slots: dict[int, Placed] = {}
            complete = False
            missing: list[int] = []
            for tid, ref_values in options.items():
                rows = ref_values.T if transposed else ref_values
                if rows.ndim != values.ndim or any(
                    r != v for i, (r, v) in enumerate(zip(rows.shape, values.shape)) if i != axis
                ):
                    continue
                where = {
                    j: held.get(np.take(rows, j, axis=axis).astype(np.float32).tobytes())
                    for j in range(rows.shape[axis])
                }
                found = {j: at for j, at in where.items() if at is not None}
                if len(found) < len(where):  # a part of a leaf only by rows that tell leaves apart (not single numbers)
                    found = {j: at for j, at in found.items() if _informative(np.take(rows, j, axis=axis))}
                if found and _informative(rows):
                    slots[tid] = {position: j for j, at in found.items() for position in at}
                    complete |= len(found) == len(where)
                elif all(at is None for at in where.values()):
                    missing.append(tid)
            if not (complete or len({p for placed in slots.values() for p in placed}) == values.shape[axis]):
                continue
            sizes = {t: (options[t].T if transposed else options[t]).shape[axis] for t in missing}
            slots = _with_the_rest(slots, sizes, values.shape[axis])
            positions = len({p for placed in slots.values() for p in placed})
            if positions > covering:
                best, covering = (axis, transposed, slots), positions
    return best


def _with_the_rest(slots: dict[int, Placed], missing: dict[int, int], positions: int) -> dict[int, Placed]:
    """`slots` (reference tid -> where its rows are in a fused leaf of `positions` rows), and the one
    leaf of `missing` (tid -> its row count) given the positions no other holds, in order, where it is
    one and fits."""
    free = sorted(set(range(positions)) - {p for placed in slots.values() for p in placed})
    if len(missing) == 1 and next(iter(missing.values())) == len(free):
        return {**slots, next(iter(missing)): {p: row for row, p in enumerate(free)}}
    return slots


def _layouts(
    ref_shape: tuple[int, ...], cand_shape: tuple[int, ...], ref_values: np.ndarray, values: np.ndarray
) -> Iterator[tuple[tuple[int, ...] | None, tuple[int, int, int] | None]]:
    """(transform, part) layouts that could map the reference's values onto the candidate's shape."""
    size = int(np.prod(cand_shape))
    if int(np.prod(ref_shape)) == size:
        yield None, None
        if len(ref_shape) == 2:
            yield (1, 0), None
        return
    for transform in (None, (1, 0)) if len(ref_shape) == len(cand_shape) == 2 else (None,):
        oriented = cand_shape if transform is None else cand_shape[::-1]
        if len(oriented) != len(ref_shape):
            continue
        for axis, (r, c) in enumerate(zip(ref_shape, oriented)):
            others_equal = all(a == b for i, (a, b) in enumerate(zip(ref_shape, oriented)) if i != axis)
            if c < r and r % c == 0 and others_equal:
                for start in _starts(ref_values, values if transform is None else values.T, axis, c):
                    yield transform, (axis, start, start + c)


def _starts(ref_values: np.ndarray, values: np.ndarray, axis: int, length: int) -> Iterator[int]:
    """Offsets along `axis` where the candidate's first slice could sit in the reference (checked whole later)."""
    first = np.take(values, [0], axis=axis).astype(np.float32)
    for start in range(0, ref_values.shape[axis] - length + 1):
        if np.allclose(np.take(ref_values, [start], axis=axis), first, rtol=1e-2, atol=0):
            yield start


def _informative(values: np.ndarray) -> bool:
    """Values that can tell leaves apart: not all the same (every LayerNorm bias starts at zero)."""
    return values.size > 1 and bool(np.any(values != values.flat[0]))


def _shape_transform(ref_shape: tuple[int, ...], cand_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Transposed where a 2-d shape is the other's reversed (and not square), else as stored."""
    if (
        len(ref_shape) == len(cand_shape) == 2
        and ref_shape != cand_shape
        and tuple(ref_shape[::-1]) == tuple(cand_shape)
    ):
        return (1, 0)
    return None


def _leaves(trace: Trace) -> list[int]:
    """The floating parameters and buffers a trace read, in the order first read."""
    first = trace.first_reads()
    leaves = [
        tid
        for tid, info in trace.tensors.items()
        if info.producer is None and is_model_leaf(info.leaf) and is_floating(info.dtype)
    ]
    return sorted(leaves, key=lambda tid: first.get(tid, 1 << 62))


@lru_cache(maxsize=1)
def _norm_statistics() -> dict[str, str]:
    """Every framework's names of BatchNorm statistics -> what they hold (`Adapter.norm_statistics`)."""
    return {name: held for adapter in registered() for name, held in adapter.norm_statistics.items()}


def _plain_name(leaf: str) -> str:
    """The leaf's name, a BatchNorm statistic named by what it holds (`bn1.mean` for torch's `bn1.running_mean`
    and paddle's `bn1._mean`)."""
    name = leaf_name(leaf)
    owner, _, local = name.rpartition(".")
    local = _norm_statistics().get(local, local)
    return f"{owner}.{local}" if owner else local


def _parent(leaf: str) -> str:
    """The module holding the leaf's module (`h.0.attn` for `param:h.0.attn.q_proj.weight`)."""
    return leaf_name(leaf).rpartition(".")[0].rpartition(".")[0]


def _same_kind(a: str, b: str) -> bool:
    """Both parameters or both buffers."""
    return leaf_kind(a) == leaf_kind(b)


def cause_key(pair: LeafPair) -> tuple[str, str]:
    """Leaves that differ the same way: the same local name (up to layer numbers) and description kind."""
    local = re.sub(r"\d+", "#", pair.candidate.rpartition(".")[2])
    kind = re.split(r"[(:]", pair.description)[0]  # not what follows, which may name the leaf's own rows
    return local, re.sub(r"[-\d.e]+", "#", kind).strip()
