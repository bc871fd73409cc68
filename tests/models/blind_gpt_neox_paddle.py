"""GPT-NeoX (parallel residual, partial rotary) hand-ported from PyTorch / Hugging Face to PaddlePaddle.

Reference
---------
``reference()`` builds ``transformers.GPTNeoXForCausalLM`` from a tiny config: 3 layers, hidden 64, 4 heads
(head_dim 16), intermediate 128, vocab 128, ``rotary_pct=0.5`` (rotary on the first 8 of the 16 dims of each
head, base 10000), ``use_parallel_residual=True``, eager attention, untied ``lm_head``, ``pad_token_id=1``.
``torch.manual_seed(0)`` builds it, then every weight is redrawn (numpy ``default_rng(1234)``, shared with the
port so that the candidate needs paddle + numpy only) at trained-model scales: projections N(0, 1/fan_in),
biases 0.1 N(0,1), LayerNorm weights 1 + 0.1 N(0,1), LayerNorm biases 0.1 N(0,1), embeddings N(0,1), and loaded
with a strict ``load_state_dict``.  Logits are O(1) (max |logit| 4.65, std 1.0), attention not saturated nor flat (mean max
probability over rows with >= 5 keys: 0.39 / 0.33 / 0.33 per layer, largest 0.76).
Inputs (``numpy.random.default_rng(0)``): ``input_ids`` of shape (2, 12) with ids in [2, 128); the second row is
right-padded: its last 3 tokens are the pad id 1 and ``attention_mask`` is 0 there; ``use_cache=False``.

Port (``candidate()``)
----------------------
Own module tree (``named_sublayers()`` names):
``embed`` (nn.Embedding), ``rope`` (RopeTables, no parameters: builds the half-width cos/sin tables),
``blocks.<i>`` (ParallelBlock) with ``ln_a`` / ``ln_m`` (paddle nn.LayerNorm), ``attn`` (CausalSelfAttention
with separate ``wq``, ``wk``, ``wv`` and output ``wo`` nn.Linear), ``mlp`` (GeluMLP: ``fc_in``, ``fc_out``,
exact erf GELU); ``ln_f``; ``unembed`` (bias-free nn.Linear).
Structural choices:
* the checkpoint's fused per-head ``query_key_value`` (rows laid out [q_h, k_h, v_h] per head) is split by the
  converter into three separate projections ``wq``/``wk``/``wv``;
* the rotary tables are computed ONCE at the model level (``rope``), BEFORE the model-level mask, which combines
  causality and key padding into one additive [B, 1, T, T] mask (finfo.min where not allowed);
* the tables are half-width ([T, rot/2]) and the rotary function rotates (first half, second half) pairs by hand;
* q is scaled by 1/sqrt(head_dim) right after its projection (before rotary and before the q.k product),
  instead of scaling the scores;
* paddle ``nn.Linear`` stores weights [in, out]: the converter transposes every projection.
Converter: ``convert(state_dict_as_numpy) -> dict`` maps ``gpt_neox.*`` / ``lm_head.*`` names and layouts to the
port's; the port is loaded with ``set_state_dict`` after a strict check (same key set, same shapes).

Measured relative error (max |port - reference| / max |reference| on the logits):
``candidate``                          3.4e-07   (noise; float32 rounding, threshold 1e-5)

Planted mistakes (each is ONE tagged line, switched on by a flag handed to the port or converter)
------------------------------------------------------------------------------------------------
``candidate_qkv_blocks``           (tag qkv_blocks, converter) the fused per-head qkv weight/bias is split as if it
                                   were three blocks [Q; K; V]: wq/wk/wv get mixed rows of q, k and v of
                                   different heads.                                      rel. err 6.6e-01
``candidate_rotary_interleaved``   (tag rotary_interleaved, positions) the port's rotary function pairs dims
                                   (2i, 2i+1) (GPT-J / interleaved convention) instead of (i, i + rot/2)
                                   (written back as halves: q.k equals a true GPT-J rotary's).
                                                                                         rel. err 2.0e-01
``candidate_sequential_residual``  (tag sequential_residual, order) the parallel residual is written as the
                                   sequential one: the MLP's LayerNorm reads x + attn(x) instead of x.
                                                                                         rel. err 4.1e-01
``candidate_embedding_padding_idx``(tag embedding_padding_idx, default) ``nn.Embedding(..., padding_idx=pad_id)``
                                   as a torch porter habitually writes it: in paddle ``padding_idx`` zeroes the
                                   looked-up vector of the pad token in the forward (torch only uses it at init
                                   and for gradients), so the padded positions start from 0.  rel. err 6.7e-01
``candidate_dense_untransposed``   (tag dense_untransposed, converter) the square attention output projection
                                   (``attention.dense``) is copied without the [out, in] -> [in, out] transpose
                                   paddle's nn.Linear needs (no shape error since it is 64x64).
                                                                                         rel. err 7.3e-01
Relative errors of the mistakes are against the reference (against the correct port they agree to 2 digits).
Every function was run twice: outputs identical (deterministic).
"""
import math

