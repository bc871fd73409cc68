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
from functools import partial
from typing import Any

import numpy as np

from .adapters import CannotUpcast
from .metrics import error_metrics
from .numerics import judge_float64
from .record import RunRecord
from .result import Float64Check
from .sides import Sides


def float64_check(run: RunRecord, sides: Sides) -> Float64Check:
    """Run both sides of a live run in float64 and compare their outputs (see the module docstring)."""
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


def float64_gradient_check(backward: Any, error: float) -> Float64Check:
    """Both sides' backward passes in float64: is the parameters' gradient error rounding? (`backward`:
    a `backward.BackwardRun`, not imported here: it imports this module.)"""
    run = backward.run
    if not math.isfinite(error):
        return Float64Check("skipped", "the candidate's gradients hold NaN/Inf", error)
    grads = {}
    for role in ("reference", "candidate"):
        try:
            grads[role] = backward.sides.float64_gradients(role, backward.seeds[role])
        except CannotUpcast as exc:
            return Float64Check("skipped", f"the {role} cannot run in float64: {exc}", error)
    float64_error = reference_rounding = candidate_rounding = 0.0
    for cand_tid, pair in backward.leaf_pairs.items():
        ref_info = run.reference.tensors[pair.reference]
        reference64, candidate64 = grads["reference"].get(ref_info.leaf), grads["candidate"].get(run.candidate.tensors[cand_tid].leaf)
        reference32, candidate32 = backward.reference.leaves.get(pair.reference), backward.candidate.leaves.get(cand_tid)
        if any(g is None for g in (reference64, candidate64, reference32, candidate32)):
            continue
        candidate64 = pair.candidate_in_reference_layout(candidate64, ref_info.shape)
        candidate32 = pair.candidate_in_reference_layout(candidate32, ref_info.shape)
        relative = partial(backward.relative, cand_tid)
        float64_error = max(float64_error, relative(error_metrics(candidate64, reference64)["max_abs"]))
        reference_rounding = max(reference_rounding, relative(error_metrics(reference32.astype(np.float64), reference64)["max_abs"]))
        candidate_rounding = max(candidate_rounding, relative(error_metrics(candidate32.astype(np.float64), candidate64)["max_abs"]))
    return judge_float64(error, float64_error, reference_rounding, candidate_rounding,
                         [trace.dtype for trace in run.traces.values()], "gradients")
