"""Hugging Face Llama vs PaddleFormers' Llama (`examples/hf_llama.py`), and the state-dict weight copies it uses."""

import json
import math
import subprocess
import sys

import numpy as np
import paddle
import pytest
import torch

from bisectr.weights import paddle_to_torch, torch_to_paddle
from conftest import EXAMPLES, assert_verdict_contract, needs_paddleformers

# ---------------------------------------------------------------- state dicts (no model library needed)


def test_torch_state_dict_into_paddle_transposes_by_the_destinations_layer_type():
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Embedding(4, 4))
    state = {name: value.numpy() for name, value in source.state_dict().items()}
    target = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.LayerNorm(4), paddle.nn.Embedding(4, 4))
    report = torch_to_paddle(state, target).check()
    assert report.transposed == ["0.weight"] and len(report.copied) == 5
    np.testing.assert_array_equal(target[0].weight.numpy(), state["0.weight"].T)
    np.testing.assert_array_equal(target[2].weight.numpy(), state["2.weight"])


def test_paddle_state_dict_into_torch():
    paddle.seed(0)
    source = paddle.nn.Sequential(paddle.nn.Linear(3, 3), paddle.nn.Linear(3, 2))
    target = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    report = paddle_to_torch(source.state_dict(), target).check()
    assert sorted(report.transposed) == ["0.weight", "1.weight"]
    np.testing.assert_array_equal(target[1].weight.detach().numpy(), source[1].weight.numpy().T)


def test_a_state_dict_is_not_expected_to_hold_non_persistent_buffers():
    target = paddle.nn.Layer()
    target.proj = paddle.nn.Linear(2, 2)
    target.register_buffer("inv_freq", paddle.ones([2]), persistable=False)
    target.register_buffer("table", paddle.zeros([2]))
    report = torch_to_paddle({"proj.weight": np.eye(2, dtype=np.float32), "proj.bias": np.zeros(2, np.float32)}, target)
    assert report.extra == ["table"]  # persistent: a checkpoint should have held it
    module = torch.nn.Module()
    module.register_buffer("inv_freq", torch.ones(2), persistent=False)
    assert paddle_to_torch({}, module).ok


def test_a_state_dict_is_no_destination():
    with pytest.raises(TypeError, match="expected a paddle.nn.Layer"):
        torch_to_paddle(torch.nn.Linear(2, 2), {})


# ---------------------------------------------------------------- the example (needs transformers and paddleformers)


def bisect_hf_llama(hf_python: str, candidate: str, *options: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "bisect",
            str(EXAMPLES / "hf_llama.py"),
            "--json",
            "--candidate",
            candidate,
            "--isolate",
            "--reference-python",
            hf_python,
            *options,
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    result = json.loads(done.stdout)
    assert_verdict_contract(result)
    return result


@needs_paddleformers
def test_the_right_weights_are_noise(hf_python):
    result = bisect_hf_llama(hf_python, "candidate")
    assert result["verdict"] == "noise" and result["fp64_check"]["status"] == "agree"
    assert result["output_error"]["max_rel"] < 1e-4
    # Both libraries compute the RMSNorm variance, the softmax and the rotary table in float32: in the
    # float64 check those casts stay float64. Left below it: PaddleFormers' attention mask, which
    # `paddle.where` builds in float32 from Python numbers (0 and the most negative value: nothing to round).
    check = result["fp64_check"]
    assert check["float64_error"] < 1e-10
    assert check["narrow_ops"] == {
        "candidate": ["_C_ops.expand in model (x2)", "_C_ops.where in model"]
        + [f"Tensor.__getitem__ in model.layers.{layer}.self_attn" for layer in range(4)]
    }
    assert result["ops"]["aligned"] >= 0.9 * result["ops"]["candidate"]


@needs_paddleformers
def test_the_untransposed_square_q_proj_is_divergent_at_that_projection(hf_python):
    result = bisect_hf_llama(hf_python, "candidate_untransposed")
    culprit = result["culprit"]
    assert result["verdict"] == "divergent" and result["output_error"]["max_rel"] > 0.1
    assert culprit["kind"] == "leaf" and culprit["leaf"] == "model.layers.1.self_attn.q_proj.weight"
    assert culprit["op"] == "linear"
    assert culprit["candidate"]["module"] == culprit["reference"]["module"] == "model.layers.1.self_attn.q_proj"
    assert result["recurrences"] == []  # later layers only carry the difference, they add none


@needs_paddleformers
def test_one_layer_on_gelu_is_divergent_at_that_activation_confirmed(hf_python):
    result = bisect_hf_llama(hf_python, "candidate_gelu_layer")
    culprit, confirmation = result["culprit"], result["confirmation"]
    assert result["verdict"] == "divergent" and result["output_error"]["max_rel"] > 0.01
    assert culprit["candidate"]["op"] == "_C_ops.gelu" and culprit["reference"]["op"] == "nn.functional.silu"
    assert culprit["candidate"]["module"] == culprit["reference"]["module"] == "model.layers.2.mlp.act_fn"
    assert confirmation["confirmed"] and confirmation["output_error"] < confirmation["before"] / 10


@needs_paddleformers
def test_the_right_weights_are_backward_noise_with_the_gradient_profile(hf_python):
    result = bisect_hf_llama(hf_python, "candidate", "--backward")
    backward = result["backward"]
    assert backward["verdict"] == "noise" and backward["fp64_check"]["status"] == "agree"
    assert backward["output_error"]["max_rel"] < 1e-3
    assert len(backward["profile"]) >= 0.9 * len(result["profile"])  # the paired ops (N:M blocks are left out)
    assert backward["reruns"] <= math.ceil(math.log2(backward["ops"]["candidate"])) + 3
