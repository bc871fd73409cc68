"""Padding masks written two ways: masked_fill(-1e9) in the reference, "+ (1 - mask) * -1e4" in the port.

Both are correct. After softmax, exp(-1e4 - max) and exp(-1e9 - max) are both exactly 0.0 in
float32, so the masked positions get probability 0 on both sides and the outputs differ only by
rounding. The masked scores themselves differ enormously (-1e9 vs score - 1e4): a tool that
blames the first large difference blames the mask (seed 000 worried about exactly this: "adding
the large negative number raised the max error from 4.6e-5 to 9.8e-4").

Reference (torch): token/position embeddings + 2 post-LN encoder layers, scores masked with
`scores.masked_fill(~mask, -1e9)`. Candidate: the paddle port (weights copied by
`bisectr.weights.torch_to_paddle`) with `scores + (1.0 - mask) * -1e4`. The second sequence
has 8 padding tokens; no row is fully masked.

Measured here: hidden states differ by 7.2e-7 at magnitude 4.2 (1.7e-7 relative); the masked
scores differ by ~1e9.

bisectr should conclude: verdict `noise` (never `divergent`), and not name the mask: the
difference in the masked scores does not reach the outputs.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import paddle_port, paddle_side, token_ids, torch_model, torch_side  # noqa: E402

CONFIG = dict(vocab=100, dim=64, heads=4, hidden=256, layers=2)


def input_ids():
    return token_ids(CONFIG["vocab"], batch=2, length=24, padded_from=16)


def build_torch():
    return torch_model("Encoder", dict(CONFIG, masking="fill", mask_value=-1e9))


def reference():
    return torch_side(build_torch(), input_ids())


def candidate():
    model = paddle_port("Encoder", dict(CONFIG, masking="add", mask_value=-1e4), build_torch())
    return paddle_side(model, input_ids())
