"""The search for the culprit, and its result.

1. **Cut search.** F(k) is the outputs' error when the candidate is re-run with the
   reference's tensors patched in for every paired op up to candidate op k (and
   every paired parameter first read by then): what ops after k still add. F falls
   from the full error to ~0 as k grows; a binary search over the paired ops finds
   the entry point k*, the first cut after which less than half of the error is
   left (`--exhaustive` evaluates F at every cut instead). When the candidate's outputs
   hold NaN or Inf (an infinite error), k* is the first cut after which they are finite.
2. **First semantic difference.** Ops up to k* whose local replay is judged
   *different* (see `analysis`) are suspects, in order. Each is tested for reach:
   the reference is re-run with only that op's output replaced by the candidate's
   local output; a difference that does not move the outputs (a masked score, a dead
   branch) is not blamed. The first suspect that reaches is the culprit: `divergent`.
3. Otherwise the run is `noise` and the culprit is the op that amplifies rounding
   the most among the ops carrying a real share of the outputs' error whose own
   (local) rounding reaches the outputs.
4. **Confirmation.** The candidate is re-run with only the culprit (and its
   recurrences) patched; the outputs' error should fall back to noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .align import Alignment
from .analysis import Analysis, OpEvidence, noise_floor
from .run import Run
from .trace import OpNode, Trace, is_floating

ENTRY_FRACTION = 0.5  # k* is where the error left after the cut falls under this share
REACH_FRACTION = 0.1  # a difference reaches the outputs if it alone makes this share of the error
NOISE_REACH_FRACTION = 0.01  # an op's own rounding must make this share of the error to be named
MAX_REACH_TESTS = 8


@dataclass
class Result:
    verdict: str
    output_error: dict[str, float]
    culprit: dict | None
    reruns: int
    ops: dict[str, int]
    entry: int | None = None  # k*
    recurrences: list[dict] = field(default_factory=list)
    confirmation: dict | None = None
    cuts: list[tuple[int, float]] = field(default_factory=list)  # (candidate op, F) evaluated
    not_blamed: list[dict] = field(default_factory=list)  # differences that do not reach the outputs
    profile: list[dict] = field(default_factory=list)
    reference_reruns: int = 0
    nonfinite: dict | None = None  # NaN/Inf in the candidate's outputs: counts and where they start
    alignment: Alignment | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "output_error": self.output_error,
            "culprit": self.culprit,
            "reruns": self.reruns,
            "ops": self.ops,
            "entry": self.entry,
            "recurrences": self.recurrences,
            "confirmation": self.confirmation,
            "not_blamed": self.not_blamed,
            "cuts": [{"op": k, "output_error": f} for k, f in self.cuts],
            "reference_reruns": self.reference_reruns,
            "nonfinite": self.nonfinite,
            "profile": self.profile,
        }


class Search:
    """Re-runs of either side with patches, and the measures the search takes from them."""

    def __init__(self, run: Run, alignment: Alignment, analysis: Analysis):
        self.run = run
        self.alignment = alignment
        self.analysis = analysis
        self.candidate_reruns = 0
        self.reference_reruns = 0
        self.patchable = self._patchable_tensors()
        self._reference_values: dict[int, np.ndarray | None] = {}

    # -- re-runs ---------------------------------------------------------------
    def candidate_error(self, patches: dict[int, np.ndarray]) -> float:
        """Outputs' error (vs the reference) of a candidate re-run with `patches`."""
        self.candidate_reruns += 1
        outputs = self.run.rerun("candidate", patches).outputs
        return self.run.candidate_output_error(outputs)

    def reference_error(self, patches: dict[int, np.ndarray]) -> float:
        """How far a reference re-run with `patches` moves the reference's own outputs."""
        self.reference_reruns += 1
        return self.run.worst_output_error(self.run.rerun("reference", patches).outputs)

    def patches_up_to(self, cut: int) -> dict[int, np.ndarray]:
        """Reference values for every patchable candidate tensor produced or first read by op `cut`."""
        patches = {}
        for position, tid in self.patchable:
            if position > cut:
                break
            if tid not in self._reference_values:  # read once: successive cuts patch overlapping prefixes
                self._reference_values[tid] = self.analysis.reference_values_for(tid)
            values = self._reference_values[tid]
            if values is not None:
                patches[tid] = values
        return patches

    def _patchable_tensors(self) -> list[tuple[int, int]]:
        """(op position, tid) of the paired candidate tensors a cut patches, in op order: the op
        that produced or first read each. Only floating tensors are patched (indices, masks and
        shapes are structure, not values), and no leaf that already holds the reference's values."""
        first_read = _first_reads(self.run.candidate)
        patchable = []
        for tid in self.alignment.tensors:
            info = self.run.candidate.tensors[tid]
            position = info.producer if info.producer is not None else first_read.get(tid)
            leaf = self.analysis.leaves.get(tid)
            if position is None or (info.leaf or "").startswith("input:") or not is_floating(info.dtype) or (leaf and leaf.verdict == "exact"):
                continue
            patchable.append((position, tid))
        return sorted(patchable)

    # -- the search ------------------------------------------------------------
    def entry_point(self, cuts: list[int], full_error: float, exhaustive: bool) -> tuple[int | None, list[tuple[int, float]]]:
        evaluated: dict[int, float] = {}

        def past_entry(position: int) -> bool:
            """Is most of the outputs' error gone when the candidate is patched up to this cut?"""
            if position not in evaluated:
                evaluated[position] = self.candidate_error(self.patches_up_to(cuts[position]))
            if math.isinf(full_error):
                return math.isfinite(evaluated[position])
            return evaluated[position] <= ENTRY_FRACTION * full_error

        if not cuts:
            return None, []
        if exhaustive:
            entry = next((i for i in range(len(cuts)) if past_entry(i)), None)
        elif not past_entry(len(cuts) - 1):
            entry = None
        else:
            low, high = -1, len(cuts) - 1  # not past_entry(low), past_entry(high)
            while high - low > 1:
                middle = (low + high) // 2
                if past_entry(middle):
                    high = middle
                else:
                    low = middle
            entry = high
        trail = [(cuts[i], evaluated[i]) for i in sorted(evaluated)]
        return (cuts[entry] if entry is not None else None), trail

    def reach(self, evidence: OpEvidence) -> float:
        """The outputs' error when only this op's (or block's) own difference enters the reference run."""
        local = self.analysis.local_outputs(evidence.candidate, evidence.reference)
        patches = {}
        for cand_tid, ref_tid in self.analysis.compared_outputs(evidence.candidate, evidence.reference):
            info = self.run.reference.tensors[ref_tid]
            patches[ref_tid] = local[cand_tid].astype(_numpy_dtype(info.dtype), copy=False).reshape(info.shape)
        return self.reference_error(patches)


