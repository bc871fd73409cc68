"""A 2-layer transformer encoder with a bilinear span head (seed 004's shape), small dims.

`reference()` and `candidate()` are the same Paddle model with the same weights;
`torch_reference()` is a PyTorch port with the weights copied (Linear weights
transposed); `raising()` is a Paddle model whose forward raises midway.
Lines marked `# @name` are looked up by the tests to check source attribution.
"""
import numpy as np

D, HEADS, FF, SEQ, BATCH, QUERIES = 32, 4, 64, 8, 2, 4


def _weights():
    """Deterministic weights, keyed by the Paddle parameter names (Paddle layout: Linear is [in, out])."""
    rng = np.random.default_rng(4)
    weights = {}

    def linear(name, fan_in, fan_out):
        weights[f"{name}.weight"] = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        weights[f"{name}.bias"] = (0.1 * rng.standard_normal(fan_out)).astype(np.float32)

    def norm(name):
        weights[f"{name}.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        weights[f"{name}.bias"] = (0.1 * rng.standard_normal(D)).astype(np.float32)

    for i in range(2):
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear(f"layers.{i}.attn.{proj}", D, D)
        norm(f"layers.{i}.norm1")
        linear(f"layers.{i}.ff1", D, FF)
        linear(f"layers.{i}.ff2", FF, D)
        norm(f"layers.{i}.norm2")
    linear("proj", D, D)
    weights["classifier"] = (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)
    weights["logit_bias"] = (0.1 * rng.standard_normal(SEQ)).astype(np.float32)
    inputs = rng.standard_normal((BATCH, SEQ, D)).astype(np.float32)
    return weights, inputs


def _paddle_model(raise_in_forward=False):
    import paddle
    import paddle.nn as nn
    import paddle.nn.functional as F

    class EncoderLayer(nn.Layer):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiHeadAttention(D, HEADS)
            self.norm1 = nn.LayerNorm(D)
            self.ff1 = nn.Linear(D, FF)
            self.act = nn.GELU()
            self.ff2 = nn.Linear(FF, D)
            self.norm2 = nn.LayerNorm(D)

        def forward(self, x):
            h = self.attn(x, x, x)  # @attn
            x = x + h  # @res1
            x = self.norm1(x)  # @norm1
            h = self.ff2(self.act(self.ff1(x)))  # @ff
            if raise_in_forward:
                raise ValueError("the model gave up halfway")
            x = x + h  # @res2
            return self.norm2(x)  # @norm2

    class SpanModel(nn.Layer):
        def __init__(self):
            super().__init__()
            self.layers = nn.LayerList([EncoderLayer() for _ in range(2)])
            self.proj = nn.Linear(D, D)
            self.classifier = self.create_parameter([D, D])
            self.register_buffer("logit_bias", paddle.zeros([SEQ]))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)  # @layer
            reps = self.proj(x)  # @proj
            reps = F.gelu(reps)  # @gelu
            query_reps = reps[:, :QUERIES, :]  # @queries
            temp = paddle.matmul(query_reps, self.classifier)  # @bilinear1
            logits = paddle.matmul(temp, paddle.transpose(reps, perm=[0, 2, 1]))  # @bilinear2
            logits.add_(self.logit_bias)  # @bias
            logits[:, :, 0] = -5.0  # @mask
            probs = F.softmax(logits, axis=-1)  # @softmax
            return {"logits": logits, "probs": probs}

    weights, inputs = _weights()
    model = SpanModel()
    state = model.state_dict()
    for name, value in weights.items():
        state[name].set_value(value)
    model.eval()
    return model, (paddle.to_tensor(inputs),)


def _torch_model():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class EncoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(D, D) for _ in range(4))
            self.norm1 = nn.LayerNorm(D)
            self.ff1 = nn.Linear(D, FF)
            self.ff2 = nn.Linear(FF, D)
            self.norm2 = nn.LayerNorm(D)

        def forward(self, x):
            b, s, _ = x.shape
            heads = lambda t: t.reshape(b, s, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
            q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
            weights = F.softmax((q * (D // HEADS) ** -0.5) @ k.transpose(-1, -2), dim=-1)
            h = self.out_proj((weights @ v).transpose(1, 2).reshape(b, s, D))
            x = self.norm1(x + h)
            x = self.norm2(x + self.ff2(F.gelu(self.ff1(x))))
            return x

    class SpanModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([EncoderLayer() for _ in range(2)])
            self.proj = nn.Linear(D, D)
            self.classifier = nn.Parameter(torch.zeros(D, D))
            self.register_buffer("logit_bias", torch.zeros(SEQ))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            reps = F.gelu(self.proj(x))
            temp = torch.matmul(reps[:, :QUERIES, :], self.classifier)
            logits = torch.matmul(temp, reps.transpose(1, 2))
            logits.add_(self.logit_bias)
            logits[:, :, 0] = -5.0
            return {"logits": logits, "probs": F.softmax(logits, dim=-1)}

    weights, inputs = _weights()
    model = SpanModel()
    state = model.state_dict()
    for name, value in weights.items():
        torch_name = name.replace(".attn.", ".")
        is_linear_weight = name.endswith(".weight") and value.ndim == 2
        state[torch_name].copy_(torch.from_numpy(value.T.copy() if is_linear_weight else value))
    model.eval()
    return model, (torch.from_numpy(inputs),)


def reference():
    return _paddle_model()


def candidate():
    return _paddle_model()


def torch_reference():
    return _torch_model()


def raising():
    return _paddle_model(raise_in_forward=True)
