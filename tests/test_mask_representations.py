"""Padding masks made another way on each side (additive float against boolean, or against the float
cast of the padded positions, whose values refute the pairing of the two casts): the masks do not steer
the search, and a bug after the mask, in the pooling or in the attention's scale, is named at its line
and confirmed (`tests/models/mask_representations.py`)."""
import math

import pytest

import bisectr
from conftest import MODELS, line_of

MASKS = MODELS / "mask_representations.py"


def _bisect(candidate: str):
    return bisectr.trace(MASKS, candidate=candidate).bisect()


def _within_budget(result) -> bool:
    return result.reruns <= math.ceil(math.log2(result.ops.candidate)) + 3


@pytest.mark.parametrize("candidate", ["candidate", "candidate_padded_mask"])
def test_a_correct_port_with_its_mask_made_another_way_agrees(candidate):
    assert _bisect(candidate).verdict == "match"


@pytest.mark.parametrize("candidate", ["candidate_pool_full_length", "candidate_padded_mask_pool_full_length"])
def test_pooling_over_the_full_length_is_the_division_after_the_mask(candidate):
    result = _bisect(candidate)
    culprit = result.culprit
    assert result.verdict == "divergent" and culprit.op == "div"
    assert culprit.candidate.source == f"{MASKS}:{line_of(MASKS, '# @full_length')}"
    assert 0.3 < culprit.local_error < 0.45  # the padded row's pooled vector is 5/8 of the reference's
    assert 0.15 < result.confirmation.before < 0.18 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)


def test_a_scale_applied_after_the_mask_is_the_add_and_mul_compared_as_one_block_in_every_block():
    """The candidate adds the mask, then scales; the reference scales, then adds: pairing the two adds and
    the two muls would cross what each reads, so the two ops are compared as one block."""
    result = _bisect("candidate_padded_mask_scaled_by_model_width")
    culprit, source = result.culprit, f"{MASKS}:{line_of(MASKS, '# @scale_after_mask')}"
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert sorted(culprit.op.split("+")) == ["add", "mul"] and len(culprit.block.candidate) == 2 == len(culprit.block.reference)
    assert culprit.candidate.source == source and culprit.candidate.module == "blocks.0"
    # Relative to the masked scores: -1e9 * 32 ** -0.5 where the reference's hold -1e9 (1 - 0.177).
    assert 0.8 < culprit.local_error < 0.85
    assert [(r.module, r.source) for r in result.recurrences] == [("blocks.0", source), ("blocks.1", source)]
    assert 0.03 < result.confirmation.before < 0.045 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)