import numpy as np

_CFG = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=128,
    rotary_pct=0.5,
    rotary_emb_base=10000,
    layer_norm_eps=1e-5,
    use_parallel_residual=True,
    tie_word_embeddings=False,
    pad_token_id=1,
    hidden_act="gelu",
)
_BATCH, _SEQ, _NPAD = 2, 12, 3

EXPECTED = {
    "candidate": {"verdict": "noise"},
    "candidate_qkv_blocks": {
        "verdict": "divergent",
        "module": "blocks.0.attn.wq",
        "leaf": "blocks.0.attn.wq.weight",
        "kind": "converter",
        "what": "The converter splits the fused per-head query_key_value weight and bias as three contiguous "
                "blocks [Q; K; V] instead of per head [q_h, k_h, v_h], so wq/wk/wv hold mixed rows.",
    },
    "candidate_rotary_interleaved": {
        "verdict": "divergent",
        "module": "blocks.0.attn",
        "kind": "positions",
        "what": "The rotary function rotates interleaved pairs (2i, 2i+1) (GPT-J convention) instead of the "
                "GPT-NeoX rotate-half pairs (i, i + rot/2).",
    },
    "candidate_sequential_residual": {
        "verdict": "divergent",
        "module": "blocks.0",
        "kind": "order",
        "what": "The parallel residual is written sequentially: the MLP's LayerNorm is fed x + attention "
                "output instead of the block input x.",
    },
    "candidate_embedding_padding_idx": {
        "verdict": "divergent",
        "module": "embed",
        "kind": "default",
        "what": "The embedding is built with padding_idx=pad_token_id, and paddle's embedding outputs zeros for "
                "that id in the forward (torch does not), so the pad positions' embeddings are zeroed.",
    },
    "candidate_dense_untransposed": {
        "verdict": "divergent",
        "module": "blocks.0.attn.wo",
        "leaf": "blocks.0.attn.wo.weight",
        "kind": "converter",
        "what": "The converter copies the square attention output projection without transposing torch's "
                "[out, in] layout to paddle's [in, out].",
    },
}


