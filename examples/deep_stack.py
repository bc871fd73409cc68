"""A correct PaddlePaddle port of a deep CTRL-like pre-LayerNorm causal LM.

Reproduces seeds 000 and 001: a 48-layer CTRL port whose per-layer max difference creeps from
~1e-6 to ~3e-5 with random weights, and reaches 3e-4 on the logits with pretrained weights; the
author suspected paddle's layer_norm, linear, the q.k matmul and the -1e4 mask addition.

Both sides: token embedding * sqrt(dim) + sinusoidal positions, `LAYERS` pre-LN blocks (LayerNorm
-> attention with the causal mask added as -1e4 before softmax -> residual; LayerNorm -> GELU MLP
-> residual), final LayerNorm, LM head; dim 64 so 48 layers stay fast. Reference: torch.
Candidate: the paddle port (`_paddle_blocks.DecoderLM`), weights copied with
`bisectr.weights.torch_to_paddle`.

Measured here (max abs difference at magnitude):
- `reference()` / `candidate()`: random (PyTorch default) initialisation. Hidden states after
  block 1 / 12 / 24 / 48: 1.9e-6, 3.8e-6, 5.7e-6, 9.5e-6 at magnitude ~30; logits 6e-7 at
  magnitude 2.2 (2.7e-7 relative).
- `reference_trained()` / `candidate_trained()`: trained-scale weights (q/k projections x4,
  LayerNorm gains x3, MLP x2, LM head x5). Hidden states after block 1 / 12 / 24 / 48: 1.2e-5,
  6.9e-5, 1.5e-4, 8.4e-4 at magnitude 35..90; logits 3.6e-4 at magnitude 35 (1e-5 relative),
  seed 000's 3e-4.

bisectr should conclude, for both pairs: verdict `noise`: every op's local error is float32
rounding (no op is further from the float64 oracle than torch's), and the growth with depth is
accumulation through 48 residual blocks. The culprit named is the op amplifying rounding most
(a linear/matmul inside a block), not layer_norm or the mask addition: the -1e4 entries that
differ by ~1e-3 become exactly 0 after softmax and must not be blamed.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import paddle_port, paddle_side, token_ids, torch_model, torch_side  # noqa: E402

LAYERS = 48
CONFIG = dict(vocab=64, dim=64, heads=4, hidden=256)
TRAINED_SCALE = {"attn.q_proj.weight": 4.0, "attn.k_proj.weight": 4.0, "norm.weight": 3.0,
                 "fc1.weight": 2.0, "fc2.weight": 2.0, "lm_head.weight": 5.0}


def input_ids():
    return token_ids(CONFIG["vocab"], batch=2, length=16)


def decoder(layers: int, scale: dict | None = None):
    """The torch `DecoderLM` with `layers` blocks, seeded; `scale`: trained-scale factors."""
    return torch_model("DecoderLM", dict(CONFIG, layers=layers), scale)


def port(layers: int, scale: dict | None = None):
    """Its paddle port, weights copied from `decoder(layers, scale)`."""
    return paddle_port("DecoderLM", dict(CONFIG, layers=layers), decoder(layers, scale))


def reference(layers: int = LAYERS):
    return torch_side(decoder(layers), input_ids())


def candidate(layers: int = LAYERS):
    return paddle_side(port(layers), input_ids())


def reference_trained(layers: int = LAYERS):
    return torch_side(decoder(layers, TRAINED_SCALE), input_ids())


def candidate_trained(layers: int = LAYERS):
    return paddle_side(port(layers, TRAINED_SCALE), input_ids())
