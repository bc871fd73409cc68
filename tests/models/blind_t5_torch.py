"""Hand port of T5 (encoder-decoder, gated-GELU FFN) to PyTorch, with planted porting mistakes.

Reference
---------
``transformers.T5ForConditionalGeneration`` from a tiny config: d_model 64, 2 encoder + 2 decoder layers, 4 heads,
d_kv 16, d_ff 128, vocab 128, 8 relative-attention buckets, max distance 16, feed_forward_proj 'gated-gelu'
(tanh-approximated GELU), eager attention, tied word embeddings (so the decoder output is scaled by d_model**-0.5
before the LM head), dropout 0.  ``torch.manual_seed(0)``, then every weight redrawn at trained scale:
q projections N(0, 1/(d_model*d_kv)) (T5 folds the attention scale into q), other projections N(0, 1/fan_in),
relative-attention bias tables N(0, 1), RMSNorm weights 1 + 0.1 N(0,1), the shared embedding N(0,1).
Inputs from ``numpy.random.default_rng(0)``: input_ids (2, 12), decoder_input_ids (2, 10), use_cache False.
Main output: ``logits`` (2, 10, 128), max |logit| about 7, std about 1.

Port (``candidate``)
--------------------
Own module tree: ``T5Port`` -> ``embed`` (shared token table, also the tied LM head), ``encoder`` (``EncoderStack``),
``decoder`` (``DecoderStack``).  Each stack owns its ``rel_bias`` (``RelPosBias``), its ``blocks`` and its
``final_norm``.  Structural choices:
* the relative-position bias is computed ONCE per stack, in the stack's forward (not inside layer 0), by a bucket
  function of my own (``t5_buckets``) from a (heads, buckets) table (the checkpoint stores (buckets, heads));
* self-attention uses one fused ``qkv`` projection, cross-attention a ``q`` projection and a fused ``kv``;
* the two FFN input projections wi_0 (gate) / wi_1 (up) are fused into one ``wi`` weight [gate; up];
* RMSNorm written by hand; the causal mask is a boolean ``masked_fill`` built by the decoder stack; the
  encoder padding mask (optional ``attention_mask``) is an additive mask built by the model;
* the tied-embedding rescale ``d_model**-0.5`` is applied inside the LM-head matmul, by the root module.

Converter
---------
``convert(sd)`` maps the reference's numpy state dict: shared.weight -> embed.weight (encoder/decoder
embed_tokens and lm_head are the same tied table and are checked, not copied), q/k/v concatenated into qkv
(cross: k/v into kv), wi_0/wi_1 concatenated into wi, relative_attention_bias.weight transposed to
rel_bias.table, layer_norm weights to norm1/norm2/norm3, final_layer_norm to final_norm.  Loaded with strict
``load_state_dict``.

Planted mistakes (one flagged line each, tagged with a trailing at-name comment)
--------------------------------------------------------------
* ``dec_bidir_buckets``: the decoder's bucket function is called bidirectional (the encoder's convention): half
  the buckets go to future positions and the past distances are bucketed on a coarser scale.
* ``cross_pos_bias``: the decoder's relative-position table is also added to the cross-attention scores (T5's
  cross-attention has no position bias).
* ``softmax_scale``: q scaled by 1/sqrt(d_kv) before the q.k product, as in standard attention; T5 does not scale.
* ``no_enc_final_norm``: the encoder's final RMSNorm is left out, so the cross-attention sees un-normalised states.
* ``gate_up_swapped``: the converter fuses wi_1 before wi_0, so the GELU is applied to the up projection and the
  gate becomes the linear branch.

Measured relative errors (max |port - reference| / max |reference|, logits, float32 CPU)
---------------------------------------------------------------------------------------
candidate 2.0e-07; candidate_dec_bidir_buckets 1.9e-01; candidate_cross_pos_bias 1.8e-01;
candidate_softmax_scale 2.8e-01; candidate_no_enc_final_norm 2.9e-01; candidate_gate_up_swapped 3.5e-01
(each mistake differs from the correct port by the same amount, to two digits).  Every function's output is
identical across two runs.  Reference attention: mean max-probability 0.4 (encoder), 0.6 (decoder self),
0.25 (cross); not saturated, not flat.
"""

import math

D_MODEL, N_LAYERS, N_HEADS, D_KV, D_FF, VOCAB = 64, 2, 4, 16, 128, 128
N_BUCKETS, MAX_DIST, EPS = 8, 16, 1e-6
ENC_LEN, DEC_LEN, BATCH = 12, 10, 2

