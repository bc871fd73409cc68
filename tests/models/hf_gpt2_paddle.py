"""A tiny Hugging Face GPT-2 LM (torch) against a hand-written PaddlePaddle port of it, same weights.

Reference: `transformers.GPT2LMHeadModel` from a random seeded config (4 layers, n_embd 64, 4 heads,
vocab 128, n_positions 32, eager attention, all dropouts 0, bos/eos token 0 so that
transformers does not warn about the vocabulary, `lm_head` tied to `transformer.wte`: 52
distinct parameters), non-zero biases and norm affines, eval, input_ids (2, 16), `use_cache=False`;
its output is a `CausalLMOutputWithCrossAttentions` with `logits` (2, 16, 128).
Candidate (paddle): GPT-2 written out under HF's parameter names (`transformer.wte`,
`transformer.wpe`, `transformer.h.N.ln_1`, `transformer.h.N.attn.{c_attn,c_proj}` with `c_attn` ONE
fused Linear 64 -> 192 split into q/k/v after the matmul, `transformer.h.N.ln_2`,
`transformer.h.N.mlp.{c_fc,c_proj}`, `transformer.ln_f`), `paddle.nn.Linear` in place of HF's
`Conv1D`: both store the weight as (in, out), so every weight is copied as stored (numpy from the
torch tensors, `set_value`). Attention written out (matmul, scale 1/sqrt(16), causal mask by
`paddle.where` with float32's lowest value, softmax, matmul), GELU by `F.gelu(approximate=True)`
(HF's "gelu_new" is the tanh formula); logits by `paddle.matmul(h, wte.weight, transpose_y=True)`
(tied: no `lm_head` parameter). Returns `{"logits": logits}`, which pairs with HF's `logits`.

`candidate()`: the correct port. `candidate_frozen_c_fc()`: the correct port with
`transformer.h.2.mlp.c_fc.weight.stop_gradient = True` (line marked `# @frozen`): the forward is
identical, the parameter's gradient is missing. `candidate_pylayer_ln_2()`: the correct port with
block 2's `ln_2` a `FusedLayerNorm` computed by a `PyLayer` (the forward written out, the same
values up to rounding) whose backward drops the variance term (line marked `# @dropped`).
`candidate_bias_and_pylayer()`: that `PyLayer`, and block 0's `mlp.c_proj.bias` left at zeros
(line marked `# @bias`): a forward difference before a backward one.

Measured here: logits (magnitude 0.51) differ by 1.8e-07 (3.5e-07 relative) for `candidate()`, and
by the same for `candidate_frozen_c_fc()` (its forward is the same computation); in float64 on both
sides (bisectr's float64 check), by 9.9e-12 (relative).

bisectr should conclude: `noise` forward and backward (`--backward`) for `candidate()`;
`candidate_frozen_c_fc()` is `noise` forward and `divergent` backward, culprit the leaf
`transformer.h.2.mlp.c_fc.weight` (its gradient is missing on the candidate side);
`candidate_pylayer_ln_2()` is `noise` forward and `divergent` backward, culprit the `PyLayer` in
`transformer.h.2.ln_2`, confirmed; `candidate_bias_and_pylayer()` is `divergent` forward, culprit the
leaf `transformer.h.0.mlp.c_proj.bias`, and `divergent` backward on the reference's activations,
culprit the `PyLayer`.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import seeded_gpt2  # noqa: E402

CONFIG = dict(vocab_size=128, n_positions=32, n_embd=64, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, attn_implementation="eager", bos_token_id=0, eos_token_id=0)
D = CONFIG["n_embd"]
HEADS = CONFIG["n_head"]


def _inputs():
    return np.random.default_rng(0).integers(0, CONFIG["vocab_size"], size=(2, 16))


def _gpt2():
    return seeded_gpt2("GPT2LMHeadModel", CONFIG)


def reference():
    import torch

    return _gpt2(), {"input_ids": torch.from_numpy(_inputs()), "use_cache": False}


def _port(pylayer_ln_2_layer: int = -1):
    import paddle
    import paddle.nn.functional as F
    from paddle import nn
    from paddle.autograd import PyLayer

    class Attention(nn.Layer):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

        def heads(self, t):
            b, s, _ = t.shape
            return t.reshape([b, s, HEADS, D // HEADS]).transpose([0, 2, 1, 3])

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (self.heads(t) for t in paddle.split(self.c_attn(x), 3, axis=-1))
            scores = paddle.matmul(q, k, transpose_y=True) / float(D // HEADS) ** 0.5
            causal = paddle.tril(paddle.ones([s, s], dtype="bool"))
            scores = paddle.where(causal, scores, paddle.full_like(scores, float(np.finfo(np.float32).min)))
            a = paddle.matmul(F.softmax(scores, axis=-1), v)
            return self.c_proj(a.transpose([0, 2, 1, 3]).reshape([b, s, D]))

    class MLP(nn.Layer):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate=True))

    class LayerNormFunction(PyLayer):
        """LayerNorm with its backward written out, the variance term dropped (`# @dropped`)."""

        @staticmethod
        def forward(ctx, x, weight, bias):
            mean = x.mean(-1, keepdim=True)
            rstd = paddle.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5)
            normed = (x - mean) * rstd
            ctx.save_for_backward(normed, weight, rstd)
            return normed * weight + bias

        @staticmethod
        def backward(ctx, grad):
            normed, weight, rstd = ctx.saved_tensor()
            wg = grad * weight
            grad_x = rstd * (wg - wg.mean(-1, keepdim=True))  # @dropped
            flat = [-1, normed.shape[-1]]
            return grad_x, (grad * normed).reshape(flat).sum(0), grad.reshape(flat).sum(0)

    class FusedLayerNorm(nn.LayerNorm):
        def forward(self, x):
            return LayerNormFunction.apply(x, self.weight, self.bias)

    class Block(nn.Layer):
        def __init__(self, index: int):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(D, epsilon=1e-5), Attention()
            fused = index == pylayer_ln_2_layer
            self.ln_2, self.mlp = (FusedLayerNorm if fused else nn.LayerNorm)(D, epsilon=1e-5), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Transformer(nn.Layer):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(CONFIG["vocab_size"], D), nn.Embedding(CONFIG["n_positions"], D)
            self.h = nn.LayerList([Block(i) for i in range(CONFIG["n_layer"])])
            self.ln_f = nn.LayerNorm(D, epsilon=1e-5)

        def forward(self, input_ids):
            x = self.wte(input_ids) + self.wpe(paddle.arange(input_ids.shape[1]))
            for block in self.h:
                x = block(x)
            return self.ln_f(x)

    class GPT2LM(nn.Layer):
        def __init__(self):
            super().__init__()
            self.transformer = Transformer()

        def forward(self, input_ids):
            h = self.transformer(input_ids)
            return {"logits": paddle.matmul(h, self.transformer.wte.weight, transpose_y=True)}  # tied head

    return GPT2LM()


def candidate(frozen: bool = False, pylayer_ln_2_layer: int = -1, bias_not_copied: bool = False):
    import paddle

    paddle.seed(0)
    reference_params = dict(_gpt2().named_parameters())  # tied lm_head.weight appears once, as wte
    model = _port(pylayer_ln_2_layer)
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(reference_params), sorted(set(params) ^ set(reference_params))
    for name, p in params.items():
        value = reference_params[name].detach().numpy()  # Conv1D (in, out) == paddle Linear (in, out)
        assert list(p.shape) == list(value.shape), (name, p.shape, value.shape)
        p.set_value(value)
    if frozen:
        model.transformer.h[2].mlp.c_fc.weight.stop_gradient = True  # @frozen
    if bias_not_copied:
        model.transformer.h[0].mlp.c_proj.bias.set_value(np.zeros(D, dtype="float32"))  # @bias
    model.eval()
    return model, {"input_ids": paddle.to_tensor(_inputs())}


def candidate_frozen_c_fc():
    """The correct port with block 2's `mlp.c_fc.weight` frozen (stop_gradient): no gradient for it."""
    return candidate(frozen=True)


def candidate_pylayer_ln_2():
    """The correct port with block 2's `ln_2` a `PyLayer` whose backward drops the variance term."""
    return candidate(pylayer_ln_2_layer=2)


def candidate_bias_and_pylayer():
    """Two bugs: block 0's `mlp.c_proj.bias` left at zeros (a forward difference) and the `PyLayer`
    of `candidate_pylayer_ln_2()` in block 2 (a backward one)."""
    return candidate(pylayer_ln_2_layer=2, bias_not_copied=True)
