"""Training steps (`bisectr train`): both sides trained for N steps, compared step by step.

1. **Sides.** Each side trains a copy of the model its function builds, with its optimizer
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
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .adapters import CannotUpcast
from .measure.align import TensorPair
from .errors import ModelFileError
from .capture.modelfile import BuiltSide, load_module, module_name, run_user_code
from .measure.numerics import GRADIENT_FLOOR, coarsest_dtype, magnitude, noise_floor, relative_to, rounding_allowance, rounding_explains
from .measure.runrecord import output_seeds
from .capture.recording import output_pairs
from .measure.result import Culprit
from .run import Run, trace
from .serial import to_plain
from .capture.sides import loss_of
from .capture.structure import map_tensors
from .capture.trace import is_floating
from .leafref import leaf_kind, leaf_name

MEASURES = ("loss", "gradient", "update")  # what decides the first semantic step and its stage
RECORDED = MEASURES + ("moments",)  # compared and shown at every step
STAGES = {"loss": "forward", "gradient": "backward", "update": "optimizer"}
SETTINGS = ("epsilon", "beta1", "beta2", "weight_decay", "weight_decay_kind", "amsgrad", "gradient_clipping")


@dataclass
class StepRecord:
    """What one side's training step computed. A parameter's gradient, update and Adam moments
    ("gradient", "update", "moment1", "moment2") are read from the trainer one parameter at a time, as
    float64 arrays, until the trainer's next step: no step keeps a copy of them all."""

    loss: float
    learning_rate: float
    trainer: Trainer

    def names(self) -> list[str]:
        return list(self.trainer.parameters)

    def read(self, measure: str, name: str) -> np.ndarray | None:
        """One parameter's gradient, update or Adam moment (None: it has none, or no such parameter)."""
        return self.trainer.read(measure, name)


@dataclass
class StepRow:
    """One step of the comparison (errors relative, see `StepComparison`)."""

    step: int
    loss: dict[str, float]  # reference, candidate
    learning_rate: dict[str, float]
    error: dict[str, float]  # loss, gradient, update, moments: candidate vs reference, as run (the worst parameter's)
    # What rounding predicts for each, and candidate vs reference both in float64; for gradients,
    # updates and moments, those of the parameter whose float64 difference rounding explains least.
    predicted: dict[str, float]
    float64_error: dict[str, float]
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
    verdict: str  # "match" | "noise" | "divergent"
    steps: list[StepRow]
    first_step: int | None = None
    stage: str | None = None  # "forward" | "backward" | "optimizer"
    culprit: Culprit | OptimizerCulprit | None = None
    note: str = ""  # what was not searched, and why
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # each side's optimizer settings

    def to_dict(self) -> dict:
        return to_plain(self)


