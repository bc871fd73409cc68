"""The backward pass: where the two sides' gradients part, with the forward's proof.

1. **Seeds.** Both sides' backward passes start from one fixed random gradient on the paired
   outputs (the reference's, laid out as the candidate's output), so that a difference in the
   losses cannot hide one in the backward; or from the model file's `reference_loss(outputs)` and
   `candidate_loss(outputs)`, whose values are then compared too.
2. **Gradients.** Each side runs forward and backward again through its own code
   (the sides' `Backward` request): the gradient reaching every recorded op output, and every parameter's.
3. **Pairs.** The forward alignment pairs them: the gradients of a paired tensor are a pair, and so
   are a paired parameter's or floating input's (the leaves). The backward's outputs are the
   leaves' gradients; their error (worst max_rel) is what the search brings down.
4. **Gradients one side lacks.** A parameter with a gradient on one side and none on the other
   (frozen), or a tensor the reference's gradient reaches and the candidate's does not (a `detach`
   on a path the reference differentiates), is a difference no rounding makes: `divergent`, the
   leaf or the op named. A cut gradient is confirmed as the forward confirms an op: the candidate
   re-run with the reference's gradient handed on where the cut op's input receives it.
5. **Cut search** in backward order: G(k) is the leaves' gradient error when the candidate's backward is
   re-run with the reference's gradients handed on for every paired tensor whose readers all come
   at or after candidate op k. The binary search finds the entry point, the first cut (from the
   outputs back) after which less than half of the error is left.
6. **Float64 check**: both sides' backward passes in float64; agreement there means rounding.
7. **Evidence per paired op**: the local backward error, the candidate op's backward replayed on the
   reference's forward inputs and the reference's upstream gradient against the reference op's,
   and the fp64 oracle of the reference op's backward (`analysis.judge`). Suspects, nearest to the
   entry point first, are confirmed by a candidate re-run with only their own difference taken out
   of the gradients they hand on (for a parameter, taken out of its gradient).
"""

from __future__ import annotations

import math
from dataclasses import astuple
from functools import partial
from typing import Callable, Iterator

import numpy as np

from ..adapters import COMPILED_OP, CannotUpcast
from ..measure.align import TensorPair, handed_on
from ..errors import ModelFileError, OutputMismatchError
from ..measure.metrics import EXACT, ErrorMetrics, Float64Evidence, OutputError, error_metrics
from .precision import float64_runs, noted
from ..measure.numerics import GRADIENT_FLOOR, coarsest_dtype, confirms, judge, judge_float64, magnitude, relative_to
from ..measure.runrecord import RunRecord, output_seeds
from .window import fetch_all, needs_window
from ..engines.gradient import Gradients
from ..engines.patched import Shift
from ..measure.result import Bracket, Confirmation, Culprit, Float64Check, ProfileRow
from .core import (
    Decided,
    ErrorToExplain,
    Outcome,
    PassRules,
    SearchPass,
    bracket,
    culprit_without_evidence,
    cut_before,
    site,
)
from ..sides.runner import Backward, EachRank, Float64Gradients, ReplayVJP
from ..measure.live import LiveRun
from ..measure.analysis import OpEvidence, block_name, external_inputs
from ..capture.trace import OpNode, Trace, is_floating
from ..leafref import LeafRef, leaf_kind

LEAVES = (
    "param",
    "input",
)  # the leaves whose gradients are the backward's outputs (floating inputs: see `sides.runner.Backward`)


