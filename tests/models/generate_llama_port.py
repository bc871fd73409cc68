"""Greedy generation: a tiny Hugging Face Llama against a hand port with its own cache, in another layout.

Reference: `transformers.LlamaForCausalLM` (3 layers, hidden 64, 4 query / 2 key-value heads (GQA), vocab
128, eager attention, initializer_range 0.2), `torch.manual_seed(0)`, eval; Hugging Face's `DynamicCache`
([batch, kv heads, seq, head dim]). Candidate: `PortLlama`, the same model written in plain torch, its weights
converted from the reference's state dict (`convert`), its forward `(input_ids, attention_mask, position_ids,
cache)` returning `(logits, cache)`, the cache a list of (k, v) per layer in [batch, seq, kv heads, head dim]
grown by `torch.cat` (the layout paddle and PaddleFormers keep). Prompt: input_ids (2, 8) from
`default_rng(0)`, row 1 left-padded by 3 positions (attention_mask 0).

- `candidate()`: the correct port.
- `candidate_rotary_offset()`: the decode steps' rotary uses position 0 (line tagged `@offset`).
- `candidate_cache_before_rotary()`: every layer caches k before the rotary; the attention reads the new
  key rotated and the cached ones as they were stored (`@cache_before_rotary`): the prefill's logits are
  right, its cache is not.
- `candidate_decode_mask()`: at decode steps the new token's own key is masked out (`@decode_mask`).
- `candidate_layer1_cache()`: layer 1 alone writes its values into the cache at half their size
  (`@layer1_cache`): the logits of the step that writes them are right, the next step's are not.
- `candidate_bf16_cache()`: the cache keeps k and v in bfloat16 (`@bf16_cache`), cast back as it is read.
- `candidate_prefill_mask()`: the prefill's causal mask lets each token see the next one
  (`@prefill_mask`); the decode steps are right.

Sliding window: `reference_window()` is `transformers.MistralForCausalLM` of the same sizes with
`sliding_window=6`: a query sees the keys at distances 0..5, not 6 (its attention weights, measured), and its
`DynamicCache` keeps the last 5 positions, the step's own key making the 6th. `candidate_window()`: the port
with `window=6`, masking by the same distance and slicing its cache to the same last 5 positions after each
write. `candidate_window_eviction()`: before each step the port drops one more cached position (`@evict`), one
step before the window lets it go: each decode step attends to 5 keys, not 6; the prefill and its cache are
right, and the cache keeps Hugging Face's shape.

Measured here (CPU, float32, teacher-forced on the reference's top-1 tokens, the prefill (step 0) and 12 decode
steps; max |ref - cand| / max |ref| of the last position's logits, of magnitude 4-6, both rows; a token parts
where a row's argmax differs):
- `candidate()`, `candidate_window()`: 0 (bit-identical) at every step, the logits and every cache entry;
  the float64 runs (casts below float64 kept at float64) are bit-identical too.
- `candidate_rotary_offset()`: step 0 exact, 1.3 at step 1, 0.6-1.7 after; tokens part from step 1.
- `candidate_cache_before_rotary()`: step 0 exact (its cached keys off by 1.5), 0.92 at step 1, 0.4-1.4
  after; tokens part from step 1.
- `candidate_decode_mask()`: step 0 exact, 0.22 at step 1, 0.2-1.7 after; tokens part from step 1.
- `candidate_layer1_cache()`: steps 0 and 1 exact (step 1 leaves layer 1's values in the cache off by 0.49),
  0.05 at step 2, 0.05-0.34 after; tokens part from step 4.
- `candidate_bf16_cache()`: step 0 exact (the prefill attends to its keys before they are cached; the cache
  off by 3.6e-3), 1.7e-3 at step 1, 2e-3-1.1e-2 after; one token parts (step 3, row 0, where the
  reference's top two logits are 0.019 apart); 0 in float64.
- `candidate_prefill_mask()`: 0.40 at step 0 (its cache off by 1.3), 0.3-0.9 after; tokens part from step 0.
- `candidate_window_eviction()`: step 0 exact (the cache too), 0.33 at step 1, 0.3-1.1 after; tokens part
  from step 1.

bisectr should conclude: `noise` (or `match`) for `candidate()`, and for `candidate_window()` against
`reference_window()`; for the others `divergent` at the step where the difference enters, at the tagged line:
the rotary offset, the decode mask and the window eviction at step 1 (their lines), the prefill mask at
step 0; a cache written wrong at the step that writes it, though the logits part a step later: step 0 (the
prefill) for the cache before the rotary, step 1 (the first decode step) for layer 1's halved values
(`layers.1.self_attn`, cache entry `1.1`). The bf16 cache is a cache kept in a narrower dtype than the
reference's: its error is that dtype's rounding (from step 0, in the cache), `noise`, not a mistake.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, attn_implementation="eager")
HEADS, KV_HEADS = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
HEAD_DIM = CONFIG["hidden_size"] // HEADS
WINDOW = 6


def _prompt():
    import torch

    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 8))
    mask = np.ones((2, 8), np.int64)
    mask[1, :3] = 0
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def _hf_llama(window=None):
    """The reference: a Llama, or with `window` a Mistral (a Llama with a sliding window)."""
    hide_broken_torchcodec()
    import torch
    import transformers

    torch.manual_seed(0)
    if window is None:
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    return transformers.MistralForCausalLM(transformers.MistralConfig(**CONFIG, sliding_window=window)).eval()


def _classes():
    import torch
    from torch import nn

    class PortRMSNorm(nn.Module):
        def __init__(self, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(CONFIG["hidden_size"]))
            self.eps = eps

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    class PortAttention(nn.Module):
        def __init__(self, index, bugs, window):
            super().__init__()
            hidden = CONFIG["hidden_size"]
            self.index, self.bugs, self.window = index, bugs, window
            self.q_proj = nn.Linear(hidden, HEADS * HEAD_DIM, bias=False)
            self.k_proj = nn.Linear(hidden, KV_HEADS * HEAD_DIM, bias=False)
            self.v_proj = nn.Linear(hidden, KV_HEADS * HEAD_DIM, bias=False)
            self.o_proj = nn.Linear(HEADS * HEAD_DIM, hidden, bias=False)
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def rotate(self, x, positions):  # x: [batch, seq, heads, dim]
            freqs = positions[..., None].float() * self.inv_freq
            emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]
            x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
            return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()

        def forward(self, x, mask, positions, past):
            batch, seq, _ = x.shape
            q = self.q_proj(x).view(batch, seq, HEADS, HEAD_DIM)
            k = self.k_proj(x).view(batch, seq, KV_HEADS, HEAD_DIM)
            v = self.v_proj(x).view(batch, seq, KV_HEADS, HEAD_DIM)
            if seq == 1 and "offset" in self.bugs:
                positions = torch.zeros_like(positions)  # @offset
            q = self.rotate(q, positions)
            if "cache_before_rotary" in self.bugs:
                stored_k = k  # @cache_before_rotary
                k = self.rotate(k, positions)
            else:
                k = self.rotate(k, positions)
                stored_k = k
            stored_v = v * 0.5 if seq == 1 and self.index == 1 and "layer1_cache" in self.bugs else v  # @layer1_cache
            if "bf16_cache" in self.bugs:
                stored_k, stored_v = stored_k.to(torch.bfloat16), stored_v.to(torch.bfloat16)  # @bf16_cache
            if past is not None:
                k = torch.cat([past[0].to(k.dtype), k], dim=1)
                v = torch.cat([past[1].to(v.dtype), v], dim=1)
                cache = (torch.cat([past[0], stored_k], dim=1), torch.cat([past[1], stored_v], dim=1))
            else:
                cache = (stored_k, stored_v)
            if self.window is not None:  # as Hugging Face: keep window - 1 positions, the next key makes `window`
                cache = (cache[0][:, 1 - self.window:], cache[1][:, 1 - self.window:])
            groups = HEADS // KV_HEADS
            k = k.repeat_interleave(groups, dim=2)
            v = v.repeat_interleave(groups, dim=2)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM) + mask
            weights = torch.softmax(scores, dim=-1)
            out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, HEADS * HEAD_DIM)
            return self.o_proj(out), cache

    class PortMLP(nn.Module):
        def __init__(self):
            super().__init__()
            hidden, inner = CONFIG["hidden_size"], CONFIG["intermediate_size"]
            self.gate_proj = nn.Linear(hidden, inner, bias=False)
            self.up_proj = nn.Linear(hidden, inner, bias=False)
            self.down_proj = nn.Linear(inner, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class PortDecoderLayer(nn.Module):
        def __init__(self, index, bugs, window):
            super().__init__()
            self.input_layernorm = PortRMSNorm()
            self.self_attn = PortAttention(index, bugs, window)
            self.post_attention_layernorm = PortRMSNorm()
            self.mlp = PortMLP()

        def forward(self, x, mask, positions, past):
            attended, cache = self.self_attn(self.input_layernorm(x), mask, positions, past)
            x = x + attended
            return x + self.mlp(self.post_attention_layernorm(x)), cache

    class PortLlama(nn.Module):
        def __init__(self, bugs=(), window=None):
            super().__init__()
            self.bugs, self.window = set(bugs), window
            self.embed_tokens = nn.Embedding(CONFIG["vocab_size"], CONFIG["hidden_size"])
            layers = (PortDecoderLayer(i, self.bugs, window) for i in range(CONFIG["num_hidden_layers"]))
            self.layers = nn.ModuleList(layers)
            self.norm = PortRMSNorm()
            self.lm_head = nn.Linear(CONFIG["hidden_size"], CONFIG["vocab_size"], bias=False)

        def additive_mask(self, attention_mask, seq, total, length, dtype):
            """[batch, 1, seq, length]: 0 where a query may attend, the dtype's most negative number elsewhere;
            the queries are the last `seq` of `total` positions, the keys the last `length` (those cached)."""
            query = torch.arange(total - seq, total)[:, None]
            visible = torch.arange(total)[None, :] <= query
            if seq > 1 and "prefill_mask" in self.bugs:
                visible = torch.arange(total)[None, :] <= query + 1  # @prefill_mask
            if seq == 1 and "decode_mask" in self.bugs:
                visible = torch.arange(total)[None, :] < query  # @decode_mask
            if self.window is not None:  # a key at distance `window` is out, as in Hugging Face's Mistral
                visible = (visible & (torch.arange(total)[None, :] > query - self.window))[:, -length:]
                attention_mask = None if attention_mask is None else attention_mask[:, -length:]
            if attention_mask is not None:
                visible = visible[None] & attention_mask[:, None, :].bool()
            return torch.where(visible, 0.0, torch.finfo(dtype).min)[:, None].to(dtype)

        def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None):
            if cache is not None and "evict" in self.bugs:
                cache = [(k[:, 2 - self.window:], v[:, 2 - self.window:]) for k, v in cache]  # @evict
            x = self.embed_tokens(input_ids)
            seq = input_ids.shape[1]
            length = seq + (cache[0][0].shape[1] if cache is not None else 0)  # the keys attended to
            total = attention_mask.shape[1] if attention_mask is not None else length  # all positions so far
            if position_ids is None:
                position_ids = torch.arange(total - seq, total)[None].expand(input_ids.shape[0], -1)
            mask = self.additive_mask(attention_mask, seq, total, length, x.dtype)
            caches = []
            for i, layer in enumerate(self.layers):
                x, layer_cache = layer(x, mask, position_ids, None if cache is None else cache[i])
                caches.append(layer_cache)
            return self.lm_head(self.norm(x)), caches

    return PortLlama


def convert(hf_state: dict) -> dict:
    """The port's state dict from the Hugging Face checkpoint: the same layouts, `model.` dropped."""
    return {name.removeprefix("model."): value for name, value in hf_state.items()}


def _port(*bugs, window=None):
    port = _classes()(bugs, window)
    port.load_state_dict(convert(_hf_llama(window).state_dict()))
    return port.eval(), _prompt()


def reference():
    return _hf_llama(), _prompt()


def candidate():
    return _port()


def candidate_rotary_offset():
    return _port("offset")


def candidate_cache_before_rotary():
    return _port("cache_before_rotary")


def candidate_decode_mask():
    return _port("decode_mask")


def candidate_layer1_cache():
    return _port("layer1_cache")


def candidate_bf16_cache():
    return _port("bf16_cache")


def candidate_prefill_mask():
    return _port("prefill_mask")


def reference_window():
    return _hf_llama(WINDOW), _prompt()


def candidate_window():
    return _port(window=WINDOW)


def candidate_window_eviction():
    return _port("evict", window=WINDOW)
