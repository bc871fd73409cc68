"""A PaddlePaddle port left in training mode: its dropout is on, so no two of its runs agree.

Both frameworks build layers in training mode; the torch reference calls `.eval()`, the port forgets to.
Each run of the port then drops other activations, and a difference between the sides says nothing about
the port's code until that is fixed.

Reference (torch): an MLP of three blocks (Linear 32->32, GELU, Dropout(0.1)) and a Linear head, in eval
mode. Candidate: its paddle port, weights copied by `bisectr.weights.torch_to_paddle`, left in train mode.

`candidate_downscale()`: the port in eval mode, but with paddle's other dropout mode,
`mode="downscale_in_infer"`: it scales by 1 - p when it is off, where torch's dropout passes its input on.

Measured here: outputs (magnitude 0.20) differ by 0.03 to 0.18 (relative), other on every run; with the port
put in eval mode by 7.3e-8; with `candidate_downscale()` by 1.4e-2 (7.1e-2 relative).

bisectr should conclude: verdict `nondeterministic` (exit 1): the candidate does not repeat itself; the
first op that differs between two of its runs is the dropout of `blocks.0.drop`, cause `random`, fix
`model.eval()`. With `--fix-nondeterminism` it puts the port in eval mode, records again and searches as
usual: `noise` (the port is right). For `candidate_downscale()`: `divergent`, at the dropout of `blocks.0.drop`.
"""


def _torch_model():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 32)
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(torch.nn.functional.gelu(self.fc(x)))

    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("blocks", torch.nn.Sequential(Block(), Block(), Block()))
    model.add_module("head", torch.nn.Linear(32, 8))
    return model.eval()


def _paddle_model(mode: str = "upscale_in_train"):
    import paddle

    class Block(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(32, 32)
            self.drop = paddle.nn.Dropout(0.1, mode=mode)

        def forward(self, x):
            return self.drop(paddle.nn.functional.gelu(self.fc(x)))

    model = paddle.nn.Sequential()  # built in training mode, as paddle builds every layer
    model.add_sublayer("blocks", paddle.nn.Sequential(Block(), Block(), Block()))
    model.add_sublayer("head", paddle.nn.Linear(32, 8))
    return model


def _inputs():
    import numpy as np

    return np.random.default_rng(0).standard_normal((4, 32)).astype("float32")


def reference():
    import torch

    return _torch_model(), (torch.from_numpy(_inputs()),)


def candidate(mode: str = "upscale_in_train", train: bool = True):
    import paddle

    from bisectr.weights import torch_to_paddle

    model = _paddle_model(mode)
    torch_to_paddle(_torch_model(), model).check()
    if not train:
        model.eval()
    return model, (paddle.to_tensor(_inputs()),)  # left in training mode: the port never calls .eval()


def candidate_downscale():
    return candidate("downscale_in_infer", train=False)
