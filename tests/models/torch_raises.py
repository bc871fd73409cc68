"""The candidate model raises inside its forward."""


def reference():
    import torch

    return torch.nn.Linear(4, 4), (torch.ones(2, 4),)


def candidate():
    import torch

    class Broken(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            return y.reshape(3, 5)  # cannot reshape 8 values into 3x5

    return Broken(), (torch.ones(2, 4),)
