"""Eager against `torch.compile`: an attention that takes another path once compiled.

Reference: 4 pre-norm decoder blocks (RMSNorm, 4-head causal self-attention, GELU MLP) run eagerly.
Candidate: the same model, `torch.compile(model)` (inductor). Its attention, as library code often
does, calls the fused `scaled_dot_product_attention` when `torch.compiler.is_compiling()` and
writes the softmax out otherwise; the fused branch scales the queries by 1/sqrt(head_dim) itself and
lets the kernel scale them again. Eager runs never take that branch, so only the compiled model is
wrong. `candidate_fixed()` leaves the scaling to the kernel.

Measured here: the outputs differ by 0.0653 relative; fixed, by 1.9e-07 (the compiled kernels'
rounding).

bisectr should conclude: verdict `divergent`; the culprit is the compiled model's call, and inside
it the module `blocks.0.attention` (compiled alone it makes the difference), the `Tensor.mul` of the
`@compiled_branch` line (the first op on a line eager runs never execute), the compiler step `eager`
(dynamo's graph capture already takes the other branch), confirmed: with every `Attention` left
eager inside the compiled model its error falls to rounding. `candidate_fixed()` is `noise`.
"""
WIDTH, HEADS, BLOCKS = 32, 4, 4


def _decoder(scale_twice: bool):
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(WIDTH))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
            self.out = nn.Linear(WIDTH, WIDTH)
            self.head_dim = WIDTH // HEADS

        def forward(self, x):
            batch, length, _ = x.shape
            q, k, v = self.qkv(x).view(batch, length, 3, HEADS, self.head_dim).permute(2, 0, 3, 1, 4)
            if torch.compiler.is_compiling():
                if scale_twice:
                    q = q * self.head_dim ** -0.5  # @compiled_branch
                mixed = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = q @ k.transpose(-2, -1) * self.head_dim ** -0.5
                causal = torch.ones(length, length, dtype=torch.bool).tril()
                mixed = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
            return self.out(mixed.transpose(1, 2).reshape(batch, length, WIDTH))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = RMSNorm(), Attention()
            self.mlp_norm = RMSNorm()
            self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.down(nn.functional.gelu(self.up(self.mlp_norm(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    return Decoder().eval(), (torch.randn(2, 8, WIDTH, generator=torch.Generator().manual_seed(1)),)


def reference():
    return _decoder(scale_twice=True)


def candidate():
    import torch

    model, inputs = _decoder(scale_twice=True)
    return torch.compile(model), inputs


def candidate_fixed():
    import torch

    model, inputs = _decoder(scale_twice=False)
    return torch.compile(model), inputs
