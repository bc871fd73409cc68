"""Outputs of different shapes: the candidate returns the reference's [2, 4] output transposed
(a layout the values confirm), or reshaped to [4, 2] (no layout of the values fits)."""


def _weights():
    import torch

    torch.manual_seed(0)
    return torch.randn(8, 4), torch.randn(2, 8)


def reference():
    weight, x = _weights()
    return (lambda x: x @ weight), (x,)


def candidate_transposed():
    weight, x = _weights()
    return (lambda x: (x @ weight).T), (x,)


def candidate_reshaped():
    weight, x = _weights()
    return (lambda x: (x @ weight).reshape(4, 2)), (x,)
