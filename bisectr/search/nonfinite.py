"""Where NaN or Inf in the candidate's outputs start, read from the recorded traces: they are never
rounding, so the op (or leaf) that made them from finite values is the culprit when no replay names one."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..measure.align import Alignment
from ..measure.runrecord import RunRecord
from ..measure.result import Culprit, NonFinite, NonFiniteSite
from .core import culprit_without_evidence, site
from ..capture.trace import OpNode
from ..leafref import leaf_name


@dataclass
class NonFiniteStart:
    """Where the candidate's NaN/Inf (absent from the reference) start."""

    tid: int  # the first such tensor: an op output, or a leaf (a NaN parameter)
    op: OpNode | None  # the candidate op that produced it, or the first that read the leaf (None: no op did)
    reference_op: OpNode | None  # the reference op whose finite output it stands against


def nonfinite_start(run: RunRecord, alignment: Alignment) -> NonFiniteStart | None:
    """None when the candidate's outputs are finite. Otherwise: the first candidate tensor, in op order,
    holding more NaN/Inf than its reference partner (so a -inf mask both sides build is passed over),
    or the first non-finite output when no paired tensor does; then back through unpaired non-finite
    inputs (an N:M block such as exp/sum/div against softmax) to the op that made them from finite ones."""
    candidate, reference = run.candidate, run.reference
    outputs = {pair.candidate: pair.reference for pair in run.output_pairs}
    if not any(candidate.tensors[tid].nonfinite for tid in outputs):
        return None

    def excess(tid: int) -> bool:
        pair = alignment.tensors.get(tid)
        return pair is not None and candidate.tensors[tid].nonfinite > reference.tensors[pair.reference].nonfinite

    flagged = next(((tid, op) for op in candidate.ops for tid in op.inputs + op.outputs if excess(tid)), None)
    if flagged is None:
        tid = next(t for t in outputs if candidate.tensors[t].nonfinite)
        flagged = (tid, candidate.producer_op(tid))
    tid, op = flagged
    partner = alignment.tensors[tid].reference if tid in alignment.tensors else outputs.get(tid)
    while candidate.tensors[tid].producer is not None:
        op = candidate.ops[candidate.tensors[tid].producer]
        upstream = next((t for t in op.inputs if t not in alignment.tensors and candidate.tensors[t].nonfinite), None)
        if upstream is None:
            break
        tid = upstream
    reference_op = None if partner is None else reference.producer_op(partner)
    return NonFiniteStart(tid, op, reference_op)


def nonfinite_summary(run: RunRecord, start: NonFiniteStart) -> NonFinite:
    outputs = [run.candidate.tensors[pair.candidate] for pair in run.output_pairs]
    info = run.candidate.tensors[start.tid]
    first = (
        None
        if start.op is None
        else NonFiniteSite(**vars(site(start.op)), leaf=info.leaf if info.producer is None else None)
    )
    return NonFinite(sum(o.stats.nan for o in outputs), sum(o.stats.inf for o in outputs), first)


def nonfinite_culprit(run: RunRecord, start: NonFiniteStart) -> Culprit | None:
    """The culprit when no op's evidence names one: where the NaN/Inf start (no replay evidence).
    None when either side has no op to show (an output that is an input or parameter)."""
    if start.op is None or start.reference_op is None:
        return None
    info = run.candidate.tensors[start.tid]
    leaf = leaf_name(info.leaf) if info.producer is None and info.leaf else None
    return culprit_without_evidence("leaf" if leaf else "op", start.op, start.reference_op, leaf, math.inf)
