"""The numbers every judgement rests on: a dtype's noise floor, whether an op's own difference
is rounding, errors relative to a magnitude, the float64 rule, and the searches' thresholds.
The forward and backward searches, the search inside compiled code and the training comparison
all judge with these.
"""

from __future__ import annotations

import math

import numpy as np

from .metrics import OpVerdict
from .result import Float64Check

NOISE_FACTOR = 4.0  # an op is rounding while it is within this factor of the reference's own distance to float64
_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
FLOOR_EPS = 16  # a dtype's noise floor, in units of its machine epsilon
ROUNDING_SHARE = 0.1  # float64 results agree when they differ by at most this share of what rounding predicts
GRADIENT_FLOOR = 1e-3  # a gradient or update is compared at no less than this share of the largest one
# A value computed again elsewhere (another device or kernel) is taken for one of a tensor's values
# within this share of the tensor's largest value (telling which row of a weight an output holds).
SAME_VALUE_REACH = 1e-4

# The search (`search`, `past_entry`): the entry point is the first cut that moves the outputs by
# this share of the error (beyond what rounding explains); for a run that is rounding, where
# ENTRY_FRACTION of it is gone.
REAL_SHARE = 0.02
ENTRY_FRACTION = 0.5
REACH_FRACTION = 0.1  # a difference reaches the outputs if it alone makes this share of the error
NOISE_REACH_FRACTION = 0.01  # an op's own rounding must make this share of the error to be named
CONFIRM_FRACTION = 0.1  # a confirmation takes the error under this share of it (or down to rounding)

# The search inside a compiled module's call (`search.compiled`): a module's compiled code makes the
# difference where, compiled alone, it makes COMPILED_SHARE of the whole module's error (and a compiler step
# where, without the step, the module's error stays below that share of it).
COMPILED_SHARE = 0.1
COMPILED_NODE_FACTOR = 100  # a graph node's compiled value differs where its error is over this many times its rounding
COMPILED_NODE_FLOOR = 1e-5  # and over this (both against its eager value in float64)
# Confirmed: with every module of the culprit's class eager, the compiled module's error is within this many times
# its eager rounding, or under this share of its difference.
COMPILED_CONFIRMED_ROUNDING = 10
COMPILED_CONFIRMED_SHARE = 0.01


def noise_floor(dtype: str) -> float:
    return FLOOR_EPS * _EPS.get(dtype, 0.0)


def coarsest_dtype(dtypes: list[str]) -> str:
    """The least precise floating dtype among `dtypes` (an op's rounding is bounded by it)."""
    floating = [d for d in dtypes if d in _EPS]
    return max(floating, key=lambda d: _EPS[d]) if floating else (dtypes[0] if dtypes else "")


def judge(local_error: float, candidate_error: float | None, reference_error: float | None, dtype: str) -> OpVerdict:
    """exact / noise / different for one op (or leaf): its local error against the fp64 oracle
    (the candidate's distance to it against the reference's), or against the dtype's floor."""
    if local_error == 0.0:
        return "exact"
    if candidate_error is None or reference_error is None:
        return "noise" if local_error <= noise_floor(dtype) else "different"
    return "noise" if candidate_error <= NOISE_FACTOR * reference_error + noise_floor(dtype) else "different"


def magnitude(values: np.ndarray | None) -> float:
    """The largest absolute value (0 for none)."""
    return float(np.abs(values).max()) if values is not None and values.size else 0.0


def relative_to(max_abs: float, scale: float) -> float:
    """An absolute error against a scale (0 against 0, infinite for an error against nothing)."""
    return max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)


def rounding_explains(float64_error: float, predicted: float, floor: float) -> bool:
    """The float64 rule: what is left with both sides in float64 is at most a tenth of what rounding
    predicts (each side's distance to its own float64 result, summed), or under the float32 floor and
    no more than that prediction. Rounding shrinks by about 2^29 from float32 to float64; a semantic
    difference does not. The floor leaves room for float32 parts a float64 run keeps (a cast inside
    compiled code); no float32 part makes the float64 runs differ by more than the float32 runs' rounding."""
    return float64_error <= rounding_allowance(predicted, floor)


def rounding_allowance(predicted: float, floor: float) -> float:
    """The most a float64 difference may be for rounding to explain it (see `rounding_explains`)."""
    return max(ROUNDING_SHARE * predicted, min(floor, predicted), noise_floor("float64"))


def judge_float64(
    error: float,
    float64_error: float,
    reference_rounding: float,
    candidate_rounding: float,
    dtypes: list[str],
    what: str = "outputs",
) -> Float64Check:
    """Agree or disagree by the float64 rule, for the `what` compared."""
    check = Float64Check(
        "disagree",
        f"in float64 the {what} still differ: something computes differently",
        error,
        float64_error,
        reference_rounding,
        candidate_rounding,
    )
    floor = min((f for f in map(noise_floor, dtypes) if f > 0), default=0.0)
    if rounding_explains(float64_error, check.predicted, floor):
        check.status, check.reason = "agree", f"in float64 the {what} agree: the difference is rounding"
    return check


def confirms(after: float, before: float, rounding: float) -> bool:
    """Did taking a difference out bring the error down to what rounding explains (under a tenth of
    it, and in any case under half)? For NaN/Inf: did it make them finite?"""
    if not math.isfinite(before):
        return math.isfinite(after)
    return after <= max(CONFIRM_FRACTION * before, rounding) and after < ENTRY_FRACTION * before


def past_entry(error: float, moved: float, full_error: float, rounding: float, is_rounding: bool) -> bool:
    """Is a cut past the entry point, leaving `error` of `full_error` after moving the outputs by
    `moved` from the candidate's own? NaN/Inf: when they are finite again. A difference is found
    where it first enters: the first cut that moves the outputs by a real share of the error, beyond
    rounding, so that one entering in every layer is bracketed at its first layer (measured as a
    move, because the layers' differences may partly cancel in the outputs). A run that is rounding
    has no such place: its entry is where most of the error is gone, and no entry lies past that."""
    if not math.isfinite(full_error):
        return math.isfinite(error)
    if is_rounding:
        return error <= ENTRY_FRACTION * full_error
    share = min(max(REAL_SHARE, rounding / full_error), ENTRY_FRACTION)
    return moved >= share * full_error or error <= ENTRY_FRACTION * full_error
