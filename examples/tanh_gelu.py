"""A PaddlePaddle port where one block uses the tanh approximation of GELU.

A classic porting slip: `paddle.nn.functional.gelu(x, approximate=True)` (or a copied
`gelu_new`) in one place where the reference uses the exact erf GELU. The two differ by at most
4.7e-4 (at |x| ~ 2.7), about 1000x float32 rounding, so the slip hides under "framework noise"
unless someone looks op by op.

Reference (torch): token/position embeddings, then 12 post-LN encoder layers (attention + GELU
MLP, MLP weights scaled x3/x2 so the GELU inputs reach the region where the two formulas differ).
Candidate: the paddle port with weights copied by `bisectr.weights.torch_to_paddle`, except that
`layers.7.ffn` uses `F.gelu(h, approximate=True)`. `candidate_fixed()` is the port without the slip.

Measured here: final hidden states differ by 6.7e-4 at magnitude 3.0 (2.3e-4 relative); the same
port with the exact GELU everywhere differs by 5.0e-6 (1.7e-6 relative).

bisectr should conclude: verdict `divergent`; culprit the `gelu` in `layers.7.ffn` (candidate
source: the `approximate=True` line of `_paddle_blocks.FeedForward.forward`). Its local error
(~5e-4) is far above both frameworks' distance to the float64 oracle; the ops after it only
carry the difference.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _blocks import paddle_port, paddle_side, token_ids, torch_model, torch_side  # noqa: E402

CONFIG = dict(vocab=100, dim=64, heads=4, hidden=256, layers=12)
TRAINED_SCALE = {"fc1.weight": 3.0, "fc2.weight": 2.0}
TANH_LAYER = 7


def input_ids():
    return token_ids(CONFIG["vocab"], batch=2, length=16)


def build_torch():
    return torch_model("Encoder", CONFIG, TRAINED_SCALE)


def reference():
    return torch_side(build_torch(), input_ids())


def candidate(tanh_layer: int | None = TANH_LAYER):
    model = paddle_port("Encoder", CONFIG, build_torch())
    if tanh_layer is not None:
        model.layers[tanh_layer].ffn.activation = "gelu_tanh"  # the bug
    return paddle_side(model, input_ids())


def candidate_fixed():
    """The same port with the exact GELU everywhere."""
    return candidate(tanh_layer=None)
