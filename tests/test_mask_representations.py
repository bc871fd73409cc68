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
    assert sorted(culprit.op.split("+")) == ["add", "mul"] and len(culprit.block.candidate) == 2 == len(
        culprit.block.reference
    )
    assert culprit.candidate.source == source and culprit.candidate.module == "blocks.0"
    # The keys both masks block are alike (-1e9 * 32 ** -0.5 against -1e9); the kept ones are scaled by
    # 32 ** -0.5 where the reference's are by 8 ** -0.5 (1 - 0.5).
    assert 0.49 < culprit.local_error < 0.51
    assert [(r.module, r.source) for r in result.recurrences] == [("blocks.0", source), ("blocks.1", source)]
    assert 0.03 < result.confirmation.before < 0.045 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)


BOOL_MASK = MODELS / "paddle_bool_mask.py"


def test_a_boolean_mask_handed_to_paddle_as_torch_means_it_is_named_where_paddle_makes_its_additive_mask():
    """torch's padding mask is True where a key is blocked, paddle's where it is kept. The reference's
    fused attention takes the mask whole; the candidate's mask, made before its attention's ops, pairs
    with the reference's as the mask blocking the most positions alike (-1e9 against -inf), which splits
    the ops that make it off the attention's block."""
    correct = bisectr.trace(BOOL_MASK).bisect()
    assert correct.verdict == "noise" and correct.output_error.max_rel < 1e-6
    result = bisectr.trace(BOOL_MASK, candidate="candidate_mask_as_is").bisect()
    culprit = result.culprit
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert culprit.candidate.source == f"{BOOL_MASK}:{line_of(BOOL_MASK, 'unsqueeze([1, 2])')}"
    assert culprit.reference.op == "Tensor.masked_fill_" and len(culprit.block.reference) == 2
    assert math.isinf(culprit.local_error)  # a key blocked on one side (-inf) is kept on the other (0)
    assert 0.4 < result.confirmation.before < 0.5 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)
