"""The structural choices a porter makes, each drawn at random where it applies to the family and framework.

`draw(arch, framework, rng)` returns `{choice: value}` for the choices that apply, in `CHOICES`' order (a choice's
open values may depend on those drawn before it), and `draw_names(rng)` the port's own names for its modules and
parameters. Every combination is a correct port: the converter the writer writes matches it.

A decoding port (`decoding.py`: the port with its own cache, for cached decoding) draws `DECODING_CHOICES` with
`draw(arch, framework, rng, DECODING_CHOICES)`: the cache's layout, where positions and the step's mask come from,
how much a sliding layer keeps, then the port's choices (its masks and tables at the model level, where the cache's
length is known); `draw_decoding_names(rng)` adds the cache's names.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Callable

from ports.architectures import Arch

# (arch, framework, the choices drawn so far) -> the values open to a choice; () where it does not apply
Openness = Callable[[Arch, str, dict], tuple[str, ...]]


@dataclass(frozen=True)
class Choice:
    """One structural choice: its name, what it decides, and the values open to it where it applies."""

    name: str
    what: str
    open_values: Openness


def _tables(arch: Arch, framework: str, drawn: dict) -> tuple[str, ...]:
    if arch.kind == "t5":  # its bias table lives in the stack: computed there, in either order
        return ("model_mask_first", "model_tables_first")
    if arch.has_mask and arch.has_tables:
        return ("model_mask_first", "model_tables_first", "per_layer")
    return ("model", "per_layer") if arch.has_mask or arch.has_tables else ()


def _norm(arch: Arch, framework: str, drawn: dict) -> tuple[str, ...]:
    if arch.kind == "resnet":
        return ("module", "function", "written", "folded")
    written = ("written_rsqrt", "written_sqrt")
    if arch.norm == "rms":
        # torch has nn.RMSNorm and F.rms_norm, paddle neither on the CPU; a 1 + w added in the forward needs a function
        if framework == "paddle":
            return written
        return (("module",) if drawn.get("norm_offset", "folded") == "folded" else ()) + ("function",) + written
    return ("module", "function") + written


def _grouped_kv(arch: Arch, framework: str, drawn: dict) -> tuple[str, ...]:
    return ("repeat_interleave", "expand", "grouped") if arch.has_attention and arch.kv_heads < arch.heads else ()


CHOICES = [
    Choice("tree", "the model's parts in modules of their own (the decoder in a wrapper holding the head, the "
           "embeddings, T5's stacks, ResNet's stages) or one flat model",
           lambda a, f, d: ("nested", "flat")),
    Choice("qkv", "q/k/v projections separate, fused as blocks [Q; K; V], or fused per key-value group",
           lambda a, f, d: ("separate", "blocks", "per_group") if a.has_attention else ()),
    Choice("gate_up", "a gated MLP's gate and up projections separate or fused (gate first, or up first)",
           lambda a, f, d: ("separate", "gate_up", "up_gate") if a.gated else ()),
    Choice("rotary", "rotary pairs half-split (rotate_half) or interleaved (the converter permutes q/k rows)",
           lambda a, f, d: ("half", "interleaved") if a.rotary else ()),
    Choice("tables", "masks and position tables computed once at the model level (mask or tables first) or in "
           "each attention layer", _tables),
    Choice("alibi", "ALiBi by absolute key positions or relative (j - i): equal after softmax",
           lambda a, f, d: ("absolute", "relative") if a.alibi else ()),
    Choice("mask", "a mask added (-inf, or a large negative constant) or boolean (masked_fill, where)",
           lambda a, f, d: ("additive_inf", "additive_large", "masked_fill", "where") if a.has_mask else ()),
    Choice("norm_offset", "Gemma's 1 + w applied in the forward or folded into the weight by the converter",
           lambda a, f, d: ("forward", "folded") if a.norm_offset else ()),
    Choice("norm", "norms as the framework's module, its function, or written out (rsqrt or 1/sqrt); ResNet's "
           "BatchNorm also folded into the convolution by the converter", _norm),
    Choice("activation", "activations as a function, a module, or written out",
           lambda a, f, d: ("function", "module", "written")),
    Choice("linear", "linear layers as the framework's Linear, or the port's own holding (out, in) or (in, out)",
           lambda a, f, d: ("framework", "own_out_in", "own_in_out") if a.kind != "resnet" else ()),
    Choice("attention", "attention written out (matmul, softmax) or fused (scaled_dot_product_attention)",
           lambda a, f, d: ("written", "fused") if a.has_attention and not a.attn_softcap else ()),
    Choice("scale", "the query scaled before the product, or the scores after",
           lambda a, f, d: ("query", "scores") if a.has_attention and d.get("attention", "written") == "written"
           and a.query_scale != 1.0 else ()),
    Choice("kv_heads", "key-value heads repeated by repeat_interleave, by expand + reshape, or attention computed "
           "grouped without repeating", _grouped_kv),
    Choice("router", "the router's top-k of the softmax renormalised, or the softmax of the top-k logits",
           lambda a, f, d: ("probs_topk", "topk_softmax") if a.experts else ()),
    Choice("moe", "the experts combined densely (every expert on every token, weighted) or by index",
           lambda a, f, d: ("dense", "indexed") if a.experts else ()),
    Choice("head", "the tied head used as the embedding's weight or copied into a head of its own",
           lambda a, f, d: ("tied", "own") if a.kind == "t5" else ()),
    Choice("patch", "the patch embedding as a convolution, or a linear layer on the flattened patches",
           lambda a, f, d: ("conv", "linear") if a.kind == "vit" else ()),
    Choice("conv", "convolutions as the framework's module, or the port's own weight and the functional call",
           lambda a, f, d: ("module", "function") if a.kind == "resnet" else ()),
]


def _model_level_tables(arch: Arch, framework: str, drawn: dict) -> tuple[str, ...]:
    return tuple(value for value in _tables(arch, framework, drawn) if value != "per_layer")


DECODING_CHOICES = [
    Choice("cache_layout", "the port's cache: each layer's k and v kept [batch, heads, seq, dim] or [batch, seq, "
           "heads, dim], or one tensor per layer holding k and v stacked",
           lambda a, f, d: ("heads_second", "seq_second", "stacked")),
    Choice("positions", "positions counted from the cache's length, or read from the position_ids the forward takes",
           lambda a, f, d: ("cache_length", "position_ids") if a.rotary or a.learned_positions else ()),
    Choice("decode_mask", "the step's mask offset by the cache's length, or by the attention_mask's width (its padding "
           "masked too)", lambda a, f, d: ("cache_length", "attention_mask")),
    Choice("window_kept", "a sliding layer's cache keeps the window - 1 positions the next query sees, or the last "
           "window (the oldest then masked)", lambda a, f, d: ("visible", "window") if a.sliding_window else ()),
    *(replace(choice, open_values=_model_level_tables) if choice.name == "tables" else choice for choice in CHOICES),
]


def draw(arch: Arch, framework: str, rng: random.Random, choices: list[Choice] = CHOICES) -> dict[str, str]:
    """One value of each of `choices` that applies, drawn from `rng`."""
    drawn: dict[str, str] = {}
    for choice in choices:
        values = choice.open_values(arch, framework, drawn)
        if values:
            drawn[choice.name] = rng.choice(values)
    return drawn


# The port's own names, one pool per role: a porter's names are rarely Hugging Face's.
NAME_POOLS = {
    "layers": ("blocks", "layers", "h", "stack"),
    "attention": ("attn", "attention", "mixer", "self_attn"),
    "mlp": ("mlp", "ffn", "feed_forward"),
    "qkv_separate": (("q", "k", "v"), ("wq", "wk", "wv"), ("query", "key", "value"), ("q_proj", "k_proj", "v_proj")),
    "qkv_fused": ("qkv", "wqkv", "in_proj", "c_attn"),
    "kv_fused": ("kv", "wkv", "kv_proj"),
    "out": ("o", "wo", "out_proj", "dense"),
    "gated": (("gate", "up", "down"), ("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj")),
    "gate_up_fused": ("gate_up", "w13", "fc_in"),
    "plain_mlp": (("fc1", "fc2"), ("c_fc", "c_proj"), ("up", "down"), ("w_in", "w_out")),
    "norms": (("attn_norm", "mlp_norm"), ("ln_1", "ln_2"), ("norm1", "norm2"), ("input_norm", "post_norm")),
    "norm_weight": ("weight", "scale", "gamma"),
    "norm_bias": ("bias", "beta", "shift"),
    "embed": ("embed", "tok_embeddings", "wte", "embedding"),
    "final_norm": ("norm", "ln_f", "final_norm"),
    "head": ("lm_head", "head", "output"),
    "wrapper": ("model", "transformer", "decoder", "backbone"),
    "positions": ("positions", "pos_embed", "wpe"),
    "token_types": ("token_types", "segments", "type_embed"),
    "pooler": ("pooler", "pool", "cls_proj"),
    "patches": ("patch_embed", "patchify", "to_tokens"),
    "bias_table": ("relative_bias", "position_bias", "rel_bias"),
    "router": ("router", "gate", "route"),
    "experts": ("experts", "ffns"),
}


def draw_names(rng: random.Random) -> dict[str, object]:
    """One name (or tuple of names) from each pool."""
    return {role: rng.choice(pool) for role, pool in NAME_POOLS.items()}


DECODING_NAME_POOLS = {
    "cache_class": ("KVCache", "Cache", "LayerCache"),
    "cache": ("cache", "past_key_values", "kv_cache"),  # the forward's keyword (one bisectr generate knows)
}


def draw_decoding_names(rng: random.Random) -> dict[str, object]:
    """The port's names (`draw_names`) and its cache's."""
    return {**draw_names(rng), **{role: rng.choice(pool) for role, pool in DECODING_NAME_POOLS.items()}}
