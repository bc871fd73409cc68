"""Every kind of torch call bisectr must capture: operators, methods, functional,
in-place ops, indexing and library layers (Linear, LayerNorm, MultiheadAttention)."""


def _model():
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(8)
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
            self.register_buffer("scale", torch.tensor(0.5))
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            h = x @ self.w  # LINE_MATMUL
            h = h + x  # LINE_ADD
            h = -h  # LINE_NEG
            h = self.norm(self.proj(h))  # LINE_LAYERS
            h = h.softmax(-1)  # LINE_SOFTMAX
            h = torch.nn.functional.gelu(h)  # LINE_GELU
            h.mul_(self.scale)  # LINE_INPLACE
            first = h[0]  # LINE_GETITEM
            h[1] = first  # LINE_SETITEM
            attended, _ = self.attn(h, h, h, need_weights=False)  # LINE_ATTN
            return attended

    return Net().eval(), (torch.randn(2, 3, 8),)


def reference():
    return _model()


def candidate():
    return _model()
