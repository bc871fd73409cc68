"""PaddlePaddle ports of the blocks in `_torch_blocks.py`, written the way a port is written.

Same class and attribute names as the torch file, so `bisectr.weights` pairs the weights by name;
the code uses paddle idioms (`paddle.matmul(..., transpose_y=True)`, `paddle.transpose(perm=...)`,
`reshape([...])`, `axis=`). Each class is a correct port unless an example changes a setting.
"""
from __future__ import annotations

import math

import paddle
import paddle.nn.functional as F
from paddle import nn

from _blocks import sinusoidal_table


class RMSNorm(nn.Layer):
    """Llama-style RMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter([dim], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * paddle.rsqrt(variance + self.eps) * self.weight


def make_norm(kind: str, dim: int, eps: float) -> nn.Layer:
    """"layer" -> nn.LayerNorm, "rms" -> RMSNorm."""
    return nn.LayerNorm(dim, epsilon=eps) if kind == "layer" else RMSNorm(dim, eps)


class Attention(nn.Layer):
    """Port of `_torch_blocks.Attention` (same `mask`, `mask_value` and `masking` meaning)."""

    def __init__(self, dim: int, heads: int, mask_value: float = -1e4, masking: str = "add"):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.mask_value, self.masking = mask_value, masking
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
            if self.masking == "add":
                scores = scores + (1.0 - mask.astype(scores.dtype)) * self.mask_value
            else:
                scores = paddle.masked_fill(scores, ~mask, self.mask_value)
        probs = F.softmax(scores, axis=-1)
        context = paddle.transpose(paddle.matmul(probs, v), perm=[0, 2, 1, 3]).reshape([batch, length, dim])
        return self.out_proj(context)


class FeedForward(nn.Layer):
    """fc1 -> activation -> fc2; activation is "gelu" (exact erf), "gelu_tanh" or "relu"."""

    def __init__(self, dim: int, hidden: int, activation: str = "gelu"):
        super().__init__()
        self.activation = activation
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.fc1(x)
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate=True)
        else:
            h = F.relu(h)
        return self.fc2(h)


class EncoderLayer(nn.Layer):
    """BERT-style post-LN layer: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, dim: int, heads: int, hidden: int, eps: float = 1e-12, **attention):
        super().__init__()
        self.attn = Attention(dim, heads, **attention)
        self.attn_norm = nn.LayerNorm(dim, epsilon=eps)
        self.ffn = FeedForward(dim, hidden)
        self.ffn_norm = nn.LayerNorm(dim, epsilon=eps)

    def forward(self, x, mask=None):
        x = self.attn_norm(x + self.attn(x, mask))
        return self.ffn_norm(x + self.ffn(x))


class PreLNBlock(nn.Layer):
    """CTRL/GPT/Llama-style pre-norm block: x = x + attn(norm(x)); x = x + ffn(norm(x))."""

    def __init__(self, dim: int, heads: int, hidden: int, norm: str = "layer", eps: float = 1e-6,
                 activation: str = "gelu"):
        super().__init__()
        self.attn_norm = make_norm(norm, dim, eps)
        self.attn = Attention(dim, heads)
        self.ffn_norm = make_norm(norm, dim, eps)
        self.ffn = FeedForward(dim, hidden, activation)

    def forward(self, x, mask=None):
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.ffn(self.ffn_norm(x))


class Encoder(nn.Layer):
    """Token + position embeddings, LayerNorm, post-LN `EncoderLayer`s; padding mask from ids != 0."""

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int, max_len: int = 128,
                 eps: float = 1e-12, **attention):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(max_len, dim)
        self.embed_norm = nn.LayerNorm(dim, epsilon=eps)
        self.layers = nn.LayerList([EncoderLayer(dim, heads, hidden, eps, **attention) for _ in range(layers)])

    def forward(self, input_ids):
        positions = paddle.arange(input_ids.shape[1])
        x = self.embed_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        mask = (input_ids != 0).unsqueeze([1, 2])
        for layer in self.layers:
            x = layer(x, mask)
        return x


