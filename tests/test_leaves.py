"""Parameters and buffers on pairs built from public libraries: paired across layouts (transposes,
slices of a fused parameter, tied and frozen weights), compared before any op is blamed, described
when they differ, and rounding when they are the reference's rounded to a lower dtype."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXAMPLES, needs_paddleformers
from test_recurring import bisect
from bisectr.measure.leaves import compare, rounded_to


def statuses(result: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pair in result["leaves"]["pairs"]:
        counts[pair["status"]] = counts.get(pair["status"], 0) + 1
    return counts


def assert_leaf_culprit(result: dict, leaf: str, description: str) -> None:
    culprit = result["culprit"]
    assert result["verdict"] == "divergent" and culprit["kind"] == "leaf"
    assert culprit["leaf"] == leaf and culprit["description"].startswith(description)
    assert (
        result["confirmation"]["confirmed"]
        and result["confirmation"]["output_error"] < result["confirmation"]["before"] / 2
    )


def test_a_llama_cast_whole_to_bfloat16_is_rounding_with_its_weights_only_rounded():
    result = bisect("hf_llama_weights.py", "candidate_bf16")
    check = result["fp64_check"]
    assert result["verdict"] == "noise" and 1e-3 < result["output_error"]["max_rel"] < 5e-2
    assert statuses(result) == {"rounded": 40}
    never_read = {
        "side": "candidate",
        "name": "buffer:model.rotary_emb.original_inv_freq",
        "reason": "no op of the forward reads it",
    }
    assert result["leaves"]["unpaired"] == [never_read, {**never_read, "side": "reference"}]
    assert "2 never read" in result["leaves"]["summary"] and "unpaired" not in result["leaves"]["summary"]
    assert "rounded to bfloat16" in result["leaves"]["summary"]
    # Both sides ran with the reference's weights and no cast left float64: they agree to float64 rounding.
    assert check["status"] == "agree" and check["float64_error"] < 1e-12 and not check["narrow_ops"]
    assert "rounded to bfloat16 (40 leaves" in check["rounded_leaves"]


def test_a_norm_weight_scaled_after_the_bfloat16_cast_is_that_leaf():
    result = bisect("hf_llama_weights.py", "candidate_bf16_norm_scaled")
    assert_leaf_culprit(result, "model.layers.1.post_attention_layernorm.weight", "scaled by 1.1")
    assert result["culprit"]["candidate"]["module"] == "model.layers.1.post_attention_layernorm"
    assert statuses(result) == {"rounded": 39, "different": 1}


def test_a_rotary_table_of_another_theta_is_that_buffer():
    result = bisect("hf_llama_weights.py", "candidate_rope_theta")
    assert_leaf_culprit(result, "model.rotary_emb.inv_freq", "a rotary table of another base: theta 5e+05")
    assert result["confirmation"]["output_error"] == 0


def test_resnet_whose_converter_left_every_batch_norm_statistic_at_defaults_is_all_20_layers_statistics():
    result = bisect("paddle_resnet.py", "candidate_bn_stats_default")
    assert_leaf_culprit(result, "bn1.running_mean", "all zeros")
    assert result["culprit"]["reference_leaf"] == "bn1._mean"
    listed = [r["module"] for r in result["recurrences"]]
    assert len(listed) == 20 and listed[0] == "bn1" and len(set(listed)) == 20
    assert result["confirmation"]["leaves"] == 40  # every mean and variance, given back together
    different = {
        p["candidate"].rpartition(".")[2]: p["description"]
        for p in result["leaves"]["pairs"]
        if p["status"] == "different"
    }
    assert different == {"running_mean": "all zeros", "running_var": "all ones"}


def test_gpt2_conv1d_fused_qkv_pairs_with_the_split_linear_port_slice_by_slice():
    result = bisect("hf_gpt2.py", "candidate")
    pairs = {p["candidate"]: p for p in result["leaves"]["pairs"]}
    assert result["verdict"] == "noise" and len(pairs) == 52 and not result["leaves"]["unpaired"]
    assert statuses(result) == {"equal": 52}
    assert pairs["param:h.1.attn.k_proj.weight"]["reference"] == "param:h.1.attn.c_attn.weight"
    assert pairs["param:h.1.attn.k_proj.weight"]["layout"] == "slice 64:128 of axis 1 of [64, 192], transposed"
    assert pairs["param:h.1.attn.v_proj.bias"]["layout"] == "slice 128:192 of axis 0 of [192]"


def test_gpt2_whose_converter_skipped_one_square_transpose_is_that_weight_transposed():
    result = bisect("hf_gpt2.py", "candidate_untransposed")
    assert_leaf_culprit(result, "h.2.attn.c_proj.weight", "transposed")
    assert result["culprit"]["layout"] == "transposed"  # as every other layer's c_proj pairs


def test_gpt2_against_a_paddle_linear_port_pairs_all_52_parameters_and_finds_a_frozen_one():
    correct = bisect("hf_gpt2_paddle.py", "candidate", "--backward")
    assert statuses(correct) == {"equal": 52} and not correct["leaves"]["unpaired"]
    assert correct["backward"]["verdict"] == "noise"
    frozen = bisect("hf_gpt2_paddle.py", "candidate_frozen_c_fc", "--backward")
    assert frozen["verdict"] == "noise" and frozen["backward"]["verdict"] == "divergent"
    assert frozen["backward"]["culprit"]["kind"] == "leaf"
    assert frozen["backward"]["culprit"]["leaf"] == "transformer.h.2.mlp.c_fc.weight"
    assert "gets no gradient on the candidate" in frozen["backward"]["missing_gradient"]


def test_constant_leaves_are_not_paired_by_their_values():
    """Every LayerNorm bias starts at zero: equal values say nothing about which leaf is which."""
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(EXAMPLES / "paddle_vs_paddle.py"), "--json"],
        capture_output=True,
        text=True,
    )
    pairs = {p["candidate"]: p["reference"] for p in json.loads(done.stdout)["leaves"]["pairs"]}
    assert pairs["param:layers.0.out_weight"] == "param:layers.0.attn.out_proj.weight"
    assert pairs["param:layers.1.fc2_weight"] == "param:layers.1.ffn.fc2.weight"
    assert not any(name.endswith(("norm1_bias", "norm2_bias", "out_bias")) for name in pairs)


@pytest.mark.parametrize(
    "make, dtype, status, description",
    [
        (lambda w: w.astype(np.float16).astype(np.float32), "float16", "rounded", "the reference's rounded to float16"),
        # a checkpoint saved in a narrower dtype, loaded into float32
        (
            lambda w: w.astype(np.float16).astype(np.float32),
            "float32",
            "rounded",
            "the reference's rounded to float16, held in float32",
        ),
        (
            lambda w: rounded_to(w, "bfloat16"),
            "float32",
            "rounded",
            "the reference's rounded to bfloat16, held in float32",
        ),
        (lambda w: rounded_to(w, "bfloat16") * np.float32(1 + 2**-20), "float32", "different", "values differ"),
        (lambda w: np.zeros_like(w), "float32", "different", "all zeros"),
        (lambda w: np.ones_like(w), "float32", "different", "all ones"),
        (lambda w: w * 1.1, "float32", "different", "scaled by 1.1"),
        (lambda w: w + 1, "float32", "different", "offset by 1 (1 + w)"),
        (lambda w: w.T.copy(), "float32", "different", "transposed"),
        (
            lambda w: np.concatenate([w[4:], w[:4]]),
            "float32",
            "different",
            "blocks permuted along axis 0: the reference's blocks of 4 in order [1, 0]",
        ),
        (lambda w: w + np.eye(8, dtype=np.float32) * 0.5, "float32", "different", "values differ (max rel"),
    ],
)
def test_a_leaf_comparison_says_how_it_differs(make, dtype, status, description):
    weight = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
    found, text, _ = compare(weight, make(weight), dtype, "float32")
    assert found == status and text.startswith(description)


# ------------------------------------------------- PaddleFormers' fused Qwen2 (needs transformers and paddleformers)
def bisect_qwen2(hf_python: str, candidate: str) -> dict:
    return bisect("pf_qwen2.py", candidate, "--isolate", "--reference-python", hf_python)


@needs_paddleformers
def test_paddleformers_fused_qwen2_pairs_q_k_v_inside_qkv_proj_and_is_noise(hf_python):
    result = bisect_qwen2(hf_python, "candidate")
    assert result["verdict"] == "noise" and result["fp64_check"]["float64_error"] < 1e-10
    parts = [p for p in result["leaves"]["pairs"] if p["candidate"] == "param:model.layers.0.self_attn.qkv_proj.bias"]
    assert {p["reference"].rpartition(".")[0].rpartition(".")[2] for p in parts} == {"q_proj", "k_proj", "v_proj"}
    assert statuses(result) == {"equal": len(result["leaves"]["pairs"])}
    assert [(u["side"], u["name"]) for u in result["leaves"]["unpaired"]] == [
        ("reference", "buffer:model.rotary_emb.original_inv_freq")
    ]


@needs_paddleformers
def test_paddleformers_qwen2_whose_k_bias_was_not_copied_is_that_slice_of_the_fused_bias(hf_python):
    result = bisect_qwen2(hf_python, "candidate_k_bias_missing")
    assert_leaf_culprit(result, "model.layers.2.self_attn.qkv_proj.bias", "all zeros")
    assert result["culprit"]["reference_leaf"] == "model.layers.2.self_attn.k_proj.bias"
    assert result["culprit"]["layout"].startswith("rows 32:48, 96:112 of axis 0")


@needs_paddleformers
def test_paddleformers_qwen2_with_q_k_v_concatenated_naively_is_every_fused_qkv_with_its_blocks_permuted(hf_python):
    result = bisect_qwen2(hf_python, "candidate_naive_qkv_order")
    # the grouped layout its split reads
    read = "q_proj 0:32, k_proj 0:16, v_proj 0:16, q_proj 32:64, k_proj 16:32, v_proj 16:32"
    assert_leaf_culprit(
        result,
        "model.layers.0.self_attn.qkv_proj.weight",
        f"blocks permuted along axis 1: holds q_proj 0:64, k_proj 0:32, v_proj 0:32 where its ops read {read}",
    )
    different = {p["candidate"] for p in result["leaves"]["pairs"] if p["status"] == "different"}
    assert different == {
        f"param:model.layers.{n}.self_attn.qkv_proj.{kind}" for n in range(4) for kind in ("weight", "bias")
    }
    assert result["confirmation"]["output_error"] < 1e-3 < 0.5 < result["confirmation"]["before"]
