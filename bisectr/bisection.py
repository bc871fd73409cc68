"""The search for the culprit, and its result.

0. **Reproducibility.** Each side is re-run once, unpatched: a model whose outputs move
   (dropout in training mode, random ops) is refused before any verdict.
1. **Cut search.** F(k) is the outputs' error when the candidate is re-run with the
   reference's tensors patched in for every paired op up to candidate op k (and
   every paired parameter first read by then): what ops after k still add. F falls
   from the full error to ~0 as k grows; a binary search over the paired ops finds
   the entry point k*, the first cut after which less than half of the error is
   left (`--exhaustive` evaluates F at every cut instead). When the candidate's outputs
   hold NaN or Inf (an infinite error), k* is the first cut after which they are finite.
   The ops between the cut before k* and k* are the bracket: where the error enters.
2. **Float64 check** (`precision`): both sides run in float64. If they agree there, the
   difference is rounding and the run is `noise`.
3. **First semantic difference.** Suspects, in order: ops up to k* whose local replay is
   judged *different* (see `analysis`), then the bracket itself when it holds ops that have
   no partner (an activation changed for another), judged as one block. Each is tested for
   reach: the reference is re-run with only that suspect's own difference in it; one that
   does not move the outputs (a masked score, a dead branch) is not blamed. A suspect that
   reaches must then be **confirmed**: the candidate re-run with only its own difference
   taken out (its outputs shifted by reference output minus local replay; then with its
   recurrences too) must bring the outputs' error down to rounding. A patch that makes the
   error worse contradicts the pairing; one that leaves it unconfirmed lets the search go on.
   The first confirmed suspect is the culprit: `divergent`.
4. When nothing confirms but a suspect reaches, or the float64 outputs still disagree, the
   run is `divergent` and unconfirmed, and the bracket says where the difference lies.
5. Otherwise the run is `noise` and the culprit is the op that amplifies rounding the most
   among the ops carrying a real share of the outputs' error whose own (local) rounding
   reaches the outputs.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .align import Alignment, Block
from .analysis import NOISE_FACTOR, Analysis, OpEvidence, computing_op, noise_floor
from .errors import TraceMismatchError
from .precision import float64_check
from .record import RunRecord
from .result import (BlockOps, Bracket, Confirmation, Culprit, Cut, NonFinite, NonFiniteSite, NotBlamed, OpSite,
                     ProfileRow, Recurrence, Result)
from .sides import Sides
from .store import SIDES
from .trace import OpNode, is_floating

ENTRY_FRACTION = 0.5  # k* is where the error left after the cut falls under this share
REACH_FRACTION = 0.1  # a difference reaches the outputs if it alone makes this share of the error
NOISE_REACH_FRACTION = 0.01  # an op's own rounding must make this share of the error to be named
CONFIRM_FRACTION = 0.1  # a confirmation takes the outputs' error under this share of it (or down to rounding)
MAX_REACH_TESTS = 8
RERUN_SLACK = 3  # candidate re-runs stay within ceil(log2 ops) + this


class Search:
    """Re-runs of either side with patches, and the measures the search takes from them."""

    def __init__(self, run: RunRecord, sides: Sides, analysis: Analysis):
        self.run = run
        self.sides = sides
        self.alignment = run.alignment
        self.analysis = analysis
        self.candidate_reruns = 0
        self.reference_reruns = 0
        self.patchable = self._patchable_tensors()
        self._reference_values: dict[int, np.ndarray | None] = {}

    # -- re-runs ---------------------------------------------------------------
    def candidate_error(self, patches: dict[int, np.ndarray]) -> float:
        """Outputs' error (vs the reference) of a candidate re-run with `patches`."""
        self.candidate_reruns += 1
        outputs = self.sides.rerun("candidate", patches).outputs
        return self.run.candidate_output_error(outputs)

    def reference_error(self, patches: dict[int, np.ndarray]) -> float:
        """How far a reference re-run with `patches` moves the reference's own outputs."""
        self.reference_reruns += 1
        return self.run.worst_output_error(self.sides.rerun("reference", patches).outputs)

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
        first_read = self.run.candidate.first_reads()
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

        entry = first_past(len(cuts), past_entry, exhaustive)
        trail = [(cuts[i], evaluated[i]) for i in sorted(evaluated)]
        return (cuts[entry] if entry is not None else None), trail

    def reach(self, evidence: OpEvidence) -> float:
        """The outputs' error when only this op's (or block's) own difference enters the reference run."""
        local = self.analysis.local_outputs(evidence.candidate, evidence.reference, evidence.block)
        patches = {}
        for cand_tid, ref_tid in self.analysis.compared_outputs(evidence.candidate, evidence.reference, evidence.block):
            info = self.run.reference.tensors[ref_tid]
            values = self.analysis.in_reference_layout(cand_tid, ref_tid, local[cand_tid])
            patches[ref_tid] = values.astype(_numpy_dtype(info.dtype), copy=False)
        return self.reference_error(patches)