# ----------------------------------------------------------------------------------------------------------
# shared: weights (reference names and layouts, numpy) and inputs
# ----------------------------------------------------------------------------------------------------------
def _reference_state_dict():
    """Trained-scale weights under the reference's names, torch layouts ([out, in]), float32 numpy."""
    rng = np.random.default_rng(1234)
    D, F, V = _CFG["hidden_size"], _CFG["intermediate_size"], _CFG["vocab_size"]
    sd = {}

    def linear(name, n_out, n_in, bias=True):
        sd[name + ".weight"] = rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)
        if bias:
            sd[name + ".bias"] = 0.1 * rng.standard_normal(n_out)

    def norm(name):
        sd[name + ".weight"] = 1.0 + 0.1 * rng.standard_normal(D)
        sd[name + ".bias"] = 0.1 * rng.standard_normal(D)

    sd["gpt_neox.embed_in.weight"] = rng.standard_normal((V, D))
    for i in range(_CFG["num_hidden_layers"]):
        p = f"gpt_neox.layers.{i}."
        norm(p + "input_layernorm")
        norm(p + "post_attention_layernorm")
        linear(p + "attention.query_key_value", 3 * D, D)
        linear(p + "attention.dense", D, D)
        linear(p + "mlp.dense_h_to_4h", F, D)
        linear(p + "mlp.dense_4h_to_h", D, F)
    norm("gpt_neox.final_layer_norm")
    linear("lm_head", V, D, bias=False)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def _numpy_inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(2, _CFG["vocab_size"], size=(_BATCH, _SEQ)).astype(np.int64)
    mask = np.ones((_BATCH, _SEQ), dtype=np.int64)
    ids[1, _SEQ - _NPAD:] = _CFG["pad_token_id"]  # right padding of the second sequence
    mask[1, _SEQ - _NPAD:] = 0
    return ids, mask


# ----------------------------------------------------------------------------------------------------------
# reference
# ----------------------------------------------------------------------------------------------------------
def reference():
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    config = GPTNeoXConfig(attn_implementation="eager", **_CFG)
    model = GPTNeoXForCausalLM(config)
    sd = {k: torch.from_numpy(v) for k, v in _reference_state_dict().items()}
    if "embed_out.weight" in model.state_dict():  # transformers before 5.4 names the head so
        sd["embed_out.weight"] = sd.pop("lm_head.weight")
    model.load_state_dict(sd, strict=True)
    model.eval()
    ids, mask = _numpy_inputs()
    inputs = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask), "use_cache": False}
    return model, inputs


# ----------------------------------------------------------------------------------------------------------
# converter: reference names/layouts -> port names/layouts
# ----------------------------------------------------------------------------------------------------------
def _split_qkv(w, heads, as_blocks=False):
    """Fused query_key_value rows are laid out per head: [q_h0, k_h0, v_h0, q_h1, ...] (each head_dim rows)."""
    if as_blocks: return np.split(w, 3, axis=0)  # @qkv_blocks
    w = w.reshape((heads, 3, -1) + w.shape[1:])
    return [np.ascontiguousarray(w[:, j].reshape((-1,) + w.shape[3:])) for j in range(3)]


def convert(state_dict_as_numpy, qkv_blocks=False, dense_untransposed=False):
    sd = state_dict_as_numpy
    heads = _CFG["num_attention_heads"]
    out = {"embed.weight": sd["gpt_neox.embed_in.weight"]}
    for i in range(_CFG["num_hidden_layers"]):
        src, dst = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        for a, b in (("input_layernorm", "ln_a"), ("post_attention_layernorm", "ln_m")):
            out[dst + b + ".weight"] = sd[src + a + ".weight"]
            out[dst + b + ".bias"] = sd[src + a + ".bias"]
        ws = _split_qkv(sd[src + "attention.query_key_value.weight"], heads, qkv_blocks)
        bs = _split_qkv(sd[src + "attention.query_key_value.bias"], heads, qkv_blocks)
        for name, w, b in zip(("wq", "wk", "wv"), ws, bs):
            out[dst + f"attn.{name}.weight"] = w.T  # paddle Linear: [in, out]
            out[dst + f"attn.{name}.bias"] = b
        wo = sd[src + "attention.dense.weight"]
        out[dst + "attn.wo.weight"] = wo if dense_untransposed else wo.T  # @dense_untransposed
        out[dst + "attn.wo.bias"] = sd[src + "attention.dense.bias"]
        out[dst + "mlp.fc_in.weight"] = sd[src + "mlp.dense_h_to_4h.weight"].T
        out[dst + "mlp.fc_in.bias"] = sd[src + "mlp.dense_h_to_4h.bias"]
        out[dst + "mlp.fc_out.weight"] = sd[src + "mlp.dense_4h_to_h.weight"].T
        out[dst + "mlp.fc_out.bias"] = sd[src + "mlp.dense_4h_to_h.bias"]
    out["ln_f.weight"] = sd["gpt_neox.final_layer_norm.weight"]
    out["ln_f.bias"] = sd["gpt_neox.final_layer_norm.bias"]
    out["unembed.weight"] = sd["lm_head.weight"].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------
