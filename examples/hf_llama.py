"""A tiny Hugging Face Llama (torch) against PaddleFormers' Llama (paddle), one checkpoint for both.

Reference: `transformers.LlamaForCausalLM`; candidate: `paddleformers.transformers.LlamaForCausalLM`
(4 layers, hidden 64, 4 query / 2 key-value heads, untied head). Both load the same random
Hugging Face checkpoint (`_llama_checkpoint.py`) with `bisectr.weights`: the reference as stored,
the candidate with `torch_to_paddle`, which transposes every `nn.Linear` weight by layer type and
keeps PaddleFormers' `LMHead` as stored. `candidate_untransposed()` forgets the transpose of the
square (64, 64) `model.layers.1.self_attn.q_proj.weight`, as a shape-driven converter would.
PaddleFormers' fused RMSNorm kernel is not built for CPU, so the candidate sets `fuse_rms_norm=False`.

Run it with each side in its own process:

    bisectr bisect examples/hf_llama.py --isolate --reference-python HF_VENV/bin/python

Why: installing `paddleformers` installs `paddlecodec`, which puts a module named `torchcodec`
(without `torchcodec`'s package metadata) into site-packages; `transformers` then fails to import
any torch model in that environment (`Could not import module 'LlamaForCausalLM'`), in every process.
And importing `paddleformers` first switches `transformers`' torch support off for the rest of the
process. So the reference needs an interpreter whose environment has torch, transformers and
bisectr but not paddlecodec (HF_VENV: `python -m venv HF_VENV && HF_VENV/bin/pip install torch
transformers -e .` in this checkout); the candidate runs in the current one (paddlepaddle,
paddleformers, bisectr). Where one environment imports both, `--isolate` alone is enough.

Measured here (torch 2.13, transformers 5.3.0, paddlepaddle 3.3.1, paddleformers 1.2.0, CPU):
logits (magnitude 7.5) differ by 7e-05 (relative 9.2e-06); with `candidate_untransposed()`, by 8.4
(relative 1.1). The isolated search gives the same JSON, number for number, as an in-process one
run where transformers is made importable.

bisectr should conclude: `noise` for `candidate()`; `divergent` for `candidate_untransposed()`, with
the culprit the `linear` of `model.layers.1.self_attn.q_proj` (the leaf
`model.layers.1.self_attn.q_proj.weight` it reads). `candidate_gelu_layer()` is the correct port with
layer 2's MLP activation GELU instead of SiLU: `divergent` at that layer's MLP.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import token_ids  # noqa: E402
from _llama_checkpoint import llama_checkpoint  # noqa: E402

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)
FORGOTTEN = "model.layers.1.self_attn.q_proj.weight"


def input_ids():
    return token_ids(CONFIG["vocab_size"], batch=2, length=16)


def reference():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from bisectr.weights import copy_weights

    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    copy_weights(llama_checkpoint(CONFIG), model).check()
    return model, {"input_ids": torch.from_numpy(input_ids()), "use_cache": False}


def candidate(forgotten: str | None = None):
    import paddle
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    from bisectr.weights import torch_to_paddle

    model = LlamaForCausalLM(LlamaConfig(**CONFIG, fuse_rms_norm=False))
    overrides = {forgotten: False} if forgotten else {}
    torch_to_paddle(llama_checkpoint(CONFIG), model, transpose_overrides=overrides).check()
    model.eval()
    return model, {"input_ids": paddle.to_tensor(input_ids()), "use_cache": False, "return_dict": True}


def candidate_untransposed():
    """The same port with the square q_proj of layer 1 copied without its transpose."""
    return candidate(forgotten=FORGOTTEN)


def candidate_gelu_layer():
    """The correct port with GELU instead of SiLU in layer 2's MLP."""
    import paddle

    model, inputs = candidate()
    model.model.layers[2].mlp.act_fn = paddle.nn.GELU()
    return model, inputs
