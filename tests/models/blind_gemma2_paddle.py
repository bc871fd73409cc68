"""Gemma-2 causal LM: Hugging Face (PyTorch) reference vs. a hand-written PaddlePaddle port.

Reference
    ``transformers.Gemma2ForCausalLM`` from a tiny config: 3 layers, hidden 64, 4 query heads, 2 key/value
    heads, head_dim 16, intermediate 128 (gelu-tanh gated MLP), vocab 128, sliding_window 4 (layer types
    sliding / full / sliding), attention soft-cap 5 (scores are tanh-bounded to +-5, so the cap is active
    at this size), final logit soft-cap 30, query_pre_attn_scalar 16, rms eps 1e-6, rope base 10000, tied
    embeddings, eager attention. ``torch.manual_seed(0)``, then every weight is redrawn (numpy
    ``default_rng(1234)``, in state-dict order, so the port needs no torch) at trained-model scale:
    projections N(0, 1/fan_in) (q and k N(0, 2/fan_in): scaled scores std ~2, max ~8), embeddings N(0, 1),
    RMSNorm weights 0.1 N(0, 1) (Gemma adds the 1 itself), the final norm's -0.65 + 0.1 N(0, 1) (gain ~0.35,
    so the tied read-out gives logits of std ~3 rather than pinned at the cap); loaded strictly.
    Inputs: ``input_ids`` (2, 12) from ``numpy.random.default_rng(0)``, ``use_cache=False``.
    Output: ``logits`` (2, 12, 128), std 3.3, max |logit| 22.5; mean attention row max 0.58-0.70.

Port (``candidate``), PaddlePaddle, own module tree::

    GemmaLM                       root: builds rope tables and both masks once, picks a mask per layer
      tok   ScaledLookup          embedding table + the sqrt(hidden) normaliser (a python float)
      stack LayerList[Block]      own decoder block (four norms, sandwich style)
        mix_norm / mix_post / ff_norm / ff_post   UnitRMS  (the (1 + w) norm written as y + y * w)
        mixer  GroupedAttention   fused qkv Linear ([q | k | v] columns), q scaled by 1/sqrt(16) before the
                                  q.k product, rope applied on half-splits with [T, D/2] tables, GQA by
                                  broadcasting a [B, kv, group, T, D] query against [B, kv, 1, T, D] keys,
                                  tanh soft-cap, additive float mask, softmax
        ff     GatedFF            fused [up | gate] Linear, gelu(approximate=True)
      head  CappedReadout         final UnitRMS (``head.norm``), tied read-out against ``tok.table``, tanh cap
    The layer types are fixed at the model level (even layers sliding) and the masks are built there:
    causal j <= i, and for sliding layers also i - j < window.

Converter ``convert(sd)``: the reference's numpy state dict -> the port's names. Linear weights are
transposed (paddle stores [in, out]); q/k/v are concatenated column-wise into ``mixer.qkv.weight``,
up/gate into ``ff.up_gate.weight`` (up first); norm weights copied as is; ``lm_head.weight`` (tied) is
checked equal to the embedding and dropped. Loading checks that every port parameter is set.

Planted mistakes (each a single tagged line switched by a flag):
  candidate_no_attn_softcap     @no_attn_softcap     the tanh soft-cap on the attention scores left out.
  candidate_final_softcap_const @final_softcap_const the final logits capped with the attention cap 5, not 30.
  candidate_norm_plain_weight   @norm_plain_weight   RMSNorm multiplies by w instead of (1 + w).
  candidate_window_wrong_layers @window_wrong_layers sliding window put on the odd layers, not the even ones.
  candidate_no_embed_scale      @no_embed_scale      embedding never multiplied by sqrt(hidden) = 8 (the
                                                     "other dtype" variant would be invisible here: 8 is
                                                     exact in bfloat16 / float16).

Measured relative errors (max |port - reference| / max |reference|, float32, CPU):
  candidate                      1.7e-07
  candidate_no_attn_softcap      1.0e-02
  candidate_final_softcap_const  7.8e-01
  candidate_norm_plain_weight    2.3e+00
  candidate_window_wrong_layers  1.0e-01
  candidate_no_embed_scale       6.1e-01
(the mistakes measured against the correct port give the same numbers.)
Every function gives identical outputs on a second call.
"""
import math

import numpy as np