# the port (paddle), classes built lazily so that importing this file needs no framework
# ----------------------------------------------------------------------------------------------------------
_PORT = {}


def _port_classes():
    if _PORT:
        return _PORT
    import paddle
    import paddle.nn as nn
    import paddle.nn.functional as F

    def rotate(x, cos, sin, interleaved=False):
        """Rotate pairs of x's last dim by the angles whose cos/sin are given (half-width tables)."""
        h = x.shape[-1] // 2
        x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :h], x[..., h:])  # @rotary_interleaved
        return paddle.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    class RopeTables(nn.Layer):
        """cos/sin of position * inverse frequency, [T, rot_dims/2], computed once per forward of the model."""

        def __init__(self, rot_dims, base):
            super().__init__()
            self.rot_dims, self.base = rot_dims, float(base)

        def forward(self, seq_len):
            exponent = paddle.arange(0, self.rot_dims, 2, dtype="float32") / self.rot_dims
            inv_freq = 1.0 / paddle.pow(paddle.full([], self.base, dtype="float32"), exponent)
            pos = paddle.arange(seq_len, dtype="float32")
            angles = pos.unsqueeze(1) * inv_freq.unsqueeze(0)
            return paddle.cos(angles), paddle.sin(angles)

    class CausalSelfAttention(nn.Layer):
        def __init__(self, cfg, bugs):
            super().__init__()
            d = cfg["hidden_size"]
            self.heads = cfg["num_attention_heads"]
            self.head_dim = d // self.heads
            self.rot = int(self.head_dim * cfg["rotary_pct"])
            self.scale = 1.0 / math.sqrt(self.head_dim)
            self.interleaved = bool(bugs.get("rotary_interleaved"))
            self.wq = nn.Linear(d, d)
            self.wk = nn.Linear(d, d)
            self.wv = nn.Linear(d, d)
            self.wo = nn.Linear(d, d)

        def _heads(self, t):
            b, s, _ = t.shape
            return t.reshape([b, s, self.heads, self.head_dim]).transpose([0, 2, 1, 3])

        def _rope(self, t, cos, sin):
            return paddle.concat([rotate(t[..., :self.rot], cos, sin, self.interleaved), t[..., self.rot:]], -1)

        def forward(self, x, cos, sin, mask):
            b, s, d = x.shape
            q = self._heads(self.wq(x) * self.scale)  # scale q, not the scores
            k = self._heads(self.wk(x))
            v = self._heads(self.wv(x))
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            scores = paddle.matmul(q, k, transpose_y=True) + mask
            probs = F.softmax(scores, axis=-1)
            ctx = paddle.matmul(probs, v).transpose([0, 2, 1, 3]).reshape([b, s, d])
            return self.wo(ctx)

    class GeluMLP(nn.Layer):
        def __init__(self, cfg):
            super().__init__()
            self.fc_in = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"])
            self.fc_out = nn.Linear(cfg["intermediate_size"], cfg["hidden_size"])

        def forward(self, x):
            return self.fc_out(F.gelu(self.fc_in(x), approximate=False))

    class ParallelBlock(nn.Layer):
        def __init__(self, cfg, bugs):
            super().__init__()
            self.ln_a = nn.LayerNorm(cfg["hidden_size"], epsilon=cfg["layer_norm_eps"])
            self.ln_m = nn.LayerNorm(cfg["hidden_size"], epsilon=cfg["layer_norm_eps"])
            self.attn = CausalSelfAttention(cfg, bugs)
            self.mlp = GeluMLP(cfg)
            self.sequential = bool(bugs.get("sequential_residual"))

        def forward(self, x, cos, sin, mask):
            a = self.attn(self.ln_a(x), cos, sin, mask)
            mlp_in = x + a if self.sequential else x  # @sequential_residual
            return x + a + self.mlp(self.ln_m(mlp_in))

    class NeoXPort(nn.Layer):
        def __init__(self, cfg, bugs):
            super().__init__()
            d = cfg["hidden_size"]
            pad = cfg["pad_token_id"]
            self.embed = nn.Embedding(cfg["vocab_size"], d, padding_idx=pad if bugs.get("embedding_padding_idx") else None)  # @embedding_padding_idx
            head_dim = d // cfg["num_attention_heads"]
            self.rope = RopeTables(int(head_dim * cfg["rotary_pct"]), cfg["rotary_emb_base"])
            self.blocks = nn.LayerList([ParallelBlock(cfg, bugs) for _ in range(cfg["num_hidden_layers"])])
            self.ln_f = nn.LayerNorm(d, epsilon=cfg["layer_norm_eps"])
            self.unembed = nn.Linear(d, cfg["vocab_size"], bias_attr=False)

        @staticmethod
        def _mask(attention_mask, b, s):
            causal = paddle.tril(paddle.ones([s, s], dtype="int64")).astype("bool").reshape([1, 1, s, s])
            if attention_mask is None:
                keep = causal.expand([b, 1, s, s])
            else:
                keys = attention_mask.astype("bool").reshape([b, 1, 1, s])
                keep = paddle.logical_and(causal, keys)
            neg = paddle.full([b, 1, s, s], float(np.finfo(np.float32).min), dtype="float32")
            return paddle.where(keep, paddle.zeros_like(neg), neg)

        def forward(self, input_ids, attention_mask=None, use_cache=False):
            b, s = input_ids.shape
            x = self.embed(input_ids)
            cos, sin = self.rope(s)  # tables first, ...
            mask = self._mask(attention_mask, b, s)  # ... then the mask
            for block in self.blocks:
                x = block(x, cos, sin, mask)
            return {"logits": self.unembed(self.ln_f(x))}

    _PORT.update(NeoXPort=NeoXPort)
    return _PORT


