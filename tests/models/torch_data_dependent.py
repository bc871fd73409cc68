"""Data-dependent control flow: a patched value changes which ops run."""


def _model():
    import torch

    def forward(x):
        y = x * 2
        if float(y.sum()) > 0:
            return y.exp()
        return y.tanh() + 1

    return forward, (torch.ones(4),)


def reference():
    return _model()


def candidate():
    return _model()
