"""Falcon (multi-query, parallel attention/MLP block, rotary) -- hand port to PyTorch, with planted mistakes.

Reference
---------
``reference()`` builds ``transformers.FalconForCausalLM`` from a tiny ``FalconConfig``: vocab 128, hidden 64,
3 layers, 4 heads (head_dim 16), ``multi_query=True`` (one key/value head), ``parallel_attn=True``,
``new_decoder_architecture=False``, ``alibi=False`` (rotary, theta 10000), ``bias=True``, ffn 256, exact GELU,
LayerNorm eps 1e-5, tied input/output embeddings, eager attention.  After ``torch.manual_seed(0)`` the weights are
redrawn at trained-model scale: projection weights N(0, 1/fan_in), biases 0.1 N(0,1), LayerNorm weights
1 + 0.1 N(0,1), LayerNorm biases 0.1 N(0,1), embeddings N(0,1) (so the tied lm_head gives logits of O(10)).
Inputs: ``input_ids`` of shape (2, 12) from ``numpy.random.default_rng(0)``, ``use_cache=False``; the output
compared is ``logits``.

Port
----
``candidate()`` is a hand-written PyTorch port with its own module tree::

    FalconPort
      embed        nn.Embedding
      rope         RotaryTable   -- cos/sin tables computed once per forward at model level
      blocks.<i>   ParallelBlock
        norm       Norm          -- LayerNorm written out by hand (gain / shift)
        attn       MQAttention   -- separate q / k / v / out projections
          q, k, v, out   nn.Linear
        mlp        GeluMLP       -- up, down (nn.Linear), exact GELU
      head         LMHead        -- norm (final LayerNorm) + proj (vocab projection, untied copy)

Structural choices: the fused ``query_key_value`` is split by the converter into separate ``q`` (64 rows),
``k`` (16) and ``v`` (16) projections; the single key/value head is expanded to the 4 query heads by the port
itself (``expand`` of a broadcast head axis); attention is written out with ``q`` scaled by head_dim**-0.5 *before*
the q.k product, a boolean causal mask built at model level and ``masked_fill(-inf)``; rotary uses the
half-split (rotate-half) convention, its cos/sin tables built at model level from positions 0..T-1 and applied to
k before it is expanded; the parallel block is ``x + attn(norm(x)) + mlp(norm(x))`` with one shared norm; the
final norm and the vocabulary projection live in a separate ``head`` module; the lm_head is a separate parameter
(copied from the tied checkpoint weight).

Converter
---------
``convert(sd)`` maps the reference's numpy state dict to the port's names: ``word_embeddings -> embed``,
``input_layernorm.{weight,bias} -> norm.{gain,shift}``, ``query_key_value`` rows [0:64] / [64:80] / [80:96] ->
``attn.q`` / ``attn.k`` / ``attn.v`` (multi-query layout: all query heads, then the key head, then the value
head), ``dense -> attn.out``, ``dense_h_to_4h -> mlp.up``, ``dense_4h_to_h -> mlp.down``,
``ln_f -> head.norm``, ``lm_head -> head.proj``.  Loaded with ``load_state_dict(strict=True)``.

Planted mistakes (one tagged line each)
---------------------------------------
* ``candidate_qkv_order`` (converter): the multi-query fused block is split with key and value swapped (value
  rows taken as the key projection and vice versa).
* ``candidate_kv_expand`` (shared class ``MQAttention``): the single key/value head is expanded with
  ``repeat_interleave`` on the feature axis and then reshaped into heads, so every head sees each feature
  repeated 4 times instead of a copy of the key/value head.
* ``candidate_sequential`` (block order): the parallel block is computed sequentially, the MLP reading
  ``norm(x + attn)`` instead of ``norm(x)``.
* ``candidate_rope_base`` (positions): the rotary tables use base 1e6 instead of the config's 10000.
* ``candidate_no_final_norm`` (missing): the head skips the final LayerNorm.

Measured (float32, CPU): relative error = max|port - ref| / max|ref| of the logits.
  candidate                 2.4e-07   (noise; float32 rounding)
  candidate_qkv_order       5.8e-01
  candidate_kv_expand       5.9e-01
  candidate_sequential      2.5e-01
  candidate_rope_base       7.5e-02
  candidate_no_final_norm   1.3e+00
(each mistake's difference from the correct port is the same to 3 digits.)  Reference logits: max |.| 47, std 8.3;
mean max attention probability per row about 0.45 (neither saturated nor flat).
Every function is deterministic (two calls give bit-identical outputs).
"""
import numpy as np