def _load_strict(model, weights):
    import paddle

    own = model.state_dict()
    missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or extra:
        raise KeyError(f"state dict mismatch: missing {missing}, unexpected {extra}")
    for k, v in own.items():
        if tuple(v.shape) != tuple(weights[k].shape):
            raise ValueError(f"{k}: port {tuple(v.shape)} vs converted {tuple(weights[k].shape)}")
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})


def _candidate(**bugs):
    import paddle

    paddle.seed(0)
    model = _port_classes()["NeoXPort"](_CFG, bugs)
    weights = convert(_reference_state_dict(), qkv_blocks=bool(bugs.get("qkv_blocks")),
                      dense_untransposed=bool(bugs.get("dense_untransposed")))
    _load_strict(model, weights)
    model.eval()
    ids, mask = _numpy_inputs()
    inputs = {"input_ids": paddle.to_tensor(ids), "attention_mask": paddle.to_tensor(mask), "use_cache": False}
    return model, inputs


def candidate():
    return _candidate()


def candidate_qkv_blocks():
    return _candidate(qkv_blocks=True)


def candidate_rotary_interleaved():
    return _candidate(rotary_interleaved=True)


def candidate_sequential_residual():
    return _candidate(sequential_residual=True)


def candidate_embedding_padding_idx():
    return _candidate(embedding_padding_idx=True)


def candidate_dense_untransposed():
    return _candidate(dense_untransposed=True)