class SpanHead(nn.Layer):
    """Bilinear start/end span scorer, as ported in seed 004."""

    def __init__(self, dim: int):
        super().__init__()
        self.query_start = nn.Linear(dim, dim)
        self.query_end = nn.Linear(dim, dim)
        self.start = nn.Linear(dim, dim)
        self.end = nn.Linear(dim, dim)
        self.start_classifier = self.create_parameter([dim, dim])
        self.end_classifier = self.create_parameter([dim, dim])

    def forward(self, hidden):
        query_start_reps, query_end_reps = self.query_start(hidden), self.query_end(hidden)
        start_reps, end_reps = self.start(hidden), self.end(hidden)
        temp = paddle.matmul(query_start_reps, self.start_classifier)
        start_reps = paddle.transpose(start_reps, perm=[0, 2, 1])
        start_logits = paddle.matmul(temp, start_reps)
        temp = paddle.matmul(query_end_reps, self.end_classifier)
        end_reps = paddle.transpose(end_reps, perm=[0, 2, 1])
        end_logits = paddle.matmul(temp, end_reps)
        return start_logits, end_logits


class SpanModel(nn.Layer):
    """`Encoder` + `SpanHead`: (start_logits, end_logits), each [batch, length, length]."""

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int):
        super().__init__()
        self.encoder = Encoder(vocab, dim, heads, hidden, layers)
        self.span_head = SpanHead(dim)

    def forward(self, input_ids):
        return self.span_head(self.encoder(input_ids))


class DecoderLM(nn.Layer):
    """Port of `_torch_blocks.DecoderLM` (pre-norm causal LM, `style` "ctrl" or "llama")."""

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int, style: str = "ctrl",
                 eps: float = 1e-6, max_len: int = 128):
        super().__init__()
        self.dim, self.style = dim, style
        norm = "layer" if style == "ctrl" else "rms"
        self.embed = nn.Embedding(vocab, dim)
        if style == "ctrl":
            self.register_buffer("positions", paddle.to_tensor(sinusoidal_table(max_len, dim)))
        self.blocks = nn.LayerList([PreLNBlock(dim, heads, hidden, norm, eps) for _ in range(layers)])
        self.final_norm = make_norm(norm, dim, eps)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, input_ids):
        length = input_ids.shape[1]
        x = self.embed(input_ids)
        if self.style == "ctrl":
            x = x * math.sqrt(self.dim) + self.positions[:length]
        causal = paddle.triu(paddle.ones([length, length]), diagonal=1) == 0
        for block in self.blocks:
            x = block(x, causal)
        return self.lm_head(self.final_norm(x))


