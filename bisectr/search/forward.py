"""The forward pass's search: cuts, patches and evidence of the recorded activations (see `search`
for the search itself).

0. **Reproducibility.** Each side is re-run once, unpatched: a model whose outputs move
   (dropout in training mode, random ops) is refused before any verdict.
1. **Cuts.** A cut at candidate op k patches in the reference's tensors for every paired op up to k
   (and every paired parameter first read by then). Where those equal the candidate's own values bit
   for bit (the same code up to a difference), the re-run would reproduce the candidate: no re-run.
   When the candidate's outputs hold NaN or Inf, the entry point is the first cut after which they
   are finite.
   A run that did not store every op's values (a big model) is searched layer window first
   (`bisectr.search.window`): cuts at layer outputs, then at the ops between the two that bracket it.
2. **Float64 check** (`precision`): both sides run in float64. If they agree there, the
   difference is rounding and the run is `noise`.
3. **Evidence** of an op is its local replay (`analysis`); its own difference is the reference's
   output minus the candidate op replayed on the reference's inputs. Suspects are the ops (and
   matched blocks) judged different up to the entry point, those in the bracket first, then the
   entry region as one block when it holds ops with no partner (an activation changed for another).
4. Otherwise the run is `noise` and the culprit is the op that amplifies rounding the most
   among the ops carrying a real share of the outputs' error whose own (local) rounding
   reaches the outputs.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Callable, Iterator

import numpy as np

from .compiled import in_compiled
from ..measure.align import Block, LeafPairing, code_place, handed_on, settle_layouts
from ..measure.assignments import reassignments
from ..measure.dataflow import align_by_dataflow
from ..measure.analysis import Analysis, Entering, OpEvidence, computing_op, external_inputs, rewired_input
from ..errors import TraceMismatchError
from ..sides.runner import InTraining, RerunByCode
from .repeat import not_repeated
from ..measure.leaves import leaf_causes, pair_leaves, reference_values, with_leaves_of
from ..measure.numerics import NOISE_REACH_FRACTION, REACH_FRACTION, coarsest_dtype, confirms, noise_floor
from .nonfinite import NonFiniteStart, nonfinite_culprit, nonfinite_start, nonfinite_summary
from .precision import float64_check
from ..measure.live import LiveRun
from ..measure.runrecord import RunRecord
from ..engines.patched import PassOn, Shift
from ..capture.ops import UNINITIALISED
from ..measure.metrics import OutputError, error_metrics
from ..measure.result import (
    BlockOps,
    Bracket,
    Confirmation,
    Culprit,
    Float64Check,
    NonFinite,
    Nondeterminism,
    Placements,
    ProfileRow,
    Recurrence,
    Result,
    Rewired,
)
from .core import (
    MAX_REACH_TESTS,
    Decided,
    ErrorToExplain,
    Outcome,
    PassRules,
    SearchPass,
    bracket,
    culprit_without_evidence,
    cut_before,
    entry_point,
    site,
)
from ..capture.store import SIDES
from ..capture.trace import LOCAL_PART, RANKS_DIFFER, OpNode, host_dtype, is_floating
from .window import boundaries, fetch_all, fetch_recurrences, fetch_window, missing, needs_window, window_between
from ..leafref import leaf_kind, leaf_name

# The share of the candidate's ops paired, as recorded, with an op of a module of the same name above which it runs
# the reference's module tree.
SAME_TREE = 0.9
# A block spanning more candidate ops than a few layers of a small model hold: too coarse to stand for where a
# difference enters while the recording's op pairs may name it more finely.
COARSE_BLOCK = 256
# Norms that keep running statistics: in training mode they normalize by the batch's own instead.
NORMS_WITH_STATISTICS = frozenset({"batch_norm", "instance_norm"})
# Ops that only move or select data, through which the parts of a fused projection's output are split.
SPLITS_DATA = frozenset({"reshape", "transpose", "split", "getitem", "copy", "cast"})


class ForwardPass(SearchPass):
    """Re-runs of either side with activations patched, and the evidence of each paired op."""

    def __init__(
        self,
        live: LiveRun,
        analysis: Analysis,
        bounds: tuple[int | None, int | None] = (None, None),
        known_cuts: dict[int, tuple[float, float]] | None = None,
    ):
        super().__init__(live)
        self.bounds = bounds  # the first and last cut searched (None: the first, the last)
        # cut -> `error_at_cut`, evaluated by this search or an earlier one of the run (its layer window)
        self.known_cuts = dict(known_cuts or {})
        self.alignment = live.run.alignment
        self.analysis = analysis
        self.patchable = self._patchable_tensors()
        self._reference_values: dict[int, np.ndarray | None] = {}
        self._first_change = self._first_changing_patch()

    # -- re-runs ---------------------------------------------------------------
    def candidate_outputs(self, patches: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
        self.candidate_reruns += 1
        return self.live.rerun("candidate", patches).outputs

    def candidate_error(self, patches: dict[int, np.ndarray]) -> float:
        """Outputs' error (vs the reference) of a candidate re-run with `patches`."""
        return self.run.candidate_output_error(self.candidate_outputs(patches))

    def reference_error(self, patches: dict[int, np.ndarray]) -> float:
        """How far a reference re-run with `patches` moves the reference's own outputs."""
        self.reference_reruns += 1
        return self.run.worst_output_error(self.live.rerun("reference", patches).outputs)

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

    def _first_changing_patch(self) -> float:
        """The op position of the first patch that would change the candidate's values (inf: none would):
        up to it, every reference value a cut patches in equals the candidate's own bit for bit."""
        for position, tid in self.patchable:
            error = self.analysis.tensor_error(tid)  # None: a value missing on one side
            if error is not None and error.max_abs == 0:
                continue
            if error is not None or self.analysis.reference_values_for(tid) is not None:
                return position  # a patch with other values, or the candidate's own unknown
        return math.inf

    def _patchable_tensors(self) -> list[tuple[int, int]]:
        """(op position, tid) of the paired candidate tensors a cut patches, in op order: the op
        that produced or first read each. Only floating tensors are patched (indices, masks and
        shapes are structure, not values), no leaf that already holds the reference's values, and no
        uninitialised memory (`torch.empty`: what an op writes into it later is what counts)."""
        candidate = self.run.candidate
        first_read = candidate.first_reads()
        patchable = []
        for tid in self.alignment.tensors:
            info = candidate.tensors[tid]
            position = info.producer if info.producer is not None else first_read.get(tid)
            leaf = self.analysis.leaves.get(tid)
            if (
                position is None
                or leaf_kind(info.leaf) == "input"
                or not is_floating(info.dtype)
                or (leaf and leaf.verdict == "exact")
                or (info.producer is not None and candidate.ops[info.producer].op in UNINITIALISED)
            ):
                continue
            patchable.append((position, tid))
        return sorted(patchable)

    # -- what the search asks --------------------------------------------------
    def cuts(self) -> list[int]:
        reference, (first, last) = self.run.reference, self.bounds
        return [
            e.candidate
            for e in self.analysis.in_order()
            if reference.has_value(reference.ops[e.reference].outputs[0])
            and (first is None or e.candidate >= first)
            and (last is None or e.candidate <= last)
        ]

    def error_at_cut(self, cut: int) -> tuple[float, float]:
        if cut in self.known_cuts:
            return self.known_cuts[cut]
        if (
            cut < self._first_change
        ):  # the patches change nothing: the re-run would reproduce the candidate's own outputs
            return self.run.output_error().max_rel, 0.0
        outputs = self.candidate_outputs(self.patches_up_to(cut))
        error = self.run.candidate_output_error(outputs), self.run.candidate_output_change(outputs)
        self.known_cuts[cut] = error
        return error

    def likely_entry(self, cuts: list[int]) -> int | None:
        """The first cut at an op whose own difference the evidence judges semantic; where no op's
        evidence says so (a run holding its layer outputs only replays none inside the layers), the cut
        whose propagated error grows most over every cut before it."""
        judged = next(
            (position for position, cut in enumerate(cuts) if self.analysis.ops[cut].verdict == "different"), None
        )
        return judged if judged is not None else self._largest_growth(cuts)

    def _largest_growth(self, cuts: list[int]) -> int | None:
        """The position of the cut whose error most exceeds every earlier cut's and its dtype's
        rounding (None: none exceeds both)."""
        largest, guess, before = 1.0, None, 0.0  # before: the largest error of the cuts so far
        for position, cut in enumerate(cuts):
            evidence = self.analysis.ops[cut]
            error = evidence.output_error.max_rel
            if math.isnan(error):
                continue
            scale = max(before, noise_floor(evidence.dtype))
            growth = error / scale if scale > 0 else (math.inf if error > 0 else 0.0)
            if growth > largest:
                largest, guess = growth, position
            before = max(before, error)
        return guess

    def evidence_of(self, index: int) -> OpEvidence | None:
        return self.analysis.ops.get(index)

    def judged_as(self, suspect: OpEvidence) -> Callable[[int], OpEvidence | None]:
        """Where the suspect is its op with the unpaired ops feeding it (`entry_region`): an op of the
        same code as the suspect's, with the unpaired ops of the same code feeding it (None for an op of
        other code). A cache write a port moved sits outside the paired ops at every layer and decoding
        step alike, however each step's tokens make the blocks around it."""
        analysis, candidate = self.analysis, self.run.candidate
        if suspect.block is None or entry_region(analysis, suspect.candidate) != suspect.block:
            return self.evidence_of
        place = code_place(candidate.ops[suspect.candidate])
        paired = {role: {getattr(pair, role) for pair in analysis.alignment.pairs} for role in SIDES}
        places = {
            role: {code_place(analysis.run.traces[role].ops[i]) for i in getattr(suspect.block, role)} for role in SIDES
        }

        def like_the_suspect(index: int) -> OpEvidence | None:
            evidence = analysis.ops.get(index)
            if evidence is None or code_place(candidate.ops[index]) != place:
                return None
            region = entry_region(analysis, index, outside=paired, places=places)
            return evidence if region is None else analysis.evidence(index, evidence.reference, region)

        return like_the_suspect

    def suspects(self, cuts: list[int], entry: int | None) -> Iterator[OpEvidence]:
        """Paired ops (and matched blocks) judged different up to the entry point. The cut search says
        the error enters between the cut before the entry point and the entry point, so the ones there
        come first (a block that starts there and hands on a checkpoint inside the bracket, a cache entry, among
        them), then the entry region as one block (when judged different), then the earlier ones."""
        analysis = self.analysis
        limit = entry if entry is not None else len(self.run.candidate.ops)
        low = cut_before(cuts, entry)
        different = [
            e
            for e in analysis.in_order()
            if e.verdict == "different"
            and (e.candidate <= limit or (e.block is not None and min(e.block.candidate) <= limit))
        ]
        yield from (e for e in different if low is None or e.candidate > low)
        region = entry_region(analysis, entry)
        if region is not None:
            yield analysis.evidence(entry, analysis.ops[entry].reference, region)
        yield from (e for e in different if low is not None and e.candidate <= low)

    def differing_leaf_kinds(self, evidence: OpEvidence) -> tuple[str, ...]:
        ops = evidence.block.candidate if evidence.block else [evidence.candidate]
        leaves = self.analysis.leaves
        return tuple(
            sorted(
                {
                    leaves[t].candidate.rpartition(".")[2]
                    for i in ops
                    for t in self.run.candidate.ops[i].inputs
                    if t in leaves and leaves[t].verdict == "different"
                }
            )
        )

    def reach(self, group: list[OpEvidence]) -> float:
        """The outputs' error when only these ops' (or blocks') own differences enter the reference run."""
        values: dict[int, np.ndarray] = {}  # reference tid -> its values with the group's own differences in
        for evidence in group:
            local = self.analysis.local_outputs(evidence.candidate, evidence.reference, evidence.block)
            for cand_tid, ref_tid in self.analysis.compared_outputs(
                evidence.candidate, evidence.reference, evidence.block
            ):
                if self.run.reference.tensors[ref_tid].dtype == "bool":
                    continue  # a mask is structure, never patched
                dtype = host_dtype(self.run.reference.tensors[ref_tid].dtype)
                pair = self.analysis.alignment.tensors.get(cand_tid)
                if pair is not None and pair.reference == ref_tid and pair.part is not None:
                    base = values.get(ref_tid, self.run.reference.value(ref_tid))
                    values[ref_tid] = pair.candidate_into_reference(local[cand_tid], base).astype(dtype, copy=False)
                else:
                    values[ref_tid] = self.analysis.in_reference_layout(cand_tid, ref_tid, local[cand_tid]).astype(
                        dtype, copy=False
                    )
        if len(group) == 1:
            return self.reference_error(values)
        with np.errstate(invalid="ignore", over="ignore"):  # as own_difference_patches: shifted for many
            return self.reference_error({tid: Shift(v - self.run.reference.value(tid), v) for tid, v in values.items()})

    def error_without(self, group: list[OpEvidence]) -> float:
        return self.candidate_error(own_difference_patches(self.analysis, self.run, group))


