"""A 48-layer residual MLP stack written twice with other module names
(`layers.N.ffn.up` vs `blocks.N.mlp.fc_in`). Every layer has the same weights, so
values of neighbouring layers are close: only position and layer numbers tell them apart."""

DEPTH, D = 48, 16


def _layer_weights():
    import torch

    torch.manual_seed(0)
    return torch.randn(4 * D, D) * 0.05, torch.randn(D, 4 * D) * 0.05


def reference():
    import torch

    up_w, down_w = _layer_weights()

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ffn = torch.nn.ModuleDict({"up": torch.nn.Linear(D, 4 * D, bias=False), "down": torch.nn.Linear(4 * D, D, bias=False)})
            with torch.no_grad():
                self.ffn["up"].weight.copy_(up_w)
                self.ffn["down"].weight.copy_(down_w)

        def forward(self, x):
            return x + self.ffn["down"](torch.relu(self.ffn["up"](x)))

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Layer() for _ in range(DEPTH))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(1)
    return Stack().eval(), (torch.randn(3, D),)


def candidate():
    import torch

    up_w, down_w = _layer_weights()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.Module()
            self.mlp.fc_in = torch.nn.Linear(D, 4 * D, bias=False)
            self.mlp.fc_out = torch.nn.Linear(4 * D, D, bias=False)
            with torch.no_grad():
                self.mlp.fc_in.weight.copy_(up_w)
                self.mlp.fc_out.weight.copy_(down_w)

        def forward(self, x):
            return self.mlp.fc_out(torch.nn.functional.relu(self.mlp.fc_in(x))) + x

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(1)
    return Stack().eval(), (torch.randn(3, D),)
