"""A small decoder against its Megatron-style tensor-parallel port: plain tensors, explicit all-reduce.

`reference()` is the decoder on one device. `candidate()` (run with `--candidate-nproc 2`) builds the
same weights and keeps on each rank only its slice, in the layer classes a port writes by hand:
`ColumnParallelLinear` holds rows of the weight (its heads, its MLP columns) and computes its part
of the features; `RowParallelLinear` holds columns of the weight, computes a partial sum and adds the
ranks' partial sums with `torch.distributed.all_reduce` before its bias. Correct, the sums round
differently (`noise`). `TP_BUG` plants a bug in `RowParallelLinear`, the class every layer uses:

- "forgotten_reduce": no all-reduce: each rank goes on with its own partial sum.
- "bias_every_rank": the bias is added before the all-reduce, so it is added once per rank.
"""
import os

LAYERS, WIDTH, HEADS, VOCAB, TOKENS = 2, 32, 4, 64, 6


def _weights():
    import torch

    torch.manual_seed(0)
    return {"embed": torch.randn(VOCAB, WIDTH), "head": torch.randn(VOCAB, WIDTH) * WIDTH ** -0.5,
            "layers": [{name: (torch.randn(rows, cols) * cols ** -0.5, 0.1 * torch.randn(rows))
                        for name, rows, cols in (("q", WIDTH, WIDTH), ("k", WIDTH, WIDTH), ("v", WIDTH, WIDTH),
                                                 ("o", WIDTH, WIDTH), ("up", 2 * WIDTH, WIDTH), ("down", WIDTH, 2 * WIDTH))}
                       for _ in range(LAYERS)]}


def _decoder(rank: int, world: int):
    import torch
    import torch.distributed as dist
    from torch import nn

    bug = os.environ.get("TP_BUG", "") if world > 1 else ""

    class ColumnParallelLinear(nn.Module):
        def __init__(self, weight, bias):
            super().__init__()
            rows = weight.shape[0] // world
            self.weight = nn.Parameter(weight[rank * rows:(rank + 1) * rows].clone())
            self.bias = nn.Parameter(bias[rank * rows:(rank + 1) * rows].clone())

        def forward(self, x):
            return nn.functional.linear(x, self.weight, self.bias)

    class RowParallelLinear(nn.Module):
        def __init__(self, weight, bias):
            super().__init__()
            cols = weight.shape[1] // world
            self.weight = nn.Parameter(weight[:, rank * cols:(rank + 1) * cols].clone())
            self.bias = nn.Parameter(bias.clone())

        def forward(self, x):
            partial = nn.functional.linear(x, self.weight)
            if bug == "bias_every_rank":
                partial = partial + self.bias  # @bias_every_rank
            if world > 1 and bug != "forgotten_reduce":
                dist.all_reduce(partial)  # @all_reduce
            return partial if bug == "bias_every_rank" else partial + self.bias

    class Attention(nn.Module):
        def __init__(self, weights):
            super().__init__()
            self.q, self.k, self.v = (ColumnParallelLinear(*weights[name]) for name in "qkv")
            self.o = RowParallelLinear(*weights["o"])
            self.heads = HEADS // world

        def forward(self, x):
            batch, tokens, _ = x.shape
            q, k, v = (proj(x).view(batch, tokens, self.heads, -1).transpose(1, 2) for proj in (self.q, self.k, self.v))
            attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(attended.transpose(1, 2).reshape(batch, tokens, -1))

    class Layer(nn.Module):
        def __init__(self, weights):
            super().__init__()
            self.attention_norm, self.mlp_norm = nn.RMSNorm(WIDTH), nn.RMSNorm(WIDTH)
            self.attention = Attention(weights)
            self.up, self.down = ColumnParallelLinear(*weights["up"]), RowParallelLinear(*weights["down"])

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.down(nn.functional.gelu(self.up(self.mlp_norm(x))))

    class Decoder(nn.Module):
        def __init__(self, weights):
            super().__init__()
            self.embed = nn.Embedding.from_pretrained(weights["embed"], freeze=False)
            self.layers = nn.ModuleList(Layer(layer) for layer in weights["layers"])
            self.norm = nn.RMSNorm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
            with torch.no_grad():
                self.head.weight.copy_(weights["head"])

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    tokens = torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(1))
    return Decoder(_weights()).eval(), (tokens,)


def reference():
    return _decoder(0, 1)


def candidate():
    import torch.distributed as dist

    return _decoder(dist.get_rank(), dist.get_world_size())
