"""A tiny Hugging Face Llama against copies of itself whose weights or buffers changed.

Reference: `transformers.LlamaForCausalLM` from a random seeded config (4 layers, hidden 64, 4 query /
2 key-value heads, head_dim 16, intermediate 128, vocab 128, eager attention), `torch.manual_seed(0)`,
RMSNorm weights drawn around 1 (1 + 0.1 * N(0, 1)) so that a rounded or scaled one shows, eval,
input_ids (2, 12) from `default_rng(0)`, `use_cache=False`. Every candidate is a `copy.deepcopy`.

- `candidate_bf16()`: the copy cast whole to bfloat16 (`model.to(torch.bfloat16)`): every parameter
  and buffer is the reference's rounded to bfloat16, nothing else changed.
- `candidate_bf16_norm_scaled()`: that cast, then layer 1's `post_attention_layernorm.weight`
  multiplied by 1.1 (the line tagged `scaled`).
- `candidate_rope_theta()`: float32, with the rotary `inv_freq` buffer built for theta 500000 where
  the reference's config says 10000 (the line tagged `theta`).

bisectr should conclude: `noise` for `candidate_bf16()` (the weights only rounded, the float64 check
agreeing); `divergent` for the other two, culprit the leaf `model.layers.1.post_attention_layernorm.weight`
("scaled by 1.1") and the buffer `model.rotary_emb.inv_freq`.
"""
import copy
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402


CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
CANDIDATE_THETA = 500000.0


def _inputs():
    import torch

    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 12))
    return {"input_ids": torch.from_numpy(ids), "use_cache": False}


def _llama():
    hide_broken_torchcodec()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.1 * torch.randn_like(parameter))
    return model


def reference():
    return _llama(), _inputs()


def candidate_bf16():
    import torch

    return copy.deepcopy(_llama()).to(torch.bfloat16), _inputs()


def candidate_bf16_norm_scaled():
    import torch

    model = copy.deepcopy(_llama()).to(torch.bfloat16)
    with torch.no_grad():
        model.model.layers[1].post_attention_layernorm.weight.mul_(1.1)  # scaled
    return model, _inputs()


def candidate_rope_theta():
    import torch

    model = copy.deepcopy(_llama())
    head_dim = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    model.model.rotary_emb.inv_freq.copy_(1.0 / CANDIDATE_THETA ** exponents)  # theta
    return model, _inputs()