EXPECTED = {
    "candidate": {"verdict": "noise"},
    "candidate_dec_bidir_buckets": {
        "verdict": "divergent", "module": "decoder.rel_bias", "kind": "positions",
        "what": "The decoder's relative-position buckets are computed bidirectionally (encoder convention) instead "
                "of causally, so past distances land in the wrong buckets."},
    "candidate_cross_pos_bias": {
        "verdict": "divergent", "module": "decoder", "kind": "positions",
        "what": "The decoder's relative-position bias table is also added to the cross-attention scores, which "
                "in T5 carry no position bias."},
    "candidate_softmax_scale": {
        "verdict": "divergent", "module": "encoder.blocks.0.self_attn", "kind": "shared-class",
        "what": "The attention scales q by 1/sqrt(d_kv) before the q.k product, but T5 attention is unscaled."},
    "candidate_no_enc_final_norm": {
        "verdict": "divergent", "module": "encoder", "kind": "missing",
        "what": "The encoder stack's final RMSNorm is skipped, so the decoder cross-attends to un-normalised "
                "encoder states."},
    "candidate_gate_up_swapped": {
        "verdict": "divergent", "module": "encoder.blocks.0.ffn", "leaf": "encoder.blocks.0.ffn.wi.weight",
        "kind": "converter",
        "what": "The converter fuses the FFN input projections as [wi_1; wi_0] instead of [wi_0; wi_1], so GELU "
                "gates the wrong branch."},
}


# ----------------------------------------------------------------------------------------------- reference
def _config():
    from transformers import T5Config
    return T5Config(vocab_size=VOCAB, d_model=D_MODEL, d_kv=D_KV, d_ff=D_FF, num_layers=N_LAYERS,
                    num_decoder_layers=N_LAYERS, num_heads=N_HEADS, relative_attention_num_buckets=N_BUCKETS,
                    relative_attention_max_distance=MAX_DIST, feed_forward_proj="gated-gelu", dropout_rate=0.0,
                    layer_norm_epsilon=EPS, attn_implementation="eager")


