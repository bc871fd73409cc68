"""What the pairing by data flow (`bisectr.measure.dataflow`) takes for the same values, and how a group's shifts
keep what a mask blocks: on the tensors ports lay out otherwise than their references."""

import numpy as np

from bisectr.engines.patched import Shift
from bisectr.measure.analysis import axis_order, same_values


def _heads(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 4, 5, 8)).astype(np.float32)  # (batch, head, seq, dim)


def test_a_cache_kept_with_its_heads_after_the_positions_holds_the_same_values_in_another_axis_order():
    reference = _heads()
    port = np.ascontiguousarray(reference.transpose(0, 2, 1, 3))  # (batch, seq, head, dim)
    assert same_values(port, reference)
    order = axis_order(reference, port, 1e-6)
    assert order == (0, 2, 1, 3)
    assert np.array_equal(np.transpose(reference, order), port)
    assert axis_order(reference, _heads(1), 1e-6) is None


def test_rotary_halves_against_interleaved_pairs_are_the_same_values_reordered_alike_in_every_row():
    reference = _heads()
    half = reference.shape[-1] // 2
    interleaved = np.stack([reference[..., :half], reference[..., half:]], axis=-1).reshape(reference.shape)
    assert same_values(interleaved, reference)
    interleaved[0, 0, 0, 0] += 1e-2  # one value off is another tensor
    assert not same_values(interleaved, reference)


def test_masked_positions_compare_alike_and_values_that_are_not_floats_exactly():
    scores = np.random.default_rng(2).standard_normal((3, 3)).astype(np.float32)
    blocked = np.triu(np.ones((3, 3), dtype=bool), 1)
    assert same_values(np.where(blocked, -1e9, scores), np.where(blocked, -np.inf, scores))
    assert not same_values(np.where(blocked, -1e9, scores), np.where(blocked.T, -np.inf, scores))
    assert same_values(np.arange(6), np.arange(6)) and not same_values(np.arange(6), np.arange(1, 7))


def test_a_shift_over_a_masked_score_leaves_the_reference_value_and_elsewhere_adds():
    reference = np.array([0.5, -1.25, 2.0], dtype=np.float32)
    candidate = np.array([0.5, np.finfo(np.float32).min, 2.0], dtype=np.float32)  # its mask blocks one key
    shift = Shift(reference - candidate, reference)
    rerun = candidate + np.float32(0.25)  # what the re-run computes there once an earlier difference is out
    assert shift.applied_to(rerun).tolist() == [0.75, -1.25, 2.25]
    assert Shift(reference - candidate).applied_to(rerun)[1] != -1.25  # without a fallback the value is lost
