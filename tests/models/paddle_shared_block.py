"""A hand-written pre-LN torch transformer against a hand-written paddle port whose ONE `Block` class is wrong.

Reference (torch): input (2, 8, 32), four instances `blocks.0` .. `blocks.3` of one class `Block`:
`x = x + o_proj(attention(q_proj, k_proj, v_proj of ln1(x)))` (4 heads, softmax), then
`x = x + fc2(gelu(fc1(ln2(x))))` (32 -> 64 -> 32, exact erf GELU); then `ln_f` and `head` Linear(32, 16).
Seeded: q/k/v/fc1/head weights N(0, 1 / fan_in), o_proj/fc2 weights 0.03 times that, biases 0.1 N(0, 1)
(0.01 for o_proj/fc2), norm affines 1 + 0.1 N(0, 1) / 0.1 N(0, 1); eval. The input is 0.05 N(0, 1) and the
residual updates are small, so the residual stream's variance stays at 2e-3 .. 5e-3 through all four
blocks, where a LayerNorm's epsilon of 1e-3 instead of 1e-5 matters. Candidate (paddle): the same network under the
same module names, weights copied with `bisectr.weights.torch_to_paddle` (every Linear weight transposed
by layer type). `candidate()` is correct (LayerNorm epsilon 1e-5, `F.gelu(approximate=False)`).

`candidate_block_bug()`: the `Block` class creates its two norms with `epsilon=1e-3` (the line marked
`# @bug`, in `Block.__init__`; the ops are called in `Block.forward` at `self.ln1(x)` / `self.ln2(x)`), so
the bug enters at the first op of the model that uses it, `blocks.0.ln1`, and recurs in `blocks.0.ln2`
and both norms of `blocks.1` .. `blocks.3` (8 norms).
`candidate_block_gelu()`: the `Block` class calls `F.gelu(..., approximate=True)` (tanh GELU, the line
marked `# @gelu`, the op's own call site): enters at the GELU of `blocks.0` (between `blocks.0.fc1` and
`blocks.0.fc2`) and recurs in `blocks.1` .. `blocks.3`.

Measured here: outputs (magnitude 2.7) differ by 8.3e-07 (3.1e-07 relative) for `candidate()`; with
`candidate_block_bug()`, by 0.62 (2.3e-01 relative); with `candidate_block_gelu()`, by 3.6e-04
(1.4e-04 relative).

bisectr should conclude: `noise` (or `match`) for `candidate()`; `divergent` for the other two, culprit
the `layer_norm` of `blocks.0.ln1` / the `gelu` of `blocks.0`, recurring in every later block.
"""
import numpy as np

D, HEADS, FF, SEQ, BATCH, BLOCKS, OUT = 32, 4, 64, 8, 2, 4, 16


def _inputs():
    return (0.05 * np.random.default_rng(1).standard_normal((BATCH, SEQ, D))).astype(np.float32)


def _torch_model():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D)
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D) for _ in range(4))
            self.ln2 = nn.LayerNorm(D)
            self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

        def forward(self, x):
            b, s, _ = x.shape
            heads = lambda t: t.reshape(b, s, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
            h = self.ln1(x)
            q, k, v = heads(self.q_proj(h)), heads(self.k_proj(h)), heads(self.v_proj(h))
            weights = F.softmax(q @ k.transpose(-1, -2) * (D // HEADS) ** -0.5, dim=-1)
            x = x + self.o_proj((weights @ v).transpose(1, 2).reshape(b, s, D))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
            self.ln_f = nn.LayerNorm(D)
            self.head = nn.Linear(D, OUT)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    torch.manual_seed(0)
    model = Transformer()
    with torch.no_grad():
        for name, module in model.named_modules():
            small = name.endswith(("o_proj", "fc2"))
            if isinstance(module, nn.Linear):
                module.weight.normal_(0, (0.03 if small else 1.0) / module.in_features ** 0.5)
                module.bias.normal_(0, 0.01 if small else 0.1)
            elif isinstance(module, nn.LayerNorm):
                module.weight.copy_(1 + 0.1 * torch.randn(D))
                module.bias.normal_(0, 0.1)
    return model.eval()


def reference():
    import torch

    return _torch_model(), (torch.from_numpy(_inputs()),)


def candidate(bug: str | None = None):
    import paddle
    import paddle.nn.functional as F
    from paddle import nn

    from bisectr.weights import torch_to_paddle

    class Block(nn.Layer):
        def __init__(self):
            super().__init__()
            if bug == "eps":
                self.ln1, self.ln2 = nn.LayerNorm(D, epsilon=1e-3), nn.LayerNorm(D, epsilon=1e-3)  # @bug
            else:
                self.ln1, self.ln2 = nn.LayerNorm(D, epsilon=1e-5), nn.LayerNorm(D, epsilon=1e-5)
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

        def forward(self, x):
            b, s, _ = x.shape
            heads = lambda t: t.reshape([b, s, HEADS, D // HEADS]).transpose([0, 2, 1, 3])  # noqa: E731
            h = self.ln1(x)
            q, k, v = heads(self.q_proj(h)), heads(self.k_proj(h)), heads(self.v_proj(h))
            weights = F.softmax(paddle.matmul(q, k, transpose_y=True) * (D // HEADS) ** -0.5, axis=-1)
            x = x + self.o_proj(paddle.matmul(weights, v).transpose([0, 2, 1, 3]).reshape([b, s, D]))
            h = self.fc1(self.ln2(x))
            if bug == "gelu":
                h = F.gelu(h, approximate=True)  # @gelu
            else:
                h = F.gelu(h)
            return x + self.fc2(h)

    class Transformer(nn.Layer):
        def __init__(self):
            super().__init__()
            self.blocks = nn.LayerList([Block() for _ in range(BLOCKS)])
            self.ln_f = nn.LayerNorm(D)
            self.head = nn.Linear(D, OUT)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    model = Transformer()
    torch_to_paddle(_torch_model(), model).check()
    model.eval()
    return model, (paddle.to_tensor(_inputs()),)


def candidate_block_bug():
    """The port whose `Block` builds both its LayerNorms with epsilon 1e-3 (not 1e-5): all four blocks."""
    return candidate(bug="eps")


def candidate_block_gelu():
    """The port whose `Block` uses the tanh GELU (`approximate=True`): all four blocks."""
    return candidate(bug="gelu")