def first_past(count: int, past: Callable[[int], bool], exhaustive: bool) -> int | None:
    """The first of positions 0..count-1 for which `past` holds, assuming that once it holds it keeps
    holding: by binary search, or asking every position in turn when `exhaustive`. None if none does."""
    if exhaustive:
        return next((i for i in range(count) if past(i)), None)
    if count == 0 or not past(count - 1):
        return None
    low, high = -1, count - 1  # not past(low), past(high)
    while high - low > 1:
        middle = (low + high) // 2
        if past(middle):
            high = middle
        else:
            low = middle
    return high


def _numpy_dtype(dtype: str) -> str:
    return "float32" if dtype == "bfloat16" else dtype


def bisect_run(run: RunRecord, sides: Sides, tolerance: float = 0.0, exhaustive: bool = False,
               progress: Callable[[str], None] | None = None) -> Result:
    """Check, analyse and search a run through its live sides (see the module docstring)."""
    say = progress or (lambda message: None)
    say("re-running each side unpatched")
    check_reproducible(run, sides)
    alignment = run.alignment
    say("replaying ops")
    analysis = Analysis(run, sides).compute()
    output_error = run.output_error()
    full_error = output_error["max_rel"]
    ops = {"reference": len(run.reference.ops), "candidate": len(run.candidate.ops),
           "aligned": len(alignment.aligned_ops("candidate"))}
    profile = [_profile_row(run, e) for e in analysis.in_order()]
    if full_error <= tolerance:
        return Result("match", output_error, None, 0, ops, profile=profile)
    nonfinite = nonfinite_start(run, alignment)
    say("running both sides in float64")
    float64 = float64_check(run, sides)

    search = Search(run, sides, analysis)
    say("searching")
    cuts = [e.candidate for e in analysis.in_order() if run.reference.has_value(run.reference.ops[e.reference].outputs[0])]
    entry, trail = search.entry_point(cuts, full_error, exhaustive)
    region = _entry_region(analysis, entry)
    finding = Finding()
    if float64.status != "agree":
        rounding = NOISE_FACTOR * float64.predicted if float64.predicted is not None else 0.0
        finding = _first_confirmed_difference(search, cuts, entry, region, full_error, rounding, say)
    bracket = None
    if finding.confirmed:
        verdict, culprit_evidence = "divergent", finding.evidence
    elif finding.evidence is not None or float64.status == "disagree" or nonfinite is not None:
        verdict, culprit_evidence = "divergent", finding.evidence
        bracket = _bracket(run, analysis, region, cuts, entry)
    else:
        verdict, culprit_evidence = "noise", _most_amplifying(search, analysis, full_error, entry)
    culprit = _culprit(run, analysis, culprit_evidence) if culprit_evidence else None
    if nonfinite is not None and culprit is None:  # NaN/Inf that the reference lacks are not rounding
        culprit = _nonfinite_culprit(run, nonfinite)
    return Result(verdict, output_error, culprit, search.candidate_reruns, ops, entry,
                  recurrences=[_recurrence(run, r) for r in finding.recurrences], confirmation=finding.confirmation,
                  not_blamed=finding.not_blamed, cuts=[Cut(op, error) for op, error in trail],
                  reference_reruns=search.reference_reruns,
                  nonfinite=_nonfinite(run, nonfinite) if nonfinite is not None else None,
                  fp64_check=float64, bracket=bracket, profile=profile)


def check_reproducible(run: RunRecord, sides: Sides) -> None:
    """Refuse a model whose unpatched re-run does not reproduce its recording: a random
    difference (dropout in training mode, random ops) is neither a bug nor rounding."""
    for role in SIDES:
        try:
            sides.rerun(role, {})
        except TraceMismatchError as exc:
            raise TraceMismatchError(f"{run.model_file}: the {role} side does not reproduce its own outputs when run "
                                     f"twice, so no verdict can be given: {exc} If the model has dropout, put it in "
                                     "eval mode (model.eval()) in the model file.") from None


