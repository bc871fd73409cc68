"""One search for both passes: where a difference first enters, which op's own difference it is,
and the proof, and the one place a verdict becomes a `Result` (`decide`). A pass says what a cut, a
patch and an op's evidence are for its tensors (`SearchPass`: `forward.ForwardPass`,
`backward.BackwardPass`), and what it decides around the search (`PassRules`: how it starts, the
error it brings down, its float64 check, the causes it names before searching, its culprit, `noise`
culprit and bracket); everything else is here.

1. **Cut search.** The candidate is re-run with the reference's values handed on at cut k: what
   is left of the error is what the ops past k (in the pass's order) still add, and how far its
   outputs moved from the candidate's own is what the ops up to k took out. A binary search finds
   the entry point, the first cut that moves them by a real share of the error, beyond rounding
   (`numerics.past_entry`), asking first the cut the pass guesses (`likely_entry`: for the forward,
   the first op whose own difference the evidence judges semantic, else the cut whose error grows
   most), and the cut before it: where the guess is right, two re-runs find it. A
   difference made in every layer (a bug in the layer class) is so bracketed at its first layer,
   not where half of the error is gone. The ops between the cut before it and it are the bracket.
2. **Suspects**, in the pass's order (nearest the entry point first), whose own difference the
   evidence judges semantic. A suspect stands for every op carrying **the same difference**: the
   same op from the same line of code, or from the same module up to layer numbers (instances of
   one layer class), or reading leaves of the same kind that differ (every BatchNorm's
   statistics). They form one group, named after its first occurrence in the model.
3. **Reach.** The reference re-run with only the group's own differences in it must move the
   outputs; one that does not (a masked score, a dead branch) is not blamed.
4. **Confirmation.** The candidate re-run with the group's own differences taken out, all together
   (alone, the first of many may remove little), must bring the error down to rounding; where the
   group does not, the suspect alone is tried (an op judged different by rounding may have joined
   it). A suspect whose removal makes the error worse contradicts its pairing and is not blamed. How much each
   occurrence makes alone is measured by reference re-runs, never by the candidate's budget.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from dataclasses import replace
from typing import Callable, Iterator, Literal

from ..measure.align import LAYOUT_OPS, LeafPairing, code_place, up_to_numbers
from ..measure.analysis import OpEvidence
from ..measure.metrics import OutputError
from ..measure.numerics import NOISE_FACTOR, REACH_FRACTION, confirms, noise_floor, past_entry
from ..measure.live import LiveRun
from ..measure.runrecord import RunRecord
from ..measure.result import (
    Bracket,
    Confirmation,
    Culprit,
    Cut,
    Float64Check,
    NonFinite,
    Nondeterminism,
    NotBlamed,
    OpCounts,
    OpSite,
    ProfileRow,
    Recurrence,
    Result,
)
from ..capture.trace import OpNode, is_floating

MAX_REACH_TESTS = 8  # suspect groups tested for reach and confirmation
MAX_SHARES = 24  # occurrences of a group whose own share is measured
RERUN_SLACK = 3  # candidate re-runs stay within ceil(log2 ops) + this, plus one confirmation per group


class SearchPass(ABC):
    """One pass (forward or backward) of a live run, as the search sees it."""

    def __init__(self, live: LiveRun):
        self.live = live
        self.candidate_reruns = 0
        self.reference_reruns = 0

    @property
    def run(self) -> RunRecord:
        return self.live.run

    @abstractmethod
    def cuts(self) -> list[int]:
        """Candidate op indices where the reference's values can be handed on, in the pass's order."""

    @abstractmethod
    def error_at_cut(self, cut: int) -> tuple[float, float]:
        """A candidate re-run with the reference's values handed on at `cut`: its error, and how far
        it moved from the candidate's own result (relative, as the error)."""

    @abstractmethod
    def suspects(self, cuts: list[int], entry: int | None) -> Iterator[OpEvidence]:
        """The evidence of the ops that may hold the difference, in the order they are tested."""

    @abstractmethod
    def evidence_of(self, index: int) -> OpEvidence | None:
        """The evidence of candidate op `index` (None: not paired)."""

    def judged_as(self, suspect: OpEvidence) -> Callable[[int], OpEvidence | None]:
        """The evidence of a candidate op by index, judged as `suspect` was (by default, its own)."""
        return self.evidence_of

    @abstractmethod
    def reach(self, group: list[OpEvidence]) -> float:
        """The error of a reference re-run with only these ops' own differences in it."""

    @abstractmethod
    def error_without(self, group: list[OpEvidence]) -> float:
        """The error of a candidate re-run with only these ops' own differences taken out."""

    def likely_entry(self, cuts: list[int]) -> int | None:
        """The position in `cuts` the cut search tries first, where the evidence says the difference
        most likely enters (None: no guess)."""
        return None

    def differing_leaf_kinds(self, evidence: OpEvidence) -> tuple[str, ...]:
        """The kinds (last name part) of the differing leaves the op reads; () for none or unknown."""
        return ()


