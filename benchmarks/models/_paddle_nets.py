"""PaddlePaddle twins of `_torch_nets.py` (same class and attribute names), written in paddle idioms."""
from __future__ import annotations

import math

import paddle
import paddle.nn.functional as F
from paddle import nn


class Attention(nn.Layer):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def split_heads(self, x):
        batch, length, _ = x.shape
        return paddle.transpose(x.reshape([batch, length, self.heads, self.head_dim]), perm=[0, 2, 1, 3])

    def forward(self, x, mask=None):
        batch, length, dim = x.shape
        q = self.split_heads(self.q_proj(x))
        k = self.split_heads(self.k_proj(x))
        v = self.split_heads(self.v_proj(x))
        scores = paddle.matmul(q, k, transpose_y=True) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + (1.0 - mask.astype(scores.dtype)) * -1e4
        probs = F.softmax(scores, axis=-1)
        context = paddle.transpose(paddle.matmul(probs, v), perm=[0, 2, 1, 3]).reshape([batch, length, dim])
        return self.out_proj(context)


class FeedForward(nn.Layer):
    def __init__(self, dim: int, hidden: int, tanh_gelu: bool = False):
        super().__init__()
        self.tanh_gelu = tanh_gelu
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.fc1(x)
        h = F.gelu(h, approximate=True) if self.tanh_gelu else F.gelu(h)
        return self.fc2(h)


class EncoderLayer(nn.Layer):
    def __init__(self, dim: int, heads: int, hidden: int, tanh_gelu: bool = False):
        super().__init__()
        self.attn = Attention(dim, heads)
        self.attn_norm = nn.LayerNorm(dim, epsilon=1e-12)
        self.ffn = FeedForward(dim, hidden, tanh_gelu)
        self.ffn_norm = nn.LayerNorm(dim, epsilon=1e-12)

    def forward(self, x, mask=None):
        x = self.attn_norm(x + self.attn(x, mask))
        return self.ffn_norm(x + self.ffn(x))


class Encoder(nn.Layer):
    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int, max_len: int,
                 tanh_layer: int | None = None):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(max_len, dim)
        self.embed_norm = nn.LayerNorm(dim, epsilon=1e-12)
        self.layers = nn.LayerList([EncoderLayer(dim, heads, hidden, i == tanh_layer) for i in range(layers)])

    def forward(self, input_ids):
        positions = paddle.arange(input_ids.shape[1])
        x = self.embed_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        mask = (input_ids != 0).unsqueeze([1, 2])
        for layer in self.layers:
            x = layer(x, mask)
        return x


class PreLNBlock(nn.Layer):
    def __init__(self, dim: int, heads: int, hidden: int, tanh_gelu: bool = False):
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim, epsilon=1e-6)
        self.attn = Attention(dim, heads)
        self.ffn_norm = nn.LayerNorm(dim, epsilon=1e-6)
        self.ffn = FeedForward(dim, hidden, tanh_gelu)

    def forward(self, x, mask=None):
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.ffn(self.ffn_norm(x))


class PreLNStack(nn.Layer):
    def __init__(self, dim: int, heads: int, hidden: int, layers: int, causal: bool = True,
                 final_norm: bool = True, tanh_layer: int | None = None):
        super().__init__()
        self.causal = causal
        self.layers = nn.LayerList([PreLNBlock(dim, heads, hidden, i == tanh_layer) for i in range(layers)])
        self.final_norm = nn.LayerNorm(dim, epsilon=1e-6) if final_norm else None

    def forward(self, x):
        mask = None
        if self.causal:
            length = x.shape[1]
            mask = paddle.triu(paddle.ones([length, length]), diagonal=1) == 0
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x) if self.final_norm is not None else x


def scale_ffn(model: nn.Layer, factor: float = 3.0) -> nn.Layer:
    with paddle.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("fc1.weight"):
                param.set_value(param * factor)
    return model