class ForwardRules(PassRules):
    """What the forward pass decides around the search (see the module docstring): it starts by
    re-running each side unpatched; a run that did not store every op's values is searched in its
    layer window first (`bisectr.search.window`), and over every op's values when that does not confirm."""

    name = "forward"

    def __init__(self, live: LiveRun):
        super().__init__(live)
        self.windowed = needs_window(live.run)
        self.narrow = False  # searching the layer window, on the layer outputs only
        self.analysis: Analysis | None = None
        self.tested_causes: set[tuple] = set()  # the differing leaves whose reference values were tried
        self.nonfinite_from: NonFiniteStart | None = None  # where the candidate's NaN/Inf start (`nonfinite`)
        self.on_flow = False  # searching over the data-flow pairing

    def start(self) -> OutputError:
        self.live.say("re-running each side unpatched" + (" (and keeping its layer outputs)" if self.windowed else ""))
        self.unrepeated = check_reproducible(
            self.live, {role: boundaries(self.run.traces[role]) for role in SIDES} if self.windowed else {}
        )
        return self.run.output_error()

    def float64_check(self) -> Float64Check:
        self.live.say("running both sides in float64")
        return float64_check(self.live)

    def searches(self, float64: Callable[[], Float64Check | None]) -> Iterator[ForwardPass]:
        """The layer window first (rounding is judged over every op: none for a float64 check that
        agrees), then every op's values: paired by the data that flows through them (`measure.dataflow`), where
        each side ran in one process, the model file pins no modules, the candidate has a module tree of its own (a
        port, not the reference's code changed) and rounding does not explain the outputs' error, then op by op as
        they were recorded (`measure.align`)."""
        check = float64() if self.windowed else None
        if self.windowed and (check is None or check.status != "agree"):
            self.narrow = True
            yield self._search()
        if self.windowed:
            self.live.say("keeping the values of every op")
            fetch_all(self.live)
        self.narrow = False
        run = self.run
        recorded = run.alignment
        pinned = any(pair.evidence.how == "pin" for pair in recorded.pairs)  # the model file's ALIGN_MODULES
        one_process = run.traced.candidate_nproc == 1 and run.traced.reference_nproc == 1
        if one_process and not pinned and not _runs_the_reference_tree(run) and not _rounding_explains(float64()):
            self.live.say("pairing the two passes by the data that flows through them")
            outputs = [(pair.candidate, pair.reference) for pair in run.output_pairs]
            replay = partial(self.live.replay, "candidate")
            flow = align_by_dataflow(run.reference, run.candidate, outputs, replay)
            run.alignment = with_leaves_of(pair_leaves(run.reference, run.candidate, flow), recorded, run.candidate)
            self.on_flow = True
            yield self._search()
            self.on_flow = False
            if self.decided is not None and self.decided.verdict != "divergent":
                return  # rounding, or a match: the op pairs of the recording would say no more
            run.alignment = recorded
        yield self._search()

    def settles(self, decided: Result) -> bool:
        """A culprit the data-flow pairing confirms as a block spanning more ops than `COARSE_BLOCK` (a decoding
        loop's steps run by the same code, paired as one block) is searched again over the recording's op pairs."""
        block = decided.culprit.block if decided.culprit is not None else None
        return not (self.on_flow and block is not None and block.candidate[-1] - block.candidate[0] >= COARSE_BLOCK)

    def accounts_for(self, search: ForwardPass, error: ErrorToExplain) -> bool:
        """The data-flow pairing accounts for the outputs' error where the reference's values put in at every pair up
        to the last cut take it down to rounding; where they do not (outputs handed on by ops it left unpaired), the
        recording's op pairs are searched instead. The re-run is the cut search's first (`known_cuts` keeps it)."""
        if not self.on_flow:
            return True
        cuts = search.cuts()
        return bool(cuts) and confirms(search.error_at_cut(cuts[-1])[0], error.full, error.rounding)

    def _search(self) -> ForwardPass:
        self.live.say("replaying ops")
        self.analysis = Analysis(self.live).compute()
        search = ForwardPass(self.live, self.analysis)
        self.searched.append(search)
        return search

    def obvious_cause(self, search: ForwardPass, error: ErrorToExplain) -> Decided | None:
        self.live.say("comparing parameters and buffers")
        return _differing_leaves(search, error, self.tested_causes) or _misplaced_leaves(
            search, error, self.tested_causes
        )

    def refined(self, search: ForwardPass, error: ErrorToExplain) -> ForwardPass:
        if not self.narrow:
            return search
        self.live.say("searching between layers")
        # The window brackets where the difference enters even in a run the float64 check takes for rounding.
        fine = _window_search(search, replace(error, is_rounding=False))
        self.searched.append(fine)
        self.analysis = fine.analysis
        return fine

    def culprit(self, search: ForwardPass, evidence: OpEvidence) -> Culprit:
        start = self.nonfinite_from
        culprit = _culprit(
            self.run, search.analysis, evidence, start.op.index if start is not None and start.op is not None else None
        )
        if culprit.verdict == "different":
            culprit.compiled = in_compiled(
                self.live, culprit.block.candidate if culprit.block else [culprit.candidate.index]
            )
        op = self.run.candidate.ops[culprit.candidate.index]
        if op.op in NORMS_WITH_STATISTICS and self.live.ask("candidate", InTraining(op.module)):
            culprit.cause = (
                f"{op.module or 'the model'} is in training mode: it normalizes by each batch's own statistics "
                "(and updates its running statistics) where the reference's uses its running statistics; put the "
                "candidate model in eval mode (model.eval())"
            )
        return culprit

    def noise_culprit(
        self, search: ForwardPass, outcome: Outcome, float64: Float64Check
    ) -> tuple[OpEvidence | None, str]:
        """The op amplifying rounding the most whose own rounding reaches the outputs; noise only
        where rounding explains the error."""
        evidence = _most_amplifying(search, search.analysis, self.full_error)
        if evidence is None and float64.status != "agree":
            return None, (
                f"rounding does not explain the outputs' error: the float64 check did not run ({float64.reason}) "
                "and no op's own rounding reaches the outputs"
            )
        return evidence if evidence is not None else search.analysis.ops.get(outcome.entry), ""

    def bracket(self, search: ForwardPass, outcome: Outcome, why: str) -> Bracket:
        return _bracket(self.run, search.analysis, outcome.cuts, outcome.entry, why)

    def profile(self) -> list[ProfileRow]:
        return [_profile_row(self.run, e) for e in self.analysis.in_order()] if self.analysis is not None else []

    def nonfinite(self) -> tuple[bool, NonFinite | None, Culprit | None]:
        start = self.nonfinite_from = nonfinite_start(self.run, self.run.alignment)
        if start is None:
            return False, None, None
        return True, nonfinite_summary(self.run, start), nonfinite_culprit(self.run, start)

    @property
    def leaves(self) -> LeafPairing:
        return self.run.alignment.leaves