class BackwardRun:
    """Both sides' backward passes of a live run, paired through the forward alignment. With
    `reference_activations`, the candidate's runs go through its own ops at the reference's forward
    values (`activations`): its gradients then differ by what its backward does alone."""

    def __init__(self, live: LiveRun, reference_activations: bool = False):
        run = self.run = live.run
        self.live = live
        self.seeds = output_seeds(run)
        self.activations = _reference_activations(run) if reference_activations else {}
        self.reference = live.ask("reference", Backward(self.seeds["reference"]))
        ranks = live.ask("candidate", EachRank(Backward(self.seeds["candidate"], activations=self.activations)))
        self.candidate, self.candidate_ranks = ranks[0], len(ranks)
        self.unreduced = _unreduced(ranks)
        tensors, parameters = {}, {}
        for cand_tid, pair in run.alignment.tensors.items():
            cand_info, ref_info = run.candidate.tensors[cand_tid], run.reference.tensors[pair.reference]
            if pair.broadcast or not (is_floating(cand_info.dtype) and is_floating(ref_info.dtype)):
                continue
            if cand_info.producer is not None and ref_info.producer is not None:
                tensors[cand_tid] = pair
            elif leaf_kind(cand_info.leaf) in LEAVES and leaf_kind(ref_info.leaf) in LEAVES:
                parameters[cand_tid] = pair
        self.tensor_pairs: dict[int, TensorPair] = tensors
        self.leaf_pairs: dict[int, TensorPair] = parameters
        # What one piece of backward evidence covers, by the candidate op it is known by: a paired op,
        # or a matched N:M block (a custom autograd function against the ops it stands for), known by
        # its first op, where the backward leaves it: a cut there hands on the reference's gradients
        # to the block's inputs. `op_pairs`: that op -> the reference's.
        units = [([p.candidate], [p.reference]) for p in run.alignment.pairs]
        units += [(b.candidate, b.reference) for b in run.alignment.blocks if b.matched and b.candidate and b.reference]
        self.units: dict[int, tuple[list[int], list[int]]] = {cand[0]: (cand, ref) for cand, ref in sorted(units)}
        self.op_pairs: dict[int, int] = {index: ref[0] for index, (_, ref) in self.units.items()}
        self.readers = {role: trace.consumers() for role, trace in run.traces.items()}
        magnitudes = {tid: magnitude(self.reference.leaves.get(pair.reference)) for tid, pair in parameters.items()}
        floor = GRADIENT_FLOOR * max(magnitudes.values(), default=0.0)
        self.leaf_scales = {tid: max(magnitude, floor) for tid, magnitude in magnitudes.items()}

    # -- gradients in one layout ---------------------------------------------------
    def pair(self, cand_tid: int) -> TensorPair | None:
        """The pair of a candidate op output or leaf whose gradients are compared (None: not compared)."""
        return self.tensor_pairs.get(cand_tid) or self.leaf_pairs.get(cand_tid)

    def _gradient(self, grads: Gradients, tid: int, paired_op_output: bool) -> np.ndarray | None:
        return (grads.tensors if paired_op_output else grads.leaves).get(tid)

    def reference_gradient(self, cand_tid: int) -> np.ndarray | None:
        """The reference's gradient of the tensor paired with `cand_tid`, in the candidate's layout."""
        pair = self.pair(cand_tid)
        values = None if pair is None else self._gradient(self.reference, pair.reference, cand_tid in self.tensor_pairs)
        return (
            None
            if values is None
            else pair.reference_in_candidate_layout(values, self.run.candidate.tensors[cand_tid].shape)
        )

    def tensor_error(self, cand_tid: int, grads: Gradients | None = None) -> ErrorMetrics | None:
        """The error of the candidate's gradient of `cand_tid` (a paired op output or parameter; the
        candidate's own, or from `grads`); None unless it is paired and both sides' gradients reach it."""
        pair = self.pair(cand_tid)
        if pair is None:
            return None
        op_output = cand_tid in self.tensor_pairs
        candidate = self._gradient(grads or self.candidate, cand_tid, op_output)
        reference = self._gradient(self.reference, pair.reference, op_output)
        if candidate is None or reference is None:
            return None
        return error_metrics(candidate, pair.reference_in_candidate_layout(reference, candidate.shape))

    def leaf_error(self, grads: Gradients | None = None) -> OutputError:
        """Worst max_abs and max_rel over the parameters whose gradients both sides have. A
        parameter's max_rel is taken against its own gradient's largest magnitude, but never
        against less than `GRADIENT_FLOOR` of the largest of any parameter's: a gradient that is
        zero but for rounding (a key bias before a softmax) has no relative error of its own."""
        grads = grads or self.candidate
        return self.worst_leaf_error(lambda tid, pair: self.tensor_error(tid, grads))

    def worst_leaf_error(self, error_of: Callable[[int, TensorPair], ErrorMetrics | None]) -> OutputError:
        max_abs = max_rel = 0.0
        for tid, pair in self.leaf_pairs.items():
            error = error_of(tid, pair)
            if error is not None:
                max_abs = max(max_abs, error.max_abs)
                max_rel = max(max_rel, self.relative(tid, error.max_abs))
        return OutputError(max_abs, max_rel)

    def relative(self, cand_tid: int, max_abs: float) -> float:
        """An absolute error of parameter `cand_tid`'s gradient, relative to its scale (see `leaf_error`)."""
        return relative_to(max_abs, self.leaf_scales[cand_tid])


