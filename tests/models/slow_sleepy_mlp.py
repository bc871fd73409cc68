"""A residual MLP that sleeps in its forward: a trace that takes seconds, for the kill tests
(tests/test_run_kills.py), and stores more than a megabyte of tensors (the disk-full test).

Environment: `SLOW_LAYERS` (default 6) residual blocks of width `SLOW_WIDTH` (default 256);
each block's forward sleeps `SLOW_SECONDS` (default 0.1) in plain Python, no framework op.
Each block reads one value back (`float(h.abs().max())`), so the recorded calls cannot stand in
for the model: the search re-runs the model's own code, sleeps included.

The candidate's last block uses the tanh GELU: verdict `divergent` (exit 1), culprit that `gelu`.
Changing `SLOW_LAYERS` changes the op count, so traces of two settings are told apart.
"""
import os
import time


def _settings() -> tuple[int, int, float]:
    return (int(os.environ.get("SLOW_LAYERS", "6")), int(os.environ.get("SLOW_WIDTH", "256")),
            float(os.environ.get("SLOW_SECONDS", "0.1")))


def _model(tanh_last: bool):
    import torch

    layers, width, delay = _settings()
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, approximate: str):
            super().__init__()
            self.fc = torch.nn.Linear(width, width)
            self.approximate = approximate

        def forward(self, x):
            time.sleep(delay)
            h = self.fc(torch.nn.functional.gelu(x, approximate=self.approximate))
            if float(h.abs().max()) > 1e30:  # a value read: re-runs execute this code again
                h = h * 0.0
            return x + h

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                Block("tanh" if tanh_last and i == layers - 1 else "none") for i in range(layers))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    return Stack().eval(), (torch.randn(16, width),)


def reference():
    return _model(tanh_last=False)


def candidate():
    return _model(tanh_last=True)
