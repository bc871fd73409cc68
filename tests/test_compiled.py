"""Eager against `torch.compile`: a compiled model is compared with its eager self (or with a paddle
reference), its compiled module's call recorded as one op; where that op is the culprit, bisectr
searches inside it (`bisectr/search/compiled.py`): the module whose compiled code alone makes the
difference, the op of its graph, the compiler step, and the proof with that module's class eager.

Inductor compiles for the CPU here with the system's C++ compiler: each model takes 15-60 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, MODELS, assert_verdict_contract, line_of

# Torch's own machinery (torch.compile, torchrun's ranks, signals) or the benchmarks: the first CI
# environment runs these, the PaddleFormers one (numpy 1.26) does not (see .ci/run).
pytestmark = pytest.mark.once

LLAMA = MODELS / "compiled_hf_llama.py"
RESNET = MODELS / "compiled_hf_resnet.py"
PADDLE_REFERENCE = MODELS / "compiled_paddle_reference.py"
TIMEOUT_S = 300


def bisect(model, *options: str, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(model), "--json", *options],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **env},
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert_verdict_contract(result)
    return result


def line_text(source: str) -> str:
    path, line = source.rsplit(":", 1)
    with open(path) as file:
        return file.readlines()[int(line) - 1].strip()


# model -> largest difference of the float64 outputs (HF Llama's rotary embedding casts to float32
# with `.float()` inside the compiled code, which the float64 run cannot widen there)
CORRECT = {"hf_llama": (LLAMA, 1e-6), "hf_resnet": (RESNET, 1e-12), "paddle_reference": (PADDLE_REFERENCE, 1e-12)}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_compile_is_noise_with_the_float64_check_agreeing(name):
    if name == "paddle_reference":
        pytest.importorskip("paddle")
    model, float64_error = CORRECT[name]
    result = bisect(model)
    assert result["verdict"] == "noise" and result["output_error"]["max_rel"] < 1e-6
    check = result["fp64_check"]
    assert check["status"] == "agree" and check["float64_error"] < float64_error
    assert result["ops"]["candidate"] == 1 and result["ops"]["aligned"] == 1  # the compiled model's call, one op
    assert result["culprit"]["candidate"]["op"] == "compiled" and result["culprit"]["compiled"] is None


def test_a_wrong_decomposition_is_named_by_module_op_line_and_compiler_step():
    result = bisect(LLAMA, COMPILE_BUG="mean_decomposition")
    assert result["verdict"] == "divergent" and result["fp64_check"]["status"] == "disagree"
    assert 0.005 < result["output_error"]["max_rel"] < 0.02  # every RMSNorm divides by 63 where it means 64
    compiled = result["culprit"]["compiled"]
    assert compiled["backend"] == "inductor"
    assert compiled["module"] == "model.layers.0.input_layernorm" and compiled["module_class"] == "LlamaRMSNorm"
    assert (
        compiled["op"] == "Tensor.mean"
        and line_text(compiled["source"]) == "variance = hidden_states.pow(2).mean(-1, keepdim=True)"
    )
    assert 0.014 < compiled["op_error"] < 0.018  # 1/63 of the mean
    assert compiled["step"] == "aot_eager_decomp_partition, decomposition"
    assert compiled["step_detail"] == "applied to aten.mean.dim"
    assert len(compiled["eager_ops"]) == 1  # the eager reference's Tensor.mean at that line, in that module
    # the proof: every RMSNorm eager inside the compiled model takes its error to rounding
    assert len(compiled["eager_modules"]) == 5 and compiled["confirmed"]
    assert compiled["confirmed_error"] < 1e-6 < compiled["error"]
    from bisectr.measure.result import Result

    assert (
        Result.from_dict(result).culprit.compiled.module == "model.layers.0.input_layernorm"
    )  # as a saved run reads it
    assert compiled["compiles"] <= 30


def test_a_compiled_port_against_a_paddle_reference_answers_as_the_eager_port_does():
    pytest.importorskip("paddle")
    assert bisect(EXAMPLES / "paddle_vs_torch.py")["verdict"] == "noise"  # the eager port; compiled: above
    result = bisect(PADDLE_REFERENCE, COMPILE_BUG="gelu_decomposition")
    assert result["verdict"] == "divergent"
    compiled = result["culprit"]["compiled"]
    assert compiled["module"] == "layers.0.ffn" and compiled["op"] == "nn.functional.gelu"
    assert line_text(compiled["source"]) == "h = F.gelu(h)"
    assert (
        compiled["step"] == "aot_eager_decomp_partition, decomposition"
        and compiled["step_detail"] == "applied to aten.gelu.default"
    )
    assert compiled["confirmed"] and len(compiled["eager_modules"]) == 4
    assert len(compiled["eager_ops"]) == 1  # the paddle reference's gelu in layers.0.ffn


def test_the_example_names_the_branch_only_compiled_code_takes(tmp_path):
    example = EXAMPLES / "compiled_model.py"
    result = bisect(example, "--repro", str(tmp_path), "--report", str(tmp_path / "report"))
    assert result["verdict"] == "divergent" and 0.03 < result["output_error"]["max_rel"] < 0.1
    compiled = result["culprit"]["compiled"]
    assert compiled["module"] == "blocks.0.attention" and compiled["op"] == "Tensor.mul" and compiled["other_path"]
    assert compiled["source"] == f"{example}:{line_of(example, '# @compiled_branch')}"
    assert compiled["step"] == "eager" and compiled["step_detail"].startswith("dynamo's graph capture")
    assert compiled["confirmed"] and compiled["eager_modules"] == [f"blocks.{n}.attention" for n in range(4)]
    # a repro script replays one op against one: the compiled call stands for the 132 ops of the reference
    assert result["repro_skipped"].endswith("compared as a block (1 candidate op(s) against 132 reference ops)")
    written = (tmp_path / "report.md").read_text()  # the write-up says the same, the compiled line in context
    assert "### Culprit: the compiled code of the model, the first semantic difference" in written
    assert "- op Tensor.mul: on a line the eager code never runs: the compiled code takes another path" in written
    assert ">   46                      q = q * self.head_dim ** -0.5  # @compiled_branch" in written
    assert bisect(example, "--candidate", "candidate_fixed")["verdict"] == "noise"


MLP_STACK = """
import torch

