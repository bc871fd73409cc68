"""The verdict contract on model pairs the project did not write: library layers against hand
ports (torch `nn.MultiheadAttention`, paddle.vision's ResNet, a Hugging Face Llama), each correct
and with one planted bug, and models that do not reproduce themselves."""

import json
import math
import subprocess
import sys

import pytest

import bisectr
from bisectr.measure.analysis import Analysis
from bisectr.measure.numerics import noise_floor

from conftest import MODELS, assert_verdict_contract, line_of


def bisect(model: str, candidate: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(MODELS / model), "--candidate", candidate, "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    result = json.loads(done.stdout)
    assert done.returncode == (1 if result["verdict"] == "divergent" else 0)
    assert result["reruns"] <= math.ceil(math.log2(result["ops"]["candidate"])) + 3
    assert_verdict_contract(result)
    return done.returncode, result


def test_multihead_attention_against_a_correct_hand_port_is_noise_by_the_float64_check():
    status, result = bisect("torch_mha.py", "candidate")
    check = result["fp64_check"]
    assert status == 0 and result["verdict"] == "noise"
    assert check["status"] == "agree" and check["float64_error"] < 1e-12 < 1e-8 < check["error"] < 1e-6


def test_multihead_attention_with_a_wrong_scale_is_divergent_and_bracketed_at_it(tmp_path):
    status, result = bisect("torch_mha.py", "candidate_wrong_scale")
    check = result["fp64_check"]
    assert status == 1 and check["status"] == "disagree" and 0.5 < check["float64_error"] / check["error"] < 2
    scale_line = f"{MODELS / 'torch_mha.py'}:{line_of(MODELS / 'torch_mha.py', 'self.scale  # @scale')}"
    if result["confirmation"]["confirmed"]:
        # torch's attention is one op (multi_head_attention_forward): the culprit is the block of the
        # candidate's ops standing for blocks.1's, the scaled scores among them
        culprit = result["culprit"]
        assert culprit["reference"]["module"] == "blocks.1.attn" and culprit["block"] is not None
        candidate = bisectr.trace(
            MODELS / "torch_mha.py", candidate="candidate_wrong_scale", out=tmp_path / "run"
        ).candidate
        assert scale_line in {candidate.ops[i].source for i in culprit["block"]["candidate"]}
    else:
        assert scale_line in [site["source"] for site in result["bracket"]["candidate"]]
        assert all(site["module"].startswith("blocks.1") for site in result["bracket"]["candidate"])


def test_paddle_vision_resnet_against_a_torch_port_is_noise():
    status, result = bisect("paddle_resnet.py", "candidate")
    assert status == 0 and result["verdict"] == "noise" and result["fp64_check"]["status"] == "agree"


def test_a_wrong_batch_norm_eps_deep_in_the_port_is_that_batch_norm_confirmed():
    status, result = bisect("paddle_resnet.py", "candidate_bn_eps")
    culprit, confirmation = result["culprit"], result["confirmation"]
    assert status == 1 and culprit["op"] == "batch_norm"
    assert culprit["candidate"]["module"] == culprit["reference"]["module"] == "layer4.1.bn1"
    assert confirmation["confirmed"] and confirmation["output_error"] < confirmation["before"] / 10
    assert result["fp64_check"]["status"] == "disagree"


def test_hugging_face_llama_with_one_layer_on_gelu_is_divergent_at_that_activation():
    pytest.importorskip("transformers")
    status, result = bisect("hf_llama_activation.py", "candidate_gelu_layer")
    culprit, confirmation = result["culprit"], result["confirmation"]
    assert (
        status == 1
        and culprit["candidate"]["op"] == "nn.functional.gelu"
        and culprit["reference"]["op"] == "nn.functional.silu"
    )
    assert culprit["candidate"]["module"] == culprit["reference"]["module"] == "model.layers.2.mlp.act_fn"
    assert confirmation["confirmed"] and confirmation["output_error"] < confirmation["before"] / 10


@pytest.mark.parametrize(
    "model, framework_op", [("torch_dropout.py", "nn.functional.dropout"), ("paddle_dropout.py", "_C_ops.dropout")]
)
def test_dropout_in_training_mode_on_both_sides_is_nondeterministic_on_both(model, framework_op):
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(MODELS / model), "--json"], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "nondeterministic"
    assert [
        (found["side"], found["op"]["index"], found["op"]["op"], found["cause"]) for found in result["nondeterminism"]
    ] == [(side, 1, framework_op, "random") for side in ("reference", "candidate")]
    assert all("model.eval()" in found["fix"] for found in result["nondeterminism"])


def test_the_corpus_benchmark_prints_a_row_per_pair_and_writes_them(tmp_path):
    """`benchmarks/corpus.py` as a user runs it (tests/test_corpus.py runs every pair through it)."""
    rows_file = tmp_path / "rows.json"
    done = subprocess.run(
        [
            sys.executable,
            str(MODELS.parent.parent / "benchmarks" / "corpus.py"),
            "--only",
            "paddle_conv_bias",
            "--json",
            str(rows_file),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(rows_file.read_text())
    assert [(r["pair"], r["verdict"], r["confirmed"], r["problems"]) for r in rows] == [
        ("paddle_conv_bias:candidate", "noise", False, []),
        ("paddle_conv_bias:candidate_wrong_bias", "divergent", True, []),
    ]
    # The op amplifying rounding the most: of two that amplify about as much, which depends on the CPU's kernels.
    assert rows[0]["culprit"] in ("conv2d+add at conv2", "linear at fc")
    assert rows[1]["culprit"] == "conv2d at conv2"
    assert rows[0]["contradicted"] == 0 and all(r["coverage"] == 1.0 and r["reruns"] <= r["budget"] for r in rows)
    assert len(done.stdout.splitlines()) == 2


@pytest.mark.parametrize("candidate, verdict", [("candidate", "noise"), ("candidate_bn_eps", "divergent")])
def test_an_op_within_its_dtypes_floor_is_noise_without_its_oracle_and_the_culprit_shows_it(candidate, verdict):
    """paddle.vision's ResNet against a torch port: an op whose local error is within its dtype's floor
    is noise whatever the fp64 oracle says (`numerics.judge`), so the oracle is not replayed for it;
    replayed, it gives each such op the same verdict. The culprit, a noise culprit too, shows its oracle."""
    run = bisectr.trace(MODELS / "paddle_resnet.py", candidate=candidate)
    analysis = Analysis(run.live).compute()
    decided = [e for e in analysis.ops.values() if e.local_error and e.fp64 is None]
    assert len(decided) >= 20
    for evidence in decided:
        assert evidence.local_error <= noise_floor(evidence.dtype) and evidence.verdict == "noise"
        replayed = analysis.evidence(evidence.candidate, evidence.reference, evidence.block, oracle=True)
        assert replayed.fp64 is not None and replayed.verdict == "noise"
    result = run.bisect()
    assert result.verdict == verdict and result.culprit.op == "batch_norm"
    assert result.culprit.fp64 is not None and result.culprit.fp64.reference_error > 0
