"""Training steps (`bisectr train`): both sides trained for N steps, compared step by step.

1. **Sides.** Each side trains a copy of the model its function builds, where the model lives
   (`engines.training`, through the side's `TrainStep` requests, as every re-run goes), with its optimizer
   (`reference_optimizer(model)` / `candidate_optimizer(model)`: an optimizer, or (optimizer,
   learning-rate scheduler)), its batches (`reference_batch(step)`, steps counted from 1; default:
   the side's inputs at every step) and its loss (`reference_loss(outputs)`; default: the outputs
   against the backward pass's fixed random gradient, `sum(outputs * seed)`). Parameters are paired
   through the forward alignment of the run traced at the initial weights.
2. **Per step**: the loss, every parameter's gradient and update (its value after the step minus
   before), Adam's moments after the step and the learning rate.
3. **The verdict over steps.** Both sides are trained again as float64 copies, in lockstep with the
   float32 runs. At each step, for the loss, the gradients and the updates, rounding predicts each
   side's distance to its own float64 run, summed (`predicted`); the float64 runs' own difference
   is what is left without rounding. The first step where that difference exceeds a share of the
   prediction (or the float32 noise floor) is the **first semantic step**; none: `noise` (`match`
   when even the float32 runs agree exactly). Gradients and updates are judged parameter by
   parameter, each against its own rounding: Adam scales every gradient to about the learning rate,
   so a gradient that is zero but for rounding (GPT-2's key bias, which softmax cancels) gets an
   update whose float32 and float64 values differ by as much as the update itself, and that
   parameter's rounding must not excuse another's real difference.
4. **The stage** at that step, from the float64 runs (whose inputs to that step still agree):
   `forward` (the losses differ), `backward` (the losses agree, the gradients differ), `reduction`
   (a side on several processes, whose gradients differ the way a reduction across its ranks makes them:
   a parameter every rank holds whole whose ranks' gradients differ and sum or average to the other
   side's, never reduced; or every differing gradient the other side's times one factor, the world size
   or its inverse for one) or `optimizer` (the gradients agree, the updates differ). At step 1, a forward
   or backward stage is searched (`Run.bisect`, with the backward for a backward stage) and its culprit
   named; a reduction stage names the parameters and what the reduction did; an optimizer stage names
   the parameter whose update differs most and what differs between the optimizers: the learning rate
   of that step, epsilon, the betas, the weight decay (and whether it is coupled to the gradient or
   decoupled), AMSGrad, gradient clipping; or, when no setting differs, the update rule itself (bias
   correction, for one).

A side on several processes (`--candidate-nproc N`, or the model file's `NPROC`) trains on its ranks, each
with its own batch (`candidate_batch(step)` gives the rank its share) and its model built again by the side's
function, wrapped as the model file wraps it (DDP, FSDP2, tensor parallel). Its loss is the mean of its
ranks' losses (the loss whose gradient data parallelism averages), and each parameter is read whole after
the ranks' reduction (a shard gathered, one parameter at a time). Ranks given batches of different shapes are
refused: the world size does not divide the batch. `<role>_micro_batches(step)` (a list of batches) makes a
step accumulate gradients over them; its loss is their losses' sum, each as the side's loss function gives it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .measure.align import TensorPair
from .errors import ModelFileError
from .measure.numerics import (
    GRADIENT_FLOOR,
    coarsest_dtype,
    magnitude,
    noise_floor,
    relative_to,
    rounding_allowance,
    rounding_explains,
)
from .measure.runrecord import output_seeds
from .measure.result import Culprit
from .run import Run, trace
from .serial import to_plain
from .sides.runner import EachRank, StepValues, TrainerSettings, TrainStep
from .measure.live import LiveRun
from .leafref import leaf_kind, leaf_name

MEASURES = ("loss", "gradient", "update")  # what decides the first semantic step and its stage
RECORDED = MEASURES + ("moments",)  # compared and shown at every step
STAGES = {"loss": "forward", "gradient": "backward", "update": "optimizer"}
# Relative difference of two float64 gradients that rounding alone cannot make (it makes about 1e-15).
_FLOAT64_EXACT = 1e-8
SETTINGS = ("epsilon", "beta1", "beta2", "weight_decay", "weight_decay_kind", "amsgrad", "gradient_clipping")


@dataclass
class StepRecord:
    """What one side's training step computed. A parameter's gradient, update and Adam moments
    ("gradient", "update", "moment1", "moment2") are read from the side one parameter at a time
    (`read`; every rank's own, by rank: `read_each`), as float64 arrays, until its next step: no step
    keeps a copy of them all. `unreduced`: the parameters every rank held alike before the step, whose
    gradients the ranks hold differently."""

    loss: float
    learning_rate: float
    parameters: list[str]
    read: Callable[[str, str], np.ndarray | None]  # (measure, parameter) -> its values, None: it has none
    read_each: Callable[[str, str], list[np.ndarray | None]]
    ranks: int = 1
    unreduced: list[str] = field(default_factory=list)
    micro_batches: int = 1


@dataclass
class BySide:
    reference: float
    candidate: float


@dataclass
class ByMeasure:
    """One number for each measure compared at a step (`RECORDED`)."""

    loss: float
    gradient: float
    update: float
    moments: float


@dataclass
class StepRow:
    """One step of the comparison (errors relative, see `StepComparison`)."""

    step: int
    loss: BySide
    learning_rate: BySide
    error: ByMeasure  # candidate vs reference, as run (the worst parameter's)
    # What rounding predicts for each, and candidate vs reference both in float64; for gradients,
    # updates and moments, those of the parameter whose float64 difference rounding explains least.
    predicted: ByMeasure
    float64_error: ByMeasure
    semantic: bool


@dataclass
class OptimizerCulprit:
    kind: str  # "optimizer"
    parameter: str
    field: str  # "learning rate", "epsilon", ..., "update rule"
    reference: Any
    candidate: Any
    update_error: float  # the parameter's update, candidate vs reference in float64 (relative)


@dataclass
class ReductionCulprit:
    kind: str  # "reduction"
    side: str  # the side on several processes
    parameters: list[str]  # its parameters whose gradients the reduction leaves wrong
    what: str  # what the reduction did, in a sentence
    factor: float | None = None  # every such gradient is the other side's times this


@dataclass
class TrainingResult:
    verdict: str  # "match" | "noise" | "divergent" | "nondeterministic"
    steps: list[StepRow]
    first_step: int | None = None
    stage: str | None = None  # "forward" | "backward" | "optimizer"
    culprit: Culprit | OptimizerCulprit | ReductionCulprit | None = None
    note: str = ""  # what was not searched, and why
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # each side's optimizer settings

    def to_dict(self) -> dict:
        return to_plain(self)


@dataclass
class Distances:
    """Candidate vs reference at one step, relative: the loss, and each paired parameter's gradient,
    update and Adam moments (the larger of the two), in the order of the comparison's pairs."""

    loss: float
    parameters: dict[str, list[float]]  # "gradient", "update", "moments": one error per pair

    def of(self, measure: str) -> list[float]:
        """The errors `measure` is judged on: the loss's, or one per parameter."""
        return [self.loss] if measure == "loss" else self.parameters[measure]

    def worst(self, measure: str) -> float:
        return max(self.of(measure), default=0.0)


class StepComparison:
    """Distances between two sides' step records (parameters paired through the forward alignment).
    A gradient's or update's error is relative to its own magnitude, floored at `GRADIENT_FLOOR` of the
    largest one's in the step (a value that is zero but for rounding has no relative error of its own)."""

    def __init__(self, pairs: list[tuple[str, str, TensorPair | None]], reference_shapes: dict[str, tuple[int, ...]]):
        self.pairs = pairs  # (reference leaf, candidate leaf, the pair's layout; None: the same side)
        self.shapes = reference_shapes

    def between(self, candidate: StepRecord, reference: StepRecord, same_side: bool = False) -> Distances:
        def per_parameter(measure: str) -> list[float]:
            return self._per_parameter(measure, candidate, reference, same_side)

        parameters = {
            "gradient": per_parameter("gradient"),
            "update": per_parameter("update"),
            "moments": list(map(max, per_parameter("moment1"), per_parameter("moment2"))),
        }
        return Distances(relative_to(abs(candidate.loss - reference.loss), abs(reference.loss)), parameters)

    def _per_parameter(
        self, measure: str, candidate: StepRecord, reference: StepRecord, same_side: bool
    ) -> list[float]:
        scale = self._floor(measure, reference)
        return [
            self._error(
                candidate.read(measure, r if same_side else c),
                reference.read(measure, r),
                None if same_side else pair,
                r,
                scale,
            )
            for r, c, pair in self.pairs
        ]

    @staticmethod
    def _floor(measure: str, record: StepRecord) -> float:
        return GRADIENT_FLOOR * max((magnitude(record.read(measure, name)) for name in record.parameters), default=0.0)

    def _error(
        self,
        candidate: np.ndarray | None,
        reference: np.ndarray | None,
        pair: TensorPair | None,
        reference_name: str,
        floor: float,
    ) -> float:
        if candidate is None or reference is None:
            return 0.0 if candidate is None and reference is None else math.inf
        if pair is not None:
            candidate = pair.candidate_in_reference_layout(candidate, self.shapes[reference_name])
        difference = magnitude(candidate.reshape(reference.shape) - reference)
        return relative_to(difference, max(magnitude(reference), floor))


# Module names a wrapper puts between a model and its parameters (DDP, torch.compile, FSDP1, checkpointing).
_WRAPPERS = frozenset({"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})


def parameter_pairs(run: Run) -> list[tuple[str, str, TensorPair]]:
    """(reference leaf, candidate leaf, pair) of the sides' parameters: where both sides run one framework, those
    named alike (but for the names a wrapper adds, `_WRAPPERS`) and of one shape; then those the forward alignment
    pairs (across frameworks, which lay weights out differently, only those)."""
    reference, candidate = run.reference, run.candidate

    def parameters(trace: Any) -> dict[str, int]:
        return {leaf: tid for leaf, tid in trace.leaves.items() if leaf_kind(leaf) == "param"}

    def unwrapped(leaf: str) -> str:
        return ".".join(part for part in leaf_name(leaf).split(".") if part not in _WRAPPERS)

    same_framework = reference.framework == candidate.framework
    by_name = {unwrapped(leaf): (leaf, tid) for leaf, tid in parameters(candidate).items() if same_framework}
    pairs, paired = [], set()
    for ref_leaf, ref_tid in parameters(reference).items():
        cand_leaf, cand_tid = by_name.get(unwrapped(ref_leaf), (None, None))
        if cand_leaf is not None and candidate.tensors[cand_tid].shape == reference.tensors[ref_tid].shape:
            pairs.append((ref_leaf, cand_leaf, TensorPair(cand_tid, ref_tid, None, 1.0, "name")))
            paired |= {ref_leaf, cand_leaf}
    for cand_tid, pair in run.alignment.tensors.items():
        cand_leaf, ref_leaf = candidate.tensors[cand_tid].leaf or "", reference.tensors[pair.reference].leaf or ""
        if leaf_kind(cand_leaf) == leaf_kind(ref_leaf) == "param" and not {cand_leaf, ref_leaf} & paired:
            pairs.append((ref_leaf, cand_leaf, pair))
            paired |= {ref_leaf, cand_leaf}
    if not pairs:
        raise ModelFileError(
            f"{run.model_file}: no parameter of the candidate is paired with one of the reference: "
            "nothing to compare over training steps"
        )
    return pairs


def _least_explained(
    float64_errors: list[float], reference_rounding: list[float], candidate_rounding: list[float], floor: float
) -> tuple[float, float]:
    """(float64 error, what rounding predicts for it) of the parameter whose float64 difference rounding
    explains least, each judged against its own two sides' rounding (for the loss: the one value)."""
    judged = [
        (error, of_reference + of_candidate)
        for error, of_reference, of_candidate in zip(float64_errors, reference_rounding, candidate_rounding)
    ]
    return max(judged, key=lambda each: relative_to(each[0], rounding_allowance(each[1], floor)), default=(0.0, 0.0))


def train(
    model_file: str,
    reference: str = "reference",
    candidate: str = "candidate",
    steps: int = 20,
    progress: Callable[[str], None] | None = None,
    **isolation: Any,
) -> TrainingResult:
    """Train both sides of `model_file` for `steps` steps and compare them (see the module docstring).
    `isolation`: where each side runs (`isolate`, `reference_python`, ..., `candidate_nproc`: see `run.trace`)."""
    say = progress or (lambda message: None)
    if steps < 1:
        raise ModelFileError(f"{model_file}: --steps must be at least 1 (got {steps})")
    say("tracing both sides at their initial weights")
    run = trace(model_file, reference, candidate, **isolation)
    seeds = output_seeds(run)
    trained = [(role, width) for role in ("reference", "candidate") for width in (32, 64)]
    pairs = parameter_pairs(run)
    comparison = StepComparison(pairs, {r: run.reference.tensors[run.reference.leaves[r]].shape for r, _, _ in pairs})
    reference_itself = StepComparison([(r, r, None) for r, _, _ in pairs], comparison.shapes)
    candidate_itself = StepComparison(
        [(c, c, None) for _, c, _ in pairs],
        {c: run.candidate.tensors[run.candidate.leaves[c]].shape for _, c, _ in pairs},
    )
    floor = noise_floor(coarsest_dtype([run.reference.dtype, run.candidate.dtype]))
    rows: list[StepRow] = []
    # step, measure, the update that differs most, what a reduction across ranks did
    first: tuple[int, str, tuple[str, float] | None, ReductionCulprit | None] | None = None
    micro_batches = {}  # role -> micro-batches per step
    for number in range(1, steps + 1):
        say(f"step {number} of {steps}")
        records = {
            (role, width): _step(run.live, role, width, number, seeds[role], run.model_file) for role, width in trained
        }
        micro_batches = {role: records[role, 32].micro_batches for role in ("reference", "candidate")}
        as_run = comparison.between(records["candidate", 32], records["reference", 32])
        in_float64 = comparison.between(records["candidate", 64], records["reference", 64])
        reference_rounding = reference_itself.between(
            records["reference", 32], records["reference", 64], same_side=True
        )
        candidate_rounding = candidate_itself.between(
            records["candidate", 32], records["candidate", 64], same_side=True
        )
        judged = {
            m: _least_explained(in_float64.of(m), reference_rounding.of(m), candidate_rounding.of(m), floor)
            for m in RECORDED
        }
        float64_error = {m: error for m, (error, _) in judged.items()}
        predicted = {m: prediction for m, (_, prediction) in judged.items()}
        semantic = [m for m in MEASURES if not rounding_explains(float64_error[m], predicted[m], floor)]
        rows.append(
            StepRow(
                number,
                BySide(records["reference", 32].loss, records["candidate", 32].loss),
                BySide(records["reference", 32].learning_rate, records["candidate", 32].learning_rate),
                ByMeasure(**{m: as_run.worst(m) for m in RECORDED}),
                ByMeasure(**predicted),
                ByMeasure(**float64_error),
                bool(semantic),
            )
        )
        if semantic and first is None:
            worst = _most_different_update(in_float64, pairs) if semantic[0] == "update" else None
            reduction = _reduction_culprit(records, comparison) if semantic[0] == "gradient" else None
            first = (number, semantic[0], worst, reduction)
    optimizers = {role: run.live.ask(role, TrainerSettings(32)) for role in ("reference", "candidate")}
    settings = {role: of_role[0] for role, of_role in optimizers.items()}
    if first is None:
        exact = all(getattr(row.error, m) == 0 for row in rows for m in MEASURES)
        return TrainingResult("match" if exact else "noise", rows, settings=settings)
    number, measure, worst, reduction = first
    row = rows[number - 1]
    result = TrainingResult("divergent", rows, number, STAGES[measure], settings=settings)
    if reduction is not None:
        result.stage, result.culprit = "reduction", reduction
    elif worst is not None:
        parameter, error = worst
        decays = {role: of_role[1] for role, of_role in optimizers.items()}
        what, ref_value, cand_value = _differing_setting(row, settings, _decay_differences(pairs, decays))
        result.culprit = OptimizerCulprit("optimizer", leaf_name(parameter), what, ref_value, cand_value, error)
    elif number == 1:
        say(f"searching the {result.stage} pass at the initial weights")
        searched = run.bisect(backward=measure == "gradient")
        if searched.verdict == "nondeterministic":  # a side against itself: the sides are not compared
            result.verdict, result.culprit = "nondeterministic", searched.culprit
            result.note = "; ".join(
                f"the {found.side} does not repeat itself ({found.cause}): {found.fix}"
                for found in searched.nondeterminism
            )
            return result
        searched = searched.backward if measure == "gradient" else searched
        if searched.verdict == "divergent":
            result.culprit = searched.culprit
            if searched.unconfirmed and searched.bracket is not None:
                result.note = _unconfirmed_text(searched.bracket)
            else:
                result.note = searched.missing_gradient or searched.unreduced_gradient or ""
        elif measure == "loss":
            result.note = (
                f"the models' outputs agree ({searched.verdict}: {_error_text(searched)}), the losses do not "
                f"(reference {row.loss.reference:.6g}, candidate {row.loss.candidate:.6g}): "
                + _loss_difference(row.loss, micro_batches)
            )
        else:
            result.note = (
                f"the backward search at the initial weights finds {searched.verdict} ({_error_text(searched)}): "
                "the gradients part in the losses' own backward"
            )
    else:
        result.note = (
            f"the {result.stage} first differs at step {number}; its search runs at the initial weights only "
            "(bisectr bisect" + (" --backward" if measure == "gradient" else "") + ")"
        )
    return result


def _step(
    live: LiveRun, role: str, width: int, number: int, seeds: dict[str, np.ndarray], model_file: str
) -> StepRecord:
    """Step `number` of the `role` side's trainer at `width` bits, made where its model lives (on each of
    its ranks)."""
    each = live.ask(role, EachRank(TrainStep(width, number, seeds)))
    shapes = [facts.batch for facts in each]
    if any(batch != shapes[0] for batch in shapes):
        ranks = "; ".join(f"rank {rank}: {', '.join(map(str, batch))}" for rank, batch in enumerate(shapes))
        raise ModelFileError(
            f"{model_file}: the {role}'s {len(each)} ranks were given batches of different shapes at step {number} "
            f"({ranks}): the world size {len(each)} does not divide the batch, and the ranks' gradients are "
            "averaged as if each held an equal share of it"
        )
    unreduced = [
        name
        for name in each[0].replicas
        if len({facts.replicas[name][0] for facts in each}) == 1
        and len({facts.replicas[name][1] for facts in each}) > 1
    ]
    return StepRecord(
        sum(facts.loss for facts in each) / len(each),
        each[0].learning_rate,
        each[0].parameters,
        lambda measure, name: live.ask(role, StepValues(width, measure, name)),
        lambda measure, name: live.ask(role, EachRank(StepValues(width, measure, name))),
        len(each),
        unreduced,
        each[0].micro_batches,
    )


def _reduction_culprit(
    records: dict[tuple[str, int], StepRecord], comparison: StepComparison
) -> ReductionCulprit | None:
    """What a reduction across a side's ranks did to its gradients, where that explains how they differ from the
    other side's (both in float64): parameters held whole that the ranks never reduced (their gradients differ by
    rank and sum or average to the other side's), or every differing gradient scaled by one factor. None: no side
    is on several processes, or its gradients differ otherwise (a backward's difference)."""
    for role in ("candidate", "reference"):
        mine = records[role, 64]
        if mine.ranks < 2:
            continue
        theirs = records["reference" if role == "candidate" else "candidate", 64]
        in_both = [(c, r, pair) if role == "candidate" else (r, c, None) for r, c, pair in comparison.pairs]
        found = _never_reduced(mine, theirs, in_both, comparison)
        if found is not None:
            return ReductionCulprit("reduction", role, *found)
        scaled = _scaled(mine, theirs, in_both, comparison)
        if scaled is not None:
            names, factor = scaled
            return ReductionCulprit("reduction", role, names, _scaling_text(factor, mine.ranks), factor)
    return None


def _never_reduced(
    mine: StepRecord, theirs: StepRecord, in_both: list[tuple[str, str, TensorPair | None]], comparison: StepComparison
) -> tuple[list[str], str] | None:
    """The parameters (of `mine`, held whole by every rank) whose gradients its ranks never reduced: each rank
    holds its own, and their sum or mean is the other side's gradient."""
    named: dict[str, list[str]] = {"sum": [], "mean": []}
    for own, other, pair in in_both:
        if own not in mine.unreduced:
            continue
        each = [values for values in mine.read_each("gradient", own) if values is not None]
        target = theirs.read("gradient", other)
        if target is None or len(each) < mine.ranks:
            continue
        total = np.sum(each, axis=0)
        for how, values in (("sum", total), ("mean", total / mine.ranks)):
            if comparison._error(values, target, pair, other, 0.0) < _FLOAT64_EXACT:
                named[how].append(leaf_name(own))
                break
    how = max(named, key=lambda each: len(named[each]))
    if not named[how]:
        return None
    return named[how], (
        f"the gradients of {_listed(named[how])} are never reduced across the {mine.ranks} ranks: each rank holds "
        f"its own, and their {how} is the other side's"
    )


def _scaled(
    mine: StepRecord, theirs: StepRecord, in_both: list[tuple[str, str, TensorPair | None]], comparison: StepComparison
) -> tuple[list[str], float] | None:
    """(the differing parameters of `mine`, the factor) where each of its gradients that differs from the other
    side's is that gradient times one factor."""
    names, factors = [], []
    for own, other, pair in in_both:
        values, target = mine.read("gradient", own), theirs.read("gradient", other)
        if values is None or target is None:
            continue
        if pair is not None:
            values = pair.candidate_in_reference_layout(values, comparison.shapes[other])
        values = values.reshape(target.shape)
        if comparison._error(values, target, None, other, 0.0) < _FLOAT64_EXACT:
            continue
        square = float(np.vdot(target, target))
        if square == 0.0:
            return None
        factor = float(np.vdot(values, target)) / square
        if relative_to(magnitude(values - factor * target), magnitude(values)) > _FLOAT64_EXACT:
            return None
        names.append(leaf_name(own))
        factors.append(factor)
    if not factors or any(not math.isclose(f, factors[0], rel_tol=1e-6) for f in factors):
        return None
    return names, factors[0]


def _scaling_text(factor: float, ranks: int) -> str:
    if math.isclose(factor, 1 / ranks, rel_tol=1e-6):
        return (
            f"every gradient is 1/{ranks} of the other side's: divided by the world size {ranks} once more than "
            "the reduction's average does (averaged twice)"
        )
    if math.isclose(factor, ranks, rel_tol=1e-6):
        return f"every gradient is {ranks} times the other side's: summed over the {ranks} ranks, not averaged"
    return f"every gradient is {factor:.6g} times the other side's"


def _listed(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _most_different_update(in_float64: Distances, pairs: list[tuple[str, str, TensorPair]]) -> tuple[str, float]:
    """The reference leaf whose update differs most (relative, both sides in float64), and by how much."""
    error, name = max(zip(in_float64.of("update"), (reference for reference, _, _ in pairs)))
    return name, error


def _unconfirmed_text(bracket: Any) -> str:
    """Where the search says an unconfirmed difference enters: the candidate's ops there and their lines."""
    sites = "; ".join(
        f"op {site.index} {site.op} ({os.path.basename(site.source) or site.module or 'top level'})"
        for site in bracket.candidate
    )
    return (
        f"unconfirmed: no patch of the culprit's own difference removes it; the difference enters between the "
        f"candidate's ops {bracket.low} and {bracket.high}: {sites}"
    )


def _loss_difference(losses: BySide, micro_batches: dict[str, int]) -> str:
    """What differs between loss functions: a side that sums its micro-batches' losses undivided, else
    their code."""
    for role, other in (("candidate", "reference"), ("reference", "candidate")):
        count = micro_batches.get(role, 1)
        ratio = getattr(losses, role) / getattr(losses, other) if getattr(losses, other) else math.inf
        if count > 1 and math.isclose(ratio, count, rel_tol=1e-4):
            return (
                f"the {role}'s loss is {count} times the {other}'s: it accumulates {count} micro-batches, each "
                f"loss not divided by {count}"
            )
    return "the loss functions compute differently"


def _error_text(result: Any) -> str:
    return f"relative difference {result.output_error.max_rel:.3g}"


def _decay_differences(
    pairs: list[tuple[str, str, TensorPair]], decays: dict[str, dict[str, float]]
) -> tuple[str, Any, Any] | None:
    """Parameters that one side decays and the other exempts: (what, reference's coefficient, candidate's)."""
    decayed_here = {"candidate": [], "reference": []}
    coefficients = {"candidate": set(), "reference": set()}
    for reference, candidate, _ in pairs:
        of_reference, of_candidate = decays["reference"].get(reference, 0.0), decays["candidate"].get(candidate, 0.0)
        for role, name, mine, other in (
            ("candidate", candidate, of_candidate, of_reference),
            ("reference", reference, of_reference, of_candidate),
        ):
            if mine and not other:
                decayed_here[role].append(leaf_name(name))
                coefficients[role].add(mine)
    for role, exempting in (("candidate", "the reference exempts"), ("reference", "the candidate exempts")):
        names = decayed_here[role]
        if names:
            what = f"weight decay on {len(names)} parameters {exempting} ({_kinds(names)})"
            coefficient = max(coefficients[role])
            return (what, 0.0, coefficient) if role == "candidate" else (what, coefficient, 0.0)
    return None


def _kinds(names: list[str]) -> str:
    """What kinds of parameters `names` are, as the usual exemption rules name them."""
    biases = sum(name.endswith("bias") for name in names)
    norms = sum(not name.endswith("bias") and any(part in name.lower() for part in ("norm", "ln")) for name in names)
    kinds = [f"{norms} norm weights"] if norms else []
    kinds += [f"{biases} biases"] if biases else []
    others = len(names) - biases - norms
    kinds += [f"{others} others"] if others else []
    return ", ".join(kinds)


def _differing_setting(
    row: StepRow, settings: dict[str, dict[str, Any]], decay_difference: tuple[str, Any, Any] | None = None
) -> tuple[str, Any, Any]:
    """What differs between the optimizers at this step: the learning rate, which parameters are
    decayed, a setting, else the update rule."""
    rates = row.learning_rate
    if not math.isclose(rates.reference, rates.candidate, rel_tol=1e-6, abs_tol=0.0):
        return "learning rate", rates.reference, rates.candidate
    if decay_difference is not None:
        return decay_difference
    reference, candidate = settings["reference"], settings["candidate"]
    for name in SETTINGS:
        of_reference, of_candidate = reference.get(name), candidate.get(name)
        if (
            isinstance(of_reference, float)
            and isinstance(of_candidate, float)
            and math.isclose(of_reference, of_candidate, rel_tol=1e-6)
        ):
            continue
        if of_reference != of_candidate:
            return name.replace("_", " "), of_reference, of_candidate
    return "update rule", reference.get("optimizer"), candidate.get("optimizer")
