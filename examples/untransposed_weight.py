"""A PaddlePaddle port whose weight conversion forgets to transpose one square q_proj.

torch `nn.Linear` stores its weight as (out, in), paddle `nn.Linear` as (in, out). Conversion
scripts that decide "transpose if the shape does not fit" copy every square matrix untransposed;
the model still loads and runs, and its outputs are merely "somewhat off". (DESIGN.md: a tiny
Hugging Face Llama vs PaddleFormers' Llama with an untransposed q_proj differ by 6.2 at
magnitude 4.)

Reference (torch): a Llama-like causal LM (`_torch_blocks.DecoderLM` with RMSNorm, 4 pre-norm
blocks, dim 64, q/k projections scaled x4 so attention is as peaked as in a trained model).
Candidate: the paddle port; weights copied with `bisectr.weights.torch_to_paddle`
and `transpose_overrides={"blocks.1.attn.q_proj.weight": False}`, i.e. everything is transposed
correctly except that one (64, 64) matrix. `candidate_fixed()` transposes it too.

Measured here: logits differ by 2.3 at magnitude 5.6 (0.41 relative); with `candidate_fixed()`,
by 3e-6 (5.4e-7 relative).

bisectr should conclude: verdict `divergent`; culprit the `linear` of `blocks.1.attn.q_proj` (or
the leaf `blocks.1.attn.q_proj.weight` it reads): the first op whose local error is semantic.
Everything before block 1's attention matches to rounding.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import paddle_port, paddle_side, token_ids, torch_model, torch_side  # noqa: E402

CONFIG = dict(vocab=64, dim=64, heads=4, hidden=256, layers=4, style="llama")
TRAINED_SCALE = {"q_proj.weight": 4.0, "k_proj.weight": 4.0, "lm_head.weight": 3.0}
FORGOTTEN = "blocks.1.attn.q_proj.weight"


def build_torch():
    return torch_model("DecoderLM", CONFIG, TRAINED_SCALE)


def input_ids():
    return token_ids(CONFIG["vocab"], batch=2, length=16)


def reference():
    return torch_side(build_torch(), input_ids())


def candidate(forgotten: str | None = FORGOTTEN):
    overrides = {forgotten: False} if forgotten else {}
    model = paddle_port("DecoderLM", CONFIG, build_torch(), transpose_overrides=overrides)
    return paddle_side(model, input_ids())


def candidate_fixed():
    """The same port with every Linear weight transposed."""
    return candidate(forgotten=None)
