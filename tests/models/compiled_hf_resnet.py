"""A tiny Hugging Face ResNet (a torchvision-style conv net: conv, batch norm, ReLU, residual
blocks, pooling) against itself `torch.compile`d (inductor, on the CPU here): correct, the compiled
convolutions and fused norms round differently (`noise`).

Reference: `transformers.ResNetForImageClassification` from a random seeded config (embedding 16,
stages of 16 and 32 channels, one bottleneck block each, 10 classes), its batch norms given running
statistics away from 0 and 1 so that a misapplied one would show, eval; pixel values (2, 3, 32, 32)
from `default_rng(0)`. Candidate: the same model, `torch.compile(model)`.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import hide_broken_torchcodec  # noqa: E402

CONFIG = dict(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck",
              num_labels=10)


def _resnet():
    hide_broken_torchcodec()
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig(**CONFIG))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.copy_(0.1 * torch.randn_like(module.running_mean))
                module.running_var.copy_(1 + 0.2 * torch.rand_like(module.running_var))
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    return model.eval(), {"pixel_values": pixels}


def reference():
    return _resnet()


def candidate():
    import torch

    model, inputs = _resnet()
    return torch.compile(model), inputs
