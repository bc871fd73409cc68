"""The hierarchical search of a big model: layer outputs first, op values only where the difference enters.

A run recorded with a value budget (`trace(value_budget=...)`) stores the op outputs of the forward's
first ops only, and the statistics of every op. Its forward search goes in two steps:

1. **Layers.** The unpatched re-run that checks each side reproduces its recording also fetches its
   layer boundaries: the tensors a numbered layer (`h.6`, `encoder.layer.3`) hands to ops outside it,
   and those the model's other ops hand to a layer. The cut search over them (`search.entry_point`)
   brackets the difference between two boundaries, asking first the boundary whose error grows most
   past every earlier one's (no op inside a layer has evidence yet).
2. **The window.** The op values of the ops between those boundaries, with the whole of each layer
   they touch, are fetched by one more re-run of each side, and so are those of the ops elsewhere
   that may carry the same difference as an op of the window (the same op of the same layer class);
   the search then runs on them as on a fully stored run.

Fetched values live in the traces (`Trace.fetched`) and are stored with the run when it is saved.
Where the window gives no confirmed culprit, and for rounding (judged on every op), the caller
fetches everything (`fetch_all`) and searches again.
"""

from __future__ import annotations

from typing import Iterable

from ..measure.align import settle_layouts
from ..measure.analysis import Analysis
from ..measure.runrecord import RunRecord
from .core import same_place
from ..measure.live import LiveRun
from ..capture.store import SIDES
from ..capture.trace import Trace, is_floating


def needs_window(run: RunRecord) -> bool:
    """Are paired op outputs missing their values (a run recorded with a value budget)?"""
    return any(not run.traces[role].has_value(tid) for role in SIDES for tid in _paired_outputs(run, role))


def layer_of(module: str) -> str:
    """The numbered layer a module path is in (`h.6` for `h.6.mlp.act`), or "" outside any."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ""


def boundaries(trace: Trace) -> set[int]:
    """Floating op outputs that cross a layer's edge: made in one layer (or outside all) and read in
    another (or outside all), and the model's outputs."""
    layer = {op.index: layer_of(op.module) for op in trace.ops}
    crossing = set(trace.outputs.values())
    for op in trace.ops:
        for tid in op.inputs:
            producer = trace.tensors[tid].producer
            if producer is not None and layer[producer] != layer[op.index]:
                crossing.add(tid)
    return {
        tid for tid in crossing if trace.tensors[tid].producer is not None and is_floating(trace.tensors[tid].dtype)
    }


def window_ops(trace: Trace, first: int, last: int) -> list[int]:
    """Ops `first`..`last`, with every op of each numbered layer among them."""
    layers = {layer_of(trace.ops[i].module) for i in range(first, last + 1)} - {""}
    return sorted(set(range(first, last + 1)) | {op.index for op in trace.ops if layer_of(op.module) in layers})


def tensors_of(trace: Trace, ops: Iterable[int]) -> set[int]:
    """The op outputs that ops `ops` make or read."""
    tids = set()
    for index in ops:
        op = trace.ops[index]
        tids.update(op.outputs)
        tids.update(t for t in op.inputs if trace.tensors[t].producer is not None)
    return tids


def missing(trace: Trace, tids: Iterable[int]) -> frozenset[int]:
    return frozenset(tid for tid in tids if not trace.has_value(tid))


def fetch(live: LiveRun, role: str, tids: Iterable[int]) -> bool:
    """Values of the op outputs `tids` the side's trace lacks, by a re-run of the side. Did it lack any?"""
    trace = live.run.traces[role]
    wanted = missing(trace, tids)
    if wanted:
        trace.fetched.update(live.rerun(role, {}, wanted).captured)
    return bool(wanted)


def window_between(run: RunRecord, partner: dict[int, int], low: int | None, entry: int | None) -> dict[str, list[int]]:
    """Each side's window: the candidate's ops after cut `low` up to the entry point `entry` (to
    the end without one), the reference's from the `partner` (candidate op -> reference op) of
    `low` to that of `entry`, each widened to whole layers (see `window_ops`)."""
    bounds = {
        "candidate": ((low + 1) if low is not None else 0, entry if entry is not None else len(run.candidate.ops) - 1)
    }
    ref_low = partner.get(low, -1) if low is not None else -1
    ref_high = partner.get(entry, len(run.reference.ops) - 1) if entry is not None else len(run.reference.ops) - 1
    bounds["reference"] = (ref_low + 1, max(ref_high, ref_low + 1))
    return {role: window_ops(run.traces[role], *bounds[role]) for role in SIDES}


def fetch_values(live: LiveRun, wanted: dict[str, Iterable[int]]) -> bool:
    """Values of the op outputs `wanted` (role -> tids) that the run lacks, by a re-run of each side that
    lacks any; the layouts of the tensors paired inside blocks are then decided on them. Were any fetched?"""
    run = live.run
    fetched = [fetch(live, role, wanted[role]) for role in SIDES]
    if any(fetched):
        settle_layouts(run.reference, run.candidate, run.alignment)
    return any(fetched)


def fetch_window(live: LiveRun, window: dict[str, list[int]]) -> None:
    fetch_values(live, {role: tensors_of(live.run.traces[role], window[role]) for role in SIDES})


def fetch_recurrences(live: LiveRun, analysis: Analysis, window: dict[str, list[int]]) -> bool:
    """Fetch what the evidence reads (`Analysis.evidence_tensors`) of every op outside the window that
    may carry the same difference as an op of the window judged different: the same op from the same
    place (`search.same_place`), so that a difference in every layer is found in every layer. Were
    any fetched?"""
    run, inside = live.run, set(window["candidate"])
    different = [e for e in analysis.ops.values() if e.candidate in inside and e.verdict == "different"]
    wanted: dict[str, set[int]] = {role: set() for role in SIDES}
    for evidence in analysis.ops.values():
        if evidence.candidate in inside:
            continue
        op = run.candidate.ops[evidence.candidate]
        if any(evidence.op == d.op and same_place(op, run.candidate.ops[d.candidate]) for d in different):
            for role, tids in zip(
                ("candidate", "reference"), analysis.evidence_tensors(evidence.candidate, evidence.reference)
            ):
                wanted[role].update(tid for tid in tids if run.traces[role].tensors[tid].producer is not None)
    return fetch_values(live, wanted)


def fetch_all(live: LiveRun) -> None:
    traces = live.run.traces
    fetch_values(live, {role: tensors_of(traces[role], range(len(traces[role].ops))) for role in SIDES})


def _paired_outputs(run: RunRecord, role: str) -> Iterable[int]:
    if role == "candidate":
        return run.alignment.tensors.keys()
    return (pair.reference for pair in run.alignment.tensors.values())