CFG = dict(vocab=128, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, inter=128, window=4,
           attn_softcap=5.0, final_softcap=30.0, qscalar=16, eps=1e-6, rope_base=10000.0)
BATCH, SEQ = 2, 12
QK_GAIN = math.sqrt(2.0)  # q/k projections a bit larger than 1/fan_in: scaled scores std ~2, as in trained models


def _ref_state_dict():
    """The reference's state dict as numpy, redrawn at trained-model scale (HF names and layouts)."""
    c = CFG
    rng = np.random.default_rng(1234)
    H, D, nq, nkv, F = c["hidden"], c["head_dim"], c["heads"], c["kv_heads"], c["inter"]

    def lin(out_f, in_f, gain=1.0):
        return (gain * rng.standard_normal((out_f, in_f)) / math.sqrt(in_f)).astype(np.float32)

    def nrm():
        return (0.1 * rng.standard_normal(H)).astype(np.float32)

    sd = {"model.embed_tokens.weight": rng.standard_normal((c["vocab"], H)).astype(np.float32)}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = lin(nq * D, H, QK_GAIN)
        sd[p + "self_attn.k_proj.weight"] = lin(nkv * D, H, QK_GAIN)
        sd[p + "self_attn.v_proj.weight"] = lin(nkv * D, H)
        sd[p + "self_attn.o_proj.weight"] = lin(H, nq * D)
        sd[p + "mlp.gate_proj.weight"] = lin(F, H)
        sd[p + "mlp.up_proj.weight"] = lin(F, H)
        sd[p + "mlp.down_proj.weight"] = lin(H, F)
        for n in ("input_layernorm", "post_attention_layernorm",
                  "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            sd[p + n + ".weight"] = nrm()
    sd["model.norm.weight"] = nrm() - 0.65  # final gain 1 + w ~ 0.35: logits O(10), cap not saturated
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # tied
    return sd


def _input_ids():
    rng = np.random.default_rng(0)
    return rng.integers(0, CFG["vocab"], size=(BATCH, SEQ)).astype(np.int64)


def reference():
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    c = CFG
    config = Gemma2Config(
        vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"],
        intermediate_size=c["inter"], sliding_window=c["window"],
        attn_logit_softcapping=c["attn_softcap"], final_logit_softcapping=c["final_softcap"],
        query_pre_attn_scalar=c["qscalar"], rms_norm_eps=c["eps"], attn_implementation="eager")
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config)
    sd = {k: torch.from_numpy(v.copy()) for k, v in _ref_state_dict().items()}
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model, {"input_ids": torch.from_numpy(_input_ids()), "use_cache": False}