@dataclass(frozen=True)
class ErrorToExplain:
    """The outputs' error a search brings down, and what rounding makes of it (by the float64 check)."""

    full: float
    rounding: float = 0.0  # NOISE_FACTOR times the rounding the float64 check predicts
    is_rounding: bool = False  # the float64 check says rounding explains it

    @classmethod
    def judged(cls, full: float, float64: Float64Check) -> "ErrorToExplain":
        rounding = NOISE_FACTOR * float64.predicted if float64.predicted is not None else 0.0
        return cls(full, rounding, float64.status == "agree")


@dataclass
class Finding:
    """The first group of suspects whose own difference reaches the error (confirmed or not)."""

    group: list[OpEvidence] = field(default_factory=list)  # in op order: the first occurrence is the culprit
    alone: dict[int, float] = field(default_factory=dict)  # candidate op -> the error it makes alone
    confirmation: Confirmation | None = None
    not_blamed: list[NotBlamed] = field(default_factory=list)

    @property
    def evidence(self) -> OpEvidence | None:
        return self.group[0] if self.group else None

    @property
    def confirmed(self) -> bool:
        return bool(self.confirmation and self.confirmation.confirmed)


@dataclass
class Outcome:
    """What the search of one pass concludes."""

    cuts: list[int]
    entry: int | None
    trail: list[Cut]  # every cut evaluated
    finding: Finding
    verdict: Literal["noise", "divergent"]
    bracketed: bool  # divergent with nothing confirmed: the bracket says where


@dataclass
class Decided:
    """A difference a pass names without the cut search: differing leaves whose reference values
    confirm it, a gradient one side lacks, a gradient a side's ranks never reduced."""

    culprit: Culprit
    confirmation: Confirmation | None = None
    recurrences: list[Recurrence] = field(default_factory=list)
    missing_gradient: str | None = None
    unreduced_gradient: str | None = None


