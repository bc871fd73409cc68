"""Operator substitution: run the candidate with the reference framework's
implementation of chosen ops, and see whether the difference goes away.

The candidate's forward is re-executed from its trace, op by op, with `Sides.replay` (the
interpreter over the recorded graph the analysis also uses, `bisectr.engines.values`). An aligned unit (a
1:1 pair, or a matched N:M block such as a fused `layer_norm` against mean/var/rsqrt) that contains a
chosen op is computed instead by replaying the reference's ops on the candidate's current values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..measure.align import Alignment, TensorPair
from ..measure.analysis import external_inputs
from ..measure.live import LiveRun


@dataclass
class Unit:
    candidate: list[int]
    reference: list[int]


@dataclass
class SubstitutionResult:
    ops: list[str]
    units: list[Unit] = field(metadata={"key": "replaced"})
    before: float  # outputs' error of the candidate replayed as it is
    after: float = field(metadata={"key": "output_error"})  # with the reference's implementation of `ops`


def substitute(live: LiveRun, ops: list[str]) -> SubstitutionResult:
    """The outputs' error with every unit containing one of `ops` (canonical names) taken from the reference."""
    run = live.run
    chosen = set(ops)
    units = [
        u
        for u in _units(run.alignment)
        if any(run.candidate.ops[i].op in chosen for i in u.candidate)
        or any(run.reference.ops[i].op in chosen for i in u.reference)
    ]
    before = run.candidate_output_error(_replay_candidate(live, []))
    after = run.candidate_output_error(_replay_candidate(live, units))
    return SubstitutionResult(sorted(chosen), units, before, after)


def _units(alignment: Alignment) -> list[Unit]:
    units = [Unit([p.candidate], [p.reference]) for p in alignment.pairs]
    units += [
        Unit(list(b.candidate), list(b.reference))
        for b in alignment.blocks
        if b.matched and b.candidate and b.reference
    ]
    return sorted(units, key=lambda u: u.candidate[0])


def _replay_candidate(live: LiveRun, units: list[Unit]) -> dict[str, np.ndarray]:
    """Execute the candidate's trace op by op; `units` are computed by the reference's ops."""
    trace = live.run.candidate
    by_first_op = {u.candidate[0]: u for u in units}
    skipped: set[int] = set()
    values: dict[int, np.ndarray] = {}
    last_read = {tid: readers[-1] for tid, readers in trace.consumers().items()}
    outputs = set(trace.outputs.values())
    for op in trace.ops:
        if op.index in skipped:
            continue
        unit = by_first_op.get(op.index)
        if unit is None:
            values.update(live.replay("candidate", [op.index], values))
        else:  # the candidate's own values first: block internals stay defined
            values.update(live.replay("candidate", unit.candidate, values))
            values.update(_reference_unit(live, unit, values))
            skipped.update(unit.candidate)
        for tid in op.inputs:  # free what no later op reads
            if last_read.get(tid) == op.index and tid not in outputs:
                values.pop(tid, None)
    return {key: values[tid] if tid in values else trace.value(tid) for key, tid in trace.outputs.items()}


def _reference_unit(live: LiveRun, unit: Unit, cand_values: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Replay the unit's reference ops on the candidate's values; return the candidate tensors they define."""
    run = live.run
    reference, alignment = run.reference, run.alignment
    from_candidate: dict[int, TensorPair] = {}
    for pair in alignment.tensors.values():
        if pair.candidate in cand_values:
            from_candidate.setdefault(pair.reference, pair)
    ref_ops = sorted(unit.reference)
    from_candidate_values = {
        tid: from_candidate[tid].candidate_in_reference_layout(
            cand_values[from_candidate[tid].candidate], reference.tensors[tid].shape
        )
        for tid in external_inputs(reference, ref_ops)
        if tid in from_candidate
    }
    ref_values = live.replay("reference", ref_ops, from_candidate_values)
    defined = {}
    for index in unit.candidate:
        for tid in run.candidate.ops[index].outputs:
            pair = alignment.tensors.get(tid)
            if pair is not None and pair.reference in ref_values:
                info = run.candidate.tensors[tid]
                values = pair.reference_in_candidate_layout(ref_values[pair.reference], info.shape)
                defined[tid] = values.astype(cand_values[tid].dtype, copy=False)
    return defined