def _runs_the_reference_tree(run: RunRecord) -> bool:
    """Does the candidate run the reference's module tree: most of its ops paired, as recorded, with an op of a
    module of the same name (the reference's code with a mistake in it, or run otherwise)?"""
    same = sum(pair.evidence.candidate_module == pair.evidence.reference_module for pair in run.alignment.pairs)
    return same >= SAME_TREE * len(run.candidate.ops)


def _rounding_explains(check: Float64Check | None) -> bool:
    """Does the float64 check leave nothing to find: the outputs within the tolerance (None) or rounding?"""
    return check is None or check.status == "agree"


def _window_search(coarse: ForwardPass, error: ErrorToExplain) -> ForwardPass:
    """The search of the window (see `bisectr.search.window`): the cut search over the layer outputs `coarse`
    holds brackets the difference, the values of the ops between are fetched, and the pass returned
    searches between those two cuts, knowing what they gave (patching the ops between changes neither:
    the layer outputs at a cut stand in for what came before)."""
    live, run = coarse.live, coarse.run
    cuts = coarse.cuts()
    entry, trail = entry_point(coarse, cuts, error, guess=coarse.likely_entry(cuts))
    low = cut_before(cuts, entry)
    partner = {index: evidence.reference for index, evidence in coarse.analysis.ops.items()}
    window = window_between(run, partner, low, entry)
    fetch_window(live, window)
    # Where the candidate's ops read a fused or repeated leaf's rows is read off op values the window now holds.
    run.alignment = pair_leaves(run.reference, run.candidate, run.alignment)
    analysis = Analysis(live).compute(earlier=coarse.analysis)
    if fetch_recurrences(live, analysis, window):
        analysis = Analysis(live).compute(earlier=analysis)
    known = {cut.op: (cut.output_error, cut.moved) for cut in trail if cut.op in (low, entry)}
    return ForwardPass(live, analysis, bounds=(low, entry), known_cuts=known)


