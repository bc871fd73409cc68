"""Greedy generation with Hugging Face's own cache: a tiny `transformers.LlamaForCausalLM` against copies of it
whose attention or rotary carries a mistake that only decoding shows.

Both sides: `LlamaForCausalLM` from a random seeded config (3 layers, hidden 64, 4 query / 2 key-value heads,
vocab 128, eager attention, initializer_range 0.2 so that tokens part quickly), `torch.manual_seed(0)`, eval.
Prompt: input_ids (2, 8) from `default_rng(0)`, row 1 left-padded by 3 positions (attention_mask 0). bisectr
drives the decoding (`DynamicCache`, position ids from the mask); each candidate swaps one class:

- `candidate()`: the same model.
- `candidate_cache_before_rope()`: every layer's attention writes k to the cache before the rotary and rotates
  only the new positions of what the cache returns (the line tagged `rotate`): the prefill's logits are right,
  the cache it writes holds un-rotated keys, every decode step attends to them.
- `candidate_rope_offset()`: the rotary embedding rotates every decode step's token at position 0 (the line
  tagged `offset`): the prefill is right.
- `candidate_decode_mask()`: at decode steps each layer's attention masks out the last key, the new token's
  own (the line tagged `mask`).

Measured here (CPU, float32): the correct copy matches bit for bit at every step; each mistake leaves step 0's
logits exact and makes the next step's differ by 0.25-1.3 (relative).

bisectr should conclude: `match` for `candidate()`; `divergent` for the others: the cache write at step 0 (the
prefill writes the un-rotated keys; the logits first differ at step 1), bracketed at layer 0's cache update
(`cache_utils.py`); the rotary embedding (`model.rotary_emb`) at step 1, bracketed at the position ids it
reads (integers, which no search patches); the tagged mask line at step 1, confirmed, recurring in every layer.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402

CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.2,
    attn_implementation="eager",
)


def _llama():
    hide_broken_torchcodec()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    ids = np.random.default_rng(0).integers(1, 128, size=(2, 8))
    mask = np.ones((2, 8), np.int64)
    mask[1, :3] = 0
    return model, {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def reference():
    return _llama()


def candidate():
    return _llama()


def candidate_cache_before_rope():
    import torch
    from transformers.models.llama import modeling_llama

    class CacheBeforeRopeAttention(modeling_llama.LlamaAttention):
        def forward(
            self,
            hidden_states,
            position_embeddings=None,
            attention_mask=None,
            cache=None,
            past_key_values=None,
            **kwargs,
        ):
            past_key_values = cache if cache is not None else past_key_values
            shape = (*hidden_states.shape[:-1], -1, self.head_dim)
            q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
            k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
            v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
            k, v = past_key_values.update(k, v, self.layer_idx)
            new = q.shape[-2]
            q, k_new = modeling_llama.apply_rotary_pos_emb(q, k[:, :, -new:], *position_embeddings)
            k = torch.cat([k[:, :, :-new], k_new], dim=-2)  # @rotate
            out, weights = modeling_llama.eager_attention_forward(
                self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling
            )
            return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights

    model, inputs = _llama()
    for layer in model.model.layers:
        layer.self_attn.__class__ = CacheBeforeRopeAttention
    return model, inputs


def candidate_rope_offset():
    import torch
    from transformers.models.llama import modeling_llama

    class OffsetRotary(modeling_llama.LlamaRotaryEmbedding):
        def forward(self, x, position_ids):
            if position_ids.shape[-1] == 1:
                position_ids = torch.zeros_like(position_ids)  # @offset
            return super().forward(x, position_ids)

    model, inputs = _llama()
    model.model.rotary_emb.__class__ = OffsetRotary
    return model, inputs


def candidate_decode_mask():
    import torch
    from transformers.models.llama import modeling_llama

    class DecodeMaskAttention(modeling_llama.LlamaAttention):
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
            if hidden_states.shape[1] == 1 and attention_mask is not None:
                attention_mask = attention_mask.clone()
                attention_mask[..., -1] = torch.finfo(attention_mask.dtype).min  # @mask
            return super().forward(hidden_states, position_embeddings, attention_mask, **kwargs)

    model, inputs = _llama()
    for layer in model.model.layers:
        layer.self_attn.__class__ = DecodeMaskAttention
    return model, inputs
