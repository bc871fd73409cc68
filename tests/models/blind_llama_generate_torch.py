"""Hand port of a tiny Llama causal LM to PyTorch, for greedy *cached* decoding, with planted decoding mistakes.

Reference
---------
``reference()`` builds ``transformers.LlamaForCausalLM`` from a tiny config (3 layers, hidden 64, 4 query heads,
2 key/value heads, head_dim 16, intermediate 128, vocab 128, rope_theta 10000, max_position_embeddings 64,
rms_norm_eps 1e-6, eager attention, untied lm_head), ``torch.manual_seed(0)``, then redraws every weight at the
scale of a trained model: projections N(0, 1/fan_in), embeddings N(0, 1), RMSNorm weights 1 + 0.1 N(0, 1).
Logits come out O(1)-O(5) and the attention is neither flat nor saturated.  Inputs: a prompt of 8 token ids,
batch 2, drawn from ``numpy.random.default_rng(0)``.

Port (``candidate()``)
----------------------
``TinyLlamaLM.forward(input_ids, cache=None) -> LMOutput(logits, cache)`` (a NamedTuple: ``.logits``/``.cache``).
Module tree (own names): ``tok_emb``, ``rope`` (cos/sin tables, no parameters), ``blocks.<i>`` each holding
``attn_norm``, ``attn`` (``qkv``, ``out``), ``mlp_norm``, ``mlp`` (``gate_up``, ``down``), then ``final_norm``
and ``unembed``.  Structural choices:

* Own cache class ``KVCache``: a tuple of per-layer ``(k, v)`` pairs, each in layout [batch, seq, kv_heads, dim]
  (not [batch, heads, seq, dim]).  It only ever grows by concatenation (``KVCache.extended``); nothing is written
  in place, so a step can be re-run from the same cache object.
* Positions come from the cache length (``cache.seq_len()``, axis 1 of the stored keys); the rotary cos/sin
  tables and the additive mask are computed once at the model level and handed to every block.
* One fused qkv projection laid out per key/value group: for kv head g the rows hold its 2 query heads, then its
  key, then its value ([kv, 2+2, dim] per group).  Grouped-query attention is done by viewing q as
  [batch, seq, kv, group, dim] and contracting against the kv head directly, with no repeat of k/v.
* q is scaled by head_dim**-0.5 before the q.k product; rotary is applied on the two halves written out by hand.
* RMSNorm written by hand (weight named ``scale``); gate and up fused into one ``gate_up`` projection (up first).
* At a step, attention uses the cached (already rotated) keys of the past followed by the fresh rotated keys of
  the current chunk; the cache returned holds past + current.

Converter
---------
``convert(state_dict_as_numpy)`` maps HF names to the port's: q/k/v weights are reshaped per head and stacked
per kv group into ``blocks.<i>.attn.qkv.weight``; gate/up are stacked as [up; gate] into
``blocks.<i>.mlp.gate_up.weight``; everything else is renamed.  Loaded with ``load_state_dict(strict=True)``.

Planted mistakes (each ONE line tagged with a trailing ``@<name>`` comment, whose 1-based number is
EXPECTED's "line"; all exact at the prefill and on a single full forward, visible at decode steps)
-------------------------------------------------------------------------------------------------------
* ``rope_offset``  (``rope``): the rotary positions restart at 0 at every step instead of the cache length.
* ``k_before_rope`` (``blocks.0.attn``): the key is put in the cache before the rotary is applied; the prefill
  (which attends to its fresh rotated keys) is right, every later step attends to unrotated past keys.
* ``mask_decode`` (root): the decode-step mask only lets a query see the cached keys (``k < past_len``), off by
  one: the new token cannot attend to itself.
* ``cache_bf16`` (``blocks.0.attn``): k/v are stored in the cache in bfloat16 (cast back to float32 at use).
* ``k_cat_order`` (``blocks.0.attn``): at a decode step the keys are concatenated as [current, past] while the
  values are [past, current], so every key is paired with another token's value.
* ``cache_layer`` (root): every block reads the past k/v of layer 0 from the cache (layer index not used).

Measured (steps 0..6: prefill of 8 tokens, then 6 greedy decode steps feeding the argmax, both sides stepped
with their own caches; relative error = max|port - ref| / max|ref| over each step's logits)
---------------------------------------------------------------------------------------------------------------
* candidate: 5.6e-07 worst (prefill), 2.6e-07..4.3e-07 at the decode steps; greedy tokens = reference's.
* vs the correct port, steps 0..6 (feeding the reference's greedy tokens; the prefill is always exactly 0):
  rope_offset 0, 0.46, 0.61, 0.51, 0.40, 0.44, 0.31;  k_before_rope 0, 0.40, 0.35, 0.40, 0.32, 0.32, 0.26;
  mask_decode 0, 0.21, 0.42, 0.18, 0.28, 0.29, 0.18;  cache_bf16 0, 1.8e-3, 1.6e-3, 2.0e-3, 1.7e-3, 1.4e-3, 1.2e-3;
  k_cat_order 0, 0.57, 0.81, 0.83, 0.53, 0.48, 0.34;  cache_layer 0, 0.81, 0.82, 0.62, 0.96, 0.62, 0.76.
  All deterministic (two runs identical); a single full forward of prompt+tokens is exact (0) for all six.
"""
from typing import NamedTuple

