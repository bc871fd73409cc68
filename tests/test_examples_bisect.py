"""`bisectr bisect --json` on every example: the verdict and culprit its docstring promises."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from conftest import EXAMPLES, assert_verdict_contract


def bisect_json(name, *args):
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(EXAMPLES / name), "--json", *args],
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    result = json.loads(done.stdout)
    assert done.returncode == (1 if result["verdict"] == "divergent" else 0)
    assert result["reruns"] <= math.ceil(math.log2(result["ops"]["candidate"])) + 3
    assert result["ops"]["aligned"] >= 0.9 * result["ops"]["candidate"]
    assert_verdict_contract(result)
    return result


def culprit_line(result, side="candidate"):
    path, line = result["culprit"][side]["source"].rsplit(":", 1)
    return open(path).read().splitlines()[int(line) - 1].strip()


def test_span_head_is_noise_amplified_by_the_span_matmul():
    result = bisect_json("span_head.py")
    culprit = result["culprit"]
    assert result["verdict"] == "noise"
    assert culprit["op"] == "matmul" and culprit["candidate"]["module"] == "span_head"
    assert culprit_line(result).startswith(("start_logits = paddle.matmul(temp", "end_logits = paddle.matmul(temp"))
    assert culprit_line(result, "reference").startswith(
        ("start_logits = torch.matmul(temp", "end_logits = torch.matmul(temp")
    )
    assert (
        1e-5 < culprit["input_error"] < 1e-4 and 1e-3 < culprit["output_error"] < 1e-2
    )  # absolute: the growth seed 004 saw
    fp64 = culprit["fp64"]  # both frameworks equally accurate: bit-equal (no oracle needed), or as far from float64
    assert culprit["local_error"] == 0 or fp64["candidate_error"] < 2 * fp64["reference_error"] + 1e-7


def test_one_tanh_gelu_is_divergent_at_that_gelu():
    result = bisect_json("tanh_gelu.py")
    assert result["verdict"] == "divergent"
    assert result["culprit"]["op"] == "gelu" and result["culprit"]["candidate"]["module"] == "layers.7.ffn"
    assert result["culprit"]["fp64"]["candidate_error"] > 100 * result["culprit"]["fp64"]["reference_error"]
    assert result["confirmation"]["output_error"] < 1e-5 < result["confirmation"]["before"]


def test_square_weight_without_transpose_is_blamed_on_the_weight():
    result = bisect_json("untransposed_weight.py")
    culprit = result["culprit"]
    assert result["verdict"] == "divergent"
    assert culprit["kind"] == "leaf" and culprit["leaf"] == "blocks.1.attn.q_proj.weight"
    assert culprit["op"] == "linear" and culprit["candidate"]["module"] == "blocks.1.attn.q_proj"


def test_wrong_eps_is_blamed_on_the_first_norm_with_recurrences():
    result = bisect_json("wrong_eps.py")
    culprit = result["culprit"]
    assert result["verdict"] == "divergent"
    assert culprit["candidate"]["module"] == "blocks.0.attn_norm"
    assert "eps" in culprit_line(result)
    modules = [r["module"] for r in result["recurrences"]]  # every occurrence, the culprit first
    assert len(modules) == 9 and modules[0] == "blocks.0.attn_norm" and all(m.endswith("_norm") for m in modules)
    assert result["confirmation"]["patched_ops"] == [r["index"] for r in result["recurrences"]]


def test_mask_fill_value_is_not_blamed():
    result = bisect_json("mask_fill.py")
    assert result["verdict"] == "noise"
    assert result["culprit"]["op"] not in ("add", "where")


def test_float64_cube_root_is_found_by_the_fp64_oracle():
    result = bisect_json("cube_root_fp64.py")
    culprit = result["culprit"]
    assert result["verdict"] == "divergent" and culprit["op"] == "pow"
    assert "** (1 / 3)" in culprit_line(result)
    assert culprit["fp64"]["candidate_error"] > 1e-9 > 1e-14 > culprit["fp64"]["reference_error"]


@pytest.mark.parametrize(
    "name",
    [
        "correct_port.py",
        "paddle_vs_torch.py",
        "paddle_vs_paddle.py",
        "op_substitution.py",
        "reformer_local_attention.py",
        "torch_vs_torch_bf16.py",
    ],
)
def test_correct_ports_are_noise_or_match(name):
    assert bisect_json(name)["verdict"] in ("noise", "match")


def test_deep_stack_is_noise_and_the_mask_add_is_not_named():
    result = bisect_json("deep_stack.py")
    assert result["verdict"] == "noise"
    assert result["culprit"]["op"] != "add"


def test_repro_reproduces_the_culprit_alone_in_both_frameworks(tmp_path):
    result = bisect_json("cube_root_fp64.py", "--repro", str(tmp_path / "repro"))
    script = tmp_path / "repro" / "repro.py"
    assert result["repro"] == str(script)
    text = script.read_text()
    assert "import paddle" in text and "import torch" in text and "** (1 / 3)" in text
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert float(lines["reference op vs float64 oracle"]) < 1e-15
    assert 1e-9 < float(lines["candidate op vs float64 oracle"]) < 1e-7
    assert "=> different" in done.stdout


def test_reformer_numbered_op_list_replaces_the_hand_numbered_ids(tmp_path):
    """Seeds 001/002 numbered ops by hand and printed `max dif` after each: `trace --ops` does it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "trace",
            str(EXAMPLES / "reformer_local_attention.py"),
            "--reference",
            "reference_trained",
            "--candidate",
            "candidate_trained",
            "--ops",
            "--no-tui",
            "-o",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split("│")[1:-1]
        for line in done.stdout.splitlines()
        if line.startswith("│ ") and len(line.split("│")) == 11
    ]
    rows = [[cell.strip() for cell in row] for row in rows if row[0].strip().isdigit()]
    layer0 = [(name, module) for _, name, module, *_ in rows if module.startswith(("embed", "layers.0"))]
    names = [name for name, _ in layer0]
    expected = [
        "embedding",
        "layer_norm",
        "linear",
        "linear",
        "linear",
        "div",
        "matmul",
        "where",
        "logsumexp",
        "exp",
        "matmul",
        "linear",
        "add",
    ]
    positions = [names.index(expected[0])]
    for name in expected[1:]:  # the seed's ops appear in this order
        positions.append(names.index(name, positions[-1] + 1))
    max_dif = {int(row[0]): float(row[5]) for row in rows}
    assert max_dif[0] == 0.0  # identical embeddings
    layer_norm = next(int(r[0]) for r in rows if r[1] == "layer_norm")
    assert 1e-7 < max_dif[layer_norm] < 1e-5  # "why does layer_norm differ on identical inputs?"
    last_add = [int(r[0]) for r in rows if r[1] == "add"]
    assert max_dif[last_add[-1]] > max_dif[last_add[0]] > 0  # error grows layer by layer


