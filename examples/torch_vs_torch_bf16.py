"""One framework, two precisions: the same torch model in float32 and under bfloat16 autocast.

Reference: a CTRL-like causal LM (`_torch_blocks.DecoderLM`, 4 pre-LN blocks, dim 64) in float32.
Candidate: the very same weights, run under `torch.autocast("cpu", dtype=torch.bfloat16)`:
every linear and matmul returns bfloat16 (8 bits of mantissa, ~4e-3 relative rounding), and so
do the ops that consume them inside attention (scale, mask add, softmax) and the MLP (GELU); the
residual stream and LayerNorm stay float32 (float32 + bfloat16 promotes). The candidate casts its
logits back to float32.

Measured here: logits differ by 7.4e-3 at magnitude 2.0 (3.7e-3 relative).

bisectr should conclude: verdict `noise`. Every bf16 op is judged against the float64 oracle
with bfloat16's own noise floor (the coarsest dtype the op touches): each is as accurate as
bfloat16 allows, so the difference is rounding the user chose, not a bug. The culprit is the op
that amplifies that rounding the most. Both sides are torch, with identical module paths and op
sequences, so the alignment is one to one.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import token_ids, torch_model, torch_side  # noqa: E402

CONFIG = dict(vocab=64, dim=64, heads=4, hidden=256, layers=4)


def input_ids():
    return token_ids(CONFIG["vocab"], batch=2, length=16)


def reference():
    return torch_side(torch_model("DecoderLM", CONFIG), input_ids())


def candidate():
    import torch
    from _torch_blocks import DecoderLM

    class AutocastDecoderLM(DecoderLM):
        def forward(self, input_ids):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = super().forward(input_ids)
            return logits.float()

    torch.manual_seed(0)
    return torch_side(AutocastDecoderLM(**CONFIG).eval(), input_ids())