def _numpy_dtype(dtype: str) -> str:
    return "float32" if dtype == "bfloat16" else dtype


def _first_reads(trace: Trace) -> dict[int, int]:
    first: dict[int, int] = {}
    for op in trace.ops:
        for tid in op.inputs:
            first.setdefault(tid, op.index)
    return first


def bisect_run(run: Run, tolerance: float = 0.0, exhaustive: bool = False,
               progress: Callable[[str], None] | None = None) -> Result:
    """Align, analyse and search a live run (see the module docstring)."""
    say = progress or (lambda message: None)
    say("aligning")
    alignment = run.align()
    say("replaying ops")
    analysis = Analysis(run, alignment).compute()
    output_error = run.output_error()
    full_error = output_error["max_rel"]
    ops = {"reference": len(run.reference.ops), "candidate": len(run.candidate.ops),
           "aligned": len(alignment.aligned_ops("candidate"))}
    profile = [_profile_row(run, e) for e in analysis.in_order()]
    if full_error <= tolerance:
        return Result("match", output_error, None, 0, ops, profile=profile, alignment=alignment)
    nonfinite = nonfinite_start(run, alignment)

    search = Search(run, alignment, analysis)
    say("searching")
    cuts = [e.candidate for e in analysis.in_order() if run.reference.has_value(run.reference.ops[e.reference].outputs[0])]
    entry, trail = search.entry_point(cuts, full_error, exhaustive)
    culprit_evidence, not_blamed = _first_reaching_difference(search, entry, full_error, say)
    recurrences, confirmation = [], None
    if culprit_evidence is not None:
        verdict = "divergent"
        recurrences = _recurrences(analysis, culprit_evidence)
        confirmation = _confirm(search, [culprit_evidence, *recurrences], full_error)
    else:
        verdict = "noise"
        culprit_evidence = _most_amplifying(search, analysis, full_error, entry)
    culprit = _culprit_dict(run, analysis, culprit_evidence) if culprit_evidence else None
    if nonfinite is not None and verdict == "noise":  # NaN/Inf that the reference lacks are not rounding
        verdict, culprit = "divergent", _nonfinite_culprit(run, nonfinite)
    return Result(verdict, output_error, culprit, search.candidate_reruns, ops, entry,
                  [_site(run, r) for r in recurrences], confirmation, trail, not_blamed, profile,
                  search.reference_reruns, nonfinite and _nonfinite_dict(run, nonfinite), alignment)


