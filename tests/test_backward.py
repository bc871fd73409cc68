"""The backward pass (`bisectr bisect --backward`): gradients compared through the forward
alignment, searched with the reference's gradients handed on, on real torch and paddle runs."""

import json
import math
import subprocess
import sys

import pytest

from bisectr import run as runs
from bisectr.search.backward import BackwardRun, output_seeds
from conftest import EXAMPLES, MODELS, assert_verdict_contract, line_of

PORTS = MODELS / "backward_ports.py"


def bisect_json(*args) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", *map(str, args), "--backward", "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    result = json.loads(done.stdout)
    assert_verdict_contract(result)
    assert result["pass"] == "forward" and result["backward"]["pass"] == "backward"
    return done.returncode, result


def rerun_bound(result: dict) -> int:
    return math.ceil(math.log2(result["ops"]["candidate"])) + 3


@pytest.mark.parametrize(
    "reference, candidate, culprit_line",
    [
        ("reference", "candidate_pylayer", "WrongGeluGrad.apply(h) if variant"),  # torch -> paddle PyLayer
        ("reference", "torch_function", "WrongGeluGrad.apply(h) if self.custom"),  # torch -> torch autograd.Function
        ("paddle_reference", "torch_function", "WrongGeluGrad.apply(h) if self.custom"),  # paddle -> torch
    ],
)
def test_a_custom_backward_that_is_subtly_wrong_is_divergent_there_confirmed(reference, candidate, culprit_line):
    status, result = bisect_json(PORTS, "--reference", reference, "--candidate", candidate)
    backward = result["backward"]
    assert result["verdict"] in ("match", "noise") and status == 1  # the forward is right
    culprit, confirmation = backward["culprit"], backward["confirmation"]
    assert backward["verdict"] == "divergent" and 1e-4 < backward["output_error"]["max_rel"] < 1e-2
    assert culprit["op"] == "WrongGeluGrad" and culprit["candidate"]["module"] == "blocks.1"
    assert culprit["candidate"]["op"].endswith("WrongGeluGrad.apply")
    assert culprit["candidate"]["source"] == f"{PORTS}:{line_of(PORTS, culprit_line)}"
    assert culprit["reference"]["module"] == "blocks.1" and culprit["reference"]["op"].endswith("gelu")
    assert culprit["verdict"] == "different" and culprit["fp64"]["reference_error"] < 1e-5 < culprit["local_error"]
    assert confirmation["confirmed"] and confirmation["output_error"] < 1e-2 * confirmation["before"]
    assert backward["fp64_check"]["status"] == "disagree"
    assert backward["reruns"] <= rerun_bound(backward)


def test_a_detached_residual_is_divergent_at_the_detach():
    status, result = bisect_json(PORTS, "--candidate", "candidate_detached")
    backward = result["backward"]
    assert status == 1 and result["verdict"] in ("match", "noise")
    assert backward["verdict"] == "divergent" and backward["output_error"]["max_rel"] > 0.1
    culprit = backward["culprit"]
    assert culprit["candidate"]["op"] == "Tensor.detach" and culprit["candidate"]["module"] == "blocks.1"
    assert culprit["candidate"]["source"] == f"{PORTS}:{line_of(PORTS, 'residual = x.detach()')}"
    assert "Tensor.detach cuts the candidate's gradient" in backward["missing_gradient"]
    assert backward["confirmation"]["confirmed"] and backward["confirmation"]["output_error"] < 1e-5


def test_a_parameter_frozen_on_one_side_is_named():
    status, result = bisect_json(PORTS, "--candidate", "candidate_frozen")
    backward = result["backward"]
    assert status == 1 and backward["verdict"] == "divergent"
    assert backward["culprit"]["kind"] == "leaf" and backward["culprit"]["leaf"] == "blocks.0.fc2.weight"
    assert backward["culprit"]["candidate"]["module"] == "blocks.0.fc2"
    assert "blocks.0.fc2.weight gets no gradient on the candidate" in backward["missing_gradient"]
    assert backward["confirmation"] is None and backward["bracket"] is None  # nothing to swap: said plainly
    assert backward["output_error"]["max_rel"] < 1e-5  # every other gradient agrees


@pytest.mark.parametrize("model, candidate", [(PORTS, "candidate"), (EXAMPLES / "span_head.py", "candidate")])
def test_a_correct_port_is_backward_noise_with_its_gradient_profile(model, candidate):
    status, result = bisect_json(model, "--candidate", candidate)
    backward = result["backward"]
    assert status == 0 and backward["verdict"] == "noise" and backward["fp64_check"]["status"] == "agree"
    assert backward["output_error"]["max_rel"] < 1e-3
    assert len(backward["profile"]) >= 0.9 * backward["ops"]["candidate"]
    assert all(row["output_error"] < 1e-3 for row in backward["profile"])
    assert backward["reruns"] <= rerun_bound(backward)