def _model():
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)) for _ in range(3)]
    return torch.nn.Sequential(*blocks).eval(), (torch.randn(4, 16),)

def reference():
    return _model()

def candidate():
    model, inputs = _model()
    COMPILE
    return model, inputs
"""


@pytest.mark.parametrize("compile_block", ["model[1] = torch.compile(model[1])", "model[1].compile()"])
def test_a_compiled_submodule_is_one_op_among_the_eager_ones(tmp_path, compile_block):
    model = tmp_path / "compiled_block.py"
    model.write_text(MLP_STACK.replace("COMPILE", compile_block))
    result = bisect(model)
    assert result["verdict"] in ("noise", "match") and (result["fp64_check"] or {}).get("status") in ("agree", None)
    assert result["ops"]["candidate"] == 7 and result["ops"]["aligned"] == 7  # 3 + 1 + 3: block 1 is one compiled op


def test_a_backend_without_float64_leaves_the_float64_check_unable_to_tell_and_no_verdict_of_noise():
    """A backend with no float64 kernels: the candidate's float64 run keeps the compiled call at float32, so
    its float64 outputs are its own, bit for bit, and show none of its rounding. The check once said
    `agree` or `disagree` from that by the last digit (a correct compiled GPT-2 whose float64 compile failed
    was `divergent` as "something computes differently"); it is skipped, naming the call. The one op makes
    the outputs from exact inputs, so no op's rounding explains them either: `divergent (unconfirmed)`,
    bracketed, saying that the float64 check did not run, never `noise` on what was not seen."""
    result = bisect(LLAMA, "--candidate", "candidate_without_float64")
    check = result["fp64_check"]
    assert check["status"] == "skipped" and check["candidate_rounding"] == 0.0
    assert check["reason"].startswith("the candidate's float64 run kept every op at its recorded dtypes")
    [narrow] = check["narrow_ops"]["candidate"]
    assert narrow.startswith("compiled (run at its recorded dtypes: in float64 it raised BackendCompilerFailed")
    assert result["verdict"] == "divergent" and result["culprit"] is None and result["output_error"]["max_rel"] < 1e-6
    assert result["bracket"]["why"].startswith(
        "rounding does not explain the outputs' error: the float64 check did not run"
    )
