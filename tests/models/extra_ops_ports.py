"""A small torch language model against a hand-written port of it that runs ops the reference has no partner for.

Reference: token and position embeddings (`embed`, `position`; vocab 64, 16 positions, width 32), three
pre-LN MLP blocks (`blocks.N`: `norm` = `nn.LayerNorm(32)`, `fc1` 32 -> 64, exact GELU, `fc2` 64 -> 32,
residual), a final `nn.LayerNorm` and a `head` 32 -> 64; `torch.manual_seed(0)`, biases 0.1 N(0, 1), norms
1 + 0.1 N(0, 1); eval, input_ids (2, 12) from `default_rng(0)`. Candidate: the same model written with
`torch.nn.functional` calls on its own parameters (`F.embedding`, `F.layer_norm`, `F.linear`, `F.gelu`),
loaded from the reference's state dict.

- `candidate()`: the correct port.
- `candidate_extra_scale()`: block 1's `fc1` output goes through a transpose, a scale by 1.001 and a
  transpose back (three ops the reference lacks; the lines tagged `@extra_scale`).
- `candidate_embedding_normalized()`: the token embedding is multiplied by sqrt(32), as Gemma's is, where
  the reference's is not (one op the reference lacks; the line tagged `@normalizer`).

Measured here (CPU, float32; relative = max abs difference / max abs of the reference), logits of
magnitude 2.1: `candidate()` bit-identical (0), `candidate_extra_scale()` 3.8e-04 (1.9e-04 relative),
`candidate_embedding_normalized()` 1.4 (0.69 relative).

bisectr should conclude: `noise` (or `match`) for `candidate()`; `divergent` for the other two, the ops
without a partner named with their source lines (in `blocks.1` and at the top level) and confirmed by a
re-run that takes their effect out.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _weights import draw_biases_and_norms, loaded_from  # noqa: E402

VOCAB, POSITIONS, D, HIDDEN, BLOCKS = 64, 16, 32, 64, 3
EXTRA_SCALE = 1.001


def _inputs():
    import torch

    return (torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, size=(2, 12))),)


def _reference_model():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.fc1 = nn.Linear(D, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, D)

        def forward(self, x):
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D)
            self.position = nn.Embedding(POSITIONS, D)
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
            self.norm = nn.LayerNorm(D)
            self.head = nn.Linear(D, VOCAB)

        def forward(self, ids):
            x = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    return draw_biases_and_norms(Model())


def reference():
    return _reference_model(), _inputs()


def _port(extra_scale_block: int | None = None, embedding_normalizer: bool = False):
    import torch
    import torch.nn.functional as F
    from torch import nn

    def parameters(*shapes):
        return [nn.Parameter(torch.empty(shape)) for shape in shapes]

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = parameters(D, D)

        def forward(self, x):
            return F.layer_norm(x, (D,), self.weight, self.bias)

    class Linear(nn.Module):
        def __init__(self, fan_in, fan_out):
            super().__init__()
            self.weight, self.bias = parameters((fan_out, fan_in), fan_out)

        def forward(self, x):
            return F.linear(x, self.weight, self.bias)

    class Block(nn.Module):
        def __init__(self, index):
            super().__init__()
            self.norm, self.fc1, self.fc2 = Norm(), Linear(D, HIDDEN), Linear(HIDDEN, D)
            self.extra_scale = index == extra_scale_block

        def forward(self, x):
            h = self.fc1(self.norm(x))
            if self.extra_scale:
                h = h.transpose(1, 2) * EXTRA_SCALE  # @extra_scale
                h = h.transpose(1, 2)  # @extra_scale
            return x + self.fc2(F.gelu(h))

    class Port(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Module()
            self.embed.weight, = parameters((VOCAB, D))
            self.position = nn.Module()
            self.position.weight, = parameters((POSITIONS, D))
            self.blocks = nn.ModuleList(Block(i) for i in range(BLOCKS))
            self.norm, self.head = Norm(), Linear(D, VOCAB)

        def forward(self, ids):
            tokens = F.embedding(ids, self.embed.weight)
            if embedding_normalizer:
                tokens = tokens * math.sqrt(D)  # @normalizer
            x = tokens + F.embedding(torch.arange(ids.shape[1]), self.position.weight)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return loaded_from(Port(), _reference_model())


def candidate():
    return _port(), _inputs()


def candidate_extra_scale():
    return _port(extra_scale_block=1), _inputs()


def candidate_embedding_normalized():
    return _port(embedding_normalizer=True), _inputs()