class PassRules(ABC):
    """What one pass decides around the shared search (see the module docstring)."""

    name: Literal["forward", "backward"]

    def __init__(self, live: LiveRun):
        self.live = live
        self.searched: list[SearchPass] = []  # every search made, whose re-runs the result counts
        self.output_error: OutputError | None = None  # what `start` returned
        self.unrepeated: list[Nondeterminism] = []  # the sides `start` found do not repeat themselves
        self.decided: Result | None = None  # the result of the search made last, where another is asked for

    @property
    def run(self) -> RunRecord:
        return self.live.run

    @property
    def full_error(self) -> float:
        """The outputs' (or gradients') error the pass brings down, relative."""
        return self.output_error.max_rel

    @abstractmethod
    def start(self) -> OutputError:
        """Run or fetch what the pass needs (refusing a run it cannot search): the error it brings down."""

    def lacking(self) -> Decided | None:
        """A difference no rounding makes, named before any float64 run (a gradient one side lacks)."""
        return None

    @abstractmethod
    def float64_check(self) -> Float64Check:
        """Both sides in float64: whether rounding explains the pass's error."""

    @abstractmethod
    def searches(self, float64: Callable[[], Float64Check | None]) -> Iterator[SearchPass]:
        """The searches to make in turn, each over the values the run holds by then; the next is made
        when one neither matches nor confirms (the forward's layer window, then every op). `float64()`
        runs the float64 check when first called (None within the tolerance)."""

    def settles(self, decided: Result) -> bool:
        """Does a confirmed result end the searches? One that a later search may name more finely asks for it, and
        stands where that search confirms nothing."""
        return True

    def accounts_for(self, search: SearchPass, error: ErrorToExplain) -> bool:
        """Can the search's pairing account for the outputs' error at all? One that cannot gives way to the next
        search unsearched."""
        return True

    def obvious_cause(self, search: SearchPass, error: ErrorToExplain) -> Decided | None:
        """A cause named before the cut search where the float64 check does not say rounding (differing leaves)."""
        return None

    def refined(self, search: SearchPass, error: ErrorToExplain) -> SearchPass:
        """The search the cut search runs on (the forward's, narrowed to the ops between two layer outputs)."""
        return search

    @abstractmethod
    def culprit(self, search: SearchPass, evidence: OpEvidence) -> Culprit:
        """The culprit an op's (or block's) evidence names."""

    @abstractmethod
    def noise_culprit(
        self, search: SearchPass, outcome: "Outcome", float64: Float64Check
    ) -> tuple[OpEvidence | None, str]:
        """For a `noise` outcome, the op to name, and why rounding does not explain the error where it
        does not after all ("" where it does)."""

    @abstractmethod
    def bracket(self, search: SearchPass, outcome: "Outcome", why: str) -> Bracket:
        """Where an unconfirmed difference enters."""

    @abstractmethod
    def profile(self) -> list[ProfileRow]:
        """Every paired op's evidence, for the error chart."""

    def nonfinite(self) -> tuple[bool, NonFinite | None, Culprit | None]:
        """(whether the candidate's outputs hold NaN/Inf the reference's lack, their summary, the culprit
        where they start)."""
        return not math.isfinite(self.full_error), None, None

    def result_fields(self) -> dict:
        """The pass's own fields of its results (the backward's losses and activations)."""
        return {}

    @property
    def leaves(self) -> LeafPairing | None:
        """The parameters and buffers, paired and compared, where the pass reports them."""
        return None


def _unrepeated_culprit(run: RunRecord, found: Nondeterminism) -> Culprit:
    """The culprit of a `nondeterministic` result: the op where the side's two runs part, as both sites."""
    op = run.traces[found.side].ops[found.op.index]
    return culprit_without_evidence("op", op, op, None, found.difference)


