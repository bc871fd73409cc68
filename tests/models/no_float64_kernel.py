"""Models whose ops have no float64 kernel on CPU, for the float64 check's fallback.

`reference()`: torch experts as mixture-of-experts layers run them: 24 rows in three groups of 8, each
group multiplied by its own expert's weights with `torch._grouped_mm` (float32, bfloat16 and float16
only), the tanh GELU between the two grouped products. `candidate()`: the same built again.
`candidate_exact_gelu()` applies the exact GELU instead (line marked `# @exact`). `candidate_in_place()`
applies it through a float32-only custom kernel that writes into its input (`ExactGeluInPlace`).
`candidate_expert_weights()` scales expert 1's `up` weights by 1.01.

`rms_norm()`: torch RMSNorm written out (pow, mean, rsqrt, mul) and a linear layer, epsilon 1e-6;
`rms_norm_wide_eps()` with epsilon 1e-2; `fused_rms_norm()`: a paddle port of `rms_norm()` with
`paddle.incubate.nn.functional.fused_rms_norm` (float32 only on CPU) and the same weights.

Measured here: `candidate()` gives bit-identical outputs; `candidate_exact_gelu()` and
`candidate_in_place()` differ by 2.3e-04 relative, `candidate_expert_weights()` by 1.2e-02;
`fused_rms_norm()` against `rms_norm()` by 1.5e-07 relative, `rms_norm_wide_eps()` against
`fused_rms_norm()` by 1.2e-02.
"""
import numpy as np

ROWS, HIDDEN, INTERMEDIATE, EXPERTS = 24, 16, 32, 3


def _values(shape, seed, scale):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _experts(activation: str, up_scale: float = 1.0):
    import torch
    import torch.nn.functional as F

    class ExactGeluInPlace(torch.autograd.Function):
        """A float32-only kernel that overwrites its input with the exact GELU of it."""

        @staticmethod
        def forward(ctx, x):
            if x.dtype != torch.float32:
                raise TypeError(f"ExactGeluInPlace takes float32 only, got {x.dtype}")
            return x.copy_(F.gelu(x))

    class GroupedExperts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            up = _values((EXPERTS, HIDDEN, INTERMEDIATE), 1, HIDDEN ** -0.5)
            up[1] *= up_scale
            self.up = torch.nn.Parameter(torch.from_numpy(up))
            self.down = torch.nn.Parameter(torch.from_numpy(_values((EXPERTS, INTERMEDIATE, HIDDEN), 2, INTERMEDIATE ** -0.5)))
            self.register_buffer("offsets", torch.tensor([8, 16, 24], dtype=torch.int32))

        def forward(self, x):
            h = torch._grouped_mm(x, self.up, offs=self.offsets)
            if activation == "tanh":
                h = F.gelu(h, approximate="tanh")
            elif activation == "exact":
                h = F.gelu(h)  # @exact
            else:
                h = ExactGeluInPlace.apply(h)
            return torch._grouped_mm(h, self.down, offs=self.offsets)

    return GroupedExperts().eval(), (torch.from_numpy(_values((ROWS, HIDDEN), 0, 1.0)),)


def reference():
    return _experts("tanh")


def candidate():
    return _experts("tanh")


def candidate_exact_gelu():
    return _experts("exact")


def candidate_in_place():
    return _experts("in place")


def candidate_expert_weights():
    return _experts("tanh", up_scale=1.01)


NORM_WEIGHT, PROJECTION = _values((HIDDEN,), 3, 0.1) + 1, _values((HIDDEN, HIDDEN), 4, HIDDEN ** -0.5)


def _rms_norm_linear(eps: float):
    import torch

    class RMSNormLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm_weight = torch.nn.Parameter(torch.from_numpy(NORM_WEIGHT))
            self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
            with torch.no_grad():
                self.proj.weight.copy_(torch.from_numpy(PROJECTION))

        def forward(self, x):
            normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.norm_weight
            return self.proj(normed)

    return RMSNormLinear().eval(), (torch.from_numpy(_values((ROWS, HIDDEN), 0, 1.0)),)


def rms_norm():
    return _rms_norm_linear(1e-6)


def rms_norm_wide_eps():
    return _rms_norm_linear(1e-2)


def fused_rms_norm():
    import paddle

    class FusedRMSNormLinear(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.norm_weight = self.create_parameter([HIDDEN], default_initializer=paddle.nn.initializer.Assign(NORM_WEIGHT))
            self.proj = paddle.nn.Linear(HIDDEN, HIDDEN, bias_attr=False)
            self.proj.weight.set_value(PROJECTION.T)

        def forward(self, x):
            normed = paddle.incubate.nn.functional.fused_rms_norm(x, self.norm_weight, None, 1e-6, 1)[0]
            return self.proj(normed)

    return FusedRMSNormLinear().eval(), (paddle.to_tensor(_values((ROWS, HIDDEN), 0, 1.0)),)