VOCAB, HIDDEN, LAYERS, HEADS, FFN = 128, 64, 3, 4, 256
HEAD_DIM = HIDDEN // HEADS
EPS = 1e-5
ROPE_THETA = 10000.0
BATCH, SEQ = 2, 12

EXPECTED = {
    "candidate": {"verdict": "noise"},
    "candidate_qkv_order": {
        "verdict": "divergent", "module": "blocks.0.attn.k", "leaf": "blocks.0.attn.k.weight",
        "kind": "converter",
        "what": "The converter splits the multi-query fused query_key_value with key and value swapped, "
                "loading the value rows into the key projection and the key rows into the value projection.",
    },
    "candidate_kv_expand": {
        "verdict": "divergent", "module": "blocks.0.attn", "kind": "shared-class",
        "what": "The single key/value head is expanded with repeat_interleave on the feature axis and then "
                "reshaped into heads, so each head gets features repeated 4 times instead of a copy of the head.",
    },
    "candidate_sequential": {
        "verdict": "divergent", "module": "blocks.0", "kind": "order",
        "what": "The parallel attention/MLP block is computed sequentially: the MLP reads norm(x + attn) "
                "instead of the same norm(x) the attention reads.",
    },
    "candidate_rope_base": {
        "verdict": "divergent", "module": "rope", "kind": "positions",
        "what": "The rotary cos/sin tables are built with base 1e6 instead of the config's rope_theta 10000.",
    },
    "candidate_no_final_norm": {
        "verdict": "divergent", "module": "head", "kind": "missing",
        "what": "The head skips the final LayerNorm (ln_f) and projects the raw residual stream to the vocabulary.",
    },
}


def _input_ids():
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int64)


# ----------------------------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------------------------

def reference():
    import torch
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        multi_query=True, parallel_attn=True, new_decoder_architecture=False, alibi=False, bias=True,
        layer_norm_epsilon=EPS, hidden_dropout=0.0, attention_dropout=0.0,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = FalconForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied lm_head appears once (as word_embeddings)
            if "word_embeddings" in name:
                p.copy_(torch.randn_like(p))
            elif ("layernorm" in name or "ln_f" in name) and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
    model.eval()
    inputs = {"input_ids": torch.from_numpy(_input_ids()), "use_cache": False}
    return model, inputs


# ----------------------------------------------------------------------------------------------------------------
# Converter
# ----------------------------------------------------------------------------------------------------------------

