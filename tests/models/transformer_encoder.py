"""torch's `nn.TransformerEncoder` against paddle's `nn.TransformerEncoder`, same weights.

Reference (torch): `TransformerEncoder(TransformerEncoderLayer(32, 4, 64, dropout=0, batch_first=True,
norm_first=False, activation="relu"), 2)`, seeded, non-zero biases, eval, input (2, 8, 32).
Candidate (paddle): `TransformerEncoder(TransformerEncoderLayer(32, 4, 64, dropout=0,
normalize_before=False), 2)`, weights moved by hand: both sides name their parameters
`layers.N.{self_attn.out_proj, linear1, linear2, norm1, norm2}.{weight, bias}`, except that torch
stacks q/k/v as `self_attn.in_proj_weight` (3*32, 32) / `in_proj_bias` (96,), which are split into
paddle's `self_attn.{q,k,v}_proj`; every linear weight is transposed ((out, in) -> (in, out)).
`candidate_gelu_layer()` makes layer 1's FFN activation `F.gelu` instead of `F.relu` (paddle's layer
calls `self.activation`; line marked `# @gelu`). (A wrong norm epsilon was the first idea, but paddle's
LayerNorm refuses epsilon > 1e-3, and 1e-3 against 1e-5 moves the outputs by only 4.0e-04 relative.)

Measured here: outputs (magnitude 3.5) differ by 7.2e-07 (2.0e-07 relative); with
`candidate_gelu_layer()`, by 0.21 (6.1e-02 relative).

bisectr should conclude: `noise` (or `match`) for `candidate()`; `divergent` for
`candidate_gelu_layer()`, culprit the activation of layer 1's FFN (`gelu` against `relu`, module
`layers.1`, between `layers.1.linear1` and `layers.1.linear2`).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _weights import draw_biases_and_norms  # noqa: E402

D, HEADS, FFN, SEQ, BATCH, LAYERS = 32, 4, 64, 8, 2, 2


def _inputs():
    return np.random.default_rng(1).standard_normal((BATCH, SEQ, D)).astype(np.float32)


def _torch_model():
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, FFN, dropout=0.0, activation="relu", batch_first=True,
                                             norm_first=False)
    return draw_biases_and_norms(torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False))


def reference():
    import torch

    return _torch_model(), (torch.from_numpy(_inputs()),)


def candidate(gelu_layer: int | None = None):
    import paddle

    layer = paddle.nn.TransformerEncoderLayer(D, HEADS, FFN, dropout=0.0, activation="relu", normalize_before=False)
    model = paddle.nn.TransformerEncoder(layer, LAYERS)
    src = {name: p.detach().numpy() for name, p in _torch_model().state_dict().items()}
    dst = dict(model.named_parameters())
    for i in range(LAYERS):
        pre = f"layers.{i}."
        weight, bias = src.pop(pre + "self_attn.in_proj_weight"), src.pop(pre + "self_attn.in_proj_bias")
        for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            dst[pre + f"self_attn.{proj}.weight"].set_value(weight[j * D:(j + 1) * D].T.copy())
            dst[pre + f"self_attn.{proj}.bias"].set_value(bias[j * D:(j + 1) * D])
    for name, value in src.items():  # the rest has the same names; linear weights go (out, in) -> (in, out)
        linear = name.endswith("weight") and ("linear" in name or "out_proj" in name)
        dst[name].set_value(value.T.copy() if linear else value)
    assert set(dst) == set(src) | {f"layers.{i}.self_attn.{p}_proj.{w}" for i in range(LAYERS) for p in "qkv"
                                   for w in ("weight", "bias")}
    if gelu_layer is not None:
        model.layers[gelu_layer].activation = paddle.nn.functional.gelu  # @gelu
    model.eval()
    return model, (paddle.to_tensor(_inputs()),)


def candidate_gelu_layer():
    """The port with GELU instead of ReLU in the feed-forward of the second layer."""
    return candidate(gelu_layer=1)