def decide(rules: PassRules, tolerance: float = 0.0, exhaustive: bool = False) -> Result:
    """Decide one pass: `match` within `tolerance`, a cause the pass names before searching, else the
    cut search's verdict, culprit, confirmation and bracket. The only place a `Result` is made."""
    say = rules.live.say
    output_error = rules.output_error = rules.start()
    full_error = rules.full_error
    run = rules.run
    ops = OpCounts(len(run.reference.ops), len(run.candidate.ops), len(run.alignment.aligned_ops("candidate")))

    def result(verdict: str, float64: Float64Check | None = None, **found) -> Result:
        return Result(
            verdict,
            output_error,
            reruns=sum(s.candidate_reruns for s in rules.searched),
            ops=ops,
            reference_reruns=sum(s.reference_reruns for s in rules.searched),
            fp64_check=float64,
            profile=rules.profile(),
            pass_=rules.name,
            leaves=None if verdict in ("match", "nondeterministic") else rules.leaves,
            settings=run.settings_differ(),
            fixed=[f"{role}: {change}" for role, fix in run.traced.fixes.items() for change in fix.described()],
            **{"culprit": None, **rules.result_fields(), **found},
        )

    if rules.unrepeated:
        return result(
            "nondeterministic",
            culprit=_unrepeated_culprit(run, rules.unrepeated[0]),
            nondeterminism=rules.unrepeated,
        )

    def obvious_cause(search: SearchPass) -> Decided | None:
        return rules.obvious_cause(search, error) if not error.is_rounding else None

    lacking = rules.lacking()
    if lacking is not None:
        return result(
            "divergent",
            culprit=lacking.culprit,
            confirmation=lacking.confirmation,
            missing_gradient=lacking.missing_gradient,
        )
    checked: list[Float64Check | None] = []

    def float64_check() -> Float64Check | None:
        if not checked:
            checked.append(rules.float64_check() if full_error > tolerance else None)
        return checked[0]

    decided = settled = None  # the last search's result; a confirmed one that asked for the next search
    for search in rules.searches(float64_check):
        if full_error <= tolerance:
            return result("match")
        float64 = float64_check()
        error = ErrorToExplain.judged(full_error, float64)
        nonfinite, nonfinite_found, nonfinite_culprit = rules.nonfinite()
        cause = obvious_cause(search)
        if cause is None:
            refined = rules.refined(search, error)
            if refined is not search:  # the values it fetched may show a leaf's layout
                cause = obvious_cause(refined)
            search = refined
        if cause is not None:
            return result(
                "divergent",
                float64,
                culprit=cause.culprit,
                confirmation=cause.confirmation,
                recurrences=cause.recurrences,
                nonfinite=nonfinite_found,
                unreduced_gradient=cause.unreduced_gradient,
            )
        if not error.is_rounding and not rules.accounts_for(search, error):
            continue
        say("searching")
        outcome = search_pass(search, error, float64, nonfinite, exhaustive)
        finding = outcome.finding
        evidence, unexplained = finding.evidence, ""
        if outcome.verdict == "noise":
            evidence, unexplained = rules.noise_culprit(search, outcome, float64)
            if unexplained:
                outcome = replace(outcome, verdict="divergent", bracketed=True)
        culprit = rules.culprit(search, evidence) if evidence is not None else nonfinite_culprit
        decided = result(
            outcome.verdict,
            float64,
            culprit=culprit,
            entry=outcome.entry,
            recurrences=recurrences(run, finding, full_error, culprit.candidate.index if culprit else None),
            confirmation=finding.confirmation,
            not_blamed=finding.not_blamed,
            cuts=outcome.trail,
            nonfinite=nonfinite_found,
            bracket=rules.bracket(search, outcome, unexplained) if outcome.bracketed else None,
        )
        if decided.confirmation is not None and decided.confirmation.confirmed:
            if rules.settles(decided):
                return decided
            settled = decided
        rules.decided = decided
    confirmed = decided is not None and decided.confirmation is not None and decided.confirmation.confirmed
    return decided if confirmed or settled is None else settled


def search_pass(
    search: SearchPass, error: ErrorToExplain, float64: Float64Check, nonfinite: bool, exhaustive: bool = False
) -> Outcome:
    """Search one pass for what makes `error` (see the module docstring). Where the float64 check
    says rounding, no suspect is tested: the verdict is `noise`."""
    cuts = search.cuts()
    guess = None if error.is_rounding else search.likely_entry(cuts)
    entry, trail = entry_point(search, cuts, error, exhaustive, guess)
    finding = Finding()
    if not error.is_rounding:
        finding = first_difference(search, cuts, entry, error)
    if finding.confirmed:
        verdict, bracketed = "divergent", False
    elif finding.evidence is not None or float64.status == "disagree" or nonfinite:
        verdict, bracketed = "divergent", True
    else:
        verdict, bracketed = "noise", False
    return Outcome(cuts, entry, trail, finding, verdict, bracketed)


def first_past(count: int, past: Callable[[int], bool], exhaustive: bool, guess: int | None = None) -> int | None:
    """The first of positions 0..count-1 for which `past` holds, assuming that once it holds it keeps
    holding: by binary search, or asking every position in turn when `exhaustive`. None if none does.
    A `guess` is asked first, with the position before it: where it is right, two questions settle it."""
    if exhaustive:
        return next((i for i in range(count) if past(i)), None)
    if count == 0 or not past(count - 1):
        return None
    low, high = -1, count - 1  # not past(low), past(high)
    if guess is not None and 0 <= guess < high:
        if not past(guess):
            low = guess
        elif guess == 0 or not past(guess - 1):
            return guess
        else:
            high = guess - 1
    while high - low > 1:
        middle = (low + high) // 2
        if past(middle):
            high = middle
        else:
            low = middle
    return high