def test_the_seeds_are_one_gradient_in_each_sides_layout_and_losses_are_compared(tmp_path):
    model = tmp_path / "with_losses.py"
    model.write_text(
        PORTS.read_text() + "\n\ndef reference_loss(outputs):\n    return (outputs ** 2).mean()\n\n\n"
        "def candidate_loss(outputs):\n    return (outputs ** 2).mean()\n"
    )
    run = runs.trace(model)
    seeds = output_seeds(run)
    (_, reference), (_, candidate) = *seeds["reference"].items(), *seeds["candidate"].items()
    assert (
        reference.shape == (4, 8, 4) and (reference == candidate).all() and reference.std() == pytest.approx(1, rel=0.2)
    )
    result = run.bisect(backward=True).backward
    assert result.verdict == "noise" and result.losses["reference"] == pytest.approx(
        result.losses["candidate"], rel=1e-5
    )
    assert result.losses["reference"] > 0


def test_the_backward_result_is_saved_with_the_run_and_shown_by_view(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "trace",
            str(PORTS),
            "--candidate",
            "candidate_pylayer",
            "--backward",
            "--no-tui",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    loaded = runs.load(out)
    assert loaded.result.verdict == "noise" and loaded.result.backward.verdict == "divergent"
    assert loaded.result.backward.culprit.op == "WrongGeluGrad"
    viewed = subprocess.run(
        [sys.executable, "-m", "bisectr", "view", str(out), "--no-tui"], capture_output=True, text=True
    )
    assert viewed.returncode == 1
    assert (
        "backward verdict: divergent" in viewed.stdout
        and "(first op whose backward differs): WrongGeluGrad" in viewed.stdout
    )
    assert "confirmed: taking out only op 7's own difference takes the gradients' error" in viewed.stdout


def test_isolated_sides_run_their_backward_in_their_workers():
    status, result = bisect_json(PORTS, "--candidate", "candidate_pylayer", "--isolate")
    assert status == 1 and result["backward"]["culprit"]["op"] == "WrongGeluGrad"
    assert result["backward"]["confirmation"]["confirmed"]


def test_only_gradients_both_sides_have_are_compared():
    run = runs.trace(PORTS, candidate="candidate_frozen")
    backward = BackwardRun(run.live)
    frozen = next(
        t for t, pair in backward.leaf_pairs.items() if run.candidate.tensors[t].leaf == "param:blocks.0.fc2.weight"
    )
    assert backward.candidate.leaves[frozen] is None and backward.tensor_error(frozen) is None
    assert backward.reference.leaves[backward.leaf_pairs[frozen].reference] is not None
    assert len(backward.leaf_pairs) == 3 * 6 + 2 + 1  # norm, fc1, fc2 (weight and bias) per block, the head, the input


def test_repro_writes_the_culprits_backward_in_both_frameworks(tmp_path):
    status, result = bisect_json(EXAMPLES / "tanh_gelu.py", "--repro", tmp_path / "repro")
    backward = result["backward"]
    assert (
        status == 1
        and backward["culprit"]["op"] == "gelu"
        and backward["culprit"]["candidate"]["module"] == "layers.7.ffn"
    )
    assert backward["repro"] == str(tmp_path / "repro" / "backward" / "repro.py")
    done = subprocess.run([sys.executable, backward["repro"]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert float(lines["reference op vs float64 oracle"]) < 1e-5 < float(lines["candidate op vs float64 oracle"])
    assert "=> different" in done.stdout


def test_nan_gradients_are_divergent_where_they_start():
    status, result = bisect_json(PORTS, "--candidate", "torch_function_nan")
    backward = result["backward"]
    assert (
        status == 1
        and backward["verdict"] == "divergent"
        and backward["output_error"]["max_rel"] in ("NaN", "Infinity")
    )
    assert backward["culprit"]["op"] == "WrongGeluGrad" and backward["confirmation"]["confirmed"]


@pytest.mark.parametrize(
    "added, message",
    [
        (
            "def reference_loss(outputs):\n    return outputs.sum()\n",
            "defines reference_loss() but not candidate_loss()",
        ),
        (
            "def reference_loss(outputs):\n    return outputs.sum()\n\n\n"
            "def candidate_loss(outputs):\n    raise ValueError('no labels')\n",
            "candidate_loss() raised ValueError: no labels",
        ),
        (
            "def reference_loss(outputs):\n    return outputs.sum()\n\n\n"
            "def candidate_loss(outputs):\n    return outputs\n",
            "candidate_loss() returned Tensor, not a paddle tensor holding one value",
        ),
        (
            "def candidate_without_gradients():\n    import paddle\n    model, inputs = candidate()\n\n"
            "    def forward(x):\n        with paddle.no_grad():\n            return model(x)\n"
            "    return forward, inputs\n",
            "no gradient reaches any parameter or input of the candidate model",
        ),
    ],
)
def test_a_model_file_whose_backward_cannot_run_is_status_2_naming_the_file(tmp_path, added, message):
    model = tmp_path / "bad_backward.py"
    model.write_text(PORTS.read_text() + "\n\n" + added)
    candidate = "candidate_without_gradients" if "without_gradients" in added else "candidate"
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(model), "--candidate", candidate, "--backward"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert str(model) in done.stderr and message in done.stderr.replace("\n", " "), done.stderr
    assert "Traceback" not in done.stderr or "Traceback (user code)" in done.stderr


def test_a_fused_port_whose_parameters_pair_with_none_is_compared_through_its_inputs_gradients():
    status, result = bisect_json(EXAMPLES / "paddle_vs_paddle.py")
    backward = result["backward"]
    assert status == 0 and backward["verdict"] == "noise" and backward["output_error"]["max_rel"] < 1e-4
    assert backward["fp64_check"]["status"] == "agree"
