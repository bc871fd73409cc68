"""Torch building blocks shared by the examples (the paddle ports are in `_paddle_blocks.py`).

Everything is written from explicit ops (`nn.Linear`, `nn.LayerNorm`, `F.softmax`, `F.gelu`,
`torch.matmul`) rather than fused modules such as `nn.TransformerEncoderLayer`, the way a
reference implementation in a model zoo reads. Attribute names match `_paddle_blocks.py` one for
one, so `bisectr.weights` copies weights between the two by name. Framework-free helpers (inputs,
the position table) are in `_blocks.py`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from _blocks import sinusoidal_table


class RMSNorm(nn.Module):
    """Llama-style RMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """"layer" -> nn.LayerNorm, "rms" -> RMSNorm."""
    return nn.LayerNorm(dim, eps=eps) if kind == "layer" else RMSNorm(dim, eps)


class Attention(nn.Module):
    """Multi-head self-attention: q/k/v projections, q.k^T / sqrt(d_head), mask, softmax, out_proj.

    `mask` is a bool tensor broadcastable to (batch, heads, query, key), True where attending.
    `masking="add"` adds `mask_value` at masked scores (CTRL adds -1e4); `"fill"` overwrites them
    with `masked_fill` (BERT-style code often fills -1e9).
    """

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
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, mask=None):
        batch, length, dim = x.shape
        q = self.split_heads(self.q_proj(x))
        k = self.split_heads(self.k_proj(x))
        v = self.split_heads(self.v_proj(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if mask is not None:
            if self.masking == "add":
                scores = scores + (1.0 - mask.to(scores.dtype)) * self.mask_value
            else:
                scores = scores.masked_fill(~mask, self.mask_value)
        probs = F.softmax(scores, dim=-1)
        context = torch.matmul(probs, v).transpose(1, 2).reshape(batch, length, dim)
        return self.out_proj(context)


class FeedForward(nn.Module):
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
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.relu(h)
        return self.fc2(h)


class EncoderLayer(nn.Module):
    """BERT-style post-LN layer: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, dim: int, heads: int, hidden: int, eps: float = 1e-12, **attention):
        super().__init__()
        self.attn = Attention(dim, heads, **attention)
        self.attn_norm = nn.LayerNorm(dim, eps=eps)
        self.ffn = FeedForward(dim, hidden)
        self.ffn_norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x, mask=None):
        x = self.attn_norm(x + self.attn(x, mask))
        return self.ffn_norm(x + self.ffn(x))


class PreLNBlock(nn.Module):
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


class Encoder(nn.Module):
    """Token + position embeddings, LayerNorm, post-LN `EncoderLayer`s; padding mask from ids != 0."""

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int, max_len: int = 128,
                 eps: float = 1e-12, **attention):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(max_len, dim)
        self.embed_norm = nn.LayerNorm(dim, eps=eps)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, hidden, eps, **attention) for _ in range(layers))

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1])
        x = self.embed_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        mask = (input_ids != 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x


class SpanHead(nn.Module):
    """Bilinear start/end span scorer: logits = (query_reps @ classifier) @ reps^T (seed 004)."""

    def __init__(self, dim: int):
        super().__init__()
        self.query_start = nn.Linear(dim, dim)
        self.query_end = nn.Linear(dim, dim)
        self.start = nn.Linear(dim, dim)
        self.end = nn.Linear(dim, dim)
        self.start_classifier = nn.Parameter(torch.empty(dim, dim).normal_(0.0, dim ** -0.5))
        self.end_classifier = nn.Parameter(torch.empty(dim, dim).normal_(0.0, dim ** -0.5))

    def forward(self, hidden):
        query_start_reps, query_end_reps = self.query_start(hidden), self.query_end(hidden)
        start_reps, end_reps = self.start(hidden), self.end(hidden)
        temp = torch.matmul(query_start_reps, self.start_classifier)
        start_logits = torch.matmul(temp, start_reps.transpose(1, 2))
        temp = torch.matmul(query_end_reps, self.end_classifier)
        end_logits = torch.matmul(temp, end_reps.transpose(1, 2))
        return start_logits, end_logits


class SpanModel(nn.Module):
    """`Encoder` + `SpanHead`: (start_logits, end_logits), each (batch, length, length)."""

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int):
        super().__init__()
        self.encoder = Encoder(vocab, dim, heads, hidden, layers)
        self.span_head = SpanHead(dim)

    def forward(self, input_ids):
        return self.span_head(self.encoder(input_ids))


class DecoderLM(nn.Module):
    """Causal LM of pre-norm blocks with the causal mask added as -1e4 before softmax.

    `style="ctrl"`: embedding * sqrt(dim) + sinusoidal positions, LayerNorm (CTRL).
    `style="llama"`: plain embedding, no absolute positions (Llama's rotary embedding is left
    out), RMSNorm.
    """

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int, style: str = "ctrl",
                 eps: float = 1e-6, max_len: int = 128):
        super().__init__()
        self.dim, self.style = dim, style
        norm = "layer" if style == "ctrl" else "rms"
        self.embed = nn.Embedding(vocab, dim)
        if style == "ctrl":
            self.register_buffer("positions", torch.from_numpy(sinusoidal_table(max_len, dim)))
        self.blocks = nn.ModuleList(PreLNBlock(dim, heads, hidden, norm, eps) for _ in range(layers))
        self.final_norm = make_norm(norm, dim, eps)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, input_ids):
        length = input_ids.shape[1]
        x = self.embed(input_ids)
        if self.style == "ctrl":
            x = x * math.sqrt(self.dim) + self.positions[:length]
        causal = torch.triu(torch.ones(length, length), diagonal=1) == 0
        for block in self.blocks:
            x = block(x, causal)
        return self.lm_head(self.final_norm(x))


class PreLNStack(nn.Module):
    """`PreLNBlock`s on hidden states (no embedding, no head): `causal` masks as `DecoderLM` does,
    `final_norm` adds a last LayerNorm. Used by the benchmarks."""

    def __init__(self, dim: int, heads: int, hidden: int, layers: int, *, causal: bool = True,
                 final_norm: bool = True, eps: float = 1e-6):
        super().__init__()
        self.causal = causal
        self.layers = nn.ModuleList(PreLNBlock(dim, heads, hidden, eps=eps) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim, eps=eps) if final_norm else None

    def forward(self, x):
        length = x.shape[1]
        mask = (torch.triu(torch.ones(length, length), diagonal=1) == 0) if self.causal else None
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.final_norm is None else self.final_norm(x)


def scale_parameters(model: nn.Module, factors: dict[str, float]) -> nn.Module:
    """Multiply every parameter whose dotted name ends with a key of `factors` by its value.

    Used to give randomly initialised models "trained-scale" weights: larger projections and
    LayerNorm gains, so hidden states reach ~10-50 the way they do in real checkpoints.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            for suffix, factor in factors.items():
                if name.endswith(suffix):
                    param.mul_(factor)
    return model


class ReformerLocalAttention(nn.Module):
    """Hugging Face Reformer's causal `LocalSelfAttention`: queries in chunks of `chunk` tokens
    attend to their own chunk and the one before; masked scores are replaced by -1e9; softmax is
    written as exp(dots - logsumexp(dots)). `dense` is `ReformerSelfOutput` (no biases anywhere)."""

    def __init__(self, dim: int, heads: int, head_dim: int, chunk: int):
        super().__init__()
        self.heads, self.head_dim, self.chunk = heads, head_dim, chunk
        self.query = nn.Linear(dim, heads * head_dim, bias=False)
        self.key = nn.Linear(dim, heads * head_dim, bias=False)
        self.value = nn.Linear(dim, heads * head_dim, bias=False)
        self.dense = nn.Linear(heads * head_dim, dim, bias=False)

    def split_heads(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def split_chunks(self, x):
        return x.reshape(x.shape[0], x.shape[1], -1, self.chunk, *x.shape[3:])

    @staticmethod
    def look_back(x):
        """Concatenate each chunk with the previous one (chunk 0 gets the last, masked out)."""
        previous = torch.cat([x[:, :, -1:], x[:, :, :-1]], dim=2)
        return torch.cat([previous, x], dim=3)

    def forward(self, hidden):
        batch, length, _ = hidden.shape
        query = self.split_heads(self.query(hidden))
        key = self.split_heads(self.key(hidden))
        value = self.split_heads(self.value(hidden))
        key = key / torch.sqrt(torch.tensor(self.head_dim, dtype=key.dtype))
        indices = torch.arange(length).repeat(batch, self.heads, 1)
        query, query_indices = self.split_chunks(query), self.split_chunks(indices)
        key, value = self.look_back(self.split_chunks(key)), self.look_back(self.split_chunks(value))
        key_indices = self.look_back(self.split_chunks(indices))
        dots = torch.matmul(query, key.transpose(-1, -2))
        mask = torch.ge(query_indices.unsqueeze(-1), key_indices.unsqueeze(-2))
        dots = torch.where(mask, dots, torch.tensor(-1e9, dtype=dots.dtype))
        logits = torch.logsumexp(dots, dim=-1, keepdim=True)
        probs = torch.exp(dots - logits)
        out = torch.matmul(probs, value).reshape(batch, self.heads, length, self.head_dim)
        return self.dense(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class ReformerLayer(nn.Module):
    """Reversible Reformer layer: attn_out = prev_attn_out + attn(LN(h)); h = h + ffn(LN(attn_out))."""

    def __init__(self, dim: int, heads: int, head_dim: int, hidden: int, chunk: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim, eps=1e-12)
        self.attention = ReformerLocalAttention(dim, heads, head_dim, chunk)
        self.ffn_norm = nn.LayerNorm(dim, eps=1e-12)
        self.ffn_dense = nn.Linear(dim, hidden)
        self.ffn_output = nn.Linear(hidden, dim)

    def forward(self, prev_attn_output, hidden_states):
        attn_output = prev_attn_output + self.attention(self.attention_norm(hidden_states))
        ffn = self.ffn_output(F.relu(self.ffn_dense(self.ffn_norm(attn_output))))
        return attn_output, hidden_states + ffn


class ReformerModel(nn.Module):
    """Embedding -> reversible `ReformerLayer`s on two streams -> LayerNorm of both streams
    concatenated (2 * dim). Reformer's axial position embeddings are left out."""

    def __init__(self, vocab: int, dim: int, heads: int, head_dim: int, hidden: int, layers: int, chunk: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(ReformerLayer(dim, heads, head_dim, hidden, chunk) for _ in range(layers))
        self.final_norm = nn.LayerNorm(2 * dim, eps=1e-12)

    def forward(self, input_ids):
        attn_output = hidden_states = self.embed(input_ids)
        for layer in self.layers:
            attn_output, hidden_states = layer(attn_output, hidden_states)
        return self.final_norm(torch.cat([attn_output, hidden_states], dim=-1))
