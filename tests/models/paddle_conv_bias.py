"""A small paddle CNN against a hand-written torch port of it, same weights.

Reference (paddle): `conv1` Conv2D(3, 8, 3) with bias, `relu`, `conv2` Conv2D(8, 8, 3) with bias,
`pool` AdaptiveAvgPool2D(1), `flatten`, `fc` Linear(8, 4); seeded, conv biases set non-zero (paddle
initialises them to zero), eval, input (1, 3, 16, 16). Candidate (torch): the same layers under the
same names (`nn.Conv2d` with bias, ...), weights copied with `bisectr.weights.paddle_to_torch` (conv
weights are (out, in, kh, kw) on both sides; `fc.weight` is transposed by layer type).
`candidate_wrong_bias()` copies `conv2.bias` negated (line marked `# @bias`).

Measured here: logits (magnitude 2.1) differ by 4.8e-07 (2.3e-07 relative); with
`candidate_wrong_bias()`, by 2.4 (1.2 relative).

Note: paddle's `conv2d` adds its bias as separate ops (`conv2d`, `reshape`, `add`), torch's
`conv2d` takes the bias inside, so the bias-free paddle `conv2d` must not be paired 1:1 with torch's.

bisectr should conclude: `noise` (or `match`) for `candidate()`; `divergent` for
`candidate_wrong_bias()`, culprit the `conv2d` of `conv2` (or its bias, the leaf `conv2.bias`).
"""
import numpy as np


def _inputs():
    return np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)


def _paddle_model():
    import paddle
    from paddle import nn

    class CNN(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv1, self.relu, self.conv2 = nn.Conv2D(3, 8, 3), nn.ReLU(), nn.Conv2D(8, 8, 3)
            self.pool, self.flatten, self.fc = nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.flatten(self.pool(self.conv2(self.relu(self.conv1(x))))))

    paddle.seed(0)
    model = CNN()
    rng = np.random.default_rng(0)
    for conv in (model.conv1, model.conv2):
        conv.bias.set_value((0.5 * rng.standard_normal(8)).astype(np.float32))
    model.eval()
    return model


def reference():
    import paddle

    return _paddle_model(), (paddle.to_tensor(_inputs()),)


def candidate(negate_conv2_bias: bool = False):
    import torch
    from torch import nn

    from bisectr.weights import paddle_to_torch

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.relu, self.conv2 = nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)
            self.pool, self.flatten, self.fc = nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.flatten(self.pool(self.conv2(self.relu(self.conv1(x))))))

    model = CNN()
    paddle_to_torch(_paddle_model(), model).check()
    if negate_conv2_bias:
        with torch.no_grad():
            model.conv2.bias.neg_()  # @bias
    return model.eval(), (torch.from_numpy(_inputs()),)


def candidate_wrong_bias():
    """The port with the second conv's bias copied negated."""
    return candidate(negate_conv2_bias=True)