def _unreduced(ranks: list[Gradients]) -> list[int]:
    """The op outputs whose gradients are placed Replicate and whose ranks hold different values of them."""
    return [tid for tid in ranks[0].replicated if len({grads.replicated.get(tid) for grads in ranks}) > 1]


def _reference_activations(run: RunRecord) -> dict[int, np.ndarray]:
    """The reference's values of every paired floating op output of the candidate, in its layout."""
    activations = {}
    for cand_tid, pair in run.alignment.tensors.items():
        info = run.candidate.tensors[cand_tid]
        if (
            info.producer is not None
            and not pair.broadcast
            and is_floating(info.dtype)
            and run.reference.has_value(pair.reference)
        ):
            activations[cand_tid] = pair.reference_in_candidate_layout(run.reference.value(pair.reference), info.shape)
    return activations


# -- gradients one side lacks ---------------------------------------------------------
def _reaches(values: np.ndarray | None) -> bool:
    return values is not None and bool(np.any(values))


def missing_leaf_gradient(backward: BackwardRun) -> tuple[int, str] | None:
    """(candidate tid, the side lacking it) of the first parameter, in backward order (read last
    in the forward first), whose gradient one side has and the other has not (frozen)."""
    first_read = backward.run.candidate.first_reads()
    order = sorted(backward.leaf_pairs, key=lambda t: -first_read.get(t, -1))
    return _first_lacking(order, backward.leaf_pairs, backward.candidate.leaves, backward.reference.leaves)


def missing_tensor_gradient(backward: BackwardRun) -> tuple[int, str] | None:
    """(candidate tid, the side lacking it) of the last paired op output (in forward order) that
    the gradient reaches on one side only."""
    order = sorted(backward.tensor_pairs, reverse=True)
    return _first_lacking(order, backward.tensor_pairs, backward.candidate.tensors, backward.reference.tensors)


def _first_lacking(
    order: list[int], pairs: dict[int, TensorPair], candidate: dict, reference: dict
) -> tuple[int, str] | None:
    """(candidate tid, the side lacking it) of the first tid in `order` with a gradient on one side only."""
    for tid in order:
        of_candidate, of_reference = candidate.get(tid), reference.get(pairs[tid].reference)
        if of_candidate is None and _reaches(of_reference):
            return tid, "candidate"
        if of_reference is None and _reaches(of_candidate):
            return tid, "reference"
    return None


# -- evidence -------------------------------------------------------------------------
def block_outputs(trace: Trace, indices: list[int], readers: dict[int, list[int]]) -> list[int]:
    """The tensors ops `indices` hand on (`align.handed_on`) where their backward starts: those no op
    inside reads. One read inside too (an alias a `.to()` to its own dtype made, that the model
    reads again later) is not a start: the gradient reaching it already holds what the block's
    own ops made of it."""
    inside = set(indices)
    return [tid for tid in handed_on(trace, indices, readers) if inside.isdisjoint(readers.get(tid, []))]


