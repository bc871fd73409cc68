"""Leaves that hold the reference's values in another leaf's place: what each might hold instead.

A converter can hand every value over and still put it in the wrong place: the key rows of a fused q/k/v weight in
the value projection, per-head rows split as if they were blocks, a norm's running variance in its running mean.
Paired by content, such a leaf is `equal` to the reference leaf (or the slice of a fused one) that it holds, and no
comparison finds it. Each `Reassignment` here is one hypothesis of where those values belong, in every layer at
once; the search gives the candidate a hypothesis's values and keeps the first that takes the outputs' error down
to rounding.

- **Parts of one fused leaf.** Candidate leaves holding rows of one reference leaf (q, k and v split from
  `query_key_value`) take the rows each *role* reads: the reference's own ops that split the fused projection's
  output, replayed on the feature numbers (`Roles`), say which rows make its query, its key and its value.
  Each way of giving the candidate's parts the roles' rows (rows for rows of the same count) is a hypothesis.
- **One leaf held twice.** Where two candidate leaves of a module hold one reference leaf and a reference leaf of
  the same shape in that module is held by none, each of the two taking the one held by none is a hypothesis.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..capture.trace import Trace
from ..leafref import leaf_kind, leaf_name
from .align import Alignment, TensorPair

MAX_HYPOTHESES = 8  # reassignments tried by the search
# The rows of a fused reference leaf that each part of its output is made of, in the part's order: reference leaf
# tid -> one array of row numbers per part (`Roles`).
Roles = Callable[[int], list[np.ndarray]]


@dataclass
class Reassignment:
    """One hypothesis: candidate leaf tid -> the values it would hold (in its own layout)."""

    values: dict[int, np.ndarray] = field(default_factory=dict)
    # The same mistake made on the reference: reference leaf tid -> its values with the candidate's misplacement in
    # them (a reference re-run with these reproduces the candidate's outputs where the hypothesis is right).
    mistaken: dict[int, np.ndarray] = field(default_factory=dict)
    # Per candidate leaf: (its name, the reference leaf it would hold, which of its rows, what it holds now).
    moves: list[tuple[str, str, str, str]] = field(default_factory=list)

    def describe(self) -> str:
        name, reference, rows, held = self.moves[0]
        return f"holds {held} where {rows} of the reference's {reference} belong"


def reassignments(reference: Trace, candidate: Trace, alignment: Alignment, roles: Roles) -> list[Reassignment]:
    """The hypotheses of the module docstring, those reassigning fused parts first."""
    held = {
        tid: pair
        for tid, pair in alignment.tensors.items()
        if candidate.tensors[tid].producer is None
        and leaf_kind(candidate.tensors[tid].leaf) in ("param", "buffer")
        and reference.tensors[pair.reference].producer is None
    }
    found = _fused_parts(reference, candidate, held, roles) + _held_twice(reference, candidate, held)
    return found[:MAX_HYPOTHESES]


def _layerless(name: str) -> str:
    return re.sub(r"\.\d+\.", ".#.", name)


def _last(name: str) -> str:
    return name.rpartition(".")[2]


def _module(name: str) -> str:
    return leaf_name(name).rpartition(".")[0]


def _rows_text(rows: np.ndarray) -> str:
    runs, start = [], 0
    for k in range(1, len(rows) + 1):
        if k == len(rows) or rows[k] != rows[k - 1] + 1:
            runs.append(f"{rows[start]}:{rows[k - 1] + 1}")
            start = k
    return "rows " + ", ".join(runs)


def _fused_parts(reference: Trace, candidate: Trace, held: dict[int, TensorPair], roles: Roles) -> list[Reassignment]:
    """Reassignments of the weights that are parts (rows) of one fused reference weight, with the biases of their
    modules, in every layer alike."""
    by_fused: dict[int, list[int]] = {}
    for tid, pair in held.items():
        if pair.part is not None and len(candidate.tensors[tid].shape) == 2:
            by_fused.setdefault(pair.reference, []).append(tid)
    # Per layerless pattern of the group: the assignment (candidate leaf pattern -> role index) of each layer.
    per_layer: dict[tuple[str, ...], list[dict[int, int]]] = {}
    for fused, parts in by_fused.items():
        try:
            split = roles(fused)
        except Exception:  # the reference's split cannot be replayed: no hypothesis from it
            continue
        parts = sorted(parts, key=lambda t: candidate.tensors[t].leaf)
        pattern = tuple(_layerless(candidate.tensors[t].leaf) for t in parts)
        options = []
        for chosen in itertools.permutations(range(len(split)), len(parts)):
            if all(len(split[role]) == len(held[t].held()) for t, role in zip(parts, chosen)):
                current = all(np.array_equal(split[role], held[t].held()) for t, role in zip(parts, chosen))
                if not current:
                    options.append(dict(zip(parts, chosen)))
        if options:
            per_layer.setdefault(pattern, []).append(options)
    hypotheses = []
    for pattern, layers in per_layer.items():
        for choice in range(max(len(options) for options in layers)):
            hypothesis = Reassignment()
            for options in layers:
                if choice >= len(options):
                    continue
                for tid, role in options[choice].items():
                    if not np.array_equal(roles(held[tid].reference)[role], held[tid].held()):
                        _move_rows(reference, candidate, held, roles, hypothesis, tid, role)
            if hypothesis.values:
                hypotheses.append(hypothesis)
    return hypotheses


def _move_rows(
    reference: Trace,
    candidate: Trace,
    held: dict[int, TensorPair],
    roles: Roles,
    hypothesis: Reassignment,
    tid: int,
    role: int,
) -> None:
    """Add to `hypothesis` candidate weight `tid` holding role `role`'s rows of its fused reference weight, and
    the bias of its module holding the same rows of the fused reference bias, where it has one."""
    pair = held[tid]
    rows = roles(pair.reference)[role]
    hypothesis.values[tid] = _rows_of(reference, candidate, pair, tid, rows)
    now = np.asarray(pair.held())
    _misplace(reference, hypothesis, pair.reference, pair.part[0], rows, now)
    hypothesis.moves.append(
        (
            leaf_name(candidate.tensors[tid].leaf),
            leaf_name(reference.tensors[pair.reference].leaf),
            _rows_text(rows),
            _rows_text(now),
        )
    )
    module = _module(candidate.tensors[tid].leaf)
    for bias, bias_pair in held.items():
        info = candidate.tensors[bias]
        if bias != tid and len(info.shape) == 1 and _module(info.leaf) == module and bias_pair.part is not None:
            if len(bias_pair.held()) == len(rows):
                hypothesis.values[bias] = reference.value(bias_pair.reference)[rows].astype(
                    candidate.value(bias).dtype, copy=False
                )
                _misplace(reference, hypothesis, bias_pair.reference, 0, rows, np.asarray(bias_pair.held()))


def _misplace(
    reference: Trace, hypothesis: Reassignment, leaf: int, axis: int, rows: np.ndarray, held: np.ndarray
) -> None:
    """Make on reference `leaf` the move the hypothesis undoes on the candidate: its `rows` take the values of the
    rows the candidate holds there (`held`)."""
    values = hypothesis.mistaken.setdefault(leaf, np.array(reference.value(leaf), copy=True))
    original = reference.value(leaf)
    index: list = [slice(None)] * values.ndim
    index[axis] = rows
    source: list = [slice(None)] * values.ndim
    source[axis] = held
    values[tuple(index)] = original[tuple(source)]


def _rows_of(reference: Trace, candidate: Trace, pair: TensorPair, tid: int, rows: np.ndarray) -> np.ndarray:
    """The reference leaf's `rows` along the pair's sliced axis, in the candidate leaf's layout."""
    axis = pair.part[0]
    values = np.take(reference.value(pair.reference), rows, axis=axis)
    if pair.transform is not None:
        values = np.transpose(values, pair.transform)
    return np.ascontiguousarray(values).reshape(candidate.tensors[tid].shape).astype(candidate.value(tid).dtype)


