"""Seed 004's span head (`examples/span_head.py`, a correct paddle port) trained 20 steps with AdamW,
as seed 004 did by hand ("反向对齐精度（20轮loss）2.0e-3"): the span logits (magnitude ~1.6e3) scaled
to ~1 and compared with fixed random targets (mean squared error), torch `AdamW` against paddle
`AdamW` with the same settings.

`candidate_cross_entropy` uses each framework's own cross-entropy instead. At these logits the
reference's `F.cross_entropy` gives 803 where paddle's gives 62 for the same values (paddle's
kernel takes the log of a softmax that underflows, torch's a log-softmax): a semantic difference
in the loss functions, not in the models.
"""
import os
import sys

import numpy as np

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
sys.path.insert(0, os.path.abspath(EXAMPLES))
from span_head import candidate, reference  # noqa: E402,F401

LR, DECAY, SCALE = 5e-4, 0.01, 1e-3
TARGETS = np.random.RandomState(4).normal(size=(2, 32, 32)).astype("float32")
POSITIONS = np.random.RandomState(4).randint(0, 32, size=2 * 32)


def reference_loss(outputs):
    import torch

    return sum(((logits * SCALE - torch.from_numpy(TARGETS).to(logits.dtype)) ** 2).mean() for logits in outputs)


def candidate_loss(outputs):
    import paddle

    return sum(((logits * SCALE - paddle.to_tensor(TARGETS, dtype=logits.dtype)) ** 2).mean() for logits in outputs)


def reference_cross_entropy():
    return reference()


def reference_cross_entropy_loss(outputs):
    import torch
    import torch.nn.functional as F

    targets = torch.from_numpy(POSITIONS)
    return sum(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets) for logits in outputs)


def candidate_cross_entropy():
    return candidate()


def candidate_cross_entropy_loss(outputs):
    import paddle
    import paddle.nn.functional as F

    targets = paddle.to_tensor(POSITIONS)
    return sum(F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), targets) for logits in outputs)


def reference_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)


def candidate_optimizer(model):
    import paddle

    return paddle.optimizer.AdamW(learning_rate=LR, parameters=model.parameters(), weight_decay=DECAY)