def op_evidence(backward: BackwardRun, cand_index: int) -> OpEvidence:
    """The local backward error of one paired op or matched block and its fp64 oracle (see the module docstring)."""
    run, live = backward.run, backward.live
    cand_ops, ref_ops = backward.units[cand_index]
    ref_index = backward.op_pairs[cand_index]
    cand_op = run.candidate.ops[cand_index]
    dtype = coarsest_dtype(run.candidate.dtypes_of(cand_ops))
    name = (
        block_name([run.reference.ops[i].op for i in ref_ops]) if len(ref_ops) > 1 or len(cand_ops) > 1 else cand_op.op
    )
    cand_outputs = block_outputs(run.candidate, cand_ops, backward.readers["candidate"])
    ref_outputs = block_outputs(run.reference, ref_ops, backward.readers["reference"])
    propagated = backward.tensor_error(cand_op.outputs[0]) or EXACT
    evidence = OpEvidence(cand_index, ref_index, name, dtype, propagated, None, None, "unknown")
    if not cand_outputs or not ref_outputs:
        return evidence
    cand_inputs, ref_inputs = external_inputs(run.candidate, cand_ops), external_inputs(run.reference, ref_ops)
    pairs = {t: backward.pair(t) for t in cand_inputs}
    compared = [(t, pair.reference) for t, pair in pairs.items() if pair is not None and pair.reference in ref_inputs]
    if not compared or not all(run.reference.has_value(t) for t in ref_inputs):
        return evidence
    cand_values = {}
    for tid in cand_inputs:
        pair = backward.tensor_pairs.get(tid)
        if pair is not None and run.reference.has_value(pair.reference):
            cand_values[tid] = pair.reference_in_candidate_layout(
                run.reference.value(pair.reference), run.candidate.tensors[tid].shape
            )
        elif run.candidate.has_value(tid):
            cand_values[tid] = run.candidate.value(tid)
        else:
            return evidence
    cand_upstream = {
        t: backward.reference_gradient(t) if t in backward.tensor_pairs else backward.candidate.tensors.get(t)
        for t in cand_outputs
    }
    ref_upstream = {t: backward.reference.tensors.get(t) for t in ref_outputs}
    ref_values = {t: run.reference.value(t) for t in ref_inputs}
    try:
        local = live.ask("candidate", ReplayVJP(cand_ops, cand_values, cand_upstream))
        truth = live.ask("reference", ReplayVJP(ref_ops, ref_values, ref_upstream))
    except Exception:  # ops whose backward cannot be replayed on their own keep no local evidence
        return evidence
    try:
        oracle = live.ask("reference", ReplayVJP(ref_ops, ref_values, ref_upstream, float64=True))
    except CannotUpcast as exc:  # an op without a float64 kernel: the local error decides alone
        oracle, evidence.fp64_unavailable = None, str(exc)

    worst = {"local": 0.0, "candidate_error": 0.0, "reference_error": 0.0}
    own_difference = {}
    for cand_tid, ref_tid in compared:
        candidate_grad, reference_grad = local.get(cand_tid), truth.get(ref_tid)
        if candidate_grad is None or reference_grad is None:
            if _reaches(candidate_grad) or _reaches(reference_grad):
                worst["local"] = math.inf
            continue
        pair = pairs[cand_tid]
        candidate_grad = pair.candidate_in_reference_layout(candidate_grad, run.reference.tensors[ref_tid].shape)
        worst["local"] = max(worst["local"], error_metrics(candidate_grad, reference_grad).max_rel)
        difference = candidate_grad.astype(np.float64) - reference_grad
        own_difference[cand_tid] = pair.reference_in_candidate_layout(difference, run.candidate.tensors[cand_tid].shape)
        if oracle is not None and oracle.get(ref_tid) is not None:
            exact = oracle[ref_tid]
            worst["candidate_error"] = max(
                worst["candidate_error"], error_metrics(candidate_grad.astype(np.float64), exact).max_rel
            )
            worst["reference_error"] = max(
                worst["reference_error"], error_metrics(reference_grad.astype(np.float64), exact).max_rel
            )
    evidence.local_error = worst["local"]
    evidence.own_difference = own_difference
    if oracle is not None and worst["local"] not in (0.0, math.inf):
        evidence.fp64 = Float64Evidence(worst["candidate_error"], worst["reference_error"])
    evidence.verdict = (
        "different"
        if math.isinf(worst["local"])
        else judge(
            worst["local"],
            evidence.fp64 and evidence.fp64.candidate_error,
            evidence.fp64 and evidence.fp64.reference_error,
            dtype,
        )
    )
    return evidence


