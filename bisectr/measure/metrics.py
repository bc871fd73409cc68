"""Error measures between a candidate tensor and its reference."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np


# An op's (or a leaf's) own difference, judged: bit for bit, rounding, something computed differently,
# or not known (values not at hand).
OpVerdict = Literal["exact", "noise", "different", "unknown"]

# An attention mask blocks a position with a value at or below this (-1e4, -1e9, float32's lowest,
# -inf): whichever one each side uses, a softmax makes the same zero of it.
BLOCKING = -1e4
MASK_CONSTANTS = 4  # the most distinct blocking values a mask (or scores with a mask added) holds


@dataclass(frozen=True)
class ErrorMetrics:
    """How far a candidate tensor is from its reference (see `error_metrics`)."""

    max_abs: float
    mean_abs: float
    max_rel: float  # max_abs relative to the reference's largest magnitude
    cosine: float


EXACT = ErrorMetrics(0.0, 0.0, 0.0, 1.0)
UNKNOWN = ErrorMetrics(math.nan, math.nan, math.nan, math.nan)  # values not at hand


@dataclass(frozen=True)
class Float64Evidence:
    """An op's (or a block's) output on both sides against the float64 oracle, relative errors."""

    candidate_error: float
    reference_error: float


@dataclass(frozen=True)
class OutputError:
    """The worst error over a model's outputs."""

    max_abs: float
    max_rel: float


def error_metrics(candidate: np.ndarray, reference: np.ndarray) -> ErrorMetrics:
    """max_abs, mean_abs, max_rel (max_abs relative to the reference's largest magnitude) and cosine.

    NaN or Inf where the reference is finite (or the other way round) counts as an infinite error.
    Float32 inputs are compared in float32 (a difference of two float32 values that are
    close is exact); sums accumulate in float64.
    """
    cand = _flat(candidate)
    ref = _flat(reference)
    if cand.size == 0:
        return EXACT
    if cand.dtype != ref.dtype:
        cand, ref = cand.astype(np.float64), ref.astype(np.float64)
    diff, max_abs = _abs_difference(cand, ref)
    if max_abs != 0.0 and (both := unblocked(cand, ref)) is not None:
        cand, ref = both
        diff, max_abs = _abs_difference(cand, ref)
    if max_abs == 0.0:  # bit-identical: common upstream of a difference, and cheap to say
        return EXACT
    if not np.isfinite(max_abs) and cand.dtype != np.float64 and np.isfinite(cand).all() and np.isfinite(ref).all():
        cand, ref = cand.astype(np.float64), ref.astype(np.float64)  # finite values whose difference overflows float32
        diff, max_abs = _abs_difference(cand, ref)
    if np.isfinite(max_abs):
        scale = float(np.abs(ref).max())
        ok_cand, ok_ref = cand, ref
    else:  # NaN/Inf somewhere: equal specials are no error, all else is infinite
        same = (np.isnan(cand) & np.isnan(ref)) | (np.isinf(cand) & (cand == ref))
        diff[same] = 0.0
        diff[np.isnan(diff)] = np.inf
        max_abs = float(diff.max())
        ok = np.isfinite(cand) & np.isfinite(ref)
        ok_cand, ok_ref = cand[ok], ref[ok]
        finite_ref = ref[np.isfinite(ref)]
        scale = float(np.abs(finite_ref).max()) if finite_ref.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return ErrorMetrics(max_abs, float(diff.mean(dtype=np.float64)), max_rel, _cosine(ok_cand, ok_ref))


def blocked(values: np.ndarray) -> np.ndarray | None:
    """Where `values` hold a mask's blocking values (None: it holds none, or holds so many distinct
    ones that they are data, not a mask's constants)."""
    where = values <= BLOCKING
    if not where.any() or np.unique(values[where]).size > MASK_CONSTANTS:
        return None
    return where


def unblocked(cand: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Both tensors with the positions that both block set to 0 (one mask's -1e9 is another's -inf);
    None where no position is blocked on both."""
    if cand.dtype.kind != "f" or not (cand.min(initial=0.0) <= BLOCKING and ref.min(initial=0.0) <= BLOCKING):
        return None
    cand_blocked, ref_blocked = blocked(cand), blocked(ref)
    if cand_blocked is None or ref_blocked is None or not (both := cand_blocked & ref_blocked).any():
        return None
    cand, ref = cand.copy(), ref.copy()
    cand[both] = ref[both] = 0.0
    return cand, ref


def _abs_difference(cand: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, float]:
    """|cand - ref| and its largest value. Inf - Inf gives NaN here; the caller judges NaN and Inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(cand - ref)
    return diff, float(diff.max())


def _flat(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values).reshape(-1)
    return values if values.dtype.kind == "f" else values.astype(np.float64)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    # einsum rather than np.dot: no BLAS threads to spin up for one reduction
    norm = float(np.sqrt(np.einsum("i,i->", a, a, dtype=np.float64) * np.einsum("i,i->", b, b, dtype=np.float64)))
    if norm == 0:
        return float(np.array_equal(a, b))
    return float(np.einsum("i,i->", a, b, dtype=np.float64) / norm)


def rounded_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` rounded to the nearest of `dtype` (ties to even), as float32: what a cast to a
    narrower dtype leaves of them (unchanged for float32 and wider)."""
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if dtype != "bfloat16":
        return values
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)
