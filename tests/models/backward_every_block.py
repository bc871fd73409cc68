"""`backward_ports.py`'s pre-norm MLP stack with the wrong-backward GELU in EVERY block, not just one.

Reference: `backward_ports.reference()` (torch, three blocks `x = x + fc2(gelu(fc1(norm(x))))` and a
head, inputs (4, 8, 16)). The candidates compute the same forward, bit for bit or to rounding; their
backward differs in every block, first at `blocks.0`:

- `torch_function_every_block()`: torch against torch; every block's GELU (`blocks.N`, first
  `blocks.0`) is `backward_ports.torch_model`'s `WrongGeluGrad` `autograd.Function` (switched on by
  the blocks' own `custom` flag on the line tagged `every`), whose forward is exact `gelu` and whose
  backward uses the tanh approximation's derivative. The call site bisectr names is therefore
  `backward_ports.py`'s `h = WrongGeluGrad.apply(h) if self.custom else ...` line, not this file.
- `candidate_pylayer_every_block()`: torch reference against `backward_ports`' paddle port (weights
  by `bisectr.weights.torch_to_paddle`) whose `Block` class applies the paddle `PyLayer` with the
  same wrong backward in every block.
- `candidate()`: the correct paddle port (`backward_ports.candidate`), for comparison.

Measured here (CPU, float32, output gradient `default_rng(1).normal` of the output's shape;
relative = max abs difference / max abs of the reference), outputs of magnitude 1.6:

- `torch_function_every_block()`: outputs bit-identical; gradients differ: the input's by 8.8e-05
  (7.7e-05 relative), `blocks.0.fc1.weight`'s by 4.1e-04 (2.2e-04), `blocks.1.fc1.weight`'s by
  3.7e-04 (1.9e-04), `blocks.2.fc1.weight`'s by 3.9e-04 (3.1e-04), `blocks.2.fc2.weight`'s and
  `head.weight`'s by 0. The gradient at each block's `fc1` output (GELU's input gradient) by
  1.7e-04 (4.3e-04 relative) in block 0, 1.3e-04 (2.5e-04) in block 1, 1.2e-04 (2.7e-04) in block 2.
- `candidate_pylayer_every_block()`: outputs differ by 2.4e-07 (1.5e-07 relative, rounding);
  gradients as above to within 1e-6 (`blocks.2.fc2.weight`'s and `head.weight`'s at rounding,
  9e-08 and 1e-07 relative).
- `candidate()`: outputs by 2.4e-07, every gradient at rounding (<= 2.5e-07 relative).

bisectr should conclude: forward `match` (torch) / `noise` (paddle); backward `divergent`, culprit a
block's GELU backward (first in forward order `blocks.0`, op 2; first to run in the backward pass
`blocks.2`, op 12), the same difference recurring in the other two blocks (ops 7 and 12, or 2 and 7):
patching one block's GELU gradient leaves the others' error, so only all three together confirm.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_ports import (  # noqa: E402,F401
    _inputs, _paddle_side, candidate, reference, torch_model)


def torch_function_every_block():
    """Torch, same weights; every block's GELU is the `autograd.Function` with the tanh derivative."""
    import torch

    model = torch_model()
    for block in model.blocks:
        block.custom = True  # @every
    return model, (torch.from_numpy(_inputs()),)


def candidate_pylayer_every_block():
    """Paddle port, same weights; every block's GELU is a `PyLayer` with the tanh derivative."""
    return _paddle_side("pylayer_every_block")
