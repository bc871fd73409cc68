"""`transformer_encoder.py`'s pair with each side a plain function calling the model (the model file
contract allows any callable): module paths must still come from the model object, with layer
indices (`layers.1.linear1`), as when the model is given directly.

`reference()` / `candidate()` / `candidate_gelu_layer()`: a lambda wrapping the torch / paddle
`nn.TransformerEncoder` of `transformer_encoder.py` (same weights, same inputs).
`reference_two_models()`: a function calling the encoder, then a separate `nn.Linear` head: the
first model called is the root (unprefixed paths), the head a second root (paths prefixed `Linear`).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_encoder as encoder  # noqa: E402


def reference():
    model, inputs = encoder.reference()
    return (lambda x: model(x)), inputs


def candidate():
    model, inputs = encoder.candidate()
    return (lambda x: model(x)), inputs


def candidate_gelu_layer():
    model, inputs = encoder.candidate_gelu_layer()
    return (lambda x: model(x)), inputs


def reference_two_models():
    import torch

    model, inputs = encoder.reference()
    torch.manual_seed(1)
    head = torch.nn.Linear(encoder.D, 3).eval()

    def forward(x):
        return head(model(x))

    return forward, inputs
