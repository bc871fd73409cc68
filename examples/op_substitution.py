"""A correct PaddlePaddle port whose differences are pure rounding in layer_norm, matmul, sum and
logsumexp: the ops seed 003 swapped one by one for torch's until the difference was 0.

Reproduces seed 003: in the Reformer port, a `paddle.matmul` fed with large-variance weights
(N(0, 1)) differed from torch by ~5.7e-5 while N(0, 0.02) weights gave ~2e-8; the author replaced
paddle's layer_norm, matmul (inside `nn.Linear`), sum, `_len_and_dim_norm` and logsumexp with
torch calls and got bitwise-equal outputs, i.e. exactly the ops that round differently.

Both sides: Reformer's shared-QK attention (one head, as in its LSH layer, without hashing):
layer_norm (eps 1e-12) -> query_key projection (N(0, 0.04) weights, so attention stays soft) and
value projection (N(0, 1) weights) -> keys by `_len_and_dim_norm` (x * rsqrt(mean(x^2) + 1e-6)
* rsqrt(head_dim)) -> q.k^T -> logsumexp -> exp(dots - logsumexp) -> matmul with values ->
dense (N(0, 1) weights) -> sum over the sequence.
Reference (torch) writes layer_norm out by hand, as seed 003's `torchlayernorm` does (mean,
variance, sqrt); the candidate (paddle) calls the fused `nn.LayerNorm`. Weights are copied with
`bisectr.weights.torch_to_paddle`.

Measured here: outputs differ by 1.2e-4 at magnitude 5.6e2 (2.2e-7 relative). Along the way:
layer_norm 2.4e-7 at 3.5, value projection 7.6e-6 at 30 (x32 in absolute terms), q.k^T 7e-7
at 2.9, probabilities 1.2e-7, dense 4.6e-5 at 1.1e2, sum 1.2e-4.

bisectr should conclude: verdict `noise`. Each op is as close to the float64 oracle on both sides;
the layer_norm is a 1:N aligned block (fused vs mean/variance/sqrt). The culprit named is the op
that amplifies rounding most: the `value` projection (N(0, 1) weights; its output error is ~30x
its input's), or the `dense` after it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import normal  # noqa: E402

DIM, LENGTH = 64, 16
EPS = 1e-12
QUERY_KEY_STD = 0.04  # keeps the shared-QK attention from collapsing onto each token itself


def hidden_states():
    return normal(2, LENGTH, DIM, seed=0)


def torch_model():
    import torch
    from torch import nn

    class TorchLayerNorm(nn.Module):
        """Seed 003's `torchlayernorm`, written out."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(DIM))
            self.bias = nn.Parameter(torch.zeros(DIM))

        def forward(self, x):
            u = x.mean(-1, keepdim=True)
            s = (x - u).pow(2).mean(-1, keepdim=True)
            return self.weight * ((x - u) / torch.sqrt(s + EPS)) + self.bias

    class SharedQKAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = TorchLayerNorm()
            self.query_key = nn.Linear(DIM, DIM, bias=False)
            self.value = nn.Linear(DIM, DIM, bias=False)
            self.dense = nn.Linear(DIM, DIM)

        def forward(self, x):
            h = self.norm(x)
            query = self.query_key(h)
            value = self.value(h)
            variance = torch.mean(query ** 2, -1, keepdim=True)
            key = query * torch.rsqrt(variance + 1e-6) * torch.rsqrt(torch.tensor(DIM, dtype=query.dtype))
            dots = torch.matmul(query, key.transpose(-1, -2))
            probs = torch.exp(dots - torch.logsumexp(dots, dim=-1, keepdim=True))
            out = self.dense(torch.matmul(probs, value))
            return torch.sum(out, dim=1)

    torch.manual_seed(0)
    model = SharedQKAttention()
    with torch.no_grad():  # large-variance value/dense weights as in seed 003; softer query_key
        model.query_key.weight.normal_(0.0, QUERY_KEY_STD)
        model.value.weight.normal_(0.0, 1.0)
        model.dense.weight.normal_(0.0, 1.0)
    return model.eval()


def reference():
    import torch

    return torch_model(), (torch.from_numpy(hidden_states()),)


def candidate():
    import paddle
    from paddle import nn

    from bisectr.weights import torch_to_paddle

    class SharedQKAttention(nn.Layer):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(DIM, epsilon=EPS)
            self.query_key = nn.Linear(DIM, DIM, bias_attr=False)
            self.value = nn.Linear(DIM, DIM, bias_attr=False)
            self.dense = nn.Linear(DIM, DIM)

        def forward(self, x):
            h = self.norm(x)
            query = self.query_key(h)
            value = self.value(h)
            variance = paddle.mean(query ** 2, -1, keepdim=True)
            key = query * paddle.rsqrt(variance + 1e-6) * paddle.rsqrt(paddle.to_tensor(DIM, dtype=query.dtype))
            dots = paddle.matmul(query, key, transpose_y=True)
            probs = paddle.exp(dots - paddle.logsumexp(dots, axis=-1, keepdim=True))
            out = self.dense(paddle.matmul(probs, value))
            return paddle.sum(out, axis=1)

    model = SharedQKAttention()
    torch_to_paddle(torch_model(), model).check()
    model.eval()
    return model, (paddle.to_tensor(hidden_states()),)
