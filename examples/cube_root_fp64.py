"""A float64 comparison where paddle's `x ** (1/3)` is only float32-accurate.

Reproduces seed 002: porting CTRL, the author switched both sides to float64 to rule out
rounding and still saw differences, from a python-float constant that paddle applied in lower
precision (there `x / np.sqrt(80)`, fixed in paddle 3.3.1), and suspected the sinusoidal position
table. In paddle 3.3.1 the same mechanism remains for `x ** (1/3)`: the python-float exponent is
kept as a float32 attribute, so the float64 result is off by ~5e-9 relative where torch is off
by ~2e-16 (measured here against numpy's cbrt).

Both sides, float64: a sinusoidal position table built inside forward in each framework's own
idiom (torch: `1 / torch.pow(10000, 2 * (i // 2) / dim)`; paddle, as in seed 002:
`10000.0 ** (-2 * indices / dim)` and a matmul), added to the input, then `abs(h) ** (1/3)`,
then a linear layer (weights copied with `bisectr.weights.torch_to_paddle`). The two position
tables agree to ~1e-14, float64 rounding: a red herring.

Measured here: outputs differ by 1.5e-8 at magnitude 1.5 (1.0e-8 relative). The pow output is
off from the exact cube root (numpy `cbrt` of the same float64 input) by 1.4e-8 relative in
paddle and 1.4e-16 in torch: float32(1/3) - 1/3 = 9.9e-9, and h ** (1/3 + d) = h ** (1/3) *
(1 + d ln h). The two position tables agree to 1.8e-15.

bisectr should conclude: verdict `divergent`; culprit the `pow` (`h.abs() ** (1 / 3)` in
`CubeRoot.forward`): its candidate result is ~1e7x further from the float64 oracle than torch's,
which is not rounding at the precision being compared. The position table is not blamed.
"""

DIM, LENGTH = 32, 64


def inputs():
    import numpy as np

    return np.random.RandomState(0).normal(size=(2, LENGTH, DIM))


def torch_model():
    import torch
    from torch import nn

    class CubeRoot(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(DIM, DIM)

        def forward(self, x):
            length, dim = x.shape[1], x.shape[2]
            position = torch.arange(length, dtype=x.dtype).unsqueeze(1)
            i = torch.arange(dim, dtype=x.dtype).unsqueeze(0)
            angles = position * (1 / torch.pow(10000, (2 * (i // 2)) / dim))
            table = torch.cat([torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])], dim=-1)
            h = x + table
            return self.proj(h.abs() ** (1 / 3))

    torch.manual_seed(0)
    return CubeRoot().double().eval()


def reference():
    import torch

    return torch_model(), (torch.from_numpy(inputs()),)


def candidate():
    import paddle
    from paddle import nn

    from bisectr.weights import torch_to_paddle

    class CubeRoot(nn.Layer):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(DIM, DIM)

        def forward(self, x):
            length, dim = x.shape[1], x.shape[2]
            position = paddle.arange(0, length, dtype=x.dtype).unsqueeze(1)
            indices = paddle.arange(0, dim // 2, dtype=x.dtype).unsqueeze(0)
            angles = paddle.matmul(position, 10000.0 ** (-2 * indices / dim))
            table = paddle.concat([paddle.sin(angles), paddle.cos(angles)], axis=-1)
            h = x + table
            return self.proj(h.abs() ** (1 / 3))

    model = CubeRoot()
    model.to(dtype="float64")
    torch_to_paddle(torch_model(), model).check()
    model.eval()
    return model, (paddle.to_tensor(inputs()),)