class Trainer:
    """One side trained step by step: a copy of its model (float64 when asked), its optimizer and batches."""

    def __init__(self, side: BuiltSide, module: Any, seeds: dict[str, np.ndarray], float64: bool):
        self.side, self.float64, self.seeds = side, float64, seeds
        adapter = side.adapter
        try:
            self.model = adapter.float64_model(side.model) if float64 else adapter.copy_model(side.model)
        except CannotUpcast as exc:
            raise ModelFileError(f"{side.model_file}: the {side.role} cannot be trained here: {exc}") from None
        factory = _function(module, side, "optimizer", required=True)
        built = run_user_code(lambda: factory(self.model), f"{side.model_file}: {side.role}_optimizer() raised")
        self.optimizer, self.scheduler = built if isinstance(built, tuple) else (built, None)
        self.batch = _function(module, side, "batch", required=False)
        self.parameters = {name: t for name, t in adapter.named_leaves(self.model) if leaf_kind(name) == "param"}
        self._before: dict[str, np.ndarray] = {}  # each parameter's values before the last step

    def settings(self) -> dict[str, Any]:
        return self.side.adapter.optimizer_settings(self.optimizer)

    def weight_decays(self) -> dict[str, float]:
        """Each parameter's weight decay coefficient, by leaf name."""
        return self.side.adapter.weight_decays(self.optimizer, self.parameters)

    def step(self, number: int) -> StepRecord:
        side, adapter = self.side, self.side.adapter
        inputs = side.inputs if self.batch is None else \
            run_user_code(lambda: self.batch(number), f"{side.model_file}: {side.role}_batch({number}) raised")
        if self.float64:
            inputs = map_tensors(inputs, adapter.is_tensor,
                                 lambda t: adapter.float64_tensor(t) if is_floating(adapter.dtype_name(t)) else t)
        learning_rate = adapter.learning_rate(self.optimizer)
        adapter.clear_gradients(self.optimizer)
        with adapter.enable_grad():
            outputs = replace(side, model=self.model, inputs=inputs).forward()
            loss = self._loss(outputs)
        adapter.backward(loss)
        self._before = {name: np.array(adapter.to_numpy(t)) for name, t in self.parameters.items()}
        adapter.optimizer_step(self.optimizer, self.scheduler)
        return StepRecord(float(adapter.to_numpy(loss).reshape(())), learning_rate, self)

    def read(self, measure: str, name: str) -> np.ndarray | None:
        """The last step's gradient, update or Adam moment of one parameter (see `StepRecord`)."""
        adapter, parameter = self.side.adapter, self.parameters.get(name)
        if parameter is None:
            return None
        if measure == "gradient":
            values = adapter.gradient(parameter)
        elif measure == "update":
            values = adapter.to_numpy(parameter).astype(np.float64) - self._before[name]
        else:
            values = adapter.optimizer_moments(self.optimizer, parameter).get(measure)
        return None if values is None else values.astype(np.float64, copy=False)

    def _loss(self, outputs: Any) -> Any:
        side, adapter = self.side, self.side.adapter
        if side.loss is not None:
            return loss_of(side, outputs)
        total = None
        for key, tensor in output_pairs(adapter, outputs):
            if key in self.seeds:
                term = (tensor * adapter.from_numpy(self.seeds[key], adapter.dtype_name(tensor), adapter.device_name(tensor))).sum()
                total = term if total is None else total + term
        if total is None:
            raise ModelFileError(f"{side.model_file}: the {side.role} model has no floating output to train on")
        return total


def _function(module: Any, side: BuiltSide, what: str, required: bool) -> Callable | None:
    """The model file's `<side function>_<what>` (`candidate_eps_optimizer` for `--candidate candidate_eps`),
    else its `<role>_<what>` (`candidate_optimizer`)."""
    for name in dict.fromkeys((f"{side.function}_{what}", f"{side.role}_{what}")):
        found = getattr(module, name, None)
        if found is not None:
            if not callable(found):
                raise ModelFileError(f"{side.model_file}: {name} is not a function")
            return found
    if required:
        raise ModelFileError(f"{side.model_file}: defines no function {side.role}_{what}(model) returning the {side.role}'s "
                             "optimizer (or (optimizer, scheduler)): bisectr train needs one per side")
    return None


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

        parameters = {"gradient": per_parameter("gradient"), "update": per_parameter("update"),
                      "moments": list(map(max, per_parameter("moment1"), per_parameter("moment2")))}
        return Distances(relative_to(abs(candidate.loss - reference.loss), abs(reference.loss)), parameters)

    def _per_parameter(self, measure: str, candidate: StepRecord, reference: StepRecord, same_side: bool) -> list[float]:
        scale = self._floor(measure, reference)
        return [self._error(candidate.read(measure, r if same_side else c), reference.read(measure, r),
                            None if same_side else pair, r, scale)
                for r, c, pair in self.pairs]

    @staticmethod
    def _floor(measure: str, record: StepRecord) -> float:
        return GRADIENT_FLOOR * max((magnitude(record.read(measure, name)) for name in record.names()), default=0.0)

    def _error(self, candidate: np.ndarray | None, reference: np.ndarray | None, pair: TensorPair | None,
               reference_name: str, floor: float) -> float:
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
        cand_leaf, ref_leaf = run.candidate.tensors[cand_tid].leaf or "", run.reference.tensors[pair.reference].leaf or ""
        if leaf_kind(cand_leaf) == leaf_kind(ref_leaf) == "param":
            pairs.append((ref_leaf, cand_leaf, pair))
    if not pairs:
        raise ModelFileError(f"{run.model_file}: no parameter of the candidate is paired with one of the reference: "
                             "nothing to compare over training steps")
    return pairs


