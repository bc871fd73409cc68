"""A small Inception-style torch CNN against a hand-written paddle port whose pooling branch drops the padding.

Reference (torch): `Conv2d_1a_3x3` Conv2d(3, 16, 3, padding=1) + ReLU, then three instances of ONE block
class `InceptionBlock`, named `Mixed_5b` (16 -> 32 channels), `Mixed_5c` and `Mixed_5d` (32 -> 32), each
the concatenation of three ReLU'd branches: `branch1x1` (1x1 conv, 8 channels), `branch3x3` (3x3 conv,
16 channels) and `branch_pool` (`F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)`, then a 1x1 conv,
8 channels); then a global average pool and `fc` Linear(32, 10). Seeded: conv weights N(0, 2 / fan_in)
(activations stay O(1)), biases 0.1 N(0, 1); eval; input (1, 3, 32, 32).
Candidate (paddle): the same network under the same module names, weights copied with
`bisectr.weights.torch_to_paddle` (conv weights are (out, in, kh, kw) on both sides; `fc.weight` is
transposed by layer type). In `candidate()` the block pools with `exclusive=False` (torch's default
`count_include_pad=True`: a border window is divided by 9 although some of its 9 cells are padding).
`candidate_exclusive()` builds the block with paddle's default `exclusive=True` (the line marked
`# @pool`), which divides a border window by its in-image cells only (6 on an edge, 4 in a corner): the
bug sits in the class, so it enters at `Mixed_5b`'s pool (`Mixed_5b`, before `Mixed_5b.branch_pool`)
and recurs in `Mixed_5c` and `Mixed_5d`. Only border pixels change (124 of the 1024 per channel).

Measured here: logits (magnitude 1.4) differ by 4.8e-07 (3.3e-07 relative) for `candidate()`; with
`candidate_exclusive()`, by 0.052 (3.7e-02 relative).

bisectr should conclude: `noise` (or `match`) for `candidate()`; `divergent` for `candidate_exclusive()`,
culprit the `avg_pool2d` of `Mixed_5b` (the first of the block's three pools).
"""
import numpy as np

BLOCKS = ("Mixed_5b", "Mixed_5c", "Mixed_5d")
STEM, WIDTH, CLASSES = 16, 32, 10  # a block's output: 8 (1x1) + 16 (3x3) + 8 (pool) channels


def _inputs():
    return np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)


def _torch_model():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class InceptionBlock(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.branch1x1 = nn.Conv2d(channels, 8, 1)
            self.branch3x3 = nn.Conv2d(channels, 16, 3, padding=1)
            self.branch_pool = nn.Conv2d(channels, 8, 1)

        def forward(self, x):
            pooled = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)
            branches = [self.branch1x1(x), self.branch3x3(x), self.branch_pool(pooled)]
            return F.relu(torch.cat(branches, dim=1))

    class InceptionNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.Conv2d_1a_3x3 = nn.Conv2d(3, STEM, 3, padding=1)
            self.Mixed_5b = InceptionBlock(STEM)
            self.Mixed_5c = InceptionBlock(WIDTH)
            self.Mixed_5d = InceptionBlock(WIDTH)
            self.fc = nn.Linear(WIDTH, CLASSES)

        def forward(self, x):
            x = F.relu(self.Conv2d_1a_3x3(x))
            x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    model = InceptionNet()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.normal_(0, (2 / fan_in) ** 0.5)
                module.bias.normal_(0, 0.1)
    return model.eval()


def reference():
    import torch

    return _torch_model(), (torch.from_numpy(_inputs()),)


def candidate(exclusive: bool = False):
    import paddle
    import paddle.nn.functional as F
    from paddle import nn

    from bisectr.weights import torch_to_paddle

    class InceptionBlock(nn.Layer):
        def __init__(self, channels):
            super().__init__()
            self.branch1x1 = nn.Conv2D(channels, 8, 1)
            self.branch3x3 = nn.Conv2D(channels, 16, 3, padding=1)
            self.branch_pool = nn.Conv2D(channels, 8, 1)

        def forward(self, x):
            if exclusive:
                pooled = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)  # @pool
            else:
                pooled = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, exclusive=False)
            branches = [self.branch1x1(x), self.branch3x3(x), self.branch_pool(pooled)]
            return F.relu(paddle.concat(branches, axis=1))

    class InceptionNet(nn.Layer):
        def __init__(self):
            super().__init__()
            self.Conv2d_1a_3x3 = nn.Conv2D(3, STEM, 3, padding=1)
            self.Mixed_5b = InceptionBlock(STEM)
            self.Mixed_5c = InceptionBlock(WIDTH)
            self.Mixed_5d = InceptionBlock(WIDTH)
            self.fc = nn.Linear(WIDTH, CLASSES)

        def forward(self, x):
            x = F.relu(self.Conv2d_1a_3x3(x))
            x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
            return self.fc(paddle.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    model = InceptionNet()
    torch_to_paddle(_torch_model(), model).check()
    model.eval()
    return model, (paddle.to_tensor(_inputs()),)


def candidate_exclusive():
    """The port whose block pools with paddle's default `exclusive=True`: every block's pool branch."""
    return candidate(exclusive=True)
