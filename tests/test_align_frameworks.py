"""Alignment of traces recorded from real torch (reference) and paddle (candidate) code."""

import numpy as np
import pytest

import bisectr
from conftest import EXAMPLES


@pytest.fixture(scope="module")
def span(tmp_path_factory):
    run = bisectr.trace(EXAMPLES / "span_head.py", out=tmp_path_factory.mktemp("runs") / "span")
    return run, run.alignment


def _line(trace, op_index):
    path, line = trace.ops[op_index].source.rsplit(":", 1)
    return open(path).read().splitlines()[int(line) - 1].strip()


def _partner(run, alignment, cand_index):
    ref_index = alignment.reference_of(cand_index)
    assert ref_index is not None, (cand_index, run.candidate.ops[cand_index])
    return run.reference.ops[ref_index]


def test_ops_named_in_the_seed_reports_pair_with_their_counterparts(span):
    run, alignment = span
    cand = run.candidate
    named = {  # candidate line fragment -> reference line fragment (seed 004 and the encoder's attention/FFN)
        "temp = paddle.matmul(query_start_reps": "temp = torch.matmul(query_start_reps",
        "start_logits = paddle.matmul(temp": "start_logits = torch.matmul(temp",
        "end_logits = paddle.matmul(temp": "end_logits = torch.matmul(temp",
        "scores = paddle.matmul(q, k, transpose_y=True)": "scores = torch.matmul(q, k.transpose(-1, -2))",
        "probs = F.softmax(scores": "probs = F.softmax(scores, dim=-1)",
    }
    for cand_fragment, ref_fragment in named.items():
        ops = [o.index for o in cand.ops if cand_fragment in _line(cand, o.index) and o.op in ("matmul", "softmax")]
        assert ops, cand_fragment
        for index in ops:
            partner = _partner(run, alignment, index)
            assert ref_fragment in _line(run.reference, partner.index)
            assert partner.module == cand.ops[index].module


def test_ffn_linears_and_the_mask_add_pair_layer_by_layer(span):
    run, alignment = span
    linears = [o for o in run.candidate.ops if o.op == "linear"]
    assert len(linears) >= 12
    for op in linears:
        assert _partner(run, alignment, op.index).module == op.module
    mask_adds = [o for o in run.candidate.ops if o.op == "add" and "mask_value" in _line(run.candidate, o.index)]
    assert len(mask_adds) == 2
    for op in mask_adds:
        assert _partner(run, alignment, op.index).module == op.module


def test_linear_weights_pair_through_a_transpose_decided_by_layer_type(span):
    run, alignment = span
    checked = 0
    for tid, pair in alignment.tensors.items():
        leaf = run.candidate.tensors[tid].leaf or ""
        if leaf.endswith(".weight") and len(run.candidate.tensors[tid].shape) == 2 and "embed" not in leaf:
            assert pair.transform == (1, 0), leaf
            candidate = run.candidate.value(tid)
            reference = pair.reference_in_candidate_layout(run.reference.value(pair.reference), candidate.shape)
            np.testing.assert_array_equal(candidate, reference)
            checked += 1
    assert checked >= 12


def test_coverage_is_reported_by_trace(tmp_path):
    run = bisectr.trace(EXAMPLES / "deep_stack.py", out=tmp_path / "run")
    result = run.bisect()
    assert result.ops.aligned == result.ops.candidate
    from bisectr.measure.align import layer_numbers

    run_pairs = run.alignment.pairs
    assert len(run_pairs) > 0.9 * result.ops.candidate
    assert all(
        layer_numbers(p.evidence.candidate_module) == layer_numbers(p.evidence.reference_module) for p in run_pairs
    )
