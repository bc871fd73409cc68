"""What each family computes, as the port writer needs to know it: one `Arch` per family, read off the Hugging Face
modeling code of the reference (`references.py` builds it), with where the reference keeps each weight.

`DECODING_ARCHS` are the decoders as the decoding ports (`decoding.py`) are written against them: Gemma-2 with a
sliding window shorter than the prompt on every other layer, as its Hugging Face config lays them out, and Mixtral
with one on every layer (Mistral's).

The writer (`writer.py`) turns an `Arch`, a framework and the structural choices (`choices.py`) into a port's source;
nothing here depends on how a port is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from families import HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB


@dataclass(frozen=True)
class Arch:
    """One family's architecture: sizes beyond the shared ones, which norm, activation, positions and residual it
    uses, and the reference's names (`hf`) and layouts."""

    family: str
    kind: Literal["decoder", "bert", "vit", "t5", "resnet"]
    kv_heads: int = HEADS  # key-value heads (HEADS: multi-head, 1: multi-query)
    intermediate: int = 2 * HIDDEN
    norm: Literal["rms", "layer"] = "layer"
    eps: float = 1e-5
    norm_offset: bool = False  # Gemma: the norm multiplies by 1 + w
    activation: Literal["silu", "gelu", "gelu_tanh", "relu"] = "gelu"
    gated: bool = False  # act(gate(x)) * up(x)
    experts: int = 0  # a mixture of experts in place of the MLP (Mixtral), routing to `top_k`
    top_k: int = 0
    qkv_bias: bool = False
    out_bias: bool = False  # the attention's output projection
    mlp_bias: bool = False
    rotary: float = 0.0  # the share of each head's dims rotated (0: no rotary embedding)
    theta: float = 10000.0
    alibi: bool = False
    learned_positions: bool = False
    embed_scale: bool = False  # Gemma: the embedding times sqrt(hidden)
    embed_norm: bool = False  # Bloom: a LayerNorm on the embedding
    residual: Literal["sequential", "sandwich", "parallel", "parallel_shared", "post_norm"] = "sequential"
    query_scale: float = HEAD_DIM**-0.5  # the attention's scale (T5: 1, none)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int = 0  # a sliding layer's query sees itself and the `sliding_window - 1` keys before it
    sliding_layers: tuple[bool, ...] = ()  # which layers slide (none where the family has no window)
    hf_qkv: Literal["separate", "blocks_in_out", "per_head", "per_group"] = "separate"  # how the reference stores q/k/v
    hf_in_out: bool = False  # GPT-2's Conv1D: every projection stored (in, out)
    hf: dict[str, str] = field(default_factory=dict)  # role -> the reference's name (within a layer for layer roles)

    @property
    def heads(self) -> int:
        return HEADS

    @property
    def head_dim(self) -> int:
        return HEAD_DIM

    @property
    def hidden(self) -> int:
        return HIDDEN

    @property
    def layers(self) -> int:
        return LAYERS

    @property
    def vocab(self) -> int:
        return VOCAB

    @property
    def rotary_dims(self) -> int:
        return int(HEAD_DIM * self.rotary)

    @property
    def causal(self) -> bool:
        return self.kind == "decoder"

    @property
    def has_mask(self) -> bool:
        """Does the port build an attention mask (causal, or from the padding)?"""
        return self.kind in ("decoder", "bert", "t5")

    @property
    def has_tables(self) -> bool:
        """Does the port compute position tables (rotary cos/sin, ALiBi or T5's bias)?"""
        return self.rotary > 0 or self.alibi or self.kind == "t5"

    @property
    def has_attention(self) -> bool:
        return self.kind != "resnet"


LLAMA_NAMES = dict(embed="model.embed_tokens.weight", layers="model.layers.", q="self_attn.q_proj",
                   k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj", norm1="input_layernorm",
                   norm2="post_attention_layernorm", gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj",
                   final_norm="model.norm", head="lm_head.weight")
FUSED_NAMES = dict(qkv="self_attention.query_key_value", o="self_attention.dense", norm1="input_layernorm",
                   norm2="post_attention_layernorm", fc_in="mlp.dense_h_to_4h", fc_out="mlp.dense_4h_to_h",
                   embed="transformer.word_embeddings.weight", layers="transformer.h.", final_norm="transformer.ln_f",
                   head="lm_head.weight")

