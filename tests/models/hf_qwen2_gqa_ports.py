"""A tiny Hugging Face Qwen2 (grouped-query attention) against a hand-written torch port loaded through a converter.

Reference: `transformers.Qwen2ForCausalLM` from a random seeded config (3 layers, hidden 64, 4 query /
2 key-value heads, head_dim 16, intermediate 128, vocab 128, eager attention, untied head, biases on
q/k/v as Qwen2 has), `torch.manual_seed(0)`, then (`_draw_weights`) projections N(0, 1/fan_in) with
q/k at x3 (for peaked attention, so that a misplaced head shows), biases 0.1 N(0, 1), norms
1 + 0.1 N(0, 1), embeddings N(0, 1); eval, input_ids (2, 12) from `default_rng(0)`, `use_cache=False`.

Candidate: `Port`, a Llama/Qwen2-style model written here (separate q/k/v/o projections, RMSNorm,
half-split rotary as Hugging Face's `rotate_half`, causal softmax attention masked with -inf where Hugging
Face adds float32's minimum, so that the masked scores pair with values they do not equal, SiLU-gated MLP) with
`kv_heads` key-value heads, repeated per query head by `repeat_interleave` where it has fewer than 4.
Its weights come from the reference's state dict through `convert`, which may give k/v more heads
(`expand_kv`) and lay q/k rows out for a rotary convention (`rotary_rows`):

- `candidate()`: 2 kv heads, every weight as stored.
- `candidate_kv_heads_expanded()`: the port with 4 kv heads; the converter repeats each kv head's
  rows in place (`repeat_interleave`: h0 h0 h1 h1), as the port's query heads expect. Correct.
- `candidate_kv_heads_tiled()`: the same port; the converter tiles the kv heads (`repeat`: h0 h1 h0 h1),
  so query heads 1 and 2 read the other group's keys and values, in every layer (the line tagged
  `@tiled`). The candidate's k/v projections are 64 wide where the reference's are 32.
- `candidate_kv_heads_tiled_rounded_otherwise()` / `candidate_kv_heads_expanded_rounded_otherwise()`: the
  same two converters into a port whose RMSNorm divides by the root where Hugging Face multiplies by its
  reciprocal: from the first norm on, no value equals the reference's bit for bit, as with a CPU reference
  and a GPU candidate (the line tagged `@divides`).
- `candidate_rotary_rows_permuted()`: 2 kv heads; the converter permutes every q/k weight's and bias's
  rows within each head for the interleaved rotary convention (rows 0, 8, 1, 9, ... of a head of 16, as
  a Hugging Face -> Meta conversion script does), while the port rotates half-split pairs, in every
  layer (the line tagged `@rotary_rows`).

Measured here (CPU, float32; relative = max abs difference / max abs of the reference), logits of
magnitude 4.4: `candidate()` and `candidate_kv_heads_expanded()` bit-identical (0),
`candidate_kv_heads_tiled()` 3.4 (0.78 relative), `candidate_rotary_rows_permuted()` 3.3 (0.74).

bisectr should conclude: `match` (or `noise`) for `candidate()` and `candidate_kv_heads_expanded()`; `divergent` for
the other two, culprit the leaf `model.layers.0.self_attn.k_proj.weight` (with `v_proj`'s; heads tiled)
and `model.layers.0.self_attn.q_proj.weight` (with `k_proj`'s; rows permuted within each head), every
layer listed, confirmed by giving the candidate the reference's layout.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402


CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
              tie_word_embeddings=False, attn_implementation="eager")
HEADS, KV_HEADS = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
HEAD_DIM = CONFIG["hidden_size"] // HEADS


def _inputs():
    import torch

    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(2, 12))
    return torch.from_numpy(ids)


def _draw_weights(model) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            else:
                gain = 3.0 if ("q_proj" in name or "k_proj" in name) else 1.0
                p.copy_(gain * torch.randn_like(p) / p.shape[1] ** 0.5)


def _qwen2():
    hide_broken_torchcodec()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG))
    _draw_weights(model)
    return model.eval()


def reference():
    return _qwen2(), {"input_ids": _inputs(), "use_cache": False}


def _port(kv_heads: int, norm_divides: bool = False):
    """The hand port, with `kv_heads` key-value heads (module names as Hugging Face's)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    hidden, eps = CONFIG["hidden_size"], CONFIG["rms_norm_eps"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            variance = x.pow(2).mean(-1, keepdim=True)
            if norm_divides:
                return self.weight * (x / torch.sqrt(variance + eps))  # @divides
            return self.weight * (x * torch.rsqrt(variance + eps))

    def rotate_half(x):
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(hidden, HEADS * HEAD_DIM)
            self.k_proj = nn.Linear(hidden, kv_heads * HEAD_DIM)
            self.v_proj = nn.Linear(hidden, kv_heads * HEAD_DIM)
            self.o_proj = nn.Linear(HEADS * HEAD_DIM, hidden, bias=False)

        def forward(self, x, cos, sin, mask):
            batch, seq, _ = x.shape
            q = self.q_proj(x).view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
            k = self.k_proj(x).view(batch, seq, kv_heads, HEAD_DIM).transpose(1, 2)
            v = self.v_proj(x).view(batch, seq, kv_heads, HEAD_DIM).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(HEADS // kv_heads, dim=1)
            v = v.repeat_interleave(HEADS // kv_heads, dim=1)
            scores = q @ k.transpose(-1, -2) * HEAD_DIM ** -0.5 + mask
            out = scores.softmax(dim=-1) @ v
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq, HEADS * HEAD_DIM))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, CONFIG["intermediate_size"], bias=False)
            self.up_proj = nn.Linear(hidden, CONFIG["intermediate_size"], bias=False)
            self.down_proj = nn.Linear(CONFIG["intermediate_size"], hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.mlp = MLP()

        def forward(self, x, cos, sin, mask):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(CONFIG["vocab_size"], hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(CONFIG["num_hidden_layers"]))
            self.norm = RMSNorm()
            exponents = torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM
            self.register_buffer("inv_freq", 1.0 / CONFIG["rope_theta"] ** exponents, persistent=False)

        def forward(self, input_ids):
            seq = input_ids.shape[1]
            angles = torch.outer(torch.arange(seq, dtype=torch.float32), self.inv_freq)
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            mask = torch.full((seq, seq), float("-inf")).triu(1)
            x = self.embed_tokens(input_ids)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            return self.norm(x)

    class Port(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Decoder()
            self.lm_head = nn.Linear(hidden, CONFIG["vocab_size"], bias=False)

        def forward(self, input_ids):
            return {"logits": self.lm_head(self.model(input_ids))}

    return Port()


def interleave_kv_heads(values):
    """Each kv head's rows repeated in place (h0 h0 h1 h1): what query heads grouped in order read."""
    return values.unflatten(0, (KV_HEADS, HEAD_DIM)).repeat_interleave(HEADS // KV_HEADS, dim=0).flatten(0, 1)


def tile_kv_heads(values):
    """The kv heads' rows tiled (h0 h1 h0 h1)."""
    import torch

    return torch.cat([values] * (HEADS // KV_HEADS))  # @tiled


def to_interleaved_rotary(values, heads: int):
    """Each head's rows reordered from half-split pairs (i, i + HEAD_DIM / 2) to adjacent ones (2i, 2i + 1)."""
    return values.unflatten(0, (heads, 2, HEAD_DIM // 2)).transpose(1, 2).flatten(0, 2)  # @rotary_rows


def convert(state: dict, expand_kv=None, rotary_rows=None) -> dict:
    """The port's state dict from Hugging Face's: k/v rows through `expand_kv`, q/k rows through
    `rotary_rows` (None: as stored)."""
    converted = {}
    for name, values in state.items():
        if expand_kv and (".k_proj." in name or ".v_proj." in name):
            values = expand_kv(values)
        if rotary_rows and (".q_proj." in name or ".k_proj." in name):
            values = rotary_rows(values, values.shape[0] // HEAD_DIM)
        converted[name] = values
    return converted


def _ported(kv_heads: int = KV_HEADS, norm_divides: bool = False, **conversion):
    port = _port(kv_heads, norm_divides)
    port.load_state_dict(convert(_qwen2().state_dict(), **conversion))
    return port.eval(), {"input_ids": _inputs()}


def candidate():
    return _ported()


def candidate_kv_heads_expanded():
    return _ported(HEADS, expand_kv=interleave_kv_heads)


def candidate_kv_heads_tiled():
    return _ported(HEADS, expand_kv=tile_kv_heads)


def candidate_kv_heads_tiled_rounded_otherwise():
    return _ported(HEADS, norm_divides=True, expand_kv=tile_kv_heads)


def candidate_kv_heads_expanded_rounded_otherwise():
    return _ported(HEADS, norm_divides=True, expand_kv=interleave_kv_heads)


def candidate_rotary_rows_permuted():
    return _ported(rotary_rows=to_interleaved_rotary)