class BackwardPass(SearchPass):
    """The candidate's backward re-run with the reference's gradients handed on at cuts, and the
    backward evidence of each paired op."""

    def __init__(self, backward: BackwardRun):
        super().__init__(backward.live)
        self.backward = backward
        first_read = backward.run.candidate.first_reads()
        never = len(backward.run.candidate.ops)  # an output nothing reads: its gradient is the seed
        self.patchable = sorted(((first_read.get(t, never), t) for t in backward.tensor_pairs), reverse=True)
        self.evidence: dict[int, OpEvidence] = {}

    def rerun(
        self, role: str, patches: dict[int, np.ndarray | Shift], parameter_shift: dict[int, np.ndarray] | None = None
    ) -> Gradients:
        """A `role` backward re-run handing on `patches`, its parameters' gradients shifted by `parameter_shift`."""
        if role == "candidate":
            self.candidate_reruns += 1
        else:
            self.reference_reruns += 1
        activations = self.backward.activations if role == "candidate" else None
        grads = self.live.ask(role, Backward(self.backward.seeds[role], patches, activations))
        for tid, shift in (parameter_shift or {}).items():
            if grads.leaves.get(tid) is not None:
                grads.leaves[tid] = grads.leaves[tid] + shift
        return grads

    def reduced_rerun(self, reduced: dict[int, str]) -> list[Gradients]:
        """A candidate backward re-run reducing the gradients of `reduced` (tid -> "sum" or "mean") over its ranks
        as they are handed on: every rank's gradients, by rank."""
        self.candidate_reruns += 1
        backward = self.backward
        request = Backward(backward.seeds["candidate"], {}, backward.activations, reduced)
        return self.live.ask("candidate", EachRank(request))

    def _moved(self, grads: Gradients, side: str) -> float:
        """How far a re-run's parameter gradients moved from the `side`'s own (worst max_rel)."""
        backward = self.backward
        own_grads = backward.candidate if side == "candidate" else backward.reference

        def moved(cand_tid: int, pair: TensorPair) -> dict[str, float] | None:
            tid = cand_tid if side == "candidate" else pair.reference
            new, own = grads.leaves.get(tid), own_grads.leaves.get(tid)
            return None if new is None or own is None else error_metrics(new, own)

        return backward.worst_leaf_error(moved).max_rel

    # -- what the search asks --------------------------------------------------
    def cuts(self) -> list[int]:
        return sorted(self.backward.op_pairs, reverse=True)

    def error_at_cut(self, cut: int) -> tuple[float, float]:
        """Handing on the reference's gradient for every paired tensor whose readers all come at or after op `cut`."""
        patches = {}
        for position, tid in self.patchable:
            if position < cut:
                break
            values = self.backward.reference_gradient(tid)
            if values is not None and tid in self.backward.candidate.tensors:
                patches[tid] = values.astype(self.backward.candidate.tensors[tid].dtype)
        grads = self.rerun("candidate", patches)
        return self.backward.leaf_error(grads).max_rel, self._moved(grads, "candidate")

    def evidence_of(self, index: int) -> OpEvidence | None:
        if index not in self.backward.op_pairs:
            return None
        if index not in self.evidence:
            self.evidence[index] = op_evidence(self.backward, index)
        return self.evidence[index]

    def suspects(self, cuts: list[int], entry: int | None) -> Iterator[OpEvidence]:
        """From the cut before the entry point down to the entry point (where the cut search says the
        error enters), then on towards the inputs. An op at or past the cut before the entry point
        cannot hold it: the reference's gradients handed on there left most of the error in place."""
        low = cut_before(cuts, entry)
        ops = sorted((i for i in self.backward.op_pairs if low is None or i < low), reverse=True)
        if entry is not None:
            ops = [i for i in ops if i >= entry] + [i for i in ops if i < entry]
        yield from (self.evidence_of(i) for i in ops)

    def reach(self, group: list[OpEvidence]) -> float:
        """The reference's backward re-run with these ops' own differences added to the gradients they hand on."""
        patches, shift = self._own_differences(group, "reference")
        return self._moved(self.rerun("reference", patches, shift), "reference")

    def error_without(self, group: list[OpEvidence]) -> float:
        """A candidate re-run with these ops' own backward differences taken out of the gradients they hand on."""
        patches, shift = self._own_differences(group, "candidate")
        return self.backward.leaf_error(self.rerun("candidate", patches, shift)).max_rel

    def _own_differences(self, group: list[OpEvidence], side: str) -> tuple[dict[int, Shift], dict[int, np.ndarray]]:
        """The group's own differences as shifts of the gradients it hands on and of parameters'
        gradients, by the `side`'s tids: taken out of the candidate's, put into the reference's.
        Where the candidate's op itself made NaN/Inf, the reference's gradient is what is left."""
        backward, run = self.backward, self.run
        patches: dict[int, Shift] = {}
        shift: dict[int, np.ndarray] = {}
        for evidence in group:
            for cand_tid, difference in (evidence.own_difference or {}).items():
                pair = backward.pair(cand_tid)
                tid, own = (
                    (cand_tid, backward.candidate) if side == "candidate" else (pair.reference, backward.reference)
                )
                if side == "candidate":
                    difference = -difference
                else:
                    difference = pair.candidate_in_reference_layout(difference, run.reference.tensors[tid].shape)
                if cand_tid in backward.leaf_pairs:
                    shift[tid] = shift.get(tid, 0) + difference
                elif tid in own.tensors:
                    total = (patches[tid].delta + difference) if tid in patches else difference
                    fallback = backward.reference_gradient(tid) if side == "candidate" else None
                    dtype = own.tensors[tid].dtype
                    patches[tid] = Shift(total.astype(dtype), None if fallback is None else fallback.astype(dtype))
        return patches, shift

    def error_with_cut_gradient(self, op: OpNode) -> tuple[float, bool]:
        """A candidate re-run with the reference's gradients handed on where the cut op's inputs
        receive theirs; and whether there was any to hand on."""
        patches = {}
        for tid in op.inputs:
            values = self.backward.reference_gradient(tid)
            if values is not None and tid in self.backward.tensor_pairs:
                patches[tid] = values
        return self.backward.leaf_error(self.rerun("candidate", patches)).max_rel, bool(patches)


