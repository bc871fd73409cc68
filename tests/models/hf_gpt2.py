"""A tiny Hugging Face GPT-2 against a hand-written torch port of it, same weights.

Reference: `transformers.GPT2Model` from a random seeded config (3 layers, n_embd 64, 4 heads, vocab
128, n_positions 32, eager attention, all dropouts 0), non-zero biases and norm affines, eval,
input_ids (2, 16), `use_cache=False`. Candidate: GPT-2 written out in torch with the same module
names (`wte`, `wpe`, `h.N.ln_1`, `h.N.attn.{q_proj,k_proj,v_proj,c_proj}`, `h.N.ln_2`,
`h.N.mlp.{c_fc,c_proj}`, `ln_f`), `nn.Linear` in place of HF's `Conv1D`: `c_attn`'s fused (64, 3*64)
(in, out) weight is split into q/k/v and each part transposed into Linear's (out, in);
attention by `F.scaled_dot_product_attention(is_causal=True)`, GELU by `F.gelu(approximate="tanh")`
(HF's "gelu_new" writes the tanh formula out). `candidate_untransposed()` copies the weight of
`h.2.attn.c_proj` (square 64x64) without the transpose (line marked `# @untransposed`).
`candidate_exact_gelu()` leaves `F.gelu` at its default, the exact GELU, in every layer's MLP (line
marked `# @gelu`): a framework default, in a class every layer uses.

Measured here: outputs (magnitude 2.9) differ by 6.0e-07 (2.1e-07 relative); with
`candidate_untransposed()`, by 0.42 (1.5e-01 relative); with `candidate_exact_gelu()`, by 9.1e-06
(3.7e-06 relative, some 20x the rounding).

bisectr should conclude: `noise` for `candidate()`; `divergent` for `candidate_untransposed()`, culprit
the `linear` of `h.2.attn.c_proj` (or its weight, the leaf `h.2.attn.c_proj.weight`); `divergent` for
`candidate_exact_gelu()`, culprit the GELU of `h.0.mlp` (against HF's tanh formula written out: a block),
recurring in `h.1.mlp` and `h.2.mlp`.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import seeded_gpt2  # noqa: E402

CONFIG = dict(vocab_size=128, n_positions=32, n_embd=64, n_layer=3, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, attn_implementation="eager")
D = CONFIG["n_embd"]


def _inputs():
    return np.random.default_rng(0).integers(0, CONFIG["vocab_size"], size=(2, 16))


def _gpt2():
    return seeded_gpt2("GPT2Model", CONFIG)


def reference():
    import torch

    return _gpt2(), {"input_ids": torch.from_numpy(_inputs()), "use_cache": False}


def _port(gelu: str = "tanh"):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.c_proj = (nn.Linear(D, D) for _ in range(4))

        def heads(self, t):
            b, s, _ = t.shape
            return t.view(b, s, CONFIG["n_head"], D // CONFIG["n_head"]).transpose(1, 2)

        def forward(self, x):
            q, k, v = self.heads(self.q_proj(x)), self.heads(self.k_proj(x)), self.heads(self.v_proj(x))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(a.transpose(1, 2).reshape(x.shape))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate=gelu))  # @gelu

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), Attention(), nn.LayerNorm(D), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(CONFIG["vocab_size"], D), nn.Embedding(CONFIG["n_positions"], D)
            self.h = nn.ModuleList(Block() for _ in range(CONFIG["n_layer"]))
            self.ln_f = nn.LayerNorm(D)

        def forward(self, input_ids):
            x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))
            for block in self.h:
                x = block(x)
            return {"last_hidden_state": self.ln_f(x)}

    return GPT2()


def candidate(untransposed: str | None = None, gelu: str = "tanh"):
    import torch

    state = {}
    for name, value in _gpt2().state_dict().items():
        if name.endswith("c_attn.weight"):  # Conv1D (in, 3*out) -> three Linear (out, in)
            for part, w in zip(("q_proj", "k_proj", "v_proj"), value.split(D, dim=1)):
                state[name.replace("c_attn", part)] = w.T
        elif name.endswith("c_attn.bias"):
            for part, b in zip(("q_proj", "k_proj", "v_proj"), value.split(D)):
                state[name.replace("c_attn", part)] = b
        elif name == untransposed:
            state[name] = value  # @untransposed
        elif name.endswith((".c_proj.weight", ".c_fc.weight")):  # Conv1D (in, out) -> Linear (out, in)
            state[name] = value.T
        else:
            state[name] = value
    model = _port(gelu)
    model.load_state_dict(state)  # strict: every name and shape must fit
    return model.eval(), {"input_ids": torch.from_numpy(_inputs())}


def candidate_untransposed():
    """The port with block 2's attention output projection copied without the transpose."""
    return candidate(untransposed="h.2.attn.c_proj.weight")


def candidate_exact_gelu():
    """The port with `F.gelu`'s default, the exact GELU, in every layer's MLP."""
    return candidate(gelu="none")
