"""A model left in training mode: dropout changes every run, so re-runs cannot follow the recording."""


def _model():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4))
    return model.train(), (torch.randn(4, 16),)


def reference():
    return _model()


def candidate():
    return _model()
