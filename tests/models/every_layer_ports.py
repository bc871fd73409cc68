"""A small residual stack against hand-written ports of it that differ the same subtle way in every layer.

Reference: inputs (2, 8, 32) from `torch.manual_seed(1)`; four layers (`layers.N`), each two pre-LN
residual sublayers, `x = x + mix(norm1(x))` then `x = x + fc2(gelu(fc1(norm2(x))))` (`nn.LayerNorm(32)`,
`mix` 32 -> 32, `fc1` 32 -> 64, `fc2` 64 -> 32, exact GELU), then a final `nn.LayerNorm` and a `head`
32 -> 8; `torch.manual_seed(0)`, biases 0.1 N(0, 1), norms 1 + 0.1 N(0, 1); eval. Candidate: the same
stack written out (a hand layer norm: mean, variance, `rsqrt`; `F.linear`), loaded from the
reference's state dict, each difference planted in every layer:

- `candidate()`: the correct port (the variance with `unbiased=False`).
- `candidate_unbiased_norm()`: every hand layer norm takes the variance with `unbiased=True`
  (divides by 31, not 32; the line tagged `@unbiased`).
- `candidate_parallel_residual()`: every layer adds both sublayers to its input
  (`x + mix(norm1(x)) + mlp(norm2(x))`, as GPT-J does; the line tagged `@parallel`).
- `candidate_bias_twice()`: every layer's `fc2` adds its bias a second time (the line tagged `@bias_twice`).

Measured here (CPU, float32; relative = max abs difference / max abs of the reference), outputs of
magnitude 1.6: `candidate()` 3.0e-07 (1.9e-07 relative), `candidate_unbiased_norm()` 2.7e-02 (1.7e-02),
`candidate_parallel_residual()` 0.22 (0.13), `candidate_bias_twice()` 0.27 (0.17).

bisectr should conclude: `noise` (or `match`) for `candidate()`; `divergent` for the other three, culprit in
layer 0 (`layers.0.norm1`'s variance, `layers.0`'s residual add, `layers.0.fc2`'s second bias add), every
layer's occurrence listed, confirmed by taking them out together.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _weights import draw_biases_and_norms, loaded_from  # noqa: E402

D, HIDDEN, OUT, SEQ, BATCH, LAYERS = 32, 64, 8, 8, 2, 4
EPS = 1e-5


def _inputs():
    import torch

    torch.manual_seed(1)
    return (torch.randn(BATCH, SEQ, D),)


def _reference_model():
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.mix = nn.LayerNorm(D, eps=EPS), nn.Linear(D, D)
            self.norm2, self.fc1, self.fc2 = nn.LayerNorm(D, eps=EPS), nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

        def forward(self, x):
            x = x + self.mix(self.norm1(x))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm, self.head = nn.LayerNorm(D, eps=EPS), nn.Linear(D, OUT)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    return draw_biases_and_norms(Model())


def reference():
    return _reference_model(), _inputs()


def _port(unbiased_norm: bool = False, parallel_residual: bool = False, bias_twice: bool = False):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.empty(D)), nn.Parameter(torch.empty(D))

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            if unbiased_norm:
                variance = x.var(-1, keepdim=True, unbiased=True)  # @unbiased
            else:
                variance = x.var(-1, keepdim=True, unbiased=False)
            return (x - mean) * torch.rsqrt(variance + EPS) * self.weight + self.bias

    class Linear(nn.Module):
        def __init__(self, fan_in, fan_out):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.empty(fan_out, fan_in)), nn.Parameter(torch.empty(fan_out))

        def forward(self, x):
            return F.linear(x, self.weight, self.bias)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.mix = Norm(), Linear(D, D)
            self.norm2, self.fc1, self.fc2 = Norm(), Linear(D, HIDDEN), Linear(HIDDEN, D)

        def mlp(self, h):
            out = self.fc2(F.gelu(self.fc1(h)))
            if bias_twice:
                out = out + self.fc2.bias  # @bias_twice
            return out

        def forward(self, x):
            if parallel_residual:
                return x + self.mix(self.norm1(x)) + self.mlp(self.norm2(x))  # @parallel
            x = x + self.mix(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class Port(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm, self.head = Norm(), Linear(D, OUT)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    return loaded_from(Port(), _reference_model())


def candidate():
    return _port(), _inputs()


def candidate_unbiased_norm():
    return _port(unbiased_norm=True), _inputs()


def candidate_parallel_residual():
    return _port(parallel_residual=True), _inputs()


def candidate_bias_twice():
    return _port(bias_twice=True), _inputs()
