"""torch's own `nn.MultiheadAttention` against a hand-written torch port of it, same weights.

Reference: two pre-LN residual attention blocks (`blocks.N.norm`, `blocks.N.attn` =
`nn.MultiheadAttention(32, 4, batch_first=True)`), input (2, 8, 32). Candidate: the same blocks with
the attention written out (q/k/v as three `F.linear` on slices of `in_proj_weight`/`in_proj_bias`,
heads split, `q @ k^T * scale`, softmax, `@ v`, heads merged, `out_proj`), weights loaded from the
reference's state dict. `candidate_wrong_scale()` scales the scores of `blocks.1.attn` by
1/d_head instead of 1/sqrt(d_head) (line marked `# @scale`).

Measured here: outputs (magnitude 3.4) differ by 2.4e-07 (7.1e-08 relative); with
`candidate_wrong_scale()`, by 0.29 (8.7e-02 relative).

bisectr should conclude: `noise` (or `match`) for `candidate()`; `divergent` for
`candidate_wrong_scale()`, culprit the scaled scores (or the softmax reading them) in `blocks.1.attn`.
"""
import math

D, HEADS, SEQ, BATCH, BLOCKS = 32, 4, 8, 2, 2


def _inputs():
    import torch

    torch.manual_seed(1)
    return (torch.randn(BATCH, SEQ, D),)


def _model(attention):
    import torch

    class Block(torch.nn.Module):
        def __init__(self, index):
            super().__init__()
            self.norm = torch.nn.LayerNorm(D)
            self.attn = attention(index)

        def forward(self, x):
            h = self.norm(x)
            return x + self.attn(h, h, h, need_weights=False)[0]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block(i) for i in range(BLOCKS))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    return Model()


def _reference_model():
    import torch

    torch.manual_seed(0)
    model = _model(lambda index: torch.nn.MultiheadAttention(D, HEADS, batch_first=True))
    with torch.no_grad():  # non-zero biases, so that a misplaced bias slice would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def reference():
    return _reference_model(), _inputs()


def candidate(wrong_scale_block: int | None = None):
    import torch
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def __init__(self, index):
            super().__init__()
            self.in_proj_weight = torch.nn.Parameter(torch.empty(3 * D, D))
            self.in_proj_bias = torch.nn.Parameter(torch.empty(3 * D))
            self.out_proj = torch.nn.Linear(D, D)
            d_head = D // HEADS
            self.scale = 1 / d_head if index == wrong_scale_block else 1 / math.sqrt(d_head)

        def heads(self, t):
            return t.view(BATCH, SEQ, HEADS, D // HEADS).transpose(1, 2)

        def forward(self, query, key, value, need_weights=False):
            w, b = self.in_proj_weight, self.in_proj_bias
            q = self.heads(F.linear(query, w[:D], b[:D]))
            k = self.heads(F.linear(key, w[D:2 * D], b[D:2 * D]))
            v = self.heads(F.linear(value, w[2 * D:], b[2 * D:]))
            scores = q @ k.transpose(-1, -2) * self.scale  # @scale
            a = scores.softmax(dim=-1) @ v
            a = a.transpose(1, 2).reshape(BATCH, SEQ, D)
            return self.out_proj(a), None

    model = _model(Attention)
    model.load_state_dict(_reference_model().state_dict())
    return model.eval(), _inputs()


def candidate_wrong_scale():
    """The port with 1/d_head instead of 1/sqrt(d_head) in the second block's attention."""
    return candidate(wrong_scale_block=1)