def _differing_leaves(search: ForwardPass, error: ErrorToExplain, tested: set[tuple]) -> Decided | None:
    """The first cause among the leaves that differ (in the order the candidate reads them) whose
    reference values, given to the candidate, take the outputs' error down to rounding: the culprit
    (its first leaf), the confirmation, and every layer holding it where there are several. Causes in
    `tested` (their leaves and layouts) are not tried again; those tried are added."""
    run = search.run
    leaves, first_reads = run.candidate.leaves, run.candidate.first_reads()
    for cause in leaf_causes(run.alignment.leaves, run.candidate)[:MAX_REACH_TESTS]:
        key = tuple((pair.candidate, pair.reference, tuple(pair.slots or ())) for pair in cause)
        if key in tested:
            continue
        tested.add(key)
        tids = [leaves[pair.candidate] for pair in cause]
        patches = reference_values(run.reference, run.candidate, run.alignment, cause)
        readers = sorted({first_reads[tid] for tid in tids})
        after = search.candidate_error(patches)
        if not confirms(after, error.full, error.rounding):
            continue
        first = cause[0]
        cand_op = run.candidate.ops[readers[0] if len(readers) == 1 else first_reads[tids[0]]]
        ref_op = run.reference.ops[run.reference.first_reads()[run.reference.leaves[first.reference]]]
        culprit = culprit_without_evidence("leaf", cand_op, ref_op, leaf_name(first.candidate))
        culprit.reference_leaf, culprit.layout, culprit.description = (
            leaf_name(first.reference),
            first.layout,
            first.description,
        )
        occurrences = (
            [
                Recurrence(i, run.candidate.ops[i].op, run.candidate.ops[i].module, run.candidate.ops[i].source, None)
                for i in readers
            ]
            if len(readers) > 1
            else []
        )
        return Decided(culprit, Confirmation(readers, after, error.full, True, leaves=len(cause)), occurrences)
    return None


