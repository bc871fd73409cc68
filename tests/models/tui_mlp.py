"""A tiny torch-vs-torch model for the TUI tests: four Linear+GELU blocks and a head.

Both sides are the same torch model with the same weights, except that the candidate's
`blocks.2` uses the tanh approximation of GELU (differs from the exact GELU by up to ~5e-4).
Deterministic and fast (a few dozen ops). Lines marked `# @name` are looked up by the tests.
"""
import numpy as np

DIM, BLOCKS, BATCH, TANH_BLOCK = 16, 4, 3, 2


def _model(tanh_block=None):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, approximate):
            super().__init__()
            self.fc = nn.Linear(DIM, DIM)
            self.approximate = approximate

        def forward(self, x):
            h = self.fc(x)  # @fc
            h = F.gelu(h, approximate=self.approximate)  # @gelu
            return x + h  # @residual

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block("tanh" if i == tanh_block else "none") for i in range(BLOCKS))
            self.head = nn.Linear(DIM, 4)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)  # @block
            return self.head(x)  # @head

    rng = np.random.default_rng(7)
    model = Net()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 3.0 / np.sqrt(DIM) if name.endswith("weight") else 0.1
            param.copy_(torch.from_numpy((scale * rng.standard_normal(tuple(param.shape))).astype(np.float32)))
    model.eval()
    inputs = torch.from_numpy(rng.standard_normal((BATCH, DIM)).astype(np.float32))
    return model, (inputs,)


def reference():
    return _model()


def candidate():
    return _model(tanh_block=TANH_BLOCK)