def entry_point(
    search: SearchPass, cuts: list[int], error: ErrorToExplain, exhaustive: bool = False, guess: int | None = None
) -> tuple[int | None, list[Cut]]:
    """The entry point (a cut) and every cut evaluated on the way (see the module docstring), the
    position `guess` in `cuts` tried first."""
    evaluated: dict[int, tuple[float, float]] = {}

    def past(position: int) -> bool:
        if position not in evaluated:
            evaluated[position] = search.error_at_cut(cuts[position])
        return past_entry(*evaluated[position], error.full, error.rounding, error.is_rounding)

    entry = first_past(len(cuts), past, exhaustive, guess)
    return (cuts[entry] if entry is not None else None), [Cut(cuts[i], *evaluated[i]) for i in sorted(evaluated)]


def cut_before(cuts: list[int], entry: int | None) -> int | None:
    """The last cut before the entry point in the pass's order (the last of all without one)."""
    position = cuts.index(entry) if entry is not None else len(cuts)
    return cuts[position - 1] if position > 0 else None


def first_difference(search: SearchPass, cuts: list[int], entry: int | None, error: ErrorToExplain) -> Finding:
    """The first group of suspects whose own difference reaches the error and whose removal confirms
    it; else the first that reaches, unconfirmed. What does not reach, or is contradicted, is not blamed."""
    say, full_error = search.live.say, error.full
    low = cut_before(cuts, entry)
    reach_needed = max(REACH_FRACTION * full_error, noise_floor(search.run.candidate.dtype))
    # After an exhaustive cut search the confirmations still get two re-runs.
    budget = max(math.ceil(math.log2(max(len(search.run.candidate.ops), 2))) + RERUN_SLACK, search.candidate_reruns + 2)
    finding, tested, seen = Finding(), 0, set()
    for suspect in search.suspects(cuts, entry):
        if suspect.candidate in seen or suspect.verdict != "different":
            continue
        if tested >= MAX_REACH_TESTS or search.candidate_reruns >= budget:  # what is left untested stays in the bracket
            break
        group = occurrences(search, suspect)
        seen.update(e.candidate for e in group)
        tested += 1
        say(
            f"testing op {suspect.candidate}"
            + (f" and {len(group) - 1} more with the same difference" if len(group) > 1 else "")
        )
        reached = search.reach(group)
        if reached < reach_needed:
            finding.not_blamed.append(NotBlamed(suspect.candidate, suspect.op, reached))
            continue
        if len(group) > 1:
            budget += 1  # one confirmation per group beyond the search's own budget
        confirmation = confirm(search, group, error)
        in_bracket = low is None or suspect.candidate > low
        for wider in (
            same_call(search, suspect, group),
            same_line_ops(search, suspect, group),
            same_code_blocks(search, suspect, group),
            same_table_readers(search, suspect, group),
        ):
            # one class every layer uses, built in several places (a stem's norm and the blocks' norms); one line
            # whose mistake several ops carry (a soft-cap's constant, divided by and multiplied by); the code of a
            # block that other layers pair in other blocks: for a suspect where the cut search says the difference
            # enters
            if confirmation.confirmed or not wider or not in_bracket or search.candidate_reruns >= budget:
                continue
            budget += 1
            widened = confirm(search, wider, error)
            if widened.confirmed:
                group, confirmation = wider, widened
        if not confirmation.confirmed and len(group) > 1 and search.candidate_reruns < budget:
            # an op judged different by its rounding (a false occurrence) can spoil the group's proof
            alone = confirm(search, [suspect], error)
            if alone.confirmed:
                group, confirmation = [suspect], alone
        if confirmation.confirmed:
            finding.group, finding.confirmation = group, confirmation
            break
        if confirmation.output_error >= full_error and math.isfinite(full_error):  # the values contradict the pairing
            finding.not_blamed.append(NotBlamed(suspect.candidate, suspect.op, reached, confirmation.output_error))
        elif not finding.group:
            finding.group, finding.confirmation = group, confirmation
    if len(finding.group) > 1:  # each occurrence alone, by reference re-runs
        finding.alone = {e.candidate: search.reach([e]) for e in finding.group[:MAX_SHARES]}
    return finding