@dataclass
class Finding:
    """The first suspect whose own difference reaches the outputs (confirmed or not), and what was tried."""

    evidence: OpEvidence | None = None
    recurrences: list[OpEvidence] = field(default_factory=list)
    confirmation: Confirmation | None = None
    not_blamed: list[NotBlamed] = field(default_factory=list)

    @property
    def confirmed(self) -> bool:
        return bool(self.confirmation and self.confirmation.confirmed)


def _entry_region(analysis: Analysis, entry: int | None) -> Block | None:
    """The entry op with the ops without a partner that feed it (through such ops only), on both
    sides: an activation changed for another, an extra scale, a missing op. None without an entry
    point, or when every op feeding the entry op has a partner."""
    if entry is None:
        return None
    alignment = analysis.alignment
    regions = {}
    for role, index in (("candidate", entry), ("reference", analysis.ops[entry].reference)):
        trace, aligned = analysis.run.traces[role], alignment.aligned_ops(role)
        region, pending = {index}, list(trace.ops[index].inputs)
        while pending:
            producer = trace.tensors[pending.pop()].producer
            if producer is not None and producer not in aligned and producer not in region:
                region.add(producer)
                pending.extend(trace.ops[producer].inputs)
        regions[role] = sorted(region)
    if len(regions["candidate"]) == len(regions["reference"]) == 1:
        return None
    return Block(regions["candidate"], regions["reference"], matched=True)


def _suspects(analysis: Analysis, cuts: list[int], entry: int | None, region: Block | None) -> list[OpEvidence]:
    """Paired ops (and matched blocks) judged different up to the entry point. The cut search says
    most of the error enters between the cut before the entry point and the entry point, so the
    ones there come first, then the entry region as one block (when judged different), then the
    earlier ones, in order."""
    limit = entry if entry is not None else len(analysis.run.candidate.ops)
    low = _cut_before(cuts, entry)
    different = [e for e in analysis.in_order() if e.verdict == "different" and e.candidate <= limit]
    inside = [e for e in different if low is None or e.candidate > low]
    if region is not None:
        evidence = analysis.evidence(entry, analysis.ops[entry].reference, region)
        if evidence.verdict == "different":
            inside.append(evidence)
    return inside + [e for e in different if low is not None and e.candidate <= low]


def _cut_before(cuts: list[int], entry: int | None) -> int | None:
    """The last cut before the entry point (the last cut of all without one); None if there is none."""
    position = cuts.index(entry) if entry is not None else len(cuts)
    return cuts[position - 1] if position > 0 else None


def _first_confirmed_difference(search: Search, cuts: list[int], entry: int | None, region: Block | None,
                                full_error: float, rounding: float, say: Callable[[str], None]) -> Finding:
    """The first suspect whose own difference moves the outputs and whose removal confirms it; else
    the first that moves them, unconfirmed. What was tested and does not reach is not blamed."""
    run, analysis = search.run, search.analysis
    reach_needed = max(REACH_FRACTION * full_error, noise_floor(run.candidate.dtype))
    finding = Finding()
    # Confirmations keep the search within its re-run budget, but get two re-runs at least (the suspect
    # alone, then with its recurrences) after an exhaustive cut search.
    budget = max(math.ceil(math.log2(max(len(run.candidate.ops), 2))) + RERUN_SLACK, search.candidate_reruns + 2)
    for evidence in _suspects(analysis, cuts, entry, region)[:MAX_REACH_TESTS]:
        if search.candidate_reruns >= budget:  # what is left untested stays in the bracket
            break
        say(f"testing op {evidence.candidate}")
        reached = search.reach(evidence)
        if reached < reach_needed:
            finding.not_blamed.append(NotBlamed(evidence.candidate, evidence.op, reached))
            continue
        recurrences = _recurrences(analysis, evidence)
        confirmation = _confirm(search, [evidence], full_error, rounding)
        if not confirmation.confirmed and recurrences:
            confirmation = _confirm(search, [evidence, *recurrences], full_error, rounding)
        if confirmation.confirmed:
            return Finding(evidence, recurrences, confirmation, finding.not_blamed)
        if confirmation.output_error >= full_error:  # the values contradict the pairing
            finding.not_blamed.append(NotBlamed(evidence.candidate, evidence.op, reached, confirmation.output_error))
        elif finding.evidence is None:
            finding.evidence, finding.confirmation = evidence, confirmation
    return finding


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


