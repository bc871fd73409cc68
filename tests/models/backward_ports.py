"""A pre-norm MLP stack in torch (the reference) and ports of it, for the backward pass.

Three blocks `x = x + fc2(gelu(fc1(norm(x))))`, then a head. Every port computes the same forward;
all but `candidate` differ in their backward only:

- `candidate`: the paddle port, correct.
- `candidate_pylayer`: block 1's GELU is a paddle `PyLayer` whose forward is exact and whose backward
  uses the tanh approximation's derivative (a subtle, 1e-3-sized error).
- (`paddle_model("pylayer_every_block")`: that `PyLayer` in every block, for `backward_every_block.py`.)
- `candidate_detached`: block 1's residual path is `x.detach()`: no gradient flows through it.
- `candidate_frozen`: block 0's `fc2.weight` is frozen (`stop_gradient = True`).
- `torch_function`: a torch port whose block 1 GELU is an `autograd.Function` with the same wrong
  backward (torch against torch).
- `torch_function_nan`: the same, its backward returning NaN.
- `paddle_reference`: the correct paddle port, to run as the reference against a torch candidate
  (`--reference paddle_reference --candidate torch_function`).
"""
import math

import numpy as np

DIM, HIDDEN, BLOCKS = 16, 32, 3


def _inputs():
    return np.random.RandomState(0).normal(size=(4, 8, DIM)).astype("float32")


def _tanh_gelu_derivative(x):
    """d/dx of the tanh approximation of GELU: close to the exact derivative, not equal."""
    c = math.sqrt(2.0 / math.pi)
    inner = c * (x + 0.044715 * x ** 3)
    t = np.tanh(inner)
    return 0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * c * (1 + 3 * 0.044715 * x ** 2)


def torch_model(gelu_block: int = -1, nan_backward: bool = False):
    import torch
    from torch import nn

    class WrongGeluGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.nn.functional.gelu(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            if nan_backward:
                return grad * float("nan")
            return grad * torch.from_numpy(_tanh_gelu_derivative(x.detach().numpy()))

    class Block(nn.Module):
        def __init__(self, custom: bool):
            super().__init__()
            self.norm = nn.LayerNorm(DIM)
            self.fc1 = nn.Linear(DIM, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, DIM)
            self.custom = custom

        def forward(self, x):
            h = self.fc1(self.norm(x))
            h = WrongGeluGrad.apply(h) if self.custom else torch.nn.functional.gelu(h)
            return x + self.fc2(h)

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block(i == gelu_block) for i in range(BLOCKS))
            self.head = nn.Linear(DIM, 4)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    return Stack().eval()


def paddle_model(variant: str = ""):
    import paddle
    from paddle import nn
    from paddle.autograd import PyLayer

    from bisectr.weights import torch_to_paddle

    class WrongGeluGrad(PyLayer):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return paddle.nn.functional.gelu(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensor()
            return grad * paddle.to_tensor(_tanh_gelu_derivative(x.numpy()))

    class Block(nn.Layer):
        def __init__(self, index: int):
            super().__init__()
            self.norm = nn.LayerNorm(DIM)
            self.fc1 = nn.Linear(DIM, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, DIM)
            self.index = index
            self.wrong_gradient_variants = ("pylayer", "pylayer_every_block") if index == 1 else ("pylayer_every_block",)

        def forward(self, x):
            h = self.fc1(self.norm(x))
            h = WrongGeluGrad.apply(h) if variant in self.wrong_gradient_variants else paddle.nn.functional.gelu(h)
            residual = x.detach() if variant == "detached" and self.index == 1 else x
            return residual + self.fc2(h)

    class Stack(nn.Layer):
        def __init__(self):
            super().__init__()
            self.blocks = nn.LayerList([Block(i) for i in range(BLOCKS)])
            self.head = nn.Linear(DIM, 4)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = Stack()
    torch_to_paddle(torch_model(), model).check()
    if variant == "frozen":
        model.blocks[0].fc2.weight.stop_gradient = True
    model.eval()
    return model


def reference():
    import torch

    return torch_model(), (torch.from_numpy(_inputs()),)


def _paddle_side(variant: str):
    import paddle

    return paddle_model(variant), (paddle.to_tensor(_inputs()),)


def candidate():
    return _paddle_side("")


def candidate_pylayer():
    return _paddle_side("pylayer")


def candidate_detached():
    return _paddle_side("detached")


def candidate_frozen():
    return _paddle_side("frozen")


def paddle_reference():
    return _paddle_side("")


def torch_function():
    import torch

    return torch_model(gelu_block=1), (torch.from_numpy(_inputs()),)


def torch_function_nan():
    import torch

    return torch_model(gelu_block=1, nan_backward=True), (torch.from_numpy(_inputs()),)