@dataclass
class NonFiniteStart:
    """Where the candidate's NaN/Inf (absent from the reference) start."""

    tid: int  # the first such tensor: an op output, or a leaf (a NaN parameter)
    op: OpNode | None  # the candidate op that produced it, or the first that read the leaf (None: no op did)
    reference_op: OpNode | None  # the reference op whose finite output it stands against


def nonfinite_start(run: Run, alignment: Alignment) -> NonFiniteStart | None:
    """None when the candidate's outputs are finite. Otherwise: the first candidate tensor, in op order,
    holding more NaN/Inf than its reference partner (so a -inf mask both sides build is passed over),
    or the first non-finite output when no paired tensor does; then back through unpaired non-finite
    inputs (an N:M block such as exp/sum/div against softmax) to the op that made them from finite ones."""
    candidate, reference = run.candidate, run.reference
    outputs = {pair.candidate: pair.reference for pair in run.output_pairs()}
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


def _nonfinite_dict(run: Run, start: NonFiniteStart) -> dict:
    outputs = [run.candidate.tensors[pair.candidate] for pair in run.output_pairs()]
    info = run.candidate.tensors[start.tid]
    first = None if start.op is None else {"leaf": info.leaf if info.producer is None else None, **_side(start.op)}
    return {"nan": sum(int(o.stats.get("nan", 0)) for o in outputs), "inf": sum(int(o.stats.get("inf", 0)) for o in outputs),
            "first": first}


def _nonfinite_culprit(run: Run, start: NonFiniteStart) -> dict[str, Any] | None:
    """The culprit when no op's evidence names one: where the NaN/Inf start (no replay evidence).
    None when either side has no op to show (an output that is an input or parameter)."""
    if start.op is None or start.reference_op is None:
        return None
    info = run.candidate.tensors[start.tid]
    leaf = info.leaf.split(":", 1)[1] if info.producer is None and info.leaf else None
    return {"kind": "leaf" if leaf else "op", "op": start.op.op, "candidate": _side(start.op),
            "reference": _side(start.reference_op), "leaf": leaf,
            "input_error": None, "output_error": math.inf, "output_error_rel": math.inf, "input_error_rel": None,
            "local_error": None, "amplification": None, "verdict": "different", "fp64": None, "block": None}


def _first_reaching_difference(search: Search, entry: int | None, full_error: float,
                               say: Callable[[str], None]) -> tuple[OpEvidence | None, list[dict]]:
    """The first op up to the entry point judged different whose own difference moves the
    outputs; and the differences that were tested and do not (not blamed)."""
    run = search.run
    limit = entry if entry is not None else len(run.candidate.ops)
    reach_needed = max(REACH_FRACTION * full_error, noise_floor(run.candidate.dtype))
    suspects = [e for e in search.analysis.in_order() if e.verdict == "different" and e.candidate <= limit]
    not_blamed = []
    for evidence in suspects[:MAX_REACH_TESTS]:
        say(f"testing op {evidence.candidate}")
        reached = search.reach(evidence)
        if reached >= reach_needed:
            return evidence, not_blamed
        not_blamed.append({"index": evidence.candidate, "op": evidence.op, "reaches": reached})
    return None, not_blamed