# ----------------------------------------------------------------------------------------------------------
# converter
# ----------------------------------------------------------------------------------------------------------
def convert(sd, flags=None):
    """Map the reference's numpy state dict (HF names, torch [out, in] layouts) to the port's names."""
    f = flags or {}
    emb = sd["model.embed_tokens.weight"]
    if "lm_head.weight" in sd and not np.array_equal(sd["lm_head.weight"], emb):
        raise ValueError("port ties the read-out to the embedding; lm_head differs")
    out = {"tok.table": emb, "head.norm.w": sd["model.norm.weight"]}
    for i in range(CFG["layers"]):
        s, d = f"model.layers.{i}.", f"stack.{i}."
        a = s + "self_attn."
        out[d + "mixer.qkv.weight"] = np.concatenate(
            [sd[a + "q_proj.weight"].T, sd[a + "k_proj.weight"].T, sd[a + "v_proj.weight"].T], axis=1)
        out[d + "mixer.out.weight"] = sd[a + "o_proj.weight"].T
        out[d + "ff.up_gate.weight"] = np.concatenate(
            [sd[s + "mlp.up_proj.weight"].T, sd[s + "mlp.gate_proj.weight"].T], axis=1)
        out[d + "ff.down.weight"] = sd[s + "mlp.down_proj.weight"].T
        out[d + "mix_norm.w"] = sd[s + "input_layernorm.weight"]
        out[d + "mix_post.w"] = sd[s + "post_attention_layernorm.weight"]
        out[d + "ff_norm.w"] = sd[s + "pre_feedforward_layernorm.weight"]
        out[d + "ff_post.w"] = sd[s + "post_feedforward_layernorm.weight"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------
# the port
# ----------------------------------------------------------------------------------------------------------
def _build_port(flags=None):
    import paddle
    import paddle.nn as nn
    import paddle.nn.functional as F

    f = dict(flags or {})
    c = CFG

    class UnitRMS(nn.Layer):
        """RMSNorm with a zero-centred gain: y * (1 + w), written as y + y * w."""

        def __init__(self, dim, eps):
            super().__init__()
            self.eps = eps
            self.plain = bool(f.get("norm_plain_weight"))
            self.w = self.create_parameter([dim], default_initializer=nn.initializer.Constant(0.0))

        def forward(self, x):
            y = x * paddle.rsqrt(paddle.mean(paddle.square(x), axis=-1, keepdim=True) + self.eps)
            return y * self.w if self.plain else y + y * self.w  # @norm_plain_weight

    class ScaledLookup(nn.Layer):
        """Token table lookup times sqrt(hidden)."""

        def __init__(self, vocab, dim):
            super().__init__()
            self.mult = math.sqrt(dim)
            self.skip_mult = bool(f.get("no_embed_scale"))
            self.table = self.create_parameter([vocab, dim], default_initializer=nn.initializer.Normal())

        def forward(self, ids):
            e = F.embedding(ids, self.table)
            return e if self.skip_mult else e * self.mult  # @no_embed_scale

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return paddle.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    class GroupedAttention(nn.Layer):
        def __init__(self):
            super().__init__()
            self.nq, self.nkv, self.d = c["heads"], c["kv_heads"], c["head_dim"]
            self.cap = c["attn_softcap"]
            self.no_cap = bool(f.get("no_attn_softcap"))
            self.qscale = 1.0 / math.sqrt(c["qscalar"])
            width = (self.nq + 2 * self.nkv) * self.d
            self.qkv = nn.Linear(c["hidden"], width, bias_attr=False)
            self.out = nn.Linear(self.nq * self.d, c["hidden"], bias_attr=False)

        def forward(self, x, cos, sin, bias):
            B, T, _ = x.shape
            d, nq, nkv = self.d, self.nq, self.nkv
            q, k, v = paddle.split(self.qkv(x), [nq * d, nkv * d, nkv * d], axis=-1)
            q = q.reshape([B, T, nq, d]).transpose([0, 2, 1, 3])
            k = k.reshape([B, T, nkv, d]).transpose([0, 2, 1, 3])
            v = v.reshape([B, T, nkv, d]).transpose([0, 2, 1, 3])
            q = rope(q, cos, sin) * self.qscale
            k = rope(k, cos, sin)
            q = q.reshape([B, nkv, nq // nkv, T, d])          # query heads grouped by their kv head
            s = paddle.matmul(q, k.unsqueeze(2), transpose_y=True)
            s = s if self.no_cap else paddle.tanh(s / self.cap) * self.cap  # @no_attn_softcap
            p = F.softmax(s + bias, axis=-1)
            o = paddle.matmul(p, v.unsqueeze(2)).reshape([B, nq, T, d])
            return self.out(o.transpose([0, 2, 1, 3]).reshape([B, T, nq * d]))

    class GatedFF(nn.Layer):
        def __init__(self):
            super().__init__()
            self.up_gate = nn.Linear(c["hidden"], 2 * c["inter"], bias_attr=False)
            self.down = nn.Linear(c["inter"], c["hidden"], bias_attr=False)

        def forward(self, x):
            up, gate = paddle.chunk(self.up_gate(x), 2, axis=-1)
            return self.down(F.gelu(gate, approximate=True) * up)

    class Block(nn.Layer):
        def __init__(self):
            super().__init__()
            H, eps = c["hidden"], c["eps"]
            self.mix_norm, self.mix_post = UnitRMS(H, eps), UnitRMS(H, eps)
            self.ff_norm, self.ff_post = UnitRMS(H, eps), UnitRMS(H, eps)
            self.mixer = GroupedAttention()
            self.ff = GatedFF()

        def forward(self, h, cos, sin, bias):
            h = h + self.mix_post(self.mixer(self.mix_norm(h), cos, sin, bias))
            return h + self.ff_post(self.ff(self.ff_norm(h)))

    class CappedReadout(nn.Layer):
        """Final norm, tied read-out, tanh soft-cap."""

        def __init__(self):
            super().__init__()
            self.norm = UnitRMS(c["hidden"], c["eps"])
            self.cap = c["attn_softcap"] if f.get("final_softcap_const") else c["final_softcap"]  # @final_softcap_const

        def forward(self, h, table):
            logits = paddle.matmul(self.norm(h), table, transpose_y=True)
            return paddle.tanh(logits / self.cap) * self.cap

    class GemmaLM(nn.Layer):
        def __init__(self):
            super().__init__()
            self.tok = ScaledLookup(c["vocab"], c["hidden"])
            self.stack = nn.LayerList([Block() for _ in range(c["layers"])])
            self.head = CappedReadout()
            odd = bool(f.get("window_wrong_layers"))
            self.sliding = [(i % 2 == 1) if odd else (i % 2 == 0) for i in range(c["layers"])]  # @window_wrong_layers

        def tables(self, T):
            d = c["head_dim"]
            inv = 1.0 / (c["rope_base"] ** (paddle.arange(0, d, 2, dtype="int64").astype("float32") / d))
            ang = paddle.arange(T, dtype="float32").unsqueeze(1) * inv.unsqueeze(0)   # [T, d/2]
            i = paddle.arange(T).unsqueeze(1)
            j = paddle.arange(T).unsqueeze(0)
            causal = j <= i
            local = paddle.logical_and(causal, (i - j) < c["window"])
            neg = paddle.full([T, T], -1e30, dtype="float32")
            zero = paddle.zeros([T, T], dtype="float32")
            return paddle.cos(ang), paddle.sin(ang), paddle.where(causal, zero, neg), paddle.where(local, zero, neg)

        def forward(self, input_ids, use_cache=False):
            cos, sin, full_bias, local_bias = self.tables(input_ids.shape[1])
            h = self.tok(input_ids)
            for blk, is_local in zip(self.stack, self.sliding):
                h = blk(h, cos, sin, local_bias if is_local else full_bias)
            return {"logits": self.head(h, self.tok.table)}

    paddle.seed(0)
    return GemmaLM()


def _port(flags=None):
    import paddle

    model = _build_port(flags)
    weights = convert(_ref_state_dict(), flags)
    own = model.state_dict()
    if set(own) != set(weights):
        raise KeyError(f"state dict mismatch: missing {set(own) - set(weights)}, extra {set(weights) - set(own)}")
    for k, v in weights.items():
        if list(own[k].shape) != list(v.shape):
            raise ValueError(f"{k}: port {list(own[k].shape)} vs converted {list(v.shape)}")
    missing, unexpected = model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
    if missing or unexpected:
        raise KeyError(f"missing {missing}, unexpected {unexpected}")
    model.eval()
    return model, {"input_ids": paddle.to_tensor(_input_ids()), "use_cache": False}


def candidate():
    return _port()


def candidate_no_attn_softcap():
    return _port({"no_attn_softcap": True})


def candidate_final_softcap_const():
    return _port({"final_softcap_const": True})


def candidate_norm_plain_weight():
    return _port({"norm_plain_weight": True})


def candidate_window_wrong_layers():
    return _port({"window_wrong_layers": True})


def candidate_no_embed_scale():
    return _port({"no_embed_scale": True})


EXPECTED = {
    "candidate": {"verdict": "noise"},
    "candidate_no_attn_softcap": {
        "verdict": "divergent", "module": "stack.0.mixer", "kind": "missing",
        "what": "The tanh soft-cap (cap 5) on the attention scores is left out before the mask and softmax."},
    "candidate_final_softcap_const": {
        "verdict": "divergent", "module": "head", "kind": "other",
        "what": "The final logits are soft-capped with the attention cap 5 instead of the final cap 30."},
    "candidate_norm_plain_weight": {
        "verdict": "divergent", "module": "stack.0.mix_norm", "kind": "shared-class",
        "what": "The RMSNorm multiplies the normalised input by w instead of (1 + w), in every norm."},
    "candidate_window_wrong_layers": {
        "verdict": "divergent", "module": "", "kind": "mask",
        "what": "The sliding-window mask is given to the odd layers and the full causal mask to the even ones."},
    "candidate_no_embed_scale": {
        "verdict": "divergent", "module": "tok", "kind": "missing",
        "what": "The embedding lookup is not multiplied by the normaliser sqrt(hidden) = 8."},
}