def confirm(search: SearchPass, group: list[OpEvidence], error: ErrorToExplain) -> Confirmation:
    """A candidate re-run with the group's own differences taken out, judged by `numerics.confirms`."""
    after = search.error_without(group)
    return Confirmation([e.candidate for e in group], after, error.full, confirms(after, error.full, error.rounding))


def occurrences(search: SearchPass, suspect: OpEvidence) -> list[OpEvidence]:
    """Every paired op carrying the same difference as `suspect` (itself included), in op order."""
    first = search.run.candidate.ops[suspect.candidate]
    kinds = search.differing_leaf_kinds(suspect)
    group, evidence_of = [suspect], search.judged_as(suspect)
    for op in search.run.candidate.ops:
        same = same_place(op, first)
        if op.index == suspect.candidate or op.op != first.op or not (same or kinds):
            continue
        evidence = evidence_of(op.index)
        # Blocks ending in the same op of the same line are one piece of code, whatever the reference ops they cover.
        if (
            evidence is None
            or evidence.verdict != "different"
            or (evidence.op != suspect.op and not same_line(op, first))
        ):
            continue
        if same or search.differing_leaf_kinds(evidence) == kinds:
            group.append(evidence)
    return sorted(group, key=lambda e: e.candidate)


def same_call(search: SearchPass, suspect: OpEvidence, group: list[OpEvidence]) -> list[OpEvidence]:
    """Every paired op of the suspect's framework call (not a block) whose own difference is semantic, where that is
    more than `group`: the occurrences of one layer class that is built and called from several places; [] else."""
    if suspect.block is not None:
        return []
    first = search.run.candidate.ops[suspect.candidate]
    found = [
        evidence
        for op in search.run.candidate.ops
        if op.framework_op == first.framework_op
        and (evidence := search.evidence_of(op.index)) is not None
        and evidence.block is None
        and evidence.verdict == "different"
    ]
    return sorted(found, key=lambda e: e.candidate) if len(found) > len(group) else []


def same_line_ops(search: SearchPass, suspect: OpEvidence, group: list[OpEvidence]) -> list[OpEvidence]:
    """Every paired op called from the suspect's line of user code, whatever op it is, whose own difference is
    semantic, where that is more than `group`; [] else."""
    first = search.run.candidate.ops[suspect.candidate]
    if suspect.block is not None or not first.source or first.library_source:
        return []
    found = [
        evidence
        for op in search.run.candidate.ops
        if same_line(op, first)
        and (evidence := search.evidence_of(op.index)) is not None
        and evidence.block is None
        and evidence.verdict == "different"
    ]
    return sorted(found, key=lambda e: e.candidate) if len(found) > len(group) else []


def same_code_blocks(search: SearchPass, suspect: OpEvidence, group: list[OpEvidence]) -> list[OpEvidence]:
    """`group` and every op or block whose own difference is semantic running code that the suspect's block runs,
    where that is more: the layers whose ops pair otherwise than the first's (its scores paired, another's not), their
    difference in blocks of other bounds; [] for a suspect that is no block."""
    if suspect.block is None:
        return []
    ops = search.run.candidate.ops
    places = {code_place(ops[i]) for i in suspect.block.candidate if ops[i].op not in LAYOUT_OPS}
    found = {evidence.candidate: evidence for evidence in group}
    for op in ops:
        evidence = search.evidence_of(op.index)
        if evidence is None or evidence.candidate in found or evidence.verdict != "different":
            continue
        members = evidence.block.candidate if evidence.block is not None else [evidence.candidate]
        if any(code_place(ops[i]) in places for i in members):
            found[evidence.candidate] = evidence
    return sorted(found.values(), key=lambda e: e.candidate) if len(found) > len(group) else []


