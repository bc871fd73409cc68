"""The backward pass on models nobody here wrote: Hugging Face GPT-2, Llama and BERT from small
random configs, and a paddle port of GPT-2, each with one planted backward bug (a gradient cut
inside attention, custom backwards that drop a term), gradient checkpointing, and a forward bug in
front of a backward one."""

import json
import subprocess
import sys

from conftest import MODELS, line_of
from test_backward import bisect_json

GPT2_DETACHED = MODELS / "hf_gpt2_detached.py"
LLAMA_FUNCTION = MODELS / "hf_llama_function.py"
GPT2_PADDLE = MODELS / "hf_gpt2_paddle.py"
BERT_CHECKPOINTING = MODELS / "hf_bert_checkpointing.py"


def assert_confirmed_tenfold(backward: dict) -> None:
    confirmation = backward["confirmation"]
    assert confirmation["confirmed"] and confirmation["output_error"] <= confirmation["before"] / 10


def test_hf_gpt2_with_attention_probabilities_detached_in_layer_2_is_cut_there_and_confirmed():
    status, result = bisect_json(GPT2_DETACHED, "--candidate", "candidate_detached")
    backward = result["backward"]
    assert status == 1 and result["verdict"] == "match"  # the forward is bit-equal
    assert backward["verdict"] == "divergent" and backward["activations"] == "own"
    culprit = backward["culprit"]["candidate"]
    assert culprit["op"] == "Tensor.detach" and culprit["module"] == "h.2.attn"
    assert culprit["source"] == f"{GPT2_DETACHED}:{line_of(GPT2_DETACHED, 'probs = probs.detach()  # @detached')}"
    assert "Tensor.detach cuts the candidate's gradient" in backward["missing_gradient"]
    assert backward["confirmation"]["cut"]
    assert_confirmed_tenfold(backward)


def test_hf_gpt2_with_a_correct_registered_attention_function_is_backward_match():
    status, result = bisect_json(GPT2_DETACHED)
    assert status == 0 and result["verdict"] == "match" and result["backward"]["verdict"] in ("match", "noise")


def test_hf_llama_whose_rmsnorm_function_drops_a_term_of_its_backward_is_confirmed_at_that_norm():
    status, result = bisect_json(LLAMA_FUNCTION, "--candidate", "candidate_dropped_term")
    backward = result["backward"]
    assert status == 1 and result["verdict"] == "match"
    assert backward["verdict"] == "divergent" and 1e-3 < backward["output_error"]["max_rel"] < 1
    culprit = backward["culprit"]
    assert culprit["candidate"]["module"] == "model.layers.1.post_attention_layernorm"
    assert culprit["candidate"]["op"].endswith("RMSNormFunction.apply")
    assert culprit["reference"]["module"] == "model.layers.1.post_attention_layernorm"
    assert "rsqrt" in culprit["op"]  # the function stands for the reference's block of RMSNorm ops
    assert culprit["verdict"] == "different" and culprit["fp64"]["reference_error"] < 1e-5 < culprit["local_error"]
    assert_confirmed_tenfold(backward)


def test_hf_llama_with_a_correct_rmsnorm_function_is_backward_noise():
    status, result = bisect_json(LLAMA_FUNCTION)
    assert status == 0 and result["verdict"] == "match"
    assert result["backward"]["verdict"] == "noise" and result["backward"]["fp64_check"]["status"] == "agree"


def test_hf_bert_with_gradient_checkpointing_is_backward_match_or_noise():
    status, result = bisect_json(BERT_CHECKPOINTING)
    assert status == 0 and result["verdict"] == "match"
    assert result["backward"]["verdict"] in ("match", "noise")


def test_hf_bert_with_a_reentrant_checkpoint_is_followed_or_refused_saying_why():
    """transformers up to 5.23 checkpoints with gradients off too (the recording then holds the
    checkpoint function); from 5.24 only with gradients on, so the backward's forward takes
    another path than the recorded one: exit 2, naming the checkpoint and what to pass instead."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "bisect",
            str(BERT_CHECKPOINTING),
            "--candidate",
            "candidate_reentrant",
            "--backward",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode == 2:
        assert "calls CheckpointFunction.apply where the recording called" in done.stderr
        assert "use_reentrant=False" in done.stderr and "Traceback" not in done.stderr
    else:
        result = json.loads(done.stdout)
        assert (
            done.returncode == 0
            and result["verdict"] == "match"
            and result["backward"]["verdict"] in ("match", "noise")
        )


def test_a_paddle_gpt2_port_is_backward_noise():
    status, result = bisect_json(GPT2_PADDLE)
    assert status == 0 and result["verdict"] == "noise"
    assert result["backward"]["verdict"] == "noise" and result["backward"]["fp64_check"]["status"] == "agree"


def test_a_paddle_gpt2_port_whose_ln_2_pylayer_drops_the_variance_term_is_confirmed_at_h_2_ln_2():
    status, result = bisect_json(GPT2_PADDLE, "--candidate", "candidate_pylayer_ln_2")
    backward = result["backward"]
    assert status == 1 and result["verdict"] == "noise"
    assert backward["verdict"] == "divergent"
    culprit = backward["culprit"]
    assert culprit["candidate"]["module"] == "transformer.h.2.ln_2" and culprit["candidate"]["op"].endswith(
        "LayerNormFunction.apply"
    )
    assert culprit["reference"]["module"] == "transformer.h.2.ln_2"
    assert_confirmed_tenfold(backward)


def test_a_forward_bug_and_a_backward_bug_are_each_named_the_backward_on_the_references_activations():
    status, result = bisect_json(GPT2_PADDLE, "--candidate", "candidate_bias_and_pylayer")
    assert status == 1 and result["verdict"] == "divergent"
    assert result["culprit"]["kind"] == "leaf" and result["culprit"]["leaf"] == "transformer.h.0.mlp.c_proj.bias"
    backward = result["backward"]
    assert backward["activations"] == "reference" and backward["verdict"] == "divergent"
    assert backward["culprit"]["candidate"]["module"] == "transformer.h.2.ln_2"
    assert_confirmed_tenfold(backward)