def test_substituting_the_reference_ops_brings_the_difference_to_zero():
    """Seed 003 swapped paddle's layer_norm, matmul, sum, logsumexp, ... for torch's by hand until 0."""
    named = bisect_json("op_substitution.py", "--substitute", "layer_norm,linear,matmul,sum,logsumexp")["substitution"]
    assert named["before"] > 1e-7 and named["output_error"] < named["before"]
    every = bisect_json("op_substitution.py", "--substitute", "rounding")["substitution"]
    # On some CPUs both frameworks' GEMMs agree bitwise (linear and matmul are then exact, not rounding);
    # paddle's fused layer_norm against torch's written out always differs in rounding, and logsumexp.
    assert {"mean+sub+pow+add+sqrt+div+mul", "logsumexp"} <= set(every["ops"])
    assert every["output_error"] == 0.0
    assert every["replaced"][0]["candidate"] == [0] and len(every["replaced"][0]["reference"]) > 5  # fused vs by hand


def test_substituting_the_culprit_removes_a_real_bug():
    substitution = bisect_json("tanh_gelu.py", "--substitute", "gelu")["substitution"]
    assert substitution["before"] > 1e-4 > 1e-5 > substitution["output_error"]


@pytest.mark.parametrize(
    "name, reference, candidate, seed_error",
    [
        ("deep_stack.py", "reference_trained", "candidate_trained", 3e-4),  # seed 000: logits off by ~3e-4
        ("reformer_local_attention.py", "reference_12_layers", "candidate_12_layers", None),  # seed 002's depth
    ],
)
def test_trained_stacks_are_noise_with_error_growing_layer_by_layer(name, reference, candidate, seed_error):
    result = bisect_json(name, "--reference", reference, "--candidate", candidate)
    assert result["verdict"] == "noise" and result["culprit"]["op"] != "add"
    if seed_error is not None:
        assert seed_error / 3 < result["output_error"]["max_abs"] < seed_error * 3
    blocks = re.compile(r"(blocks|layers)\.\d+$")
    residual = [
        row["max_abs"]
        for row in result["profile"]
        if row["op"] == "add" and blocks.search(row["module"]) and row["max_abs"] > 0
    ]
    assert residual[-1] > 10 * residual[0]
    masks = [row for row in result["profile"] if row["op"] == "add" and row["module"].endswith(".attn")]
    if masks:  # the -1e4 mask add's jump is shown (rounding at magnitude 1e4) and not blamed
        assert masks[0]["max_abs"] > 10 * residual[0]
