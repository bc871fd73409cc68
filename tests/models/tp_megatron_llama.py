"""Hugging Face Llama on one device against a Megatron-style port of it on ranks, with fused weights.

Reference: `transformers.LlamaForCausalLM` (`_hf.tiny_llama`: 2 layers, hidden 64, 4 query / 2 key-value
heads). Candidate (run with `--candidate-nproc 2`): a port written by hand, as Megatron writes one, that
converts the reference's weights and keeps on each rank only its slice, in plain tensors:

- `qkv`: one column-parallel weight, each rank's `[q heads; k head; v head]` rows fused;
- `gate_up`: one column-parallel weight, each rank's `[gate; up]` rows fused (SwiGLU);
- `o` and `down`: row-parallel, a partial sum added over ranks with `all_reduce`;
- the embedding vocabulary-parallel (each rank looks up its half, the others' rows masked, all-reduced),
  the head vocabulary-parallel, its logits gathered with `all_gather` along the vocabulary.

Correct, the sharded sums round differently (`noise`). `TP_BUG` plants one bug:

- "gate_up_as_stored": the converter fuses `[gate; up]` for the whole model and shards that weight as
  stored, so rank 0 holds all of gate and rank 1 all of up.
- "head_gathered_wrong_dim": the head's vocabulary halves are gathered along a new last dim and
  flattened, interleaving the vocabulary.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hf import tiny_llama  # noqa: E402

NPROC = {"candidate": 2}


def reference():
    return tiny_llama()


def _rotate_half(x):
    import torch

    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _port(hf, rank: int, world: int):
    import torch
    import torch.distributed as dist
    from torch import nn

    config = hf.config
    bug = os.environ.get("TP_BUG", "")
    head_dim = config.hidden_size // config.num_attention_heads
    heads, kv_heads = config.num_attention_heads // world, config.num_key_value_heads // world

    def rows(weight, part: int, parts: int = world):
        size = weight.shape[0] // parts
        return weight[part * size:(part + 1) * size]

    class ColumnParallelLinear(nn.Module):
        def __init__(self, local_weight):
            super().__init__()
            self.weight = nn.Parameter(local_weight.detach().clone())

        def forward(self, x):
            return nn.functional.linear(x, self.weight)

    class RowParallelLinear(nn.Module):
        def __init__(self, weight):
            super().__init__()
            cols = weight.shape[1] // world
            self.weight = nn.Parameter(weight[:, rank * cols:(rank + 1) * cols].detach().clone())

        def forward(self, x):
            partial = nn.functional.linear(x, self.weight)
            if world > 1:
                dist.all_reduce(partial)
            return partial

    class VocabParallelEmbedding(nn.Module):
        def __init__(self, weight):
            super().__init__()
            self.first = rank * weight.shape[0] // world
            self.weight = nn.Parameter(rows(weight, rank).detach().clone())

        def forward(self, tokens):
            local = tokens - self.first
            outside = (local < 0) | (local >= self.weight.shape[0])
            found = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
            found = found.masked_fill(outside.unsqueeze(-1), 0.0)
            if world > 1:
                dist.all_reduce(found)
            return found

    class Attention(nn.Module):
        def __init__(self, hf_attention):
            super().__init__()
            q, k, v = (getattr(hf_attention, name).weight for name in ("q_proj", "k_proj", "v_proj"))
            self.qkv = ColumnParallelLinear(torch.cat([rows(q, rank), rows(k, rank), rows(v, rank)]))
            self.o = RowParallelLinear(hf_attention.o_proj.weight)

        def forward(self, x, cos, sin):
            batch, tokens, _ = x.shape
            q, k, v = self.qkv(x).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            q = q.view(batch, tokens, heads, head_dim).transpose(1, 2)
            k = k.view(batch, tokens, kv_heads, head_dim).transpose(1, 2)
            v = v.view(batch, tokens, kv_heads, head_dim).transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.o(attended.transpose(1, 2).reshape(batch, tokens, -1))

    class MLP(nn.Module):
        def __init__(self, hf_mlp):
            super().__init__()
            gate, up = hf_mlp.gate_proj.weight, hf_mlp.up_proj.weight
            if bug == "gate_up_as_stored":
                local = rows(torch.cat([gate, up]), rank)  # @gate_up_as_stored
            else:
                local = torch.cat([rows(gate, rank), rows(up, rank)])
            self.gate_up = ColumnParallelLinear(local)
            self.down = RowParallelLinear(hf_mlp.down_proj.weight)

        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(nn.functional.silu(gate) * up)

    class Layer(nn.Module):
        def __init__(self, hf_layer):
            super().__init__()
            self.attention_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.mlp_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.attention_norm.weight.data.copy_(hf_layer.input_layernorm.weight)
            self.mlp_norm.weight.data.copy_(hf_layer.post_attention_layernorm.weight)
            self.attention, self.mlp = Attention(hf_layer.self_attn), MLP(hf_layer.mlp)

        def forward(self, x, cos, sin):
            x = x + self.attention(self.attention_norm(x), cos, sin)
            return x + self.mlp(self.mlp_norm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = VocabParallelEmbedding(hf.model.embed_tokens.weight)
            self.layers = nn.ModuleList(Layer(layer) for layer in hf.model.layers)
            self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.norm.weight.data.copy_(hf.model.norm.weight)
            self.head = ColumnParallelLinear(rows(hf.lm_head.weight, rank))
            inverse = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim)
            self.register_buffer("inverse_frequency", inverse, persistent=False)

        def forward(self, input_ids, use_cache=False):
            angles = torch.arange(input_ids.shape[1]).float()[:, None] * self.inverse_frequency[None, :]
            angles = torch.cat([angles, angles], dim=-1)
            cos, sin = angles.cos(), angles.sin()
            x = self.embed(input_ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            local = self.head(self.norm(x))
            parts = [torch.empty_like(local) for _ in range(world)]
            if world > 1:
                dist.all_gather(parts, local)
            else:
                parts = [local]
            if bug == "head_gathered_wrong_dim":
                return torch.stack(parts, dim=-1).flatten(-2)  # @head_gathered_wrong_dim
            return torch.cat(parts, dim=-1)

    return Decoder().eval()


def candidate():
    import torch.distributed as dist

    hf, inputs = tiny_llama()
    return _port(hf, dist.get_rank(), dist.get_world_size()), inputs


def candidate_one_process():
    hf, inputs = tiny_llama()
    return _port(hf, 0, 1), inputs