class BackwardRules(PassRules):
    """What the backward pass decides around the search (see the module docstring): it starts by
    running each side's backward pass; a gradient one side lacks is named before any float64 run."""

    name = "backward"

    def __init__(self, live: LiveRun, reference_activations: bool = False):
        super().__init__(live)
        self.reference_activations = reference_activations
        self.search: BackwardPass | None = None

    def start(self) -> OutputError:
        """`reference_activations`: the candidate's backward on the reference's forward values (see `BackwardRun`)."""
        run, say = self.run, self.live.say
        if needs_window(run):  # the backward's evidence replays ops on their forward values: every op's
            say("keeping the values of every op")
            fetch_all(self.live)
        say(
            "running each side's backward pass"
            + (" (the candidate's on the reference's activations)" if self.reference_activations else "")
        )
        backward = BackwardRun(self.live, self.reference_activations)
        if not backward.leaf_pairs:
            compiled = any(op.framework_op == COMPILED_OP for op in run.candidate.ops)
            raise OutputMismatchError(
                f"{run.model_file}: no parameter or floating input of the candidate is paired with one of "
                "the reference, so the backward passes have no gradients to compare"
                + (
                    "; a compiled module reads its parameters inside its compiled code, where bisectr "
                    "does not see them: --backward does not search a compiled side"
                    if compiled
                    else ""
                )
            )
        if (backward.reference.loss is None) != (backward.candidate.loss is None):
            defined, missing = (
                ("reference", "candidate") if backward.candidate.loss is None else ("candidate", "reference")
            )
            raise ModelFileError(
                f"{run.model_file}: defines {defined}_loss() but not {missing}_loss(): both sides' backward "
                "passes start from their losses, or neither's does"
            )
        self.search = BackwardPass(backward)
        self.searched.append(self.search)
        return backward.leaf_error()

    def lacking(self) -> Decided | None:
        missing = missing_tensor_gradient(self.search.backward) or missing_leaf_gradient(self.search.backward)
        return _missing_gradient(self.search, *missing) if missing is not None else None

    def obvious_cause(self, search: BackwardPass, error: ErrorToExplain) -> Decided | None:
        return _unreduced_gradient(search, error) if search.backward.unreduced else None

    def float64_check(self) -> Float64Check:
        if self.reference_activations:
            return Float64Check(
                "skipped",
                "the candidate's backward ran on the reference's activations, which a float64 run of its own cannot",
                self.full_error,
            )
        self.live.say("running both sides' backward passes in float64")
        return _float64_gradient_check(self.search.backward, self.full_error)

    def searches(self, float64: Callable[[], Float64Check | None]) -> Iterator[BackwardPass]:
        float64()
        self.live.say("searching the backward pass")
        yield self.search

    def culprit(self, search: BackwardPass, evidence: OpEvidence) -> Culprit:
        return _culprit(self.run, evidence)

    def noise_culprit(
        self, search: BackwardPass, outcome: Outcome, float64: Float64Check
    ) -> tuple[OpEvidence | None, str]:
        """The op at the entry point: where most of the gradient's rounding enters."""
        return (search.evidence_of(outcome.entry) if outcome.entry is not None else None), ""

    def bracket(self, search: BackwardPass, outcome: Outcome, why: str) -> Bracket:
        return _bracket(self.run, search.backward.op_pairs, outcome.entry, cut_before(outcome.cuts, outcome.entry))

    def profile(self) -> list[ProfileRow]:
        backward = self.search.backward
        return [
            _profile_row(self.run, backward, cand, ref, self.search.evidence.get(cand))
            for cand, ref in backward.op_pairs.items()
        ]

    def result_fields(self) -> dict:
        backward = self.search.backward
        losses = None
        if backward.reference.loss is not None or backward.candidate.loss is not None:
            losses = {"reference": backward.reference.loss, "candidate": backward.candidate.loss}
        return {"losses": losses, "activations": "reference" if self.reference_activations else "own"}


