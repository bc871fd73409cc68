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
   `forward` (the losses differ), `backward` (the losses agree, the gradients differ) or `optimizer`
   (the gradients agree, the updates differ). At step 1, a forward or backward stage is searched
   (`Run.bisect`, with the backward for a backward stage) and its culprit named; an optimizer stage
   names the parameter whose update differs most and what differs between the optimizers: the
   learning rate of that step, epsilon, the betas, the weight decay (and whether it is coupled to
   the gradient or decoupled), AMSGrad, gradient clipping; or, when no setting differs, the update
   rule itself (bias correction, for one).
"""

from __future__ import annotations

import math
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
from .sides.runner import StepValues, TrainerSettings, TrainStep
from .measure.live import LiveRun
from .leafref import leaf_kind, leaf_name

MEASURES = ("loss", "gradient", "update")  # what decides the first semantic step and its stage
RECORDED = MEASURES + ("moments",)  # compared and shown at every step
STAGES = {"loss": "forward", "gradient": "backward", "update": "optimizer"}
SETTINGS = ("epsilon", "beta1", "beta2", "weight_decay", "weight_decay_kind", "amsgrad", "gradient_clipping")


@dataclass
class StepRecord:
    """What one side's training step computed. A parameter's gradient, update and Adam moments
    ("gradient", "update", "moment1", "moment2") are read from the side one parameter at a time
    (`read`), as float64 arrays, until its next step: no step keeps a copy of them all."""

    loss: float
    learning_rate: float
    parameters: list[str]
    read: Callable[[str, str], np.ndarray | None]  # (measure, parameter) -> its values, None: it has none


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
class TrainingResult:
    verdict: str  # "match" | "noise" | "divergent" | "nondeterministic"
    steps: list[StepRow]
    first_step: int | None = None
    stage: str | None = None  # "forward" | "backward" | "optimizer"
    culprit: Culprit | OptimizerCulprit | None = None
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


def parameter_pairs(run: Run) -> list[tuple[str, str, TensorPair]]:
    """(reference leaf, candidate leaf, pair) of the parameters the forward alignment pairs."""
    pairs = []
    for cand_tid, pair in run.alignment.tensors.items():
        cand_leaf, ref_leaf = (
            run.candidate.tensors[cand_tid].leaf or "",
            run.reference.tensors[pair.reference].leaf or "",
        )
        if leaf_kind(cand_leaf) == leaf_kind(ref_leaf) == "param":
            pairs.append((ref_leaf, cand_leaf, pair))
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
) -> TrainingResult:
    """Train both sides of `model_file` for `steps` steps and compare them (see the module docstring)."""
    say = progress or (lambda message: None)
    if steps < 1:
        raise ModelFileError(f"{model_file}: --steps must be at least 1 (got {steps})")
    say("tracing both sides at their initial weights")
    run = trace(model_file, reference, candidate)
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
    first: tuple[int, str, tuple[str, float] | None] | None = None  # step, measure, the update that differs most
    for number in range(1, steps + 1):
        say(f"step {number} of {steps}")
        records = {(role, width): _step(run.live, role, width, number, seeds[role]) for role, width in trained}
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
            first = (number, semantic[0], worst)
    optimizers = {role: run.live.ask(role, TrainerSettings(32)) for role in ("reference", "candidate")}
    settings = {role: of_role[0] for role, of_role in optimizers.items()}
    if first is None:
        exact = all(getattr(row.error, m) == 0 for row in rows for m in MEASURES)
        return TrainingResult("match" if exact else "noise", rows, settings=settings)
    number, measure, worst = first
    row = rows[number - 1]
    result = TrainingResult("divergent", rows, number, STAGES[measure], settings=settings)
    if worst is not None:
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
        elif measure == "loss":
            result.note = (
                f"the models' outputs agree ({searched.verdict}: {_error_text(searched)}), the losses do not "
                f"(reference {row.loss.reference:.6g}, candidate {row.loss.candidate:.6g}): the loss "
                "functions compute differently"
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


def _step(live: LiveRun, role: str, width: int, number: int, seeds: dict[str, np.ndarray]) -> StepRecord:
    """Step `number` of the `role` side's trainer at `width` bits, made where its model lives."""
    facts = live.ask(role, TrainStep(width, number, seeds))
    return StepRecord(
        facts.loss,
        facts.learning_rate,
        facts.parameters,
        lambda measure, name: live.ask(role, StepValues(width, measure, name)),
    )


def _most_different_update(in_float64: Distances, pairs: list[tuple[str, str, TensorPair]]) -> tuple[str, float]:
    """The reference leaf whose update differs most (relative, both sides in float64), and by how much."""
    error, name = max(zip(in_float64.of("update"), (reference for reference, _, _ in pairs)))
    return name, error


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