class PreLNStack(nn.Layer):
    """Port of `_torch_blocks.PreLNStack` (pre-norm blocks on hidden states)."""

    def __init__(self, dim: int, heads: int, hidden: int, layers: int, *, causal: bool = True,
                 final_norm: bool = True, eps: float = 1e-6):
        super().__init__()
        self.causal = causal
        self.layers = nn.LayerList([PreLNBlock(dim, heads, hidden, eps=eps) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(dim, epsilon=eps) if final_norm else None

    def forward(self, x):
        length = x.shape[1]
        mask = (paddle.triu(paddle.ones([length, length]), diagonal=1) == 0) if self.causal else None
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.final_norm is None else self.final_norm(x)


def scale_parameters(model: nn.Layer, factors: dict[str, float]) -> nn.Layer:
    """Port of `_torch_blocks.scale_parameters`: multiply each parameter whose name ends with a key
    of `factors` by its value."""
    with paddle.no_grad():
        for name, param in model.named_parameters():
            for suffix, factor in factors.items():
                if name.endswith(suffix):
                    param.set_value(param * factor)
    return model


class ReformerLocalAttention(nn.Layer):
    """Port of `_torch_blocks.ReformerLocalAttention`, written like PaddleNLP's Reformer (seed 001)."""

    def __init__(self, dim: int, heads: int, head_dim: int, chunk: int):
        super().__init__()
        self.heads, self.head_dim, self.chunk = heads, head_dim, chunk
        self.query = nn.Linear(dim, heads * head_dim, bias_attr=False)
        self.key = nn.Linear(dim, heads * head_dim, bias_attr=False)
        self.value = nn.Linear(dim, heads * head_dim, bias_attr=False)
        self.dense = nn.Linear(heads * head_dim, dim, bias_attr=False)

    def split_heads(self, x):
        batch, length, _ = x.shape
        return x.reshape([batch, length, self.heads, self.head_dim]).transpose([0, 2, 1, 3])

    def split_chunks(self, x):
        return x.reshape([x.shape[0], x.shape[1], -1, self.chunk, *x.shape[3:]])

    @staticmethod
    def look_back(x):
        previous = paddle.concat([x[:, :, -1:], x[:, :, :-1]], axis=2)
        return paddle.concat([previous, x], axis=3)

    def forward(self, hidden):
        batch, length, _ = hidden.shape
        query = self.split_heads(self.query(hidden))
        key = self.split_heads(self.key(hidden))
        value = self.split_heads(self.value(hidden))
        key = key / paddle.sqrt(paddle.to_tensor(self.head_dim, dtype=key.dtype))
        indices = paddle.tile(paddle.arange(length), repeat_times=[batch, self.heads, 1])
        query, query_indices = self.split_chunks(query), self.split_chunks(indices)
        key, value = self.look_back(self.split_chunks(key)), self.look_back(self.split_chunks(value))
        key_indices = self.look_back(self.split_chunks(indices))
        dots = paddle.matmul(query, key, transpose_y=True)
        mask = paddle.greater_equal(query_indices.unsqueeze(-1), key_indices.unsqueeze(-2))
        dots = paddle.where(mask, dots, paddle.to_tensor(-1e9, dtype=dots.dtype))
        logits = _logsumexp(dots)
        probs = paddle.exp(dots - logits)
        out = paddle.matmul(probs, value).reshape([batch, self.heads, length, self.head_dim])
        return self.dense(out.transpose([0, 2, 1, 3]).reshape([batch, length, self.heads * self.head_dim]))


def _logsumexp(x):
    """logsumexp over the last axis, keepdim; `paddle.logsumexp` takes at most 4-D input, so the
    port flattens the leading axes (PaddleNLP's Reformer has a helper of the same name)."""
    return paddle.logsumexp(x.reshape([-1, x.shape[-1]]), axis=-1, keepdim=True).reshape([*x.shape[:-1], 1])


class ReformerLayer(nn.Layer):
    """Reversible Reformer layer: attn_out = prev_attn_out + attn(LN(h)); h = h + ffn(LN(attn_out))."""

    def __init__(self, dim: int, heads: int, head_dim: int, hidden: int, chunk: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim, epsilon=1e-12)
        self.attention = ReformerLocalAttention(dim, heads, head_dim, chunk)
        self.ffn_norm = nn.LayerNorm(dim, epsilon=1e-12)
        self.ffn_dense = nn.Linear(dim, hidden)
        self.ffn_output = nn.Linear(hidden, dim)

    def forward(self, prev_attn_output, hidden_states):
        attn_output = prev_attn_output + self.attention(self.attention_norm(hidden_states))
        ffn = self.ffn_output(F.relu(self.ffn_dense(self.ffn_norm(attn_output))))
        return attn_output, hidden_states + ffn


class ReformerModel(nn.Layer):
    """Port of `_torch_blocks.ReformerModel`."""

    def __init__(self, vocab: int, dim: int, heads: int, head_dim: int, hidden: int, layers: int, chunk: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.LayerList([ReformerLayer(dim, heads, head_dim, hidden, chunk) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(2 * dim, epsilon=1e-12)

    def forward(self, input_ids):
        attn_output = hidden_states = self.embed(input_ids)
        for layer in self.layers:
            attn_output, hidden_states = layer(attn_output, hidden_states)
        return self.final_norm(paddle.concat([attn_output, hidden_states], axis=-1))