def _misplaced_leaves(search: ForwardPass, error: ErrorToExplain, tested: set[tuple]) -> Decided | None:
    """The first reassignment of values among the candidate's leaves (`measure.assignments`: key rows in the value
    projection, per-head rows split as blocks, a running variance in the running mean) that takes the outputs'
    error down to rounding, as a leaf culprit: its first leaf, every leaf it moves listed."""
    run = search.run
    first_reads = run.candidate.first_reads()
    for hypothesis in reassignments(run.reference, run.candidate, run.alignment, partial(_roles, search.live)):
        key = tuple(sorted((tid, values.tobytes()) for tid, values in hypothesis.values.items()))
        if key in tested:
            continue
        tested.add(key)
        if not _reproduces_the_candidate(search, hypothesis.mistaken, error):
            continue
        after = search.candidate_error(hypothesis.values)
        if not confirms(after, error.full, error.rounding):
            continue
        tids = sorted(hypothesis.values, key=lambda t: first_reads.get(t, 1 << 62))
        first = run.candidate.tensors[tids[0]]
        name, reference_leaf, rows, now = next(m for m in hypothesis.moves if m[0] == leaf_name(first.leaf))
        reference_tid = (
            run.reference.leaves[f"param:{reference_leaf}"]
            if f"param:{reference_leaf}" in (run.reference.leaves)
            else run.reference.leaves[f"buffer:{reference_leaf}"]
        )
        cand_op = run.candidate.ops[first_reads[tids[0]]]
        ref_op = run.reference.ops[run.reference.first_reads()[reference_tid]]
        culprit = culprit_without_evidence("leaf", cand_op, ref_op, name)
        culprit.reference_leaf, culprit.layout = reference_leaf, f"{now} of {reference_leaf}"
        culprit.description = f"holds {now} where its ops read {rows} of {reference_leaf}"
        readers = sorted({first_reads[t] for t in tids if t in first_reads})
        occurrences = [
            Recurrence(i, run.candidate.ops[i].op, run.candidate.ops[i].module, run.candidate.ops[i].source, None)
            for i in readers
        ]
        return Decided(
            culprit,
            Confirmation(readers, after, error.full, True, leaves=len(tids)),
            occurrences if len(occurrences) > 1 else [],
        )
    return None


def _reproduces_the_candidate(search: ForwardPass, mistaken: dict[int, np.ndarray], error: ErrorToExplain) -> bool:
    """Does the reference, re-run with the candidate's mistake made on its leaves (`mistaken`), give the candidate's
    outputs (within what takes the error to rounding)? A reference re-run, which the candidate's budget does not pay."""
    if not mistaken:
        return True
    search.reference_reruns += 1
    outputs = search.live.rerun("reference", mistaken).outputs
    run = search.run
    worst = 0.0
    for pair in run.output_pairs:
        candidate = pair.in_reference_layout(
            run.candidate.value(pair.candidate), run.reference.tensors[pair.reference].shape
        )
        worst = max(worst, error_metrics(outputs[pair.key], candidate).max_rel)
    return confirms(worst, error.full, error.rounding)