import numpy as np

CFG = dict(vocab=128, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, inter=128,
           theta=10000.0, max_pos=64, eps=1e-6)
PROMPT_LEN = 8
BATCH = 2


# ----------------------------------------------------------------------------------------------- reference
def reference():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=CFG["vocab"], hidden_size=CFG["hidden"], intermediate_size=CFG["inter"],
                      num_hidden_layers=CFG["layers"], num_attention_heads=CFG["heads"],
                      num_key_value_heads=CFG["kv_heads"], max_position_embeddings=CFG["max_pos"],
                      rope_theta=CFG["theta"], rms_norm_eps=CFG["eps"], tie_word_embeddings=False,
                      attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
    model.eval()
    return model, _inputs()


def _inputs():
    import torch

    rng = np.random.default_rng(0)
    ids = rng.integers(0, CFG["vocab"], size=(BATCH, PROMPT_LEN))
    return {"input_ids": torch.tensor(ids, dtype=torch.long)}


# ----------------------------------------------------------------------------------------------- converter
def convert(sd, bug=None):
    """HF LlamaForCausalLM state dict (numpy arrays) -> TinyLlamaLM state dict (numpy arrays)."""
    H, KV, D = CFG["heads"], CFG["kv_heads"], CFG["head_dim"]
    G = H // KV
    hid = CFG["hidden"]
    out = {
        "tok_emb.weight": sd["model.embed_tokens.weight"],
        "final_norm.scale": sd["model.norm.weight"],
        "unembed.weight": sd["lm_head.weight"],
    }
    for i in range(CFG["layers"]):
        src = f"model.layers.{i}."
        dst = f"blocks.{i}."
        q = sd[src + "self_attn.q_proj.weight"].reshape(KV, G, D, hid)   # query head h = g*G + j
        k = sd[src + "self_attn.k_proj.weight"].reshape(KV, 1, D, hid)
        v = sd[src + "self_attn.v_proj.weight"].reshape(KV, 1, D, hid)
        out[dst + "attn.qkv.weight"] = np.concatenate([q, k, v], axis=1).reshape(KV * (G + 2) * D, hid)
        out[dst + "attn.out.weight"] = sd[src + "self_attn.o_proj.weight"]
        out[dst + "mlp.gate_up.weight"] = np.concatenate(
            [sd[src + "mlp.up_proj.weight"], sd[src + "mlp.gate_proj.weight"]], axis=0)
        out[dst + "mlp.down.weight"] = sd[src + "mlp.down_proj.weight"]
        out[dst + "attn_norm.scale"] = sd[src + "input_layernorm.weight"]
        out[dst + "mlp_norm.scale"] = sd[src + "post_attention_layernorm.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------- port
class LMOutput(NamedTuple):
    logits: object
    cache: object


class KVCache:
    """Per-layer (k, v) pairs, each [batch, seq, kv_heads, dim]; immutable, grows by concatenation."""

    def __init__(self, layers):
        self.layers = tuple(layers)

    def seq_len(self):
        return self.layers[0][0].shape[1]

    @staticmethod
    def extended(past, k, v):
        if past is None:
            return (k, v)
        import torch
        return (torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1))