def _nonfinite(run: RunRecord, start: NonFiniteStart) -> NonFinite:
    outputs = [run.candidate.tensors[pair.candidate] for pair in run.output_pairs]
    info = run.candidate.tensors[start.tid]
    first = None if start.op is None else NonFiniteSite(**vars(_site(start.op)), leaf=info.leaf if info.producer is None else None)
    return NonFinite(sum(int(o.stats.get("nan", 0)) for o in outputs), sum(int(o.stats.get("inf", 0)) for o in outputs), first)


def _nonfinite_culprit(run: RunRecord, start: NonFiniteStart) -> Culprit | None:
    """The culprit when no op's evidence names one: where the NaN/Inf start (no replay evidence).
    None when either side has no op to show (an output that is an input or parameter)."""
    if start.op is None or start.reference_op is None:
        return None
    info = run.candidate.tensors[start.tid]
    leaf = info.leaf.split(":", 1)[1] if info.producer is None and info.leaf else None
    return Culprit("leaf" if leaf else "op", start.op.op, _site(start.op), _site(start.reference_op), leaf,
                   input_error=None, output_error=math.inf, output_error_rel=math.inf, input_error_rel=None,
                   local_error=None, amplification=None, verdict="different", fp64=None)


def _confirm(search: Search, patched: list[OpEvidence], before: float, rounding: float) -> Confirmation:
    """Re-run the candidate with only these ops' (or blocks') own differences taken out. Confirmed
    when the outputs' error falls under a tenth of what it was, or to what rounding explains, and
    in any case under half; for NaN/Inf outputs, when they become finite."""
    after = search.candidate_error(own_difference_patches(search.analysis, search.run, patched))
    if math.isinf(before):
        confirmed = math.isfinite(after)
    else:
        confirmed = after <= max(CONFIRM_FRACTION * before, rounding) and after < ENTRY_FRACTION * before
    return Confirmation([e.candidate for e in patched], after, before, confirmed)


def own_difference_patches(analysis: Analysis, run: RunRecord, evidences: list[OpEvidence]) -> dict[int, np.ndarray]:
    """For each op (or block), what it hands on with its own difference taken out: its candidate
    outputs shifted by (reference output - the candidate op replayed on the reference's inputs).
    Unlike patching in the reference's values, this leaves the error that reached the op from
    upstream in place, so it fixes nothing the op did not add."""
    patches = {}
    for evidence in evidences:
        local = analysis.local_outputs(evidence.candidate, evidence.reference, evidence.block)
        for cand_tid, _ in analysis.compared_outputs(evidence.candidate, evidence.reference, evidence.block):
            reference = analysis.reference_values_for(cand_tid)
            if reference is None:
                continue
            info = run.candidate.tensors[cand_tid]
            with np.errstate(invalid="ignore", over="ignore"):
                shifted = run.candidate.value(cand_tid) + (reference - local[cand_tid].reshape(reference.shape))
            # Where the op itself made NaN/Inf, taking its own difference out leaves the reference's value.
            shifted = np.where(np.isfinite(shifted), shifted, reference)
            patches[cand_tid] = shifted.astype(_numpy_dtype(info.dtype), copy=False)
    return patches


def op_patches(analysis: Analysis, run: RunRecord, op_indices: list[int]) -> dict[int, np.ndarray]:
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
    """Later ops carrying the same difference: the same canonical op from the same line of user code
    (or, where the line is the library's, the same module up to layer numbers), also judged different."""
    def code_site(evidence: OpEvidence) -> str:
        op = analysis.run.candidate.ops[evidence.candidate]
        if op.source and not op.library_source:
            return op.source
        return f"{re.sub(r'[0-9]+', '#', op.module)} {op.source}"  # one library line serves every layer

    site = code_site(culprit)
    return [e for e in analysis.in_order() if e.candidate > culprit.candidate and e.verdict == "different"
            and e.op == culprit.op and code_site(e) == site]