def _roles(live: LiveRun, fused: int) -> list[np.ndarray]:
    """The rows of reference leaf `fused` each part of what the reference computes from it is made of: its reader's
    output (with a bias added) replayed, on the number of each output feature, through the ops that only move data
    that split it (view, transpose, chunk, getitem), up to what the ops that compute read."""
    reference = live.run.reference
    readers = reference.consumers()
    start = reference.ops[min(readers[fused])].outputs[0]
    while reference.ops[reference.tensors[start].producer].op in SPLITS_DATA and len(readers.get(start, [])) == 1:
        start = reference.ops[readers[start][0]].outputs[0]  # the weight transposed, then multiplied
    while True:
        after = readers.get(start, [])
        if (
            len(after) == 1
            and reference.ops[after[0]].op == "add"
            and reference.tensors[reference.ops[after[0]].outputs[0]].shape == reference.tensors[start].shape
        ):
            start = reference.ops[after[0]].outputs[0]
            continue
        break
    moving, tid = [], start
    while len(readers.get(tid, [])) == 1 and reference.ops[readers[tid][0]].op in (
        "reshape",
        "transpose",
        "copy",
        "cast",
    ):
        moving.append(readers[tid][0])
        tid = reference.ops[readers[tid][0]].outputs[0]
    splitting = [r for r in readers.get(tid, []) if reference.ops[r].op in ("split", "getitem")]
    if not splitting or (reference.ops[splitting[0]].op == "getitem" and len(splitting) < 2):
        return []
    if reference.ops[splitting[0]].op == "split":
        splitting = splitting[:1]
    moving += splitting
    terminal = [t for r in splitting for t in reference.ops[r].outputs]
    if not moving:
        return []
    shape = reference.tensors[start].shape
    axis = max(k for k, n in enumerate(shape) if n in reference.tensors[fused].shape)
    features = np.broadcast_to(
        np.arange(shape[axis], dtype=np.float64).reshape([-1 if k == axis else 1 for k in range(len(shape))]), shape
    )
    computed = live.replay("reference", sorted(moving), {start: np.ascontiguousarray(features)})
    roles = []
    for tid in sorted(terminal, key=lambda t: (reference.tensors[t].producer, t)):
        values = computed[tid]
        varying = [
            k for k in range(values.ndim) if values.shape[k] > 1 and not np.all(np.take(values, [0], axis=k) == values)
        ]
        index = tuple(slice(None) if k in varying else 0 for k in range(values.ndim))
        roles.append(np.rint(values[index]).astype(np.int64).reshape(-1))
    return roles


def check_reproducible(live: LiveRun, keep: dict[str, set[int]] | None = None) -> list[Nondeterminism]:
    """Each side re-run unpatched must reproduce its recording at every op: a random difference (dropout in
    training mode, random ops) is neither a bug nor rounding. Returns where and why each side that does not
    repeat itself parts from its recording (`bisectr.search.repeat`). The values of the op outputs `keep`
    (role -> tids) names that the run lacks are kept (`Trace.fetched`)."""
    run = live.run
    unrepeated = []
    for role in SIDES:
        trace = run.traces[role]
        wanted = missing(trace, (keep or {}).get(role, ()))
        try:
            trace.fetched.update(live.rerun(role, {}, wanted, every_op=True).captured)
        except TraceMismatchError:
            live.say(f"recording the {role} again: its re-run departed from its recording")
            found = not_repeated(live, role)
            if found is not None:
                unrepeated.append(found)
                continue
            # Its code repeats itself, its recorded calls do not (a forward that seeds its own generator).
            live.ask(role, RerunByCode())
            try:
                trace.fetched.update(live.rerun(role, {}, wanted, every_op=True).captured)
            except TraceMismatchError as exc:
                raise TraceMismatchError(
                    f"{run.model_file}: the {role} side's re-run does not reproduce its outputs, though its "
                    f"model's code does when recorded twice, so no verdict can be given: {exc}"
                ) from None
    if keep and not unrepeated:
        settle_layouts(run.reference, run.candidate, run.alignment)
    return unrepeated


def entry_region(
    analysis: Analysis,
    entry: int | None,
    outside: dict[str, set[int]] | None = None,
    places: dict[str, set[tuple]] | None = None,
) -> Block | None:
    """The entry op with the ops without a partner that feed it (through such ops only), on both
    sides: an activation changed for another, an extra scale, a missing op. None without an entry
    point, or when every op feeding the entry op has a partner. `outside` (per side): the ops that have
    one (by default those paired 1:1 or inside a matched block); `places` (per side): the code
    (`code_place`) the region's ops must come from, where given."""
    if entry is None:
        return None
    outside = outside or {role: analysis.alignment.aligned_ops(role) for role in SIDES}
    regions = {}
    for role, index in (("candidate", entry), ("reference", analysis.ops[entry].reference)):
        trace = analysis.run.traces[role]
        region, pending = {index}, list(trace.ops[index].inputs)
        while pending:
            producer = trace.tensors[pending.pop()].producer
            if (
                producer is not None
                and producer not in region
                and producer not in outside[role]
                and (places is None or code_place(trace.ops[producer]) in places[role])
            ):
                region.add(producer)
                pending.extend(trace.ops[producer].inputs)
        regions[role] = sorted(region)
    if len(regions["candidate"]) == len(regions["reference"]) == 1:
        return None
    return Block(regions["candidate"], regions["reference"], matched=True)