def _build_port_classes():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            ms = x.pow(2).mean(dim=-1, keepdim=True)
            return self.scale * (x * torch.rsqrt(ms + self.eps))

    class RotaryTables(nn.Module):
        """cos/sin tables [seq, dim/2] for the positions offset .. offset+n-1."""

        def __init__(self, dim, theta, bug):
            super().__init__()
            self.bug = bug
            inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, offset, n):
            start = 0 if self.bug == "rope_offset" else offset  # @rope_offset
            pos = torch.arange(start, start + n, dtype=torch.float32)
            ang = pos[:, None] * self.inv_freq[None, :]
            return ang.cos(), ang.sin()

    def rotate(x, cos, sin):
        # x [..., dim]; cos/sin broadcastable to [..., dim/2]; halves convention (first half / second half).
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    class GroupedAttention(nn.Module):
        def __init__(self, bug):
            super().__init__()
            self.bug = bug
            self.kv, self.d = CFG["kv_heads"], CFG["head_dim"]
            self.g = CFG["heads"] // CFG["kv_heads"]
            self.qkv = nn.Linear(CFG["hidden"], self.kv * (self.g + 2) * self.d, bias=False)
            self.out = nn.Linear(CFG["heads"] * self.d, CFG["hidden"], bias=False)

        def forward(self, x, cos, sin, mask, past):
            b, s, _ = x.shape
            qkv = self.qkv(x).view(b, s, self.kv, self.g + 2, self.d)
            q, k_raw, v = qkv[:, :, :, : self.g], qkv[:, :, :, self.g], qkv[:, :, :, self.g + 1]
            c, sn = cos[None, :, None, :], sin[None, :, None, :]              # [1, s, 1, d/2]
            q = rotate(q, c[..., None, :], sn[..., None, :]) * self.d ** -0.5  # [b, s, kv, g, d]
            k = rotate(k_raw, c, sn)                                          # [b, s, kv, d]
            k_store = k_raw if self.bug == "k_before_rope" else k  # @k_before_rope
            store_dtype = torch.bfloat16 if self.bug == "cache_bf16" else x.dtype  # @cache_bf16
            new_kv = KVCache.extended(past, k_store.to(store_dtype), v.to(store_dtype))
            if past is None:
                k_all, v_all = k, v
            else:
                pk, pv = past[0].to(x.dtype), past[1].to(x.dtype)
                k_all = torch.cat([k, pk] if self.bug == "k_cat_order" else [pk, k], dim=1)  # @k_cat_order
                v_all = torch.cat([pv, v], dim=1)
            # scores [b, kv, g, s, t]
            scores = torch.einsum("bskgd,btkd->bkgst", q, k_all) + mask
            probs = F.softmax(scores, dim=-1)
            ctx = torch.einsum("bkgst,btkd->bskgd", probs, v_all)
            return self.out(ctx.reshape(b, s, -1)), new_kv

    class SwiGLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up = nn.Linear(CFG["hidden"], 2 * CFG["inter"], bias=False)
            self.down = nn.Linear(CFG["inter"], CFG["hidden"], bias=False)

        def forward(self, x):
            up, gate = self.gate_up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)

    class Block(nn.Module):
        def __init__(self, bug):
            super().__init__()
            self.attn_norm = RMSNorm(CFG["hidden"], CFG["eps"])
            self.attn = GroupedAttention(bug)
            self.mlp_norm = RMSNorm(CFG["hidden"], CFG["eps"])
            self.mlp = SwiGLU()

        def forward(self, x, cos, sin, mask, past):
            a, new_kv = self.attn(self.attn_norm(x), cos, sin, mask, past)
            x = x + a
            return x + self.mlp(self.mlp_norm(x)), new_kv

    class TinyLlamaLM(nn.Module):
        def __init__(self, bug=None):
            super().__init__()
            self.bug = bug
            self.tok_emb = nn.Embedding(CFG["vocab"], CFG["hidden"])
            self.rope = RotaryTables(CFG["head_dim"], CFG["theta"], bug)
            self.blocks = nn.ModuleList([Block(bug) for _ in range(CFG["layers"])])
            self.final_norm = RMSNorm(CFG["hidden"], CFG["eps"])
            self.unembed = nn.Linear(CFG["hidden"], CFG["vocab"], bias=False)

        def _mask(self, past_len, n):
            total = past_len + n
            kpos = torch.arange(total)
            if n == 1:  # decode step: the single new query sees the whole cache and itself
                allowed = kpos[None, :] < (past_len if self.bug == "mask_decode" else total)  # @mask_decode
            else:
                qpos = torch.arange(past_len, total)
                allowed = kpos[None, :] <= qpos[:, None]
            neg = torch.finfo(torch.float32).min
            return torch.zeros(n, total).masked_fill(~allowed, neg)

        def forward(self, input_ids, cache=None):
            n = input_ids.shape[1]
            past_len = 0 if cache is None else cache.seq_len()
            cos, sin = self.rope(past_len, n)
            mask = self._mask(past_len, n)
            x = self.tok_emb(input_ids)
            new_layers = []
            for i, blk in enumerate(self.blocks):
                past = None if cache is None else cache.layers[0 if self.bug == "cache_layer" else i]  # @cache_layer
                x, kv = blk(x, cos, sin, mask, past)
                new_layers.append(kv)
            logits = self.unembed(self.final_norm(x))
            return LMOutput(logits, KVCache(new_layers))

    return TinyLlamaLM


