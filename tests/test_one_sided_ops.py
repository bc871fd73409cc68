"""Ops one side has and the other lacks (an extra scale, an embedding normalizer, a bias added twice) are
named with their source lines, confirmed by a re-run that takes their effect out; a block culprit shows
the line where its difference enters first, then the block's other lines."""

import math

import pytest

import bisectr
from bisectr.present.report import culprit_lines
from conftest import MODELS, line_of

EXTRA_OPS = MODELS / "extra_ops_ports.py"
EVERY_LAYER = MODELS / "every_layer_ports.py"


def _bisect(path, candidate):
    run = bisectr.trace(path, candidate=candidate)
    return run, run.bisect()


def _text(run, result) -> str:
    return "\n".join("".join(text for text, _ in line) for line in culprit_lines(run, result))


def _within_budget(result) -> bool:
    return result.reruns <= math.ceil(math.log2(result.ops.candidate)) + 3


@pytest.mark.parametrize("path, candidate", [(EXTRA_OPS, "candidate"), (EVERY_LAYER, "candidate")])
def test_a_correct_port_with_ops_of_its_own_stays_rounding(path, candidate):
    _, result = _bisect(path, candidate)
    assert result.verdict in ("match", "noise")


def test_an_extra_transposed_scale_is_named_with_its_lines_and_confirmed():
    run, result = _bisect(EXTRA_OPS, "candidate_extra_scale")
    culprit, scale_line = result.culprit, line_of(EXTRA_OPS, "* EXTRA_SCALE  # @extra_scale")
    assert result.verdict == "divergent" and result.confirmation.confirmed
    # The scaled values pair with nothing up to the gelu's output: the extra ops are compared with the gelu, the op
    # the reference computes where the candidate first computes more.
    assert [run.candidate.ops[i].op for i in culprit.block.candidate] == ["transpose", "mul", "transpose", "gelu"]
    assert [run.reference.ops[i].op for i in culprit.block.reference] == ["gelu"]
    assert culprit.candidate.source == f"{EXTRA_OPS}:{scale_line}" and culprit.candidate.module == "blocks.1"
    assert culprit.reference.op == "nn.functional.gelu" and culprit.reference.module == "blocks.1"
    assert 5e-4 < culprit.local_error < 2e-3  # a scale by 1.001
    assert culprit.fp64.reference_error < 1e-6
    assert 1e-4 < result.confirmation.before < 3e-4 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)
    text = _text(run, result)
    assert f"{scale_line}:  h = h.transpose(1, 2) * EXTRA_SCALE" in text
    assert f"{scale_line + 1}:  h = h.transpose(1, 2)  # @extra_scale" in text  # the block's other line


def test_an_extra_embedding_normalizer_is_named_and_confirmed():
    _, result = _bisect(EXTRA_OPS, "candidate_embedding_normalized")
    culprit = result.culprit
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert culprit.op == "mul" and culprit.block.reference == []
    assert culprit.candidate.source == f"{EXTRA_OPS}:{line_of(EXTRA_OPS, '# @normalizer')}"
    assert abs(culprit.local_error - (math.sqrt(32) - 1)) < 0.05  # times sqrt(32) where the reference passes it on
    assert 0.6 < result.confirmation.before < 0.8 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)


def test_a_bias_added_twice_in_every_layer_is_named_at_the_first_with_every_layer():
    _, result = _bisect(EVERY_LAYER, "candidate_bias_twice")
    culprit, source = result.culprit, f"{EVERY_LAYER}:{line_of(EVERY_LAYER, '# @bias_twice')}"
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert culprit.op == "add" and culprit.candidate.module == "layers.0" and culprit.candidate.source == source
    assert [(r.module, r.source) for r in result.recurrences] == [(f"layers.{n}", source) for n in range(4)]
    assert all(0.1 < r.share < 1.0 for r in result.recurrences)  # alone, none makes the whole error
    assert 0.1 < result.confirmation.before < 0.25 and result.confirmation.output_error < 1e-6
    assert _within_budget(result)


def test_a_block_culprit_lists_the_line_of_each_of_its_ops():
    """A hand layer norm with the unbiased variance, against `layer_norm`: the block's ops have no
    partners one by one, so the culprit is the block (shown at the op completing it), and its other
    lines follow, the planted variance among them."""
    run, result = _bisect(EVERY_LAYER, "candidate_unbiased_norm")
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert result.culprit.candidate.module == "layers.0.norm1" and len(result.recurrences) == 9
    assert 0.01 < result.culprit.local_error < 0.03  # sqrt(32 / 31) - 1 = 0.016
    text = _text(run, result)
    for marker in ("mean = x.mean(-1, keepdim=True)", "# @unbiased", "torch.rsqrt(variance + EPS)"):
        assert f"{line_of(EVERY_LAYER, marker)}:  " in text


def test_a_residual_wired_in_parallel_names_the_op_the_candidate_skips_and_the_line_that_wires_it():
    """`x + mix(norm1(x)) + mlp(norm2(x))` where the reference feeds norm2 the sum after mix: the
    culprit is the norm (its output differs though its input pair agrees), and the wiring says the
    reference's norm reads the residual sum, whose counterpart the candidate computes at the planted
    line but does not feed it."""
    run, result = _bisect(EVERY_LAYER, "candidate_parallel_residual")
    culprit, wired = result.culprit, result.culprit.rewired
    parallel = f"{EVERY_LAYER}:{line_of(EVERY_LAYER, '# @parallel')}"
    assert result.verdict == "divergent" and result.confirmation.confirmed
    assert culprit.candidate.module == "layers.0.norm2" and culprit.input_error == 0
    assert wired.reference_input.op == "Tensor.add" and wired.reference_input.module == "layers.0"
    assert wired.counterpart.op == "Tensor.add" and wired.counterpart.source == parallel
    assert wired.reads is None and wired.reads_leaf == "input:0"
    assert [r.module for r in result.recurrences] == [f"layers.{n}.norm2" for n in range(4)]
    assert 0.1 < result.confirmation.before < 0.2 and result.confirmation.output_error < 1e-5
    text = _text(run, result)
    assert (
        "it reads the model's input 0 instead" in text
        and f"{line_of(EVERY_LAYER, '# @parallel')}:  return x + self.mix" in text
    )