def _confirm(search: Search, patched: list[OpEvidence], before: float) -> dict:
    """Re-run the candidate with only these ops' outputs taken from the reference."""
    indices = [e.candidate for e in patched]
    after = search.candidate_error(op_patches(search.analysis, search.run, indices))
    return {"patched_ops": indices, "output_error": after, "before": before}


def op_patches(analysis: Analysis, run: Run, op_indices: list[int]) -> dict[int, np.ndarray]:
    """Reference values for the outputs of these candidate ops (all that a block hands on, for an op completing one)."""
    patches = {}
    for index in op_indices:
        block = analysis.blocks.get(index)
        outputs = run.candidate.ops[index].outputs if block is None else \
            [c for c, _ in analysis.compared_outputs(index, analysis.ops[index].reference)]
        for tid in outputs:
            values = analysis.reference_values_for(tid)
            if values is not None:
                patches[tid] = values
    return patches


def _recurrences(analysis: Analysis, culprit: OpEvidence) -> list[OpEvidence]:
    """Later ops with the same canonical op whose own replay is also judged different."""
    return [e for e in analysis.in_order()
            if e.candidate != culprit.candidate and e.verdict == "different" and e.op == culprit.op]


def _most_amplifying(search: Search, analysis: Analysis, full_error: float, entry: int | None) -> OpEvidence | None:
    """The op amplifying rounding the most among those where the two frameworks' kernels
    really differ (not bit-equal on equal inputs) and whose own rounding reaches the
    outputs. An exact op's large amplification (a -1e4 mask add, rounded at magnitude
    1e4, then zeroed by a softmax) is passed over."""
    candidates = sorted((e for e in analysis.ops.values()
                         if e.verdict == "noise" and e.output_error["max_rel"] >= REACH_FRACTION * full_error
                         and math.isfinite(e.amplification) and e.amplification > 0),
                        key=lambda e: (-e.amplification, e.candidate))
    for evidence in candidates[:MAX_REACH_TESTS]:
        if search.reach(evidence) >= NOISE_REACH_FRACTION * full_error:
            return evidence
    return analysis.ops.get(entry) if entry is not None else None


def _site(run: Run, evidence: OpEvidence) -> dict:
    return {"index": evidence.candidate, "op": evidence.op,
            "module": run.candidate.ops[evidence.candidate].module,
            "source": run.candidate.ops[evidence.candidate].source,
            "local_error": evidence.local_error}


def _side(op: OpNode) -> dict:
    return {"index": op.index, "op": op.framework_op, "module": op.module, "source": op.source}


def _culprit_dict(run: Run, analysis: Analysis, evidence: OpEvidence) -> dict[str, Any]:
    cand_op = run.candidate.ops[evidence.candidate]
    different_leaves = [analysis.leaves[t] for t in cand_op.inputs
                        if t in analysis.leaves and analysis.leaves[t].verdict == "different"]
    leaf = different_leaves[0].candidate.split(":", 1)[1] if different_leaves else None
    return {
        "kind": "leaf" if leaf else "op",
        "op": evidence.op,
        "candidate": _side(cand_op),
        "reference": _side(run.reference.ops[evidence.reference]),
        "leaf": leaf,
        "input_error": evidence.input_error,
        "output_error": evidence.output_error["max_abs"],
        "output_error_rel": evidence.output_error["max_rel"],
        "input_error_rel": evidence.input_error_rel,
        "local_error": evidence.local_error,
        "amplification": evidence.amplification,
        "verdict": evidence.verdict,
        "fp64": evidence.fp64,
        "block": {"candidate": evidence.block.candidate, "reference": evidence.block.reference} if evidence.block else None,
    }


def _profile_row(run: Run, evidence: OpEvidence) -> dict:
    return {"index": evidence.candidate, "reference": evidence.reference, "op": evidence.op,
            "module": run.candidate.ops[evidence.candidate].module,
            "output_error": evidence.output_error["max_rel"], "max_abs": evidence.output_error["max_abs"],
            "mean_abs": evidence.output_error["mean_abs"], "local_error": evidence.local_error,
            "verdict": evidence.verdict, "amplification": evidence.amplification}
