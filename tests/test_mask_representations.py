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


@pytest.mark.parametrize(
    "candidate, ops",
    # Paired by data flow, the division is compared with the reference's count of kept positions (`weights.sum(1)`),
    # which has no counterpart, and its division; paired as recorded (the padded mask's port pairs most of its ops
    # with ops of modules of the same names), division with division.
    [("candidate_pool_full_length", ["sum", "div"]), ("candidate_padded_mask_pool_full_length", ["div"])],
)
def test_pooling_over_the_full_length_is_the_division_after_the_mask(candidate, ops):
    result = _bisect(candidate)
    culprit = result.culprit
    assert result.verdict == "divergent" and culprit.op.split("+") == ops
    assert culprit.candidate.source == f"{MASKS}:{line_of(MASKS, '# @full_length')}"
    assert 0.3 < culprit.local_error < 0.45  # the padded row's pooled vector is 5/8 of the reference's
    assert 0.15 < result.confirmation.before < 0.18 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)


def test_a_scale_applied_after_the_mask_is_named_at_the_add_where_the_reference_scales_first_in_every_block():
    """The candidate adds the mask, then scales; the reference scales, then adds: the scores of the two sides
    hold no common value, so the attention is compared as one block, entered at the candidate's add (its sum holds
    no reference value, what it reads does)."""
    result = _bisect("candidate_padded_mask_scaled_by_model_width")
    culprit, source = result.culprit, f"{MASKS}:{line_of(MASKS, '# @scale_after_mask')}"
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert culprit.candidate.op == "Tensor.add" and culprit.reference.op == "Tensor.add"
    assert culprit.candidate.source == source and culprit.candidate.module == "blocks.0"
    assert culprit.reference.source == f"{MASKS}:{line_of(MASKS, 'scores = scores + mask')}"
    # The block's output, the attention's projection (magnitude ~2), differs by 0.09 relative on the reference's
    # inputs: 0.06 at the outputs.
    assert 0.07 < culprit.local_error < 0.11
    assert [(r.module, r.source) for r in result.recurrences] == [("blocks.0", source), ("blocks.1", source)]
    assert 0.03 < result.confirmation.before < 0.045 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)


BOOL_MASK = MODELS / "paddle_bool_mask.py"


@pytest.mark.xfail(
    strict=True,
    reason="paired by data flow (paddle's attention is many ops, torch's one), the block of the first layer's "
    "attention confirms within the rounding the candidate's float64 run predicts (0.1: rows every key of which is "
    "blocked), and is named at its first op, not at the mask paddle makes",
)
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