def _least_explained(float64_errors: list[float], reference_rounding: list[float], candidate_rounding: list[float],
                     floor: float) -> tuple[float, float]:
    """(float64 error, what rounding predicts for it) of the parameter whose float64 difference rounding
    explains least, each judged against its own two sides' rounding (for the loss: the one value)."""
    judged = [(error, of_reference + of_candidate)
              for error, of_reference, of_candidate in zip(float64_errors, reference_rounding, candidate_rounding)]
    return max(judged, key=lambda each: relative_to(each[0], rounding_allowance(each[1], floor)), default=(0.0, 0.0))


def train(model_file: str, reference: str = "reference", candidate: str = "candidate", steps: int = 20,
          progress: Callable[[str], None] | None = None) -> TrainingResult:
    """Train both sides of `model_file` for `steps` steps and compare them (see the module docstring)."""
    say = progress or (lambda message: None)
    if steps < 1:
        raise ModelFileError(f"{model_file}: --steps must be at least 1 (got {steps})")
    say("tracing both sides at their initial weights")
    run = trace(model_file, reference, candidate)
    sides = {role: run.sides.runners[role].side for role in ("reference", "candidate")}
    module = sys.modules.get(module_name(Path(model_file))) or load_module(model_file)  # as the trace ran it
    seeds = output_seeds(run)
    trainers = {(role, width): Trainer(sides[role], module, seeds[role], float64=width == 64)
                for role in ("reference", "candidate") for width in (32, 64)}
    pairs = parameter_pairs(run)
    comparison = StepComparison(pairs, {r: run.reference.tensors[run.reference.leaves[r]].shape for r, _, _ in pairs})
    reference_itself = StepComparison([(r, r, None) for r, _, _ in pairs], comparison.shapes)
    candidate_itself = StepComparison([(c, c, None) for _, c, _ in pairs],
                                  {c: run.candidate.tensors[run.candidate.leaves[c]].shape for _, c, _ in pairs})
    floor = noise_floor(coarsest_dtype([run.reference.dtype, run.candidate.dtype]))
    rows: list[StepRow] = []
    first: tuple[int, str, tuple[str, float] | None] | None = None  # step, measure, the update that differs most
    for number in range(1, steps + 1):
        say(f"step {number} of {steps}")
        records = {key: trainer.step(number) for key, trainer in trainers.items()}
        as_run = comparison.between(records["candidate", 32], records["reference", 32])
        in_float64 = comparison.between(records["candidate", 64], records["reference", 64])
        reference_rounding = reference_itself.between(records["reference", 32], records["reference", 64], same_side=True)
        candidate_rounding = candidate_itself.between(records["candidate", 32], records["candidate", 64], same_side=True)
        judged = {m: _least_explained(in_float64.of(m), reference_rounding.of(m), candidate_rounding.of(m), floor)
                  for m in RECORDED}
        float64_error = {m: error for m, (error, _) in judged.items()}
        predicted = {m: prediction for m, (_, prediction) in judged.items()}
        semantic = [m for m in MEASURES if not rounding_explains(float64_error[m], predicted[m], floor)]
        rows.append(StepRow(number, {"reference": records["reference", 32].loss, "candidate": records["candidate", 32].loss},
                            {"reference": records["reference", 32].learning_rate, "candidate": records["candidate", 32].learning_rate},
                            {m: as_run.worst(m) for m in RECORDED}, predicted, float64_error, bool(semantic)))
        if semantic and first is None:
            worst = _most_different_update(in_float64, pairs) if semantic[0] == "update" else None
            first = (number, semantic[0], worst)
    settings = {role: trainers[role, 32].settings() for role in ("reference", "candidate")}
    if first is None:
        exact = all(row.error[m] == 0 for row in rows for m in MEASURES)
        return TrainingResult("match" if exact else "noise", rows, settings=settings)
    number, measure, worst = first
    row = rows[number - 1]
    result = TrainingResult("divergent", rows, number, STAGES[measure], settings=settings)
    if worst is not None:
        parameter, error = worst
        decays = {role: trainers[role, 32].weight_decays() for role in ("reference", "candidate")}
        what, ref_value, cand_value = _differing_setting(row, settings, _decay_differences(pairs, decays))
        result.culprit = OptimizerCulprit("optimizer", leaf_name(parameter), what, ref_value, cand_value, error)
    elif number == 1:
        say(f"searching the {result.stage} pass at the initial weights")
        searched = run.bisect(backward=measure == "gradient")
        searched = searched.backward if measure == "gradient" else searched
        if searched.verdict == "divergent":
            result.culprit = searched.culprit
        elif measure == "loss":
            result.note = (f"the models' outputs agree ({searched.verdict}: {_error_text(searched)}), the losses do not "
                           f"(reference {row.loss['reference']:.6g}, candidate {row.loss['candidate']:.6g}): the loss "
                           "functions compute differently")
        else:
            result.note = (f"the backward search at the initial weights finds {searched.verdict} ({_error_text(searched)}): "
                           "the gradients part in the losses' own backward")
    else:
        result.note = (f"the {result.stage} first differs at step {number}; its search runs at the initial weights only "
                       "(bisectr bisect" + (" --backward" if measure == "gradient" else "") + ")")
    return result


