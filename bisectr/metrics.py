"""Error measures between a candidate tensor and its reference."""
from __future__ import annotations

import numpy as np


def as_float64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def error_metrics(candidate: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """max_abs, mean_abs, max_rel (max_abs relative to the reference's largest magnitude) and cosine.

    NaN or Inf where the reference is finite (or the other way round) counts as an infinite error.
    """
    cand = as_float64(candidate).reshape(-1)
    ref = as_float64(reference).reshape(-1)
    if cand.size == 0:
        return {"max_abs": 0.0, "mean_abs": 0.0, "max_rel": 0.0, "cosine": 1.0}
    both_nan = np.isnan(cand) & np.isnan(ref)
    same_inf = np.isinf(cand) & (cand == ref)
    diff = np.abs(cand - ref)
    diff[both_nan | same_inf] = 0.0
    diff[np.isnan(diff)] = np.inf
    finite_ref = ref[np.isfinite(ref)]
    scale = float(np.abs(finite_ref).max()) if finite_ref.size else 0.0
    max_abs = float(diff.max())
    ok = np.isfinite(cand) & np.isfinite(ref)
    norm = float(np.linalg.norm(cand[ok]) * np.linalg.norm(ref[ok]))
    cosine = float(np.dot(cand[ok], ref[ok]) / norm) if norm > 0 else float(np.array_equal(cand[ok], ref[ok]))
    return {
        "max_abs": max_abs,
        "mean_abs": float(diff.mean()),
        "max_rel": max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf")),
        "cosine": cosine,
    }


def relative_error(candidate: np.ndarray, reference: np.ndarray) -> float:
    """max |candidate - reference| / max |reference|: the scale-free error used everywhere in bisectr."""
    return error_metrics(candidate, reference)["max_rel"]
