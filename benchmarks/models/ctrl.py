"""A CTRL-sized pre-LN transformer, the size seed 000 compared: Hugging Face GPT-2 code with d_model 1280,
d_ff 8192, 16 heads, 64 tokens (batch 1), vocabulary 256, `BISECTR_CTRL_LAYERS` layers (default 48:
1.3e9 parameters, 5.3 GB of float32 per side). All dropouts 0, eval, `use_cache=False`.

Both sides hold the same weights, drawn per parameter from a generator seeded by its name (so neither
side's build needs the other's model): weights 0.02 * N(0, 1), biases 0.1 * N(0, 1), norm scales
1 + 0.1 * N(0, 1).

- `reference()`: `transformers.GPT2Model`, tanh GELU ("gelu_new", GPT-2's) in every layer.
- `candidate()`: the same model with the exact GELU in layer `planted_layer()` (`h.N.mlp.act`), on the device
  `BISECTR_CTRL_DEVICE` names (default `cpu`; `cuda` for the GPU) in the dtype `BISECTR_CTRL_DTYPE` names
  (default `float32`; `bfloat16` for the bfloat16 port of a float32 reference).
- `candidate_paddle()`: a PaddlePaddle port of it (paddle `Linear` stores the weight as HF's `Conv1D`
  does, (in, out): weights converted as stored), the exact GELU in the same layer.

For `bisectr train`: AdamW (learning rate 1e-4, weight decay 0.01) on each side.

bisectr should conclude: `divergent`, culprit in layer `planted_layer()`'s MLP activation.
"""
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models"))
from _hf import hide_broken_torchcodec  # noqa: E402

LAYERS = int(os.environ.get("BISECTR_CTRL_LAYERS", "48"))
D, FFN, HEADS, TOKENS, VOCAB = 1280, 8192, 16, 64, 256


def planted_layer() -> int:
    return LAYERS // 2


def _value(name: str, shape: tuple[int, ...]) -> np.ndarray:
    noise = np.random.default_rng(zlib.crc32(name.encode())).standard_normal(shape, dtype=np.float32)
    if name.endswith("bias"):
        return 0.1 * noise
    if ".ln_" in name or name.startswith("ln_f"):
        return 1 + 0.1 * noise
    return 0.02 * noise


def _input_ids() -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCAB, size=(1, TOKENS))


def _torch_model(exact_gelu_layer: int | None, device: str = "cpu", dtype: str = "float32"):
    hide_broken_torchcodec()
    import torch
    from transformers import GPT2Config, GPT2Model
    from transformers.activations import ACT2FN

    config = GPT2Config(n_embd=D, n_inner=FFN, n_head=HEADS, n_layer=LAYERS, n_positions=TOKENS, vocab_size=VOCAB,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                        bos_token_id=0, eos_token_id=0)
    model = GPT2Model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(_value(name, tuple(p.shape))))
    if exact_gelu_layer is not None:
        model.h[exact_gelu_layer].mlp.act = ACT2FN["gelu"]
    model = model.to(device=device, dtype=getattr(torch, dtype))
    return model, {"input_ids": torch.from_numpy(_input_ids()).to(device), "use_cache": False}


def reference():
    return _torch_model(None)


def candidate():
    return _torch_model(planted_layer(), os.environ.get("BISECTR_CTRL_DEVICE", "cpu"),
                        os.environ.get("BISECTR_CTRL_DTYPE", "float32"))


def candidate_paddle():
    import paddle
    import paddle.nn.functional as F
    from paddle import nn

    class Attention(nn.Layer):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (t.reshape([b, s, HEADS, D // HEADS]).transpose([0, 2, 1, 3])
                       for t in paddle.split(self.c_attn(x), 3, axis=-1))
            scores = paddle.matmul(q, k, transpose_y=True) / float(D // HEADS) ** 0.5
            causal = paddle.tril(paddle.ones([s, s], dtype="bool"))
            scores = paddle.where(causal, scores, paddle.full_like(scores, float(np.finfo(np.float32).min)))
            a = paddle.matmul(F.softmax(scores, axis=-1), v)
            return self.c_proj(a.transpose([0, 2, 1, 3]).reshape([b, s, D]))

    class MLP(nn.Layer):
        def __init__(self, exact: bool):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(D, FFN), nn.Linear(FFN, D)
            self.exact = exact

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate=not self.exact))

    class Block(nn.Layer):
        def __init__(self, index: int):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(D, epsilon=1e-5), Attention()
            self.ln_2, self.mlp = nn.LayerNorm(D, epsilon=1e-5), MLP(exact=index == planted_layer())

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2(nn.Layer):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(TOKENS, D)
            self.h = nn.LayerList([Block(i) for i in range(LAYERS)])
            self.ln_f = nn.LayerNorm(D, epsilon=1e-5)

        def forward(self, input_ids):
            x = self.wte(input_ids) + self.wpe(paddle.arange(input_ids.shape[1]))
            for block in self.h:
                x = block(x)
            return {"last_hidden_state": self.ln_f(x)}

    model = GPT2()
    for name, p in model.named_parameters():
        p.set_value(_value(name, tuple(p.shape)))
    model.eval()
    return model, {"input_ids": paddle.to_tensor(_input_ids())}


def reference_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)


candidate_optimizer = reference_optimizer


def candidate_paddle_optimizer(model):
    import paddle

    return paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters(), weight_decay=0.01)