def _reference_model():
    import torch
    from transformers import T5ForConditionalGeneration
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(_config())
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied tables appear once
            if name.endswith("layer_norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "shared.weight" or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(".q.weight"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1] * D_KV))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
    return model.eval()


def _ids():
    import numpy as np
    rng = np.random.default_rng(0)
    enc = rng.integers(2, VOCAB, size=(BATCH, ENC_LEN))
    dec = rng.integers(2, VOCAB, size=(BATCH, DEC_LEN))
    dec[:, 0] = 0  # decoder start token (pad id)
    return enc.astype("int64"), dec.astype("int64")


def reference():
    import torch
    model = _reference_model()
    enc, dec = _ids()
    return model, {"input_ids": torch.from_numpy(enc), "decoder_input_ids": torch.from_numpy(dec),
                   "use_cache": False}


# ----------------------------------------------------------------------------------------------- converter
def convert(sd, swap_gate_up=False):
    """Reference state dict (numpy) -> port state dict (numpy)."""
    import numpy as np
    out = {"embed.weight": sd["shared.weight"]}
    for tied in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        if tied in sd:
            assert np.array_equal(sd[tied], sd["shared.weight"]), tied

    def ffn(src, dst):
        wi0, wi1 = sd[src + "DenseReluDense.wi_0.weight"], sd[src + "DenseReluDense.wi_1.weight"]
        out[dst + "ffn.wi.weight"] = np.concatenate([wi1, wi0] if swap_gate_up else [wi0, wi1], 0)  # @gate_up_swapped
        out[dst + "ffn.wo.weight"] = sd[src + "DenseReluDense.wo.weight"]

    for stack, n_sub in (("encoder", 2), ("decoder", 3)):
        out[f"{stack}.rel_bias.table"] = sd[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].T
        out[f"{stack}.final_norm.weight"] = sd[f"{stack}.final_layer_norm.weight"]
        for i in range(N_LAYERS):
            src, dst = f"{stack}.block.{i}.layer.", f"{stack}.blocks.{i}."
            a = src + "0.SelfAttention."
            out[dst + "self_attn.qkv.weight"] = np.concatenate([sd[a + "q.weight"], sd[a + "k.weight"],
                                                                sd[a + "v.weight"]], 0)
            out[dst + "self_attn.out.weight"] = sd[a + "o.weight"]
            out[dst + "norm1.weight"] = sd[src + "0.layer_norm.weight"]
            if stack == "decoder":
                c = src + "1.EncDecAttention."
                out[dst + "cross_attn.q.weight"] = sd[c + "q.weight"]
                out[dst + "cross_attn.kv.weight"] = np.concatenate([sd[c + "k.weight"], sd[c + "v.weight"]], 0)
                out[dst + "cross_attn.out.weight"] = sd[c + "o.weight"]
                out[dst + "norm2.weight"] = sd[src + "1.layer_norm.weight"]
            ffn(src + f"{n_sub - 1}.", dst)
            out[dst + f"norm{n_sub}.weight"] = sd[src + f"{n_sub - 1}.layer_norm.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------- the port
class Flags:
    def __init__(self, **kw):
        self.dec_bidir = kw.pop("dec_bidir", False)
        self.cross_bias = kw.pop("cross_bias", False)
        self.scale_q = kw.pop("scale_q", False)
        self.skip_enc_norm = kw.pop("skip_enc_norm", False)
        assert not kw, kw


def t5_buckets(rel, bidirectional, num_buckets, max_distance):
    """Map relative positions (key - query, long tensor) to bucket ids, T5 style."""
    import torch
    if bidirectional:
        num_buckets //= 2
        base = (rel > 0).long() * num_buckets
        dist = rel.abs()
    else:
        base = torch.zeros_like(rel)
        dist = (-rel).clamp(min=0)
    exact = num_buckets // 2
    far = dist.float().clamp(min=1.0) / exact
    log_bucket = exact + (far.log() / math.log(max_distance / exact) * (num_buckets - exact)).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return base + torch.where(dist < exact, dist, log_bucket)


def _build_port_classes():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=EPS):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            inv = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + self.eps)
            return self.weight * (x * inv)

    class RelPosBias(nn.Module):
        def __init__(self, bidirectional, flags):
            super().__init__()
            self.table = nn.Parameter(torch.zeros(N_HEADS, N_BUCKETS))
            self.bidirectional, self.f = bidirectional, flags

        def forward(self, q_len, k_len):
            qpos = torch.arange(q_len, device=self.table.device)
            kpos = torch.arange(k_len, device=self.table.device)
            rel = kpos[None, :] - qpos[:, None]
            bidir = self.bidirectional or self.f.dec_bidir  # @dec_bidir_buckets
            idx = t5_buckets(rel, bidir, N_BUCKETS, MAX_DIST)           # (q, k)
            return self.table[:, idx].unsqueeze(0)                       # (1, heads, q, k)

    class AttentionCore(nn.Module):
        """Shared multi-head machinery; subclasses produce q, k, v."""

        def __init__(self, flags):
            super().__init__()
            self.f = flags
            self.out = nn.Linear(N_HEADS * D_KV, D_MODEL, bias=False)

        @staticmethod
        def heads(t):
            b, s, _ = t.shape
            return t.view(b, s, N_HEADS, D_KV).transpose(1, 2)

        def attend(self, q, k, v, bias=None, keep=None):
            scale = D_KV ** -0.5 if self.f.scale_q else 1.0  # @softmax_scale
            q, k, v = self.heads(q) * scale, self.heads(k), self.heads(v)
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
            if bias is not None:
                scores = scores + bias
            if keep is not None:
                scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores.float(), dim=-1).type_as(v)
            ctx = torch.einsum("bhqk,bhkd->bhqd", probs, v)
            b, _, s, _ = ctx.shape
            return self.out(ctx.transpose(1, 2).reshape(b, s, N_HEADS * D_KV))

    class SelfAttention(AttentionCore):
        def __init__(self, flags):
            super().__init__(flags)
            self.qkv = nn.Linear(D_MODEL, 3 * N_HEADS * D_KV, bias=False)

        def forward(self, x, bias, keep=None):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return self.attend(q, k, v, bias, keep)

    class CrossAttention(AttentionCore):
        def __init__(self, flags):
            super().__init__(flags)
            self.q = nn.Linear(D_MODEL, N_HEADS * D_KV, bias=False)
            self.kv = nn.Linear(D_MODEL, 2 * N_HEADS * D_KV, bias=False)

        def forward(self, x, memory, bias, keep=None):
            k, v = self.kv(memory).chunk(2, dim=-1)
            return self.attend(self.q(x), k, v, bias, keep)

    class GatedGeluFFN(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi = nn.Linear(D_MODEL, 2 * D_FF, bias=False)
            self.wo = nn.Linear(D_FF, D_MODEL, bias=False)

        def forward(self, x):
            gate, up = self.wi(x).chunk(2, dim=-1)
            return self.wo(F.gelu(gate, approximate="tanh") * up)

    class EncoderBlock(nn.Module):
        def __init__(self, flags):
            super().__init__()
            self.norm1, self.self_attn = RMSNorm(D_MODEL), SelfAttention(flags)
            self.norm2, self.ffn = RMSNorm(D_MODEL), GatedGeluFFN()

        def forward(self, h, bias, keep):
            h = h + self.self_attn(self.norm1(h), bias, keep)
            return h + self.ffn(self.norm2(h))

    class DecoderBlock(nn.Module):
        def __init__(self, flags):
            super().__init__()
            self.norm1, self.self_attn = RMSNorm(D_MODEL), SelfAttention(flags)
            self.norm2, self.cross_attn = RMSNorm(D_MODEL), CrossAttention(flags)
            self.norm3, self.ffn = RMSNorm(D_MODEL), GatedGeluFFN()

        def forward(self, h, memory, self_bias, causal, cross_bias, mem_keep):
            h = h + self.self_attn(self.norm1(h), self_bias, causal)
            h = h + self.cross_attn(self.norm2(h), memory, cross_bias, mem_keep)
            return h + self.ffn(self.norm3(h))

    class EncoderStack(nn.Module):
        def __init__(self, flags):
            super().__init__()
            self.f = flags
            self.rel_bias = RelPosBias(bidirectional=True, flags=flags)
            self.blocks = nn.ModuleList([EncoderBlock(flags) for _ in range(N_LAYERS)])
            self.final_norm = RMSNorm(D_MODEL)

        def forward(self, h, keep=None):
            bias = self.rel_bias(h.shape[1], h.shape[1])
            for blk in self.blocks:
                h = blk(h, bias, keep)
            h = h if self.f.skip_enc_norm else self.final_norm(h)  # @no_enc_final_norm
            return h

    class DecoderStack(nn.Module):
        def __init__(self, flags):
            super().__init__()
            self.f = flags
            self.rel_bias = RelPosBias(bidirectional=False, flags=flags)
            self.blocks = nn.ModuleList([DecoderBlock(flags) for _ in range(N_LAYERS)])
            self.final_norm = RMSNorm(D_MODEL)

        def forward(self, h, memory, mem_keep=None):
            tq, tk = h.shape[1], memory.shape[1]
            self_bias = self.rel_bias(tq, tq)
            causal = torch.ones(tq, tq, dtype=torch.bool, device=h.device).tril()
            cross_bias = self.rel_bias(tq, tk) if self.f.cross_bias else None  # @cross_pos_bias
            for blk in self.blocks:
                h = blk(h, memory, self_bias, causal, cross_bias, mem_keep)
            return self.final_norm(h)

    class T5Port(nn.Module):
        def __init__(self, flags):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D_MODEL)
            self.encoder = EncoderStack(flags)
            self.decoder = DecoderStack(flags)

        def forward(self, input_ids, decoder_input_ids, attention_mask=None):
            keep = None
            if attention_mask is not None:
                keep = attention_mask.bool()[:, None, None, :]
            memory = self.encoder(self.embed(input_ids), keep)
            h = self.decoder(self.embed(decoder_input_ids), memory, keep)
            logits = torch.matmul(h, self.embed.weight.t() * D_MODEL ** -0.5)
            return {"logits": logits}

    return T5Port


def _candidate(swap_gate_up=False, **flags):
    import torch
    ref, inputs = reference()
    sd = {k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()}
    port = _build_port_classes()(Flags(**flags))
    new_sd = {k: torch.from_numpy(v.copy()) for k, v in convert(sd, swap_gate_up=swap_gate_up).items()}
    port.load_state_dict(new_sd, strict=True)
    port.eval()
    return port, {"input_ids": inputs["input_ids"], "decoder_input_ids": inputs["decoder_input_ids"]}


def candidate():
    return _candidate()


def candidate_dec_bidir_buckets():
    return _candidate(dec_bidir=True)


def candidate_cross_pos_bias():
    return _candidate(cross_bias=True)


def candidate_softmax_scale():
    return _candidate(scale_q=True)


def candidate_no_enc_final_norm():
    return _candidate(skip_enc_norm=True)


def candidate_gate_up_swapped():
    return _candidate(swap_gate_up=True)