def same_table_readers(search: SearchPass, suspect: OpEvidence, group: list[OpEvidence]) -> list[OpEvidence]:
    """`group` and every op or block whose own difference is semantic reading, as it is or moved, a table the suspect
    op reads that no reference tensor pairs with (a mask only the candidate computes, read by every layer), where
    that is more; [] for a suspect that is a block (what it reads of a table is not told from what it computes)."""
    if suspect.block is not None:
        return []
    candidate, paired = search.run.candidate, search.run.alignment.tensors
    members = {suspect.candidate}
    unpaired = {
        t
        for i in members
        for t in candidate.ops[i].inputs
        if (producer := candidate.tensors[t].producer) is not None
        and producer not in members
        and t not in paired
        and is_floating(candidate.tensors[t].dtype)
    }
    if not unpaired:
        return []
    activations = candidate.activations()
    tables = {t for t in unpaired if candidate.tensors[t].producer not in activations}
    readers = set()
    for op in candidate.ops:  # in order: what a layout op makes of a table is read as the table
        if tables.intersection(op.inputs):
            readers.add(op.index)
            if op.op in LAYOUT_OPS:
                tables.update(op.outputs)
    found = {evidence.candidate: evidence for evidence in group}
    for op in candidate.ops:
        evidence = search.evidence_of(op.index)
        if evidence is None or evidence.candidate in found or evidence.verdict != "different":
            continue
        if readers.intersection(evidence.block.candidate if evidence.block is not None else [evidence.candidate]):
            found[evidence.candidate] = evidence
    return sorted(found.values(), key=lambda e: e.candidate) if len(found) > len(group) else []


def same_place(op: OpNode, other: OpNode) -> bool:
    """Two ops of one piece of code: the same line of user code, or the same module up to numbers
    (`blocks.0.ln1` and `blocks.3.ln2`: instances of one layer class). A library's line alone says
    nothing: it serves every model built from the library."""
    return same_line(op, other) or (bool(op.module) and up_to_numbers(op.module) == up_to_numbers(other.module))


def same_line(op: OpNode, other: OpNode) -> bool:
    """Called from the same line of user code (a library's line serves every model built from the library)."""
    return bool(op.source) and op.source == other.source and not op.library_source


def recurrences(run: RunRecord, finding: Finding, full_error: float, named: int | None = None) -> list[Recurrence]:
    """Every occurrence of a group of more than one, with the share of the error each makes alone; each block named
    by its op of the code the culprit's candidate op `named` runs, where it has one."""
    if len(finding.group) < 2:
        return []
    listed = []
    place = code_place(run.candidate.ops[named]) if named is not None else None
    for evidence in finding.group:
        ops = evidence.block.candidate if evidence.block is not None else [evidence.candidate]
        op = next(
            (run.candidate.ops[i] for i in ops if code_place(run.candidate.ops[i]) == place),
            run.candidate.ops[evidence.candidate],
        )
        alone = finding.alone.get(evidence.candidate)
        share = None if alone is None or not math.isfinite(full_error) or full_error == 0 else alone / full_error
        listed.append(Recurrence(op.index, evidence.op, op.module, op.source, evidence.local_error, alone, share))
    return listed


def site(op: OpNode) -> OpSite:
    return OpSite(op.index, op.framework_op, op.module, op.source)


def bracket(
    run: RunRecord, candidate_ops: list[int], reference_ops: list[int], low: int | None, high: int | None, why: str = ""
) -> Bracket:
    return Bracket(
        low,
        high,
        [site(run.candidate.ops[i]) for i in sorted(set(candidate_ops))],
        [site(run.reference.ops[i]) for i in sorted(set(reference_ops))],
        why,
    )


def culprit_without_evidence(
    kind: str, cand_op: OpNode, ref_op: OpNode, leaf: str | None, output_error: float | None = None
) -> Culprit:
    """A culprit named by where something starts (NaN/Inf, a missing gradient), with no replay evidence."""
    return Culprit(
        kind,
        cand_op.op,
        site(cand_op),
        site(ref_op),
        leaf,
        input_error=None,
        output_error=output_error,
        output_error_rel=output_error,
        input_error_rel=None,
        local_error=None,
        amplification=None,
        verdict="different",
        fp64=None,
    )
