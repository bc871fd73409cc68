"""Twelve MLP blocks; the candidate's block 7 uses the tanh approximation of GELU."""

DEPTH, D, TANH_BLOCK = 12, 32, 7


def _stack(tanh_block):
    import torch

    class Block(torch.nn.Module):
        def __init__(self, approximate):
            super().__init__()
            self.norm = torch.nn.LayerNorm(D)
            self.up = torch.nn.Linear(D, 2 * D)
            self.down = torch.nn.Linear(2 * D, D)
            self.approximate = approximate

        def forward(self, x):
            h = torch.nn.functional.gelu(self.up(self.norm(x)), approximate=self.approximate)  # GELU_LINE
            return x + self.down(h)

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block("tanh" if i == tanh_block else "none") for i in range(DEPTH))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    model = Stack().eval()
    return model, (torch.randn(4, D),)


def reference():
    return _stack(tanh_block=None)


def candidate():
    return _stack(tanh_block=TANH_BLOCK)
