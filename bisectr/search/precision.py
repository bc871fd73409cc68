"""The whole-model float64 check: is the outputs' difference what rounding makes? (The backward
pass's, of the gradients, is `backward.BackwardRules.float64_check`, on the same float64 runs.)

Both sides run once more as float64 copies (parameters, buffers and floating inputs
upcast). Each side's distance to its own float64 outputs is its
rounding; their sum is what rounding predicts for the measured difference, which the
triangle inequality bounds by that prediction plus the difference left in float64.
The float64 rule (`numerics.rounding_explains`) then says whether rounding explains the
measured difference or something computes differently.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..adapters import CannotUpcast
from ..measure.leaves import reference_values
from ..measure.metrics import error_metrics
from ..measure.numerics import judge_float64
from ..measure.runrecord import RunRecord
from ..measure.result import Float64Check
from ..sides.runner import Float64Gradients, Float64Outputs
from ..engines.float64 import Float64Run
from ..measure.live import LiveRun


def float64_check(live: LiveRun) -> Float64Check:
    """Run both sides of a live run in float64 and compare their outputs (see the module docstring)."""
    run = live.run
    error = run.output_error().max_rel
    if not math.isfinite(error):
        return Float64Check("skipped", "the candidate's outputs hold NaN/Inf", error)
    if all(trace.dtype == "float64" for trace in run.traces.values()):
        return Float64Check("skipped", "both sides already run in float64", error)
    runs = float64_runs(live, lambda role, leaf_values: Float64Outputs(leaf_values), error)
    if isinstance(runs, Float64Check):
        return runs
    outputs = {role: float64.values for role, float64 in runs.items()}
    float64_error = reference_rounding = candidate_rounding = 0.0
    for pair in run.output_pairs:
        reference64 = outputs["reference"][pair.key]
        candidate64 = pair.in_reference_layout(outputs["candidate"][pair.candidate_key], reference64.shape)
        float64_error = max(float64_error, error_metrics(candidate64, reference64).max_rel)
        reference_rounding = max(
            reference_rounding, error_metrics(run.reference.value(pair.reference), reference64).max_rel
        )
        candidate32 = pair.in_reference_layout(run.candidate.value(pair.candidate), reference64.shape)
        candidate_rounding = max(candidate_rounding, error_metrics(candidate32, candidate64).max_rel)
    check = noted(
        judge_float64(
            error, float64_error, reference_rounding, candidate_rounding, [t.dtype for t in run.traces.values()]
        ),
        run,
        runs,
    )
    return inconclusive_where_narrow(check)


def inconclusive_where_narrow(check: Float64Check) -> Float64Check:
    """What the float64 runs cannot tell, where ops still ran below float64 in them: a side whose float64
    outputs are its own outputs bit for bit (every op it ran stayed at its recorded dtypes) shows none of its
    rounding, so neither agreement nor disagreement says anything; and a disagreement no larger than what
    rounding predicts may be the narrow ops' own rounding. Each op's float64 oracle decides."""
    if check.status == "skipped" or not check.narrow_ops:
        return check
    rounding = {"reference": check.reference_rounding, "candidate": check.candidate_rounding}
    unseen = [role for role in check.narrow_ops if rounding[role] == 0.0]
    if unseen:
        check.status = "skipped"
        check.reason = (
            f"the {unseen[0]}'s float64 run kept every op at its recorded dtypes (its outputs there are its "
            f"own, bit for bit), so the float64 runs cannot tell its rounding from a difference: each op's "
            f"float64 oracle decides"
        )
    elif check.status == "disagree" and check.float64_error <= check.predicted:
        check.status = "skipped"
        check.reason = (
            f"ops still ran below float64 in the float64 runs, and the outputs there differ by "
            f"{check.float64_error:.3g}, no more than rounding predicts ({check.predicted:.3g}): "
            f"the float64 runs cannot tell, each op's float64 oracle decides"
        )
    return check


def float64_runs(
    live: LiveRun, request: Callable[[str, dict[str, np.ndarray]], Float64Outputs | Float64Gradients], error: float
) -> dict[str, Float64Run] | Float64Check:
    """Each side run once in float64 (`request(role, leaf values)`: its outputs, or its gradients), the
    candidate with the reference's values for the leaves it only rounds; the check skipped where a side cannot."""
    runs = {}
    for role, leaf_values in (("reference", {}), ("candidate", rounded_leaf_values(live.run))):
        try:
            runs[role] = live.ask(role, request(role, leaf_values))
        except CannotUpcast as exc:
            return Float64Check("skipped", f"the {role} cannot run in float64: {exc}", error)
    return runs


def rounded_leaf_values(run: RunRecord) -> dict[str, np.ndarray]:
    """The reference's values (in the candidate's layout) for each candidate leaf that only rounds them:
    the float64 runs give both sides the same weights, so that their rounding is not taken for a bug."""
    rounded = [pair for pair in run.alignment.leaves.pairs if pair.status == "rounded"]
    values = reference_values(run.reference, run.candidate, run.alignment, rounded)
    return {run.candidate.tensors[tid].leaf: array for tid, array in values.items()}


def noted(check: Float64Check, run: RunRecord, runs: dict[str, Float64Run]) -> Float64Check:
    """The check with the rounded leaves it gave the reference's values, and the ops that still ran below float64."""
    rounded = [pair for pair in run.alignment.leaves.pairs if pair.status == "rounded"]
    if rounded:
        worst = max(p.max_rel or 0.0 for p in rounded)
        check.rounded_leaves = (
            f"the candidate's weights are {'; '.join(sorted({p.description for p in rounded}))} "
            f"({len(rounded)} leaves, max rel {worst:.2g}): both sides ran with the reference's values"
        )
    check.narrow_ops = {role: float64.narrow_ops for role, float64 in runs.items() if float64.narrow_ops}
    return check
