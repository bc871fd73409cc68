"""A tiny Hugging Face Llama against a second instance of itself, torch on both sides.

Reference: `transformers.LlamaForCausalLM` from a random seeded config (4 layers, hidden 64, 4 query /
2 key-value heads, intermediate 176, vocab 128, eager attention), eval, input_ids (2, 16),
`use_cache=False`. Candidate: another instance with the reference's state dict loaded.
`candidate_gelu_layer()` replaces the MLP activation of layer 2 (`model.layers.2.mlp.act_fn`) by
`torch.nn.GELU()` (line marked `# @gelu`), so that layer calls `gelu` where the reference calls `silu`.

Measured here: `candidate()` gives bit-identical logits; `candidate_gelu_layer()` differs by 7.1e-03
at magnitude 0.73 (9.7e-03 relative).

bisectr should conclude: `match` for `candidate()`; `divergent` for `candidate_gelu_layer()`, culprit
the activation of `model.layers.2.mlp.act_fn` (`gelu` against `silu`).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402


CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")


def _inputs():
    import torch

    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 16))
    return {"input_ids": torch.from_numpy(ids), "use_cache": False}


def _llama(seed=0):
    hide_broken_torchcodec()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()


def reference():
    return _llama(), _inputs()


def candidate():
    model = _llama(seed=1)
    model.load_state_dict(_llama().state_dict())
    return model, _inputs()


def candidate_gelu_layer():
    """Identical weights, but layer 2's MLP applies GELU instead of SiLU."""
    import torch

    model, inputs = candidate()
    model.model.layers[2].mlp.act_fn = torch.nn.GELU()  # @gelu
    return model, inputs