def convert(sd, mistake=None):
    """Reference numpy state dict -> port state dict (numpy)."""
    out = {"embed.weight": sd["transformer.word_embeddings.weight"]}
    for i in range(LAYERS):
        src, dst = f"transformer.h.{i}.", f"blocks.{i}."
        out[dst + "norm.gain"] = sd[src + "input_layernorm.weight"]
        out[dst + "norm.shift"] = sd[src + "input_layernorm.bias"]
        # multi-query fused layout: [all query heads | the key head | the value head] along the output rows
        q_rows = slice(0, HIDDEN)
        k_rows = slice(HIDDEN, HIDDEN + HEAD_DIM)
        v_rows = slice(HIDDEN + HEAD_DIM, HIDDEN + 2 * HEAD_DIM)
        if mistake == "qkv_order": k_rows, v_rows = v_rows, k_rows  # @qkv_order
        for part in ("weight", "bias"):
            fused = sd[src + "self_attention.query_key_value." + part]
            out[dst + "attn.q." + part] = fused[q_rows]
            out[dst + "attn.k." + part] = fused[k_rows]
            out[dst + "attn.v." + part] = fused[v_rows]
            out[dst + "attn.out." + part] = sd[src + "self_attention.dense." + part]
            out[dst + "mlp.up." + part] = sd[src + "mlp.dense_h_to_4h." + part]
            out[dst + "mlp.down." + part] = sd[src + "mlp.dense_4h_to_h." + part]
    out["head.norm.gain"] = sd["transformer.ln_f.weight"]
    out["head.norm.shift"] = sd["transformer.ln_f.bias"]
    out["head.proj.weight"] = sd["lm_head.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------------
# Port
# ----------------------------------------------------------------------------------------------------------------

_CLASSES = None


def _classes():
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Norm(nn.Module):
        """LayerNorm over the last axis, written out."""

        def __init__(self, dim, eps):
            super().__init__()
            self.eps = eps
            self.gain = nn.Parameter(torch.ones(dim))
            self.shift = nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            mu = x.mean(dim=-1, keepdim=True)
            xc = x - mu
            var = (xc * xc).mean(dim=-1, keepdim=True)
            return xc * torch.rsqrt(var + self.eps) * self.gain + self.shift

    class RotaryTable(nn.Module):
        """cos / sin tables (T, head_dim/2) for positions 0..T-1, built once per forward at model level."""

        def __init__(self, head_dim, base, mistake=None):
            super().__init__()
            self.head_dim = head_dim
            self.base = base
            if mistake == "rope_base": self.base = 1.0e6  # @rope_base

        def forward(self, seq_len):
            exps = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
            inv_freq = 1.0 / (self.base ** exps)
            pos = torch.arange(seq_len, dtype=torch.int64).float()
            ang = pos[:, None] * inv_freq[None, :]
            return torch.cos(ang), torch.sin(ang)

    def rotate(x, cos, sin):
        """Half-split rotary: pairs (i, i + d/2).  cos/sin (T, d/2) broadcast over leading axes of x (..., T, d)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class MQAttention(nn.Module):
        """Multi-query attention: HEADS query heads, one key/value head expanded here."""

        def __init__(self, mistake=None):
            super().__init__()
            self.mistake = mistake
            self.q = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=True)
            self.k = nn.Linear(HIDDEN, HEAD_DIM, bias=True)
            self.v = nn.Linear(HIDDEN, HEAD_DIM, bias=True)
            self.out = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=True)

        def _expand(self, t):
            """(B, T, d) single head -> (B, H, T, d)."""
            b, s, d = t.shape
            if self.mistake == "kv_expand": return t.repeat_interleave(HEADS, dim=-1).view(b, s, HEADS, d).transpose(1, 2)  # @kv_expand
            return t[:, None, :, :].expand(b, HEADS, s, d)

        def forward(self, x, cos, sin, mask):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)      # (B, H, T, d)
            k = self.k(x)                                                   # (B, T, d)
            v = self.v(x)                                                   # (B, T, d)
            q = rotate(q, cos, sin) * (HEAD_DIM ** -0.5)
            k = rotate(k, cos, sin)
            k = self._expand(k)
            v = self._expand(v)
            scores = torch.matmul(q, k.transpose(-1, -2))                   # (B, H, T, T)
            scores = scores.masked_fill(mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            ctx = torch.matmul(probs, v)                                    # (B, H, T, d)
            ctx = ctx.transpose(1, 2).reshape(b, s, HEADS * HEAD_DIM)
            return self.out(ctx)

    class GeluMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(HIDDEN, FFN, bias=True)
            self.down = nn.Linear(FFN, HIDDEN, bias=True)

        def forward(self, x):
            return self.down(F.gelu(self.up(x)))

    class ParallelBlock(nn.Module):
        """x + attn(norm(x)) + mlp(norm(x)) -- one norm shared by both branches."""

        def __init__(self, mistake=None):
            super().__init__()
            self.mistake = mistake
            self.norm = Norm(HIDDEN, EPS)
            self.attn = MQAttention(mistake)
            self.mlp = GeluMLP()

        def forward(self, x, cos, sin, mask):
            h = self.norm(x)
            a = self.attn(h, cos, sin, mask)
            mlp_in = self.norm(x + a) if self.mistake == "sequential" else h  # @sequential
            return x + a + self.mlp(mlp_in)

    class LMHead(nn.Module):
        def __init__(self, mistake=None):
            super().__init__()
            self.mistake = mistake
            self.norm = Norm(HIDDEN, EPS)
            self.proj = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, x):
            h = x if self.mistake == "no_final_norm" else self.norm(x)  # @no_final_norm
            return self.proj(h)

    class FalconPort(nn.Module):
        def __init__(self, mistake=None):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.rope = RotaryTable(HEAD_DIM, ROPE_THETA, mistake)
            self.blocks = nn.ModuleList([ParallelBlock(mistake) for _ in range(LAYERS)])
            self.head = LMHead(mistake)

        def forward(self, input_ids):
            s = input_ids.shape[1]
            cos, sin = self.rope(s)
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)            # True = may not attend
            x = self.embed(input_ids)
            for block in self.blocks:
                x = block(x, cos, sin, mask)
            return {"logits": self.head(x)}

    _CLASSES = FalconPort
    return _CLASSES


def _port(mistake=None):
    import torch

    ref, ref_inputs = reference()
    sd = {k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()}
    model = _classes()(mistake)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in convert(sd, mistake).items()}, strict=True)
    model.eval()
    return model, {"input_ids": ref_inputs["input_ids"].clone()}


def candidate():
    return _port()


def candidate_qkv_order():
    return _port("qkv_order")


def candidate_kv_expand():
    return _port("kv_expand")


def candidate_sequential():
    return _port("sequential")


def candidate_rope_base():
    return _port("rope_base")


def candidate_no_final_norm():
    return _port("no_final_norm")
