"""Greedy decoding with a KV cache inside `forward`: a tiny Hugging Face Llama against ports of its decode loop.

Reference: `transformers.LlamaForCausalLM` from a random seeded config (4 layers, hidden 64, 4 query /
2 key-value heads, vocab 128, eager attention, initializer_range 0.2 so that tokens part quickly),
`torch.manual_seed(0)`, eval, wrapped in `GreedyDecoding`: a prefill of the prompt (input_ids (2, 8) from
`default_rng(0)`) into a `DynamicCache`, then `STEPS` greedy decode steps, each feeding the last argmax
token with explicit position ids and a 2-D attention mask. Its output is the last position's logits of
every step, (2, STEPS + 1, 128). Every candidate holds the same weights; its decode loop (or its
attention, on all layers of the copy only) carries one mistake porters make:

- `candidate()`: the same loop.
- `candidate_cache_before_rope()`: every layer's attention is `CacheBeforeRopeAttention`, which writes k
  to the cache before the rotary and rotates only the new positions of what the cache returns (the line
  tagged `rotate`): the prefill is right, every decode step attends to un-rotated past keys.
- `candidate_rope_offset()`: the decode steps' position ids restart at 0 (`position_ids` of the line
  tagged `offset`): the rotary offset never advances.
- `candidate_decode_mask()`: the decode steps' attention mask is extended with a 0 for the new token
  (the line tagged `mask`): each new token is kept from attending to itself.

Measured here (CPU, float32), logits of magnitude about 6: the correct loop is bit-identical; each mistake
leaves step 0 (the prefill) exact and makes the later steps' logits differ by 1-8; the tokens part from
step 2 on.

bisectr should conclude: `match` for `candidate()`; `divergent`, confirmed, for the others: the cache write
(`model.layers.0.self_attn`, transformers' `cache_utils` line, with the tagged line's `cat`) at the first
decode step, recurring at every layer and step; the rotary embedding (`model.rotary_emb`) at the first
decode step; the masking of the first decode step.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, attn_implementation="eager")
STEPS = 6


def _classes():
    hide_broken_torchcodec()
    import torch
    from transformers import DynamicCache
    from transformers.models.llama import modeling_llama

    class GreedyDecoding(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            cache = DynamicCache(config=self.lm.config)
            batch, length = input_ids.shape
            mask = torch.ones(batch, length, dtype=torch.long)
            out = self.lm(input_ids, attention_mask=mask, position_ids=torch.arange(length)[None], past_key_values=cache)
            logits = [out.logits[:, -1]]
            for step in range(STEPS):
                token = logits[-1].argmax(-1, keepdim=True)
                mask = self.extended(mask)
                out = self.lm(token, attention_mask=mask, position_ids=self.positions(length + step), past_key_values=cache)
                logits.append(out.logits[:, -1])
            return torch.stack(logits, 1)

        def positions(self, first: int):
            return torch.tensor([[first]])

        def extended(self, mask):
            return torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)

    class RopeOffsetDecoding(GreedyDecoding):
        def positions(self, first: int):
            return torch.arange(1)[None]  # @offset

    class DecodeMaskDecoding(GreedyDecoding):
        def extended(self, mask):
            return torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)  # @mask

    class CacheBeforeRopeAttention(modeling_llama.LlamaAttention):
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                    past_key_values=None, **kwargs):
            cache = cache if cache is not None else past_key_values
            shape = (*hidden_states.shape[:-1], -1, self.head_dim)
            q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
            k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
            v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
            k, v = cache.update(k, v, self.layer_idx)
            new = q.shape[-2]
            q, k_new = modeling_llama.apply_rotary_pos_emb(q, k[:, :, -new:], *position_embeddings)
            k = torch.cat([k[:, :, :-new], k_new], dim=-2)  # @rotate
            out, weights = modeling_llama.eager_attention_forward(self, q, k, v, attention_mask, dropout=0.0,
                                                                  scaling=self.scaling)
            return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights

    return GreedyDecoding, RopeOffsetDecoding, DecodeMaskDecoding, CacheBeforeRopeAttention


def _decoding(kind: int):
    hide_broken_torchcodec()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 8))
    return _classes()[kind](lm), {"input_ids": torch.from_numpy(ids)}


def reference():
    return _decoding(0)


def candidate():
    return _decoding(0)


def candidate_cache_before_rope():
    model, inputs = _decoding(0)
    attention = _classes()[3]
    for layer in model.lm.model.layers:
        layer.self_attn.__class__ = attention
    return model, inputs


def candidate_rope_offset():
    return _decoding(1)


def candidate_decode_mask():
    return _decoding(2)