def _most_different_update(in_float64: Distances, pairs: list[tuple[str, str, TensorPair]]) -> tuple[str, float]:
    """The reference leaf whose update differs most (relative, both sides in float64), and by how much."""
    error, name = max(zip(in_float64.of("update"), (reference for reference, _, _ in pairs)))
    return name, error


def _error_text(result: Any) -> str:
    return f"relative difference {result.output_error.max_rel:.3g}"


def _decay_differences(pairs: list[tuple[str, str, TensorPair]], decays: dict[str, dict[str, float]]) -> tuple[str, Any, Any] | None:
    """Parameters that one side decays and the other exempts: (what, reference's coefficient, candidate's)."""
    decayed_here = {"candidate": [], "reference": []}
    coefficients = {"candidate": set(), "reference": set()}
    for reference, candidate, _ in pairs:
        of_reference, of_candidate = decays["reference"].get(reference, 0.0), decays["candidate"].get(candidate, 0.0)
        for role, name, mine, other in (("candidate", candidate, of_candidate, of_reference),
                                        ("reference", reference, of_reference, of_candidate)):
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


def _differing_setting(row: StepRow, settings: dict[str, dict[str, Any]],
                       decay_difference: tuple[str, Any, Any] | None = None) -> tuple[str, Any, Any]:
    """What differs between the optimizers at this step: the learning rate, which parameters are
    decayed, a setting, else the update rule."""
    rates = row.learning_rate
    if not math.isclose(rates["reference"], rates["candidate"], rel_tol=1e-6, abs_tol=0.0):
        return "learning rate", rates["reference"], rates["candidate"]
    if decay_difference is not None:
        return decay_difference
    reference, candidate = settings["reference"], settings["candidate"]
    for name in SETTINGS:
        of_reference, of_candidate = reference.get(name), candidate.get(name)
        if isinstance(of_reference, float) and isinstance(of_candidate, float) and math.isclose(of_reference, of_candidate, rel_tol=1e-6):
            continue
        if of_reference != of_candidate:
            return name.replace("_", " "), of_reference, of_candidate
    return "update rule", reference.get("optimizer"), candidate.get("optimizer")