ARCHS = {arch.family: arch for arch in [
    Arch("llama", "decoder", kv_heads=KV_HEADS, norm="rms", eps=1e-6, activation="silu", gated=True, rotary=1.0,
         hf=LLAMA_NAMES),
    Arch("qwen2", "decoder", kv_heads=KV_HEADS, norm="rms", eps=1e-6, activation="silu", gated=True, rotary=1.0,
         qkv_bias=True, hf=LLAMA_NAMES),
    Arch("mixtral", "decoder", kv_heads=KV_HEADS, norm="rms", eps=1e-5, activation="silu", gated=True, rotary=1.0,
         theta=1e6, experts=4, top_k=2,
         hf={**LLAMA_NAMES, "router": "mlp.gate.weight", "gate_up": "mlp.experts.gate_up_proj",
             "down": "mlp.experts.down_proj"}),
    Arch("gemma2", "decoder", kv_heads=KV_HEADS, norm="rms", eps=1e-6, norm_offset=True, activation="gelu_tanh",
         gated=True, rotary=1.0, embed_scale=True, residual="sandwich", query_scale=256**-0.5, attn_softcap=50.0,
         final_softcap=30.0, hf={**LLAMA_NAMES, "post_attn_norm": "post_attention_layernorm",
                                 "norm2": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm"}),
    Arch("gpt_neox", "decoder", rotary=0.25, qkv_bias=True, out_bias=True, mlp_bias=True, residual="parallel",
         hf_qkv="per_head", hf=dict(embed="gpt_neox.embed_in.weight", layers="gpt_neox.layers.",
                                    qkv="attention.query_key_value", o="attention.dense", norm1="input_layernorm",
                                    norm2="post_attention_layernorm", fc_in="mlp.dense_h_to_4h",
                                    fc_out="mlp.dense_4h_to_h", final_norm="gpt_neox.final_layer_norm",
                                    head="lm_head.weight")),
    Arch("gpt2", "decoder", intermediate=4 * HIDDEN, activation="gelu_tanh", qkv_bias=True, out_bias=True,
         mlp_bias=True, learned_positions=True, hf_qkv="blocks_in_out", hf_in_out=True,
         hf=dict(embed="transformer.wte.weight", positions="transformer.wpe.weight", layers="transformer.h.",
                 qkv="attn.c_attn", o="attn.c_proj", norm1="ln_1", norm2="ln_2", fc_in="mlp.c_fc", fc_out="mlp.c_proj",
                 final_norm="transformer.ln_f", head="lm_head.weight")),
    Arch("bloom", "decoder", intermediate=4 * HIDDEN, activation="gelu_tanh", qkv_bias=True, out_bias=True,
         mlp_bias=True, alibi=True, embed_norm=True, hf_qkv="per_head",
         hf={**FUSED_NAMES, "embed_norm": "transformer.word_embeddings_layernorm"}),
    Arch("falcon", "decoder", kv_heads=1, intermediate=4 * HIDDEN, rotary=1.0, residual="parallel_shared",
         hf_qkv="per_group", hf=FUSED_NAMES),
    Arch("bert", "bert", eps=1e-12, qkv_bias=True, out_bias=True, mlp_bias=True, learned_positions=True,
         residual="post_norm"),
    Arch("vit", "vit", eps=1e-12, qkv_bias=True, out_bias=True, mlp_bias=True, learned_positions=True),
    Arch("t5", "t5", norm="rms", eps=1e-6, activation="relu", query_scale=1.0),
    Arch("resnet", "resnet", activation="relu"),
]}

DECODERS = tuple(family for family, arch in ARCHS.items() if arch.kind == "decoder")
WINDOW = 8  # Gemma-2's sliding window in the decoding ports' references: shorter than the prompt, so that it evicts
DECODING_ARCHS = {family: ARCHS[family] for family in DECODERS} | {
    "gemma2": replace(ARCHS["gemma2"], sliding_window=WINDOW,
                      sliding_layers=tuple(layer % 2 == 0 for layer in range(LAYERS))),
    "mixtral": replace(ARCHS["mixtral"], sliding_window=WINDOW, sliding_layers=(True,) * LAYERS),
}
