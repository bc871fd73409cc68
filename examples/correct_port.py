"""The smallest correct torch -> PaddlePaddle port: an MLP with LayerNorm.

Reference (torch) and candidate (paddle) are the same `Sequential`: Linear -> LayerNorm -> GELU
-> Linear -> LayerNorm -> GELU -> Linear; paddle weights are copied from torch with
`bisectr.weights.torch_to_paddle` (the three Linear weights transposed, the LayerNorm
weights/biases not). Nothing is wrong with the port: the two frameworks' kernels round
differently (torch and paddle agree bitwise on only ~10% of matmul and ~23% of layer_norm
outputs), and that is all.

Measured here: outputs differ by 1.8e-7 at magnitude 0.64 (2.8e-7 relative).

bisectr should conclude: verdict `noise` (or `match` under a tolerance such as 1e-5 relative); no
op is further from the float64 oracle than its torch counterpart.
"""

SIZES = (16, 64, 64, 4)  # in, hidden, hidden, out


def inputs():
    import numpy as np

    return np.random.RandomState(0).normal(size=(8, SIZES[0])).astype("float32")


def torch_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    d_in, h1, h2, d_out = SIZES
    return nn.Sequential(nn.Linear(d_in, h1), nn.LayerNorm(h1), nn.GELU(),
                         nn.Linear(h1, h2), nn.LayerNorm(h2), nn.GELU(),
                         nn.Linear(h2, d_out)).eval()


def reference():
    import torch

    return torch_model(), (torch.from_numpy(inputs()),)


def candidate():
    import paddle
    from paddle import nn

    from bisectr.weights import torch_to_paddle

    d_in, h1, h2, d_out = SIZES
    model = nn.Sequential(nn.Linear(d_in, h1), nn.LayerNorm(h1), nn.GELU(),
                          nn.Linear(h1, h2), nn.LayerNorm(h2), nn.GELU(),
                          nn.Linear(h2, d_out))
    torch_to_paddle(torch_model(), model).check()
    model.eval()
    return model, (paddle.to_tensor(inputs()),)