def _missing_gradient(search: BackwardPass, tid: int, lacking: str) -> Decided:
    """`divergent` for a gradient one side lacks: the parameter, or the op cutting the gradient."""
    backward = search.backward
    run = backward.run
    pair = backward.pair(tid)
    has = "reference" if lacking == "candidate" else "candidate"
    if tid in backward.leaf_pairs:
        kind, leaf = astuple(LeafRef.parse(run.candidate.tensors[tid].leaf))
        cand_op = run.candidate.ops[run.candidate.first_reads()[tid]]
        ref_op = run.reference.ops[run.reference.first_reads()[pair.reference]]
        what = "parameter" if kind == "param" else "input"
        return Decided(
            culprit_without_evidence("leaf", cand_op, ref_op, leaf),
            missing_gradient=f"{what} {leaf} gets no gradient on the {lacking} (frozen there) and one on the {has}",
        )
    cand_op, ref_op = run.candidate.producer_op(tid), run.reference.producer_op(pair.reference)
    cutting = cand_op if lacking == "candidate" else ref_op
    decided = Decided(
        culprit_without_evidence("op", cand_op, ref_op, None),
        missing_gradient=f"the gradient of {cutting.framework_op}'s output in {cutting.module or '(top level)'} "
        f"reaches the {has} but not the {lacking}: {cutting.framework_op} cuts the {lacking}'s gradient there",
    )
    if lacking == "candidate":
        before = backward.leaf_error().max_rel
        after, given = search.error_with_cut_gradient(cand_op)
        decided.confirmation = Confirmation(
            [cand_op.index], after, before, given and confirms(after, before, 0.0), cut=True
        )
    return decided


def _unreduced_gradient(search: BackwardPass, error: ErrorToExplain) -> Decided | None:
    """Gradients of the candidate placed Replicate whose ranks hold different values: the op reading such a tensor
    handed on each rank's own part of its gradient (a partial sum) as if every rank held the whole, and no rank
    reduced it (a DTensor's `to_local()` without its `grad_placements`). Every gradient the backward reaches after
    it differs by rank too, so they are reduced in turn (`_reduced_in_turn`), summed, else averaged, until none is
    left that differs; confirmed where the leaves' gradients are then the reference's. The culprit is the first
    reader in the model. None where neither way confirms."""
    backward = search.backward
    run, readers = backward.run, backward.readers["candidate"]
    before = backward.leaf_error().max_rel
    for how in ("sum", "mean"):
        reduced, grads = _reduced_in_turn(search, how)
        after = backward.leaf_error(grads).max_rel if grads is not None else before
        if reduced and confirms(after, before, error.rounding):
            break
    else:
        return None
    read = {tid: max(readers[tid]) for tid in reduced}
    first = min(read, key=read.get)
    reader, producer = run.candidate.ops[read[first]], run.candidate.producer_op(first)
    others = sorted(read[tid] for tid in read if tid != first)
    return Decided(
        culprit_without_evidence("op", reader, _reference_reader(backward, first, reader), None),
        Confirmation(sorted(read.values()), after, before, True),
        unreduced_gradient=(
            f"the gradient of {producer.framework_op}'s output in {producer.module or '(top level)'} is placed "
            f"Replicate (every rank holds the same), but the {backward.candidate_ranks} ranks hold different "
            f"values: {reader.framework_op} hands on each rank's own part of it, never reduced"
            + (
                f" (and so {'does op' if len(others) == 1 else 'do ops'} {', '.join(map(str, others))})"
                if others
                else ""
            )
            + f"; {'summed' if how == 'sum' else 'averaged'} over the ranks there, the candidate's gradients are "
            "the reference's"
        ),
    )


def _reduced_in_turn(search: BackwardPass, how: str) -> tuple[dict[int, str], Gradients | None]:
    """Reduce (`how`) the unreduced gradient the backward reaches first, re-run, and again while one is left:
    the gradients reduced, and the first rank's gradients of the last re-run (None: none was made)."""
    backward = search.backward
    readers = backward.readers["candidate"]
    reduced: dict[int, str] = {}
    unreduced, grads = backward.unreduced, None
    while True:
        left = [tid for tid in unreduced if readers.get(tid) and tid not in reduced]
        if not left or len(reduced) >= len(backward.unreduced):
            return reduced, grads
        reduced[max(left, key=lambda tid: max(readers[tid]))] = how
        ranks = search.reduced_rerun(reduced)
        unreduced, grads = _unreduced(ranks), ranks[0]


