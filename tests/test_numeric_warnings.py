"""Huge and non-finite values are described and compared without numpy warnings, and correctly:
an attention mask of float32's lowest value (-3.4e38), Inf - Inf in a comparison."""

import subprocess
import sys

import numpy as np
import pytest

from bisectr.measure.metrics import ErrorMetrics, error_metrics
from bisectr.capture.trace import PENDING_STATS, StatsBatch, TensorInfo
from conftest import MODELS

LOWEST = np.finfo(np.float32).min


def _described(values: np.ndarray) -> dict[str, float]:
    info = TensorInfo(0, values.shape, "float32", PENDING_STATS, [])
    batch = StatsBatch()
    batch.add(info, values)
    batch.flush()
    return info.stats


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("size", [64, 70_000], ids=["batched", "one by one"])
def test_statistics_of_a_float32_mask_of_the_lowest_value(size):
    """Half the values -3.4e38: float32 sums of them overflow (the mean was -inf for a large tensor)."""
    mask = np.zeros(size, np.float32)
    mask[::2] = LOWEST
    mask[1] = 1.5
    stats = _described(mask)
    exact = mask.astype(np.float64)
    assert (stats.min, stats.max, stats.absmax) == (float(LOWEST), 1.5, -float(LOWEST))
    assert stats.mean == pytest.approx(exact.mean(), rel=1e-12) and stats.mean == pytest.approx(-1.7014e38, rel=1e-4)
    assert stats.std == pytest.approx(exact.std(), rel=1e-6)
    assert stats.nan == stats.inf == 0


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_statistics_whose_float32_squares_sum_past_the_largest_float32():
    """Values of 1e17 square to 1e34; 40000 of those sum to 4e38, past float32's 3.4e38."""
    values = np.tile(np.array([1e17, -1e17], np.float32), 20_000)
    stats = _described(values)
    assert stats.mean == 0.0 and stats.std == pytest.approx(1e17, rel=1e-6)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_inf_minus_inf_is_no_error_and_an_overflowing_difference_is_finite():
    both_inf = error_metrics(np.array([np.inf, 1.0], np.float32), np.array([np.inf, 2.0], np.float32))
    assert both_inf == ErrorMetrics(max_abs=1.0, mean_abs=0.5, max_rel=0.5, cosine=1.0)
    opposite = error_metrics(np.array([3e38, 1.0], np.float32), np.array([-3e38, 1.0], np.float32))
    assert opposite.max_abs == pytest.approx(6e38, rel=1e-7) and opposite.max_rel == pytest.approx(2.0)
    unequal_inf = error_metrics(np.array([np.inf, 1.0], np.float32), np.array([-np.inf, 1.0], np.float32))
    assert unequal_inf.max_abs == np.inf


def test_bisecting_a_hugging_face_llama_prints_no_numpy_warning():
    """Its attention mask holds -3.4e38; the search still names layer 2's activation."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "bisect",
            str(MODELS / "hf_llama_activation.py"),
            "--candidate",
            "candidate_gelu_layer",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    assert "verdict: divergent" in done.stdout and "model.layers.2.mlp.act_fn" in done.stdout
    assert "Warning" not in done.stderr, done.stderr
