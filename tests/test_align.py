"""Aligning traces recorded from real torch code written two different ways."""

import subprocess
import sys

import pytest

import bisectr
from bisectr.measure.align import align_traces, layer_numbers
from bisectr.adapters import input_layout
from conftest import MODELS


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory):
    run = bisectr.trace(MODELS / "torch_decomposed.py", out=tmp_path_factory.mktemp("runs") / "decomposed")
    return run, align_traces(run.reference, run.candidate, None, input_layout)


def _reference_producer(run, alignment, cand_op_index):
    pair = alignment.tensors[run.candidate.ops[cand_op_index].outputs[0]]
    return run.reference.ops[run.reference.tensors[pair.reference].producer]


def _ops(trace, op):
    return [o for o in trace.ops if o.op == op]


def test_nearly_every_candidate_op_is_aligned(decomposed):
    run, alignment = decomposed
    aligned = len(alignment.aligned_ops("candidate"))
    assert aligned / len(run.candidate.ops) >= 0.9
    assert aligned == len(run.candidate.ops) == 44


def test_projections_in_another_order_pair_by_data_not_position(decomposed):
    run, alignment = decomposed
    # candidate computes v, q, k (each as matmul + add); the reference q, k, v with nn.Linear
    adds = [o.index for o in _ops(run.candidate, "add") if o.source.endswith(tuple(f":{n}" for n in (83, 84, 85)))]
    modules = [_reference_producer(run, alignment, i).module for i in adds]
    assert modules == ["v_proj", "q_proj", "k_proj"]


def test_fused_layer_norm_and_attention_form_matched_blocks(decomposed):
    run, alignment = decomposed
    blocks = {tuple(run.reference.ops[r].op for r in b.reference): b for b in alignment.blocks}
    norm_block = next(b for ops, b in blocks.items() if "layer_norm" in ops)
    assert norm_block.matched
    assert [run.candidate.ops[i].op for i in norm_block.candidate][:7] == [
        "mean",
        "sub",
        "pow",
        "mean",
        "sub",
        "add",
        "rsqrt",
    ]
    attention_block = next(b for ops, b in blocks.items() if "attention" in ops)
    assert attention_block.matched
    assert {"softmax", "where", "div"} <= {run.candidate.ops[i].op for i in attention_block.candidate}
    # the explicit attention's result is paired with scaled_dot_product_attention's output
    last_matmul = max(o.index for o in _ops(run.candidate, "matmul") if o.index in attention_block.candidate)
    assert _reference_producer(run, alignment, last_matmul).framework_op == "nn.functional.scaled_dot_product_attention"


def test_equivalent_spellings_pair_one_to_one(decomposed):
    run, alignment = decomposed
    pairs = {
        (run.candidate.ops[p.candidate].framework_op, run.reference.ops[p.reference].framework_op)
        for p in alignment.pairs
    }
    assert ("Tensor.split", "Tensor.chunk") in pairs
    assert ("Tensor.permute", "Tensor.transpose") in pairs
    extras = [o.index for o in run.candidate.ops if o.op in ("copy", "cast")]  # contiguous, clone, float()
    assert extras and all(i in alignment.aligned_ops("candidate") for i in extras)


def test_every_pair_has_confidence_and_evidence(decomposed):
    _, alignment = decomposed
    for pair in alignment.pairs:
        assert 0.5 <= pair.confidence <= 1.0
        assert {"how", "op", "candidate_module", "reference_module", "shape", "value_distance"} <= set(
            vars(pair.evidence)
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    return bisectr.trace(MODELS / "torch_stack.py", out=tmp_path_factory.mktemp("runs") / "stack")


def test_repeated_layers_never_pair_across_layers(stack):
    alignment = align_traces(stack.reference, stack.candidate)
    assert len(alignment.pairs) == len(stack.candidate.ops) == 48 * 4
    for pair in alignment.pairs:
        cand, ref = stack.candidate.ops[pair.candidate], stack.reference.ops[pair.reference]
        assert layer_numbers(cand.module) == layer_numbers(ref.module)
        assert cand.op == ref.op
    layer_31 = [p for p in alignment.pairs if stack.candidate.ops[p.candidate].module.startswith("blocks.31.")]
    assert {stack.reference.ops[p.reference].module for p in layer_31} == {"layers.31.ffn.up", "layers.31.ffn.down"}


def test_pinned_modules_pair_only_with_each_other(stack):
    alignment = align_traces(stack.reference, stack.candidate, pins={"blocks.3": "layers.4"})
    in_block_3 = lambda module: module == "blocks.3" or module.startswith("blocks.3.")  # noqa: E731
    pinned = [p for p in alignment.pairs if in_block_3(stack.candidate.ops[p.candidate].module)]
    assert [stack.candidate.ops[p.candidate].op for p in pinned] == ["linear", "relu", "linear", "add"]
    assert all(layer_numbers(stack.reference.ops[p.reference].module) == (4,) for p in pinned)


def test_pins_come_from_the_model_file(tmp_path):
    source = (MODELS / "torch_stack.py").read_text() + '\nALIGN_MODULES = {"blocks.3": "layers.4"}\n'
    path = tmp_path / "pinned.py"
    path.write_text(source)
    alignment = bisectr.trace(path).alignment
    pinned = [p for p in alignment.pairs if p.evidence.candidate_module == "blocks.3.mlp.fc_in"]
    assert [p.evidence.reference_module for p in pinned] == ["layers.4.ffn.up"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "trace",
            str(path),
            "--alignment",
            "--format",
            "tsv",
            "-o",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
    )
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    why = {row[3]: row[-1] for row in rows[1:]}  # candidate module -> why it was paired
    assert why["blocks.3.mlp.fc_in"].startswith("ALIGN_MODULES pins these modules together")
    assert why["blocks.0.mlp.fc_in"].startswith("same op, output shape and layer numbers")


def test_a_pin_naming_no_module_is_a_model_file_error(tmp_path):
    source = (MODELS / "torch_stack.py").read_text() + '\nALIGN_MODULES = {"blocks.3": "layer.4"}\n'
    path = tmp_path / "pinned.py"
    path.write_text(source)
    done = subprocess.run([sys.executable, "-m", "bisectr", "bisect", str(path)], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        "ALIGN_MODULES pins 'blocks.3' to 'layer.4', but no op of the reference ran in a module 'layer.4'"
        in done.stderr
    )
    assert "top-level modules: layers" in done.stderr