def _reference_reader(backward: BackwardRun, tid: int, reader: OpNode) -> OpNode:
    """The reference's op reading what candidate tensor `tid` holds: the first reader of the reference tensor
    paired with it, or with the nearest tensor it was made from (a DTensor's `redistribute` of a paired
    output); else the reference's op paired with the candidate op nearest after `reader`."""
    run = backward.run
    while tid not in run.alignment.tensors:
        producer = run.candidate.producer_op(tid)
        if producer is None or not producer.inputs:
            break
        tid = producer.inputs[0]
    pair = run.alignment.tensors.get(tid)
    ref_readers = backward.readers["reference"].get(pair.reference) if pair is not None else None
    if ref_readers:
        return run.reference.ops[min(ref_readers)]
    nearest = sorted(backward.op_pairs, key=lambda index: (index < reader.index, abs(index - reader.index)))
    return run.reference.ops[backward.op_pairs[nearest[0]]]


def _float64_gradient_check(backward: BackwardRun, error: float) -> Float64Check:
    """Both sides' backward passes in float64: is the parameters' gradient error rounding? (As the
    forward's check, `precision.float64_check`, of the leaves' gradients.)"""
    run = backward.run
    if not math.isfinite(error):
        return Float64Check("skipped", "the candidate's gradients hold NaN/Inf", error)
    runs = float64_runs(
        backward.live, lambda role, leaf_values: Float64Gradients(backward.seeds[role], leaf_values), error
    )
    if isinstance(runs, Float64Check):
        return runs
    grads = {role: float64.values for role, float64 in runs.items()}
    float64_error = reference_rounding = candidate_rounding = 0.0
    for cand_tid, pair in backward.leaf_pairs.items():
        ref_info = run.reference.tensors[pair.reference]
        reference64, candidate64 = (
            grads["reference"].get(ref_info.leaf),
            grads["candidate"].get(run.candidate.tensors[cand_tid].leaf),
        )
        reference32, candidate32 = (
            backward.reference.leaves.get(pair.reference),
            backward.candidate.leaves.get(cand_tid),
        )
        if any(g is None for g in (reference64, candidate64, reference32, candidate32)):
            continue
        shape = run.candidate.tensors[cand_tid].shape
        reference64 = pair.reference_in_candidate_layout(reference64, shape)
        reference32 = pair.reference_in_candidate_layout(reference32, shape)
        relative = partial(backward.relative, cand_tid)
        float64_error = max(float64_error, relative(error_metrics(candidate64, reference64).max_abs))
        reference_rounding = max(
            reference_rounding, relative(error_metrics(reference32.astype(np.float64), reference64).max_abs)
        )
        candidate_rounding = max(
            candidate_rounding, relative(error_metrics(candidate32.astype(np.float64), candidate64).max_abs)
        )
    check = judge_float64(
        error,
        float64_error,
        reference_rounding,
        candidate_rounding,
        [trace.dtype for trace in run.traces.values()],
        "gradients",
    )
    return noted(check, run, runs)


def _bracket(run: RunRecord, pairs: dict[int, int], entry: int | None, low: int | None) -> Bracket:
    """The ops between the entry point and the cut before it (in backward order), on both sides."""
    cand_low = entry if entry is not None else 0
    cand_high = (low - 1) if low is not None else len(run.candidate.ops) - 1
    ref_low = pairs.get(cand_low, 0) if entry is not None else 0
    ref_high = pairs[low] - 1 if low is not None else len(run.reference.ops) - 1
    return bracket(run, list(range(cand_low, cand_high + 1)), list(range(ref_low, ref_high + 1)), low, entry)


def _culprit(run: RunRecord, evidence: OpEvidence) -> Culprit:
    return Culprit(
        "op",
        evidence.op,
        site(run.candidate.ops[evidence.candidate]),
        site(run.reference.ops[evidence.reference]),
        None,
        input_error=None,
        output_error=evidence.output_error.max_abs,
        output_error_rel=evidence.output_error.max_rel,
        input_error_rel=None,
        local_error=evidence.local_error,
        amplification=None,
        verdict=evidence.verdict,
        fp64=evidence.fp64,
        fp64_unavailable=evidence.fp64_unavailable,
    )


def _profile_row(
    run: RunRecord, backward: BackwardRun, cand_index: int, ref_index: int, evidence: OpEvidence | None = None
) -> ProfileRow:
    op = run.candidate.ops[cand_index]
    error = backward.tensor_error(op.outputs[0]) or EXACT
    return ProfileRow(
        cand_index,
        ref_index,
        op.op,
        op.module,
        error.max_rel,
        error.max_abs,
        error.mean_abs,
        evidence.local_error if evidence else None,
        evidence.verdict if evidence else "unknown",
        0.0,
    )