def own_difference_patches(
    analysis: Analysis, run: RunRecord, evidences: list[OpEvidence]
) -> dict[int, np.ndarray | Shift]:
    """For each op (or block), its own difference taken out of what it hands on: its outputs shifted
    by (reference output - the candidate op replayed on the reference's inputs). Unlike patching in
    the reference's values, this leaves what reached the op from upstream in place, so it fixes
    nothing the op did not add. One op's (or block's) outputs are shifted as recorded, since nothing
    upstream of it changes (a block's later outputs already carry its earlier ones); the occurrences
    of one difference are shifted as the re-run computes them, since each takes upstream ones out.
    Where the op itself made NaN/Inf, the reference's value is what is left. Ops the reference lacks,
    where it passes their input's partner on unchanged, hand on their input as the re-run computes it
    (exact where how they change it depends on more than its values: a sharded tensor's parts)."""
    patches: dict[int, np.ndarray | Shift | PassOn] = {}
    for evidence in evidences:
        passed_on = _passed_on(analysis, evidence)
        if passed_on:
            for cand_tid, source in passed_on.items():
                shape = tuple(run.candidate.tensors[cand_tid].shape)
                patches[cand_tid] = (
                    PassOn(source, shape) if len(evidences) > 1 else run.candidate.value(source).reshape(shape)
                )
            continue
        replayed = evidence.block or _rank_local_region(analysis, evidence.candidate)
        local = analysis.local_outputs(evidence.candidate, evidence.reference, replayed)
        for cand_tid, _ in analysis.compared_outputs(evidence.candidate, evidence.reference, evidence.block):
            reference = analysis.reference_values_for(cand_tid)
            if reference is None or run.candidate.tensors[cand_tid].dtype == "bool":
                continue  # a mask is structure, never patched
            dtype = host_dtype(run.candidate.tensors[cand_tid].dtype)
            with np.errstate(invalid="ignore", over="ignore"):
                shift = Shift(
                    (reference - local[cand_tid].reshape(reference.shape)).astype(dtype, copy=False),
                    reference.astype(dtype, copy=False),
                )
            patches[cand_tid] = shift if len(evidences) > 1 else shift.applied_to(run.candidate.value(cand_tid))
    return patches


def _rank_local_region(analysis: Analysis, index: int) -> Block | None:
    """Where an op reads what each rank holds of its own (a rank's heads or columns), which no reference
    tensor pairs with: the op with the ops that make it from paired values, so that its own difference is
    replayed from the reference's values and not carried in from the ranks' earlier ones."""
    candidate = analysis.candidate
    own = (LOCAL_PART, RANKS_DIFFER)
    if not any(
        candidate.tensors[t].producer is not None
        and candidate.tensors[t].placement in own
        and analysis.reference_values_for(t) is None
        for t in candidate.ops[index].inputs
    ):
        return None
    return entry_region(analysis, index)


def _passed_on(analysis: Analysis, evidence: OpEvidence) -> dict[int, int]:
    """For a block of ops the reference lacks: each tensor it hands on -> its input of the same shape
    paired with the same reference tensor, the value the reference passes on unchanged ({} if any has none)."""
    block = evidence.block
    if block is None or block.reference:
        return {}
    candidate, pairs = analysis.candidate, analysis.alignment.tensors
    inputs = external_inputs(candidate, block.candidate)
    passed = {}
    for cand_tid, ref_tid in analysis.compared_outputs(evidence.candidate, evidence.reference, block):
        source = next(
            (
                tid
                for tid in inputs
                if tid in pairs
                and pairs[tid].reference == ref_tid
                and pairs[tid].transform is None
                and candidate.tensors[tid].producer is not None  # a re-run hands `PassOn` what ops make
                and candidate.tensors[tid].shape == candidate.tensors[cand_tid].shape
            ),
            None,
        )
        if source is None or pairs[cand_tid].transform is not None:
            return {}
        passed[cand_tid] = source
    return passed


def _most_amplifying(search: ForwardPass, analysis: Analysis, full_error: float) -> OpEvidence | None:
    """The op amplifying rounding the most (its output's absolute error the largest multiple of
    its inputs') among those whose output carries a real share of the outputs' error and whose
    own rounding reaches the outputs. An op whose kernels agree bitwise (exact) has no rounding of
    its own and counts only where it makes a model output, as a span head's logits matmul does on
    CPUs where both frameworks' GEMMs agree: nothing downstream can undo its growth. Elsewhere an exact
    op's large amplification (a -1e4 mask add, rounded at magnitude 1e4, then zeroed by a softmax)
    is passed over."""
    outputs = {pair.candidate for pair in search.run.output_pairs}

    def makes_output(evidence: OpEvidence) -> bool:
        return search.run.candidate.ops[evidence.candidate].outputs[0] in outputs

    carrying = [
        e
        for e in analysis.ops.values()
        if (e.verdict == "noise" or (e.verdict == "exact" and makes_output(e)))
        and e.output_error.max_rel >= REACH_FRACTION * full_error
        and e.amplification > 0
    ]
    # An op on exact inputs amplifies nothing. Where no op amplifies, one is named only if the precision it
    # computes in is one the user chose below its tensors' (a compiled bfloat16 model, one op).
    candidates = sorted(
        (e for e in carrying if math.isfinite(e.amplification)), key=lambda e: (-e.amplification, e.candidate)
    ) or [e for e in carrying if _computes_narrower(search.run.candidate.ops[e.candidate])]
    for evidence in candidates[:MAX_REACH_TESTS]:
        if evidence.verdict == "exact" or search.reach([evidence]) >= NOISE_REACH_FRACTION * full_error:
            return evidence
    return None


