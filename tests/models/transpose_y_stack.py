"""A 48-layer pre-LN transformer stack in torch against a paddle port that uses `transpose_y`.

Reference (torch): 48 pre-LN blocks (`layers.N.{ln1, qkv, proj, ln2, fc1, fc2}`, d 32, 4 heads, FFN
64, exact GELU) and a final `norm`, seeded, input (2, 8, 32). Every FFN works in GELU's negative tail
(`fc1.bias` = FC1_BIAS, `fc2.weight` times FC2_SCALE): there the tanh approximation is off by up to
4.7e-4 against values of ~1e-2, while at default init (pre-activations ~N(0, 0.6)) a tanh GELU in one
layer of 48 moves the outputs by only ~2e-5 relative. Attention unpacks the fused
projection by iteration, `q, k, v = qkv` after `reshape(B, S, 3, H, d).permute(2, 0, 3, 1, 4)`, and
scores by `q @ k.transpose(-1, -2) * scale`. Candidate (paddle): the same blocks, the same
unpacking (`paddle.transpose` with the perm, then `q, k, v = qkv`), scores by
`paddle.matmul(q, k, transpose_y=True) * scale`; weights copied with `bisectr.weights.torch_to_paddle`.
`candidate_tanh_gelu()` makes the FFN GELU of `layers.30` the tanh approximation
(`approximate=True`; line marked `# @tanh`), deep inside the stack.

Measured here: outputs (magnitude 2.5) differ by 3.8e-05 (1.5e-05 relative; torch float32 against
float64 alone is 1.4e-05); with `candidate_tanh_gelu()`, by 7.6e-03 (3.0e-03 relative).

bisectr should conclude: `noise` for `candidate()`; `divergent` for `candidate_tanh_gelu()`, culprit
the `gelu` of `layers.30` (tanh approximation against exact).
"""
import numpy as np

D, HEADS, FFN, SEQ, BATCH, LAYERS = 32, 4, 64, 8, 2, 48
DH = D // HEADS
SCALE = DH ** -0.5
FC1_BIAS, FC2_SCALE = -2.7, 20.0


def _inputs():
    return np.random.default_rng(1).standard_normal((BATCH, SEQ, D)).astype(np.float32)


def _torch_model():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, FFN), nn.Linear(FFN, D)

        def forward(self, x):
            B, S, _ = x.shape
            qkv = self.qkv(self.ln1(x)).reshape(B, S, 3, HEADS, DH).permute(2, 0, 3, 1, 4)
            q, k, v = qkv
            scores = q @ k.transpose(-1, -2) * SCALE
            a = (scores.softmax(dim=-1) @ v).permute(0, 2, 1, 3).reshape(B, S, D)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = nn.LayerNorm(D)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    torch.manual_seed(0)
    model = Stack()
    with torch.no_grad():
        for layer in model.layers:
            layer.fc1.bias.fill_(FC1_BIAS)
            layer.fc2.weight.mul_(FC2_SCALE)
    return model.eval()


def reference():
    import torch

    return _torch_model(), (torch.from_numpy(_inputs()),)


def _paddle_model(tanh_layer):
    import paddle
    import paddle.nn.functional as F
    from paddle import nn

    class Block(nn.Layer):
        def __init__(self, index):
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, FFN), nn.Linear(FFN, D)
            self.tanh_gelu = index == tanh_layer

        def forward(self, x):
            B, S, _ = x.shape
            qkv = paddle.transpose(self.qkv(self.ln1(x)).reshape([B, S, 3, HEADS, DH]), perm=[2, 0, 3, 1, 4])
            q, k, v = qkv
            scores = paddle.matmul(q, k, transpose_y=True) * SCALE
            a = paddle.matmul(F.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3]).reshape([B, S, D])
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.tanh_gelu))  # @tanh

    class Stack(nn.Layer):
        def __init__(self):
            super().__init__()
            self.layers = nn.LayerList([Block(i) for i in range(LAYERS)])
            self.norm = nn.LayerNorm(D)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    return Stack()


def candidate(tanh_layer: int | None = None):
    import paddle

    from bisectr.weights import torch_to_paddle

    model = _paddle_model(tanh_layer)
    torch_to_paddle(_torch_model(), model).check()
    model.eval()
    return model, (paddle.to_tensor(_inputs()),)


def candidate_tanh_gelu():
    """The port with the tanh-approximated GELU in the feed-forward of layer 30."""
    return candidate(tanh_layer=30)
