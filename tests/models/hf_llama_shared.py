"""A tiny Hugging Face Llama against a copy of itself whose every layer shares one planted bug.

Reference: `transformers.LlamaForCausalLM` from a random seeded config (4 layers, hidden 64, 4 query /
2 key-value heads, head_dim 16, intermediate 128, vocab 128, eager attention, initializer_range
INIT_RANGE), `torch.manual_seed(0)`, eval, input_ids (2, 12) from `default_rng(0)`,
`use_cache=False`. Every candidate is a `copy.deepcopy` of the reference (same weights); the buggy
classes are subclasses defined here and swapped in per instance (`module.__class__ = ...`) on ALL
layers of the copy only, so the reference's transformers classes stay untouched in this process.

- `candidate()`: the identical copy.
- `candidate_mlp_act()`: every layer's MLP (`model.layers.N.mlp`, first at `model.layers.0.mlp`)
  is `GeluLlamaMLP`, whose forward applies exact GELU to `gate_proj`'s output where the reference
  applies SiLU through `model.layers.N.mlp.act_fn` (the line tagged `act`).
- `candidate_attention_scale()`: every layer's attention (`model.layers.N.self_attn`, first at
  `model.layers.0.self_attn`) is `HiddenScaleLlamaAttention`, whose forward (HF's eager attention,
  written out) scales the scores by `hidden_size ** -0.5` (1/8) instead of `head_dim ** -0.5` (1/4)
  (the line tagged `scale`).

Measured here (CPU, float32; relative = max abs difference / max abs of the reference), logits of
magnitude 0.58:

- `candidate()`: logits bit-identical (0).
- `candidate_mlp_act()`: logits differ by 9.4e-03 (1.6e-02 relative). Layer 0 alone (same inputs):
  `model.layers.0.mlp`'s output by 8.3e-04 (9.0e-02 relative), `model.layers.0`'s by 8.3e-04
  (8.9e-03 relative); the activation itself (bisectr's op 100) is 0.20 relative off.
- `candidate_attention_scale()`: logits differ by 3.9e-03 (6.7e-03 relative). Layer 0:
  `model.layers.0.self_attn`'s output by 5.1e-04 (5.9e-03 relative), `model.layers.0`'s by 5.1e-04
  (5.5e-03 relative); the scaled scores (bisectr's op 79, `Tensor.mul`) are 0.5 relative off.

bisectr should conclude: `match` (or `noise`) for `candidate()`; `divergent` for the other two,
culprit in layer 0 (`model.layers.0.mlp`'s `gelu` against `model.layers.0.mlp.act_fn`'s `silu`;
`model.layers.0.self_attn`'s score scaling `mul`), the same bug recurring in layers 1-3.
"""
import copy
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402


INIT_RANGE = 0.02
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=INIT_RANGE,
              attn_implementation="eager")


def _inputs():
    import torch

    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 12))
    return {"input_ids": torch.from_numpy(ids), "use_cache": False}


def _llama():
    hide_broken_torchcodec()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()


def reference():
    return _llama(), _inputs()


def candidate():
    return copy.deepcopy(_llama()), _inputs()


def _gelu_mlp_class():
    import torch
    from transformers.models.llama.modeling_llama import LlamaMLP

    class GeluLlamaMLP(LlamaMLP):
        """LlamaMLP whose gate activation is GELU instead of the config's SiLU."""

        def forward(self, x):
            return self.down_proj(torch.nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))  # @act

    return GeluLlamaMLP


def _hidden_scale_attention_class():
    import torch
    from transformers.models.llama.modeling_llama import LlamaAttention, apply_rotary_pos_emb, repeat_kv

    class HiddenScaleLlamaAttention(LlamaAttention):
        """LlamaAttention (eager, no cache) scaling the scores by hidden_size ** -0.5."""

        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                    **kwargs):
            input_shape = hidden_states.shape[:-1]
            hidden_shape = (*input_shape, -1, self.head_dim)

            query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

            cos, sin = position_embeddings
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

            key_states = repeat_kv(key_states, self.num_key_value_groups)
            value_states = repeat_kv(value_states, self.num_key_value_groups)
            scores = torch.matmul(query_states, key_states.transpose(2, 3)) * self.config.hidden_size ** -0.5  # @scale
            if attention_mask is not None:
                scores = scores + attention_mask
            attn_weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query_states.dtype)
            attn_weights = torch.nn.functional.dropout(attn_weights, p=0.0, training=self.training)
            attn_output = torch.matmul(attn_weights, value_states)
            attn_output = attn_output.transpose(1, 2).contiguous()

            attn_output = attn_output.reshape(*input_shape, -1).contiguous()
            attn_output = self.o_proj(attn_output)
            return attn_output, attn_weights

    return HiddenScaleLlamaAttention


def candidate_mlp_act():
    """Same weights; every layer's MLP gates with GELU instead of SiLU."""
    model, inputs = candidate()
    mlp_class = _gelu_mlp_class()
    for layer in model.model.layers:
        layer.mlp.__class__ = mlp_class
    return model, inputs


def candidate_attention_scale():
    """Same weights; every layer's attention scales scores by hidden_size ** -0.5, not head_dim ** -0.5."""
    model, inputs = candidate()
    attention_class = _hidden_scale_attention_class()
    for layer in model.model.layers:
        layer.self_attn.__class__ = attention_class
    return model, inputs