def _computes_narrower(op: OpNode) -> bool:
    """Does `op` compute in a dtype coarser than float32 that none of its tensors shows (`OpNode.inner_dtypes`)?"""
    return bool(op.inner_dtypes) and noise_floor(coarsest_dtype(op.inner_dtypes)) > noise_floor("float32")


def _bracket(run: RunRecord, analysis: Analysis, cuts: list[int], entry: int | None, why: str = "") -> Bracket:
    """Where an unconfirmed difference enters: the cut before the entry point and the entry point,
    and the ops from one to the other (with the entry region's), on both sides. Without an entry
    point: everything after the last cut. `why`: why the difference is not taken for rounding, where
    no op's evidence says it."""
    low = cut_before(cuts, entry)
    ref_low = analysis.ops[low].reference if low is not None else -1
    cand_high, ref_high = (
        (entry, analysis.ops[entry].reference)
        if entry is not None
        else (len(run.candidate.ops) - 1, len(run.reference.ops) - 1)
    )
    region = entry_region(analysis, entry)
    return bracket(
        run,
        list(range((low if low is not None else -1) + 1, cand_high + 1)) + (region.candidate if region else []),
        list(range(ref_low + 1, ref_high + 1)) + (region.reference if region else []),
        low,
        entry,
        why,
    )


def _culprit(run: RunRecord, analysis: Analysis, evidence: OpEvidence, nonfinite_from: int | None = None) -> Culprit:
    """The culprit an op's (or block's) evidence names; a block is shown at the op where its NaN/Inf
    start (`nonfinite_from`) when they start inside it, else where its difference enters."""
    evidence = analysis.with_oracle(evidence)
    cand_op = run.candidate.ops[evidence.candidate]
    different_leaves = [
        analysis.leaves[t] for t in cand_op.inputs if t in analysis.leaves and analysis.leaves[t].verdict == "different"
    ]
    leaf = leaf_name(different_leaves[0].candidate) if different_leaves else None
    cand_index, ref_index, cause = evidence.candidate, evidence.reference, None
    if evidence.block is not None:  # shown where its difference enters, against the reference op it is named after
        inside = nonfinite_from is not None and nonfinite_from in evidence.block.candidate
        entering = (
            Entering(nonfinite_from, analysis.counterpart(nonfinite_from, evidence.block))
            if inside
            else analysis.entering_op(evidence.block, evidence.candidate, evidence.reference)
        )
        cand_index, cause = entering.candidate, entering.cause
        if entering.reference is not None:
            ref_index = entering.reference
        elif evidence.block.reference:
            ref_index = computing_op(run.reference, evidence.block.reference)
    else:
        table = analysis.table_read(evidence.candidate)
        if table is not None:  # the op is right; what it reads is not (a mask only the candidate computes)
            cand_index, cause = table.candidate, table.cause
    block = evidence.block or Block([evidence.candidate], [evidence.reference], matched=True)
    return Culprit(
        "leaf" if leaf else "op",
        evidence.op,
        site(run.candidate.ops[cand_index]),
        site(run.reference.ops[ref_index]),
        leaf,
        input_error=evidence.input_error,
        output_error=evidence.output_error.max_abs,
        output_error_rel=evidence.output_error.max_rel,
        input_error_rel=evidence.input_error_rel,
        local_error=evidence.local_error,
        amplification=evidence.amplification,
        verdict=evidence.verdict,
        fp64=evidence.fp64,
        block=BlockOps(evidence.block.candidate, evidence.block.reference) if evidence.block else None,
        fp64_unavailable=evidence.fp64_unavailable,
        rewired=_rewired(run, block),
        placements=_placements(run, block),
        cause=cause,
    )


def _placements(run: RunRecord, block: Block) -> Placements | None:
    """How the candidate's ranks held what the culprit reads and hands on (None: one process)."""
    if run.traced.candidate_nproc == 1:
        return None
    candidate = run.candidate
    floating = [t for t in external_inputs(candidate, block.candidate) if is_floating(candidate.tensors[t].dtype)]
    handed = handed_on(candidate, block.candidate, candidate.consumers())
    return Placements(
        run.traced.candidate_nproc,
        [candidate.tensors[t].placement or "whole" for t in floating],
        [candidate.tensors[t].placement or "whole" for t in handed],
    )


def _rewired(run: RunRecord, block: Block) -> Rewired | None:
    found = rewired_input(run, run.alignment, block.candidate, block.reference)
    if found is None:
        return None
    ref_tid, counterpart, instead = found
    reads = run.candidate.tensors[instead]
    return Rewired(
        site(run.reference.ops[run.reference.tensors[ref_tid].producer]),
        site(run.candidate.ops[run.candidate.tensors[counterpart].producer]),
        site(run.candidate.ops[reads.producer]) if reads.producer is not None else None,
        reads.leaf if reads.producer is None else None,
    )


def _profile_row(run: RunRecord, evidence: OpEvidence) -> ProfileRow:
    return ProfileRow(
        evidence.candidate,
        evidence.reference,
        evidence.op,
        run.candidate.ops[evidence.candidate].module,
        evidence.output_error.max_rel,
        evidence.output_error.max_abs,
        evidence.output_error.mean_abs,
        evidence.local_error,
        evidence.verdict,
        evidence.amplification,
    )