def _held_twice(reference: Trace, candidate: Trace, held: dict[int, TensorPair]) -> list[Reassignment]:
    """Where two candidate leaves of a module hold one reference leaf (whole) and a reference leaf of the same shape
    in that reference module is held by none: each of the two holding it instead, in every layer alike."""
    holders: dict[int, list[int]] = {}
    for tid, pair in held.items():
        if pair.part is None:
            holders.setdefault(pair.reference, []).append(tid)
    taken = {pair.reference for pair in held.values()}
    by_pattern: dict[tuple[str, str], Reassignment] = {}
    for ref_tid, tids in holders.items():
        if len(tids) < 2 or len({_module(candidate.tensors[t].leaf) for t in tids}) != 1:
            continue
        info = reference.tensors[ref_tid]
        orphans = [
            t
            for t, other in reference.tensors.items()
            if other.producer is None
            and t not in taken
            and other.shape == info.shape
            and leaf_kind(other.leaf) in ("param", "buffer")
            and _module(other.leaf) == _module(info.leaf)
            and reference.has_value(t)
        ]
        if len(orphans) != 1:
            continue
        for tid in sorted(tids, key=lambda t: candidate.tensors[t].leaf):
            # One hypothesis per kind of move (a running mean holding the running variance), in every module alike.
            kind = (_last(candidate.tensors[tid].leaf), _last(reference.tensors[orphans[0]].leaf))
            hypothesis = by_pattern.setdefault(kind, Reassignment())
            pair = held[tid]
            values = reference.value(orphans[0])
            if pair.transform is not None:
                values = np.transpose(values, pair.transform)
            hypothesis.values[tid] = np.ascontiguousarray(values).reshape(candidate.tensors[tid].shape)
            hypothesis.mistaken[orphans[0]] = np.array(reference.value(ref_tid), copy=True)
            hypothesis.moves.append(
                (
                    leaf_name(candidate.tensors[tid].leaf),
                    leaf_name(reference.tensors[orphans[0]].leaf),
                    "the values",
                    f"the reference's {leaf_name(info.leaf)}",
                )
            )
    return list(by_pattern.values())
