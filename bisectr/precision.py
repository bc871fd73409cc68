"""The whole-model float64 check: is the outputs' difference what rounding makes?

Both sides run once more as float64 copies (parameters, buffers and floating inputs
upcast), as seed 002 did by hand. Each side's distance to its own float64 outputs is its
rounding; their sum is what rounding predicts for the measured difference, which the
triangle inequality bounds by that prediction plus the difference left in float64.
The float64 rule (`numerics.rounding_explains`) then says whether rounding explains the
measured difference or something computes differently.
"""
from __future__ import annotations

import math

from .adapters import CannotUpcast
from .metrics import error_metrics
from .numerics import judge_float64
from .record import RunRecord
from .result import Float64Check
from .sides import Sides


def float64_check(run: RunRecord, sides: Sides) -> Float64Check:
    """Run both sides of a live run in float64 and compare (see the module docstring)."""
    error = run.output_error()["max_rel"]
    if not math.isfinite(error):
        return Float64Check("skipped", "the candidate's outputs hold NaN/Inf", error)
    if all(trace.dtype == "float64" for trace in run.traces.values()):
        return Float64Check("skipped", "both sides already run in float64", error)
    outputs = {}
    for role in ("reference", "candidate"):
        try:
            outputs[role] = sides.float64_outputs(role)
        except CannotUpcast as exc:
            return Float64Check("skipped", f"the {role} cannot run in float64: {exc}", error)
    float64_error = reference_rounding = candidate_rounding = 0.0
    for pair in run.output_pairs:
        reference64 = outputs["reference"][pair.key]
        candidate64 = pair.in_reference_layout(outputs["candidate"][pair.candidate_key], reference64.shape)
        float64_error = max(float64_error, error_metrics(candidate64, reference64)["max_rel"])
        reference_rounding = max(reference_rounding, error_metrics(run.reference.value(pair.reference), reference64)["max_rel"])
        candidate32 = pair.in_reference_layout(run.candidate.value(pair.candidate), reference64.shape)
        candidate_rounding = max(candidate_rounding, error_metrics(candidate32, candidate64)["max_rel"])
    return judge_float64(error, float64_error, reference_rounding, candidate_rounding, [t.dtype for t in run.traces.values()])
