"""Hugging Face model families for the seeded-bug benchmark, each from a tiny random config.

`build(name)` returns `(model, inputs)`: the family's model class from its config (3 layers, hidden 64,
4 query / 2 key-value heads where the family has them, eager attention), `torch.manual_seed(0)`, then
weights drawn at the scale trained models have (`draw_weights`), eval. Nothing is downloaded.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "models"))
from _hf import hide_broken_torchcodec  # noqa: E402

HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 3, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
BATCH, SEQUENCE, PADDED = 2, 12, 3  # the second row of an encoder's batch ends in PADDED padding tokens

COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64,
              attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2,
              initializer_range=HIDDEN ** -0.5, tie_word_embeddings=False)


@dataclass(frozen=True)
class Family:
    name: str
    config: str  # the `transformers` config class
    model: str  # the `transformers` model class
    inputs: Literal["ids", "padded_ids", "pixels"]
    settings: dict = field(default_factory=dict)  # beyond COMMON


FAMILIES = {family.name: family for family in [
    Family("llama", "LlamaConfig", "LlamaForCausalLM", "ids"),
    Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM", "ids"),
    # Mixtral's experts run torch._grouped_mm as transformers runs them by default (no float64 kernel on CPU);
    # Qwen2-MoE's run a loop over experts ("eager").
    Family("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", "ids",
           dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                experts_implementation="eager")),
    Family("mixtral", "MixtralConfig", "MixtralForCausalLM", "ids", dict(num_local_experts=4, num_experts_per_tok=2)),
    Family("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", "ids"),
    Family("gpt2", "GPT2Config", "GPT2LMHeadModel", "ids", dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64)),
    Family("opt", "OPTConfig", "OPTForCausalLM", "ids", dict(ffn_dim=2 * HIDDEN, word_embed_proj_dim=HIDDEN)),
    Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM", "ids", dict(head_dim=HEAD_DIM)),
    # Gemma-3: sliding-window layers with their own rotary base beside a full-attention one.
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "ids",
           dict(head_dim=HEAD_DIM, sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM", "ids"),
    Family("granite", "GraniteConfig", "GraniteForCausalLM", "ids",
           dict(embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0, attention_multiplier=HEAD_DIM ** -0.5)),
    Family("bert", "BertConfig", "BertModel", "padded_ids"),
    Family("roberta", "RobertaConfig", "RobertaModel", "padded_ids"),
    Family("vit", "ViTConfig", "ViTModel", "pixels", dict(image_size=16, patch_size=4, num_channels=3)),
    Family("mamba", "MambaConfig", "MambaForCausalLM", "ids", dict(state_size=8, expand=2)),
]}


def draw_weights(model) -> None:
    """Biases 0.1 N(0, 1) and norm weights 1 + 0.1 N(0, 1) (0.1 N(0, 1) where the norm adds the 1 itself, as
    Gemma's), so that a misplaced or missing one shows; the rest keep their init at `initializer_range`."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 1 or "A_log" in name or name.endswith(".D") or "dt_proj" in name:
                continue
            if torch.all(p == 1):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif torch.all(p == 0):
                p.copy_(0.1 * torch.randn_like(p))


def build(name: str, attention: str = "eager", kv_heads: int | None = None):
    """`(model, inputs)` of family `name`: seeded, trained-scale weights, eval, inputs from `default_rng(0)`;
    its attention run by `attention` ("eager": matmul and softmax ops, "sdpa": one fused call), with
    `kv_heads` key-value heads where given."""
    return built(FAMILIES[name], attention, kv_heads)


def built(family: Family, attention: str = "eager", kv_heads: int | None = None):
    """`build` of a family given whole (one that is not in `FAMILIES`, or one with other settings)."""
    hide_broken_torchcodec()
    import numpy as np
    import torch
    import transformers

    name = family.name
    widened = {} if kv_heads is None else {"num_key_value_heads": kv_heads}
    config = getattr(transformers, family.config)(**{**COMMON, "attn_implementation": attention, **family.settings, **widened})
    torch.manual_seed(0)
    model = getattr(transformers, family.model)(config)
    draw_weights(model)
    model.eval()
    rng = np.random.default_rng(0)
    if family.inputs == "pixels":
        return model, {"pixel_values": torch.from_numpy(rng.standard_normal((BATCH, 3, 16, 16), dtype=np.float32))}
    ids = torch.from_numpy(rng.integers(3, VOCAB, size=(BATCH, SEQUENCE)))
    if family.inputs == "ids":
        return model, ({"input_ids": ids} if name == "mamba" else {"input_ids": ids, "use_cache": False})
    mask = torch.ones_like(ids)
    mask[1, -PADDED:] = 0
    ids[1, -PADDED:] = config.pad_token_id
    return model, {"input_ids": ids, "attention_mask": mask}


def has_grouped_kv_heads(name: str) -> bool:
    """Do family `name`'s layers share key-value heads among query heads (grouped-query attention): are its
    key projections (or the key part of a fused q/k/v one) narrower than its query projections?"""
    model, _ = build(name)
    rows = {parameter.rpartition(".")[0].rpartition(".")[2]: p.shape[0] for parameter, p in model.named_parameters()
            if parameter.endswith("proj.weight")}
    return rows.get("k_proj", HIDDEN) < rows.get("q_proj", HIDDEN) or rows.get("qkv_proj", 3 * HIDDEN) < 3 * HIDDEN


# The projections tensor parallelism shards as Megatron does, by name: column-parallel ones (q, k, v; gate,
# up, or the two fused as gate_up) and the row-parallel one that consumes them (o; down).
COLUMN_PARALLEL = re.compile(r"^(.*\.)?(self_attn\.[qkv]_proj|mlp\.(gate|up|gate_up)_proj)$")
ROW_PARALLEL = re.compile(r"^(.*\.)?(self_attn\.o_proj|mlp\.down_proj)$")
PARTS_OF = {"o_proj": ("q_proj", "k_proj", "v_proj"), "down_proj": ("up_proj", "gate_up_proj")}


def tensor_parallel_layout(model) -> dict[str, Literal["colwise", "packed_colwise", "rowwise"]]:
    """How `mutant_pair.tensor_parallel` shards `model`'s layers: module -> style. An attention with q, k, v
    and o projections of its own (`nn.Linear`) and an MLP with up (or gate_up) and down projections are
    sharded; a fused gate_up projection is `packed_colwise` (each rank holds its gate rows and its up rows); an
    attention whose q/k/v are fused stays whole on each rank."""
    import torch

    linears = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    layout = {}
    for name in sorted(linears):
        parent, _, leaf = name.rpartition(".")
        if ROW_PARALLEL.match(name) and any(f"{parent}.{part}" in linears for part in PARTS_OF[leaf]):
            layout[name] = "rowwise"
            for column in linears:
                if column.rpartition(".")[0] == parent and COLUMN_PARALLEL.match(column):
                    layout[column] = "packed_colwise" if column.endswith("gate_up_proj") else "colwise"
    return layout


def norms(model) -> list[str]:
    """The norms sequence parallel splits along the sequence: every norm of the hidden states (not the
    per-head q/k norms inside an attention, which read column-parallel parts)."""
    return [name for name, module in model.named_modules()
            if "norm" in type(module).__name__.lower() and not name.endswith(("q_norm", "k_norm"))]


def splits_sequence(name: str) -> bool:
    """Can family `name` run with sequence parallel: every layer's attention and MLP sharded (`shards_over_ranks`),
    so that each reads the hidden states through a column-parallel projection that gathers the sequence (a
    fused attention left whole, Phi-3's, or an MoE block would read one rank's part of it)."""
    model, _ = build(name)
    layout = tensor_parallel_layout(model)
    rowwise = [n for n, style in layout.items() if style == "rowwise"]
    return _every_layer_in(model, layout) and "packed_colwise" not in layout.values() and len(rowwise) == 2 * model.config.num_hidden_layers


def shards_over_ranks(name: str) -> bool:
    """Does every layer of family `name` have projections that `tensor_parallel_layout` shards?"""
    model, _ = build(name)
    return _every_layer_in(model, tensor_parallel_layout(model))


def _every_layer_in(model, layout: dict[str, str]) -> bool:
    layers = {int(found.group(1)) for n in layout if (found := re.search(r"\.(\d+)\.", n))}
    return layers == set(range(model.config.num_hidden_layers))


def runs_attention(name: str, attention: str) -> bool:
    """Can family `name` run its attention with `attention` (Mamba has none; Gemma-2 refuses "sdpa")?"""
    try:
        model, _ = build(name, attention)
    except ValueError:
        return False
    return model.config._attn_implementation == attention