def _build(bug=None):
    import torch

    ref, inputs = reference()
    sd = {k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()}
    TinyLlamaLM = _build_port_classes()
    model = TinyLlamaLM(bug)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in convert(sd, bug).items()}, strict=True)
    model.eval()
    return model, inputs


def candidate():
    return _build(None)


def candidate_rope_offset():
    return _build("rope_offset")


def candidate_k_before_rope():
    return _build("k_before_rope")


def candidate_mask_decode():
    return _build("mask_decode")


def candidate_cache_bf16():
    return _build("cache_bf16")


def candidate_k_cat_order():
    return _build("k_cat_order")


def candidate_cache_layer():
    return _build("cache_layer")


EXPECTED = {
    "candidate": {"verdict": "noise", "tokens": 6},
    "candidate_rope_offset": {
        "verdict": "divergent", "module": "rope", "kind": "positions", "line": 178,
        "step": 1, "first_divergent_step": 1, "tokens": 6,
        "what": "The rotary positions start at 0 at every step instead of at the cache length, so decoded "
                "tokens are rotated as if they were the first token."},
    "candidate_k_before_rope": {
        "verdict": "divergent", "module": "blocks.0.attn", "kind": "order", "line": 205,
        "step": 0, "first_divergent_step": 1, "tokens": 6,
        "what": "The key is written to the cache before the rotary is applied, so decode steps attend to "
                "unrotated past keys (the prefill, using its fresh rotated keys, is right)."},
    "candidate_mask_decode": {
        "verdict": "divergent", "module": "", "kind": "mask", "line": 257,
        "step": 1, "first_divergent_step": 1, "tokens": 6,
        "what": "The decode-step mask allows keys < past_len instead of <= past_len, so the new token "
                "cannot attend to itself."},
    "candidate_cache_bf16": {
        "verdict": "divergent", "module": "blocks.0.attn", "kind": "other", "line": 206,
        "step": 0, "first_divergent_step": 1, "tokens": 6,
        "what": "Keys and values are stored in the cache in bfloat16, so every decode step attends to "
                "rounded past keys and values."},
    "candidate_k_cat_order": {
        "verdict": "divergent", "module": "blocks.0.attn", "kind": "order", "line": 212,
        "step": 1, "first_divergent_step": 1, "tokens": 6,
        "what": "At decode steps the keys are concatenated as [current, past] while the values are "
                "[past, current], pairing each key with another token's value."},
    "candidate_cache_layer": {
        "verdict": "divergent", "module": "", "kind": "other", "line": 272,
        "step": 1, "first_divergent_step": 1, "tokens": 6,
        "what": "Every block reads layer 0's past keys and values from the cache instead of its own "
                "layer's."},
}