def _most_amplifying(search: Search, analysis: Analysis, full_error: float, entry: int | None) -> OpEvidence | None:
    """The op amplifying rounding the most (its output's absolute error the largest multiple of
    its inputs') among those whose output carries a real share of the outputs' error and whose
    own rounding reaches the outputs. An op whose kernels agree bitwise (exact) has no rounding of
    its own and counts only where it makes a model output, as seed 004's span matmul does on CPUs
    where both frameworks' GEMMs agree: nothing downstream can undo its growth. Elsewhere an exact
    op's large amplification (a -1e4 mask add, rounded at magnitude 1e4, then zeroed by a softmax)
    is passed over."""
    outputs = {pair.candidate for pair in search.run.output_pairs}

    def makes_output(evidence: OpEvidence) -> bool:
        return search.run.candidate.ops[evidence.candidate].outputs[0] in outputs

    candidates = sorted((e for e in analysis.ops.values()
                         if (e.verdict == "noise" or (e.verdict == "exact" and makes_output(e)))
                         and e.output_error["max_rel"] >= REACH_FRACTION * full_error
                         and math.isfinite(e.amplification) and e.amplification > 0),
                        key=lambda e: (-e.amplification, e.candidate))
    for evidence in candidates[:MAX_REACH_TESTS]:
        if evidence.verdict == "exact" or search.reach(evidence) >= NOISE_REACH_FRACTION * full_error:
            return evidence
    return analysis.ops.get(entry) if entry is not None else None


def _recurrence(run: RunRecord, evidence: OpEvidence) -> Recurrence:
    op = run.candidate.ops[evidence.candidate]
    return Recurrence(evidence.candidate, evidence.op, op.module, op.source, evidence.local_error)


def _bracket(run: RunRecord, analysis: Analysis, region: Block | None, cuts: list[int], entry: int | None) -> Bracket:
    """Where an unconfirmed difference enters: the cut before the entry point and the entry point,
    and the ops from one to the other (with the entry region's), on both sides. Without an entry
    point: everything after the last cut."""
    def sites(role: str, after: int, upto: int, extra: list[int]) -> list[OpSite]:
        return [_site(run.traces[role].ops[i]) for i in sorted(set(range(after + 1, upto + 1)).union(extra))]

    low = _cut_before(cuts, entry)
    ref_low = analysis.ops[low].reference if low is not None else -1
    cand_high, ref_high = (entry, analysis.ops[entry].reference) if entry is not None else \
        (len(run.candidate.ops) - 1, len(run.reference.ops) - 1)
    return Bracket(low, entry, sites("candidate", low if low is not None else -1, cand_high, region.candidate if region else []),
                   sites("reference", ref_low, ref_high, region.reference if region else []))


def _site(op: OpNode) -> OpSite:
    return OpSite(op.index, op.framework_op, op.module, op.source)


def _culprit(run: RunRecord, analysis: Analysis, evidence: OpEvidence) -> Culprit:
    cand_op = run.candidate.ops[evidence.candidate]
    different_leaves = [analysis.leaves[t] for t in cand_op.inputs
                        if t in analysis.leaves and analysis.leaves[t].verdict == "different"]
    leaf = different_leaves[0].candidate.split(":", 1)[1] if different_leaves else None
    cand_index, ref_index = evidence.candidate, evidence.reference
    if evidence.block is not None:  # a block is shown at the op it is named after, on both sides
        cand_index = computing_op(run.candidate, evidence.block.candidate)
        ref_index = computing_op(run.reference, evidence.block.reference)
    return Culprit("leaf" if leaf else "op", evidence.op, _site(run.candidate.ops[cand_index]),
                   _site(run.reference.ops[ref_index]), leaf,
                   input_error=evidence.input_error, output_error=evidence.output_error["max_abs"],
                   output_error_rel=evidence.output_error["max_rel"], input_error_rel=evidence.input_error_rel,
                   local_error=evidence.local_error, amplification=evidence.amplification, verdict=evidence.verdict,
                   fp64=evidence.fp64, block=BlockOps(evidence.block.candidate, evidence.block.reference) if evidence.block else None)


def _profile_row(run: RunRecord, evidence: OpEvidence) -> ProfileRow:
    return ProfileRow(evidence.candidate, evidence.reference, evidence.op, run.candidate.ops[evidence.candidate].module,
                      evidence.output_error["max_rel"], evidence.output_error["max_abs"], evidence.output_error["mean_abs"],
                      evidence.local_error, evidence.verdict, evidence.amplification)
