"""Greedy generation: a tiny Hugging Face Llama (or Mistral) against hand ports whose caches do not pair with its
`DynamicCache` entry for entry, in one layout: stacked, merged, windowed otherwise, or in another rotary convention.

Reference: `transformers.LlamaForCausalLM` (2 layers, hidden 64, 4 query / 2 key-value heads of 16 dims, vocab 128,
eager attention, initializer_range 0.2), `torch.manual_seed(0)`, eval; its `DynamicCache` holds each layer's keys and
values [batch, kv heads, seq, head dim]. `reference_window()`: `transformers.MistralForCausalLM` of the same sizes
with `sliding_window=6` (its cache keeps the last 5 positions). Prompt: input_ids (2, 8) from `default_rng(0)`, row 1
left-padded by 3 positions (attention_mask 0).

Candidates: `PortLlama`, the same model in plain torch, its weights converted from the reference's state dict, its
forward `(input_ids, attention_mask, position_ids, cache)` returning `(logits, cache)`, the cache a `PortCache`
holding each layer's keys and values (computed [batch, kv heads, seq, dim]) in its layout:

- `candidate_stacked()`: one tensor per layer, k and v stacked [2, batch, kv heads, seq, dim].
- `candidate_merged()`: (k, v) per layer with the heads merged into one dimension [batch, seq, kv heads * dim].
- `candidate_interleaved()`: (k, v) per layer as Hugging Face keeps them, but its rotary turns adjacent pairs of
  dimensions (2i, 2i + 1), the converter reordering each head's q and k rows to match: its cached keys hold each
  head's dimensions in another order than the reference's (0, 8, 1, 9, ...), equal up to that order.
- `candidate_window()` (against `reference_window()`): masks keys at distance 6 and more as Mistral does, but
  keeps the last 6 positions in its cache where Hugging Face keeps 5.

and each with a mistake: `candidate_stacked_decode_mask()`, `candidate_merged_decode_mask()`,
`candidate_interleaved_decode_mask()` and `candidate_window_decode_mask()` mask the new token's own key at decode
steps (`@decode_mask`); `candidate_stacked_kv_swapped()` writes each layer's values where its keys go and its keys
where its values go (`@kv_swapped`): the prefill's logits are right, its cache is not.

Measured here (CPU, float32, teacher-forced on the reference's top-1 tokens, the prefill and 4 decode steps, relative
to the reference's largest value): the stacked, merged and window ports' logits and caches are bit-identical to the
reference's at every step (the window's over the last 5 positions); the interleaved port's logits differ by 6e-7 to
1e-6 (1e-15 in float64), its keys bit-identical taken in the reference's order; each decode mask mistake leaves step
0 exact and makes step 1's logits differ by 0.5 (1.5 with the window); the swapped cache leaves step 0's logits exact,
its cache off by 1.2, and step 1's logits off by 1.7.

bisectr should conclude: `match` or `noise` for the correct ports, the stacked entries paired as parts with the
reference's keys and values, the merged ones not compared (the note says why), the interleaved keys paired in the
reference's order, the windows over the positions both keep; `divergent` for the decode masks at step 1, searched
there on what the step's outputs pair (the logits, and the entries that pair whole); for the swapped cache, the
cache divergent at step 0 (in a part the search inside a step cannot compare) and the step searched the first whose
logits differ, step 1.
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
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


def _hf(window=None):
    """The reference: a Llama, or with `window` a Mistral (a Llama with a sliding window)."""
    hide_broken_torchcodec()
    import torch
    import transformers

    torch.manual_seed(0)
    if window is None:
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    return transformers.MistralForCausalLM(transformers.MistralConfig(**CONFIG, sliding_window=window)).eval()


class PortCache:
    """Each layer's keys and values, given and returned [batch, kv heads, seq, dim], kept in `layout`: "pairs" (as
    given), "stacked" (one tensor [2, ...]) or "merged" ([batch, seq, kv heads * dim]); the last `kept` positions
    (None: all)."""

    def __init__(self, layout, kept):
        self.layout, self.kept, self.layers = layout, kept, []

    def read(self, index):
        if index >= len(self.layers):
            return None
        held = self.layers[index]
        if self.layout == "stacked":
            return held[0], held[1]
        if self.layout == "merged":
            return tuple(x.view(x.shape[0], x.shape[1], KV_HEADS, HEAD_DIM).transpose(1, 2) for x in held)
        return held

    def write(self, index, k, v, bugs):
        import torch

        if self.kept is not None:
            k, v = k[:, :, -self.kept:], v[:, :, -self.kept:]
        if self.layout == "stacked":
            held = torch.stack([v, k] if "kv_swapped" in bugs else [k, v])  # @kv_swapped
        elif self.layout == "merged":
            held = tuple(x.transpose(1, 2).reshape(x.shape[0], x.shape[2], KV_HEADS * HEAD_DIM) for x in (k, v))
        else:
            held = (k, v)
        if index < len(self.layers):
            self.layers[index] = held
        else:
            self.layers.append(held)


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
        def __init__(self, index, options):
            super().__init__()
            hidden = CONFIG["hidden_size"]
            self.index, self.options = index, options
            self.q_proj = nn.Linear(hidden, HEADS * HEAD_DIM, bias=False)
            self.k_proj = nn.Linear(hidden, KV_HEADS * HEAD_DIM, bias=False)
            self.v_proj = nn.Linear(hidden, KV_HEADS * HEAD_DIM, bias=False)
            self.o_proj = nn.Linear(HEADS * HEAD_DIM, hidden, bias=False)
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def rotate(self, x, positions):  # x: [batch, heads, seq, dim]
            angles = positions[:, None, :, None].float() * self.inv_freq
            if self.options["rotary"] == "interleaved":  # adjacent pairs (2i, 2i + 1)
                even, odd = x[..., 0::2], x[..., 1::2]
                turned = [even * angles.cos() - odd * angles.sin(), even * angles.sin() + odd * angles.cos()]
                return torch.stack(turned, dim=-1).flatten(-2)
            angles = torch.cat([angles, angles], dim=-1)
            x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
            return x * angles.cos() + torch.cat([-x2, x1], dim=-1) * angles.sin()

        def forward(self, x, mask, positions, cache):
            batch, seq, _ = x.shape
            q = self.q_proj(x).view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
            k = self.k_proj(x).view(batch, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = self.v_proj(x).view(batch, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
            q, k = self.rotate(q, positions), self.rotate(k, positions)
            past = cache.read(self.index)
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            cache.write(self.index, k, v, self.options["bugs"])
            k, v = k.repeat_interleave(HEADS // KV_HEADS, dim=1), v.repeat_interleave(HEADS // KV_HEADS, dim=1)
            scores = q @ k.transpose(2, 3) / math.sqrt(HEAD_DIM) + mask
            out = torch.softmax(scores, dim=-1) @ v
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq, HEADS * HEAD_DIM))

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
        def __init__(self, index, options):
            super().__init__()
            self.input_layernorm = PortRMSNorm()
            self.self_attn = PortAttention(index, options)
            self.post_attention_layernorm = PortRMSNorm()
            self.mlp = PortMLP()

        def forward(self, x, mask, positions, cache):
            x = x + self.self_attn(self.input_layernorm(x), mask, positions, cache)
            return x + self.mlp(self.post_attention_layernorm(x))

    class PortLlama(nn.Module):
        def __init__(self, options):
            super().__init__()
            self.options = options
            self.embed_tokens = nn.Embedding(CONFIG["vocab_size"], CONFIG["hidden_size"])
            self.layers = nn.ModuleList(PortDecoderLayer(i, options) for i in range(CONFIG["num_hidden_layers"]))
            self.norm = PortRMSNorm()
            self.lm_head = nn.Linear(CONFIG["hidden_size"], CONFIG["vocab_size"], bias=False)

        def additive_mask(self, attention_mask, seq, length, dtype):
            """[batch, 1, seq, length]: 0 where a query may attend, the dtype's most negative number elsewhere; the
            queries are the last `seq` of all positions so far, the keys the last `length`."""
            total = attention_mask.shape[1]
            query = torch.arange(total - seq, total)[:, None]
            keys = torch.arange(total)[None, :]
            decode_mask = seq == 1 and "decode_mask" in self.options["bugs"]
            visible = keys < query if decode_mask else keys <= query  # @decode_mask
            if self.options["window"] is not None:  # a key at distance `window` is out, as in Mistral
                visible = visible & (keys > query - self.options["window"])
            visible = visible[:, -length:][None] & attention_mask[:, None, -length:].bool()
            return torch.where(visible, 0.0, torch.finfo(dtype).min)[:, None].to(dtype)

        def forward(self, input_ids, attention_mask, position_ids, cache=None):
            if cache is None:
                cache = PortCache(self.options["layout"], self.options["kept"])
            x = self.embed_tokens(input_ids)
            past = cache.read(0)
            length = input_ids.shape[1] + (past[0].shape[2] if past is not None else 0)
            mask = self.additive_mask(attention_mask, input_ids.shape[1], length, x.dtype)
            for layer in self.layers:
                x = layer(x, mask, position_ids, cache)
            return self.lm_head(self.norm(x)), cache

    return PortLlama


def convert(hf_state: dict, rotary: str) -> dict:
    """The port's state dict from the Hugging Face checkpoint, `model.` dropped; for the interleaved rotary, each
    head's q and k rows reordered from pairs (i, i + half) to adjacent pairs (2i, 2i + 1)."""
    state = {name.removeprefix("model."): value for name, value in hf_state.items()}
    if rotary == "interleaved":
        half = HEAD_DIM // 2
        order = [j for i in range(half) for j in (i, i + half)]
        for name in list(state):
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                rows = state[name]
                state[name] = rows.reshape(-1, HEAD_DIM, rows.shape[-1])[:, order].reshape(rows.shape)
    return state


def _port(layout="pairs", rotary="half", window=None, kept=None, bugs=()):
    options = dict(layout=layout, rotary=rotary, window=window, kept=kept, bugs=set(bugs))
    port = _classes()(options)
    port.load_state_dict(convert(_hf(window).state_dict(), rotary))
    return port.eval(), _prompt()


def reference():
    return _hf(), _prompt()


def reference_window():
    return _hf(WINDOW), _prompt()


def candidate_stacked():
    return _port("stacked")


def candidate_stacked_decode_mask():
    return _port("stacked", bugs=("decode_mask",))


def candidate_stacked_kv_swapped():
    return _port("stacked", bugs=("kv_swapped",))


def candidate_merged():
    return _port("merged")


def candidate_merged_decode_mask():
    return _port("merged", bugs=("decode_mask",))


def candidate_interleaved():
    return _port(rotary="interleaved")


def candidate_interleaved_decode_mask():
    return _port(rotary="interleaved", bugs=("decode_mask",))


def candidate_window():
    return _port(window=WINDOW, kept=WINDOW)


def candidate_window_decode_mask():
    return _port(window=WINDOW, kept=WINDOW, bugs=("decode_mask",))
