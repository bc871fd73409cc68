"""Ports whose outputs hold NaN where the reference's are finite (`@`-marked lines are looked up by the tests).

fc1 -> relu -> x2 -> log -> fc2 -> softmax. The relu leaves zeros, so an unclamped `log` makes
-inf, fc2 mixes -inf into NaN and every output is NaN; the reference clamps (log of 1e-6).
- `reference()`: torch, clamped. `candidate()`: torch, unclamped.
- `paddle_candidate()`: the same unclamped model in paddle, the reference's weights copied in.
- `nan_weight()`: the reference with one NaN in `fc2.weight`: the NaN starts at a parameter.

fc1 -> x100 -> softmax, against the same with a naive softmax (exp, sum, div: no max subtracted):
`exp` overflows to inf and inf / inf is NaN. The three ops cannot pair with `softmax` one by one.
- `softmax_reference()` (torch), `naive_softmax()` (torch), `paddle_naive_softmax()` (paddle).
- `hotter_reference()`, `hotter_naive_softmax()`: scores 5x larger; the block no longer pairs.
"""
import numpy as np

IN, HIDDEN, OUT, BATCH = 8, 8, 4, 3


def _weights():
    rng = np.random.default_rng(0)
    weights = {  # torch layout: Linear weight is [out, in]
        "fc1.weight": rng.standard_normal((HIDDEN, IN)) / np.sqrt(IN),
        "fc1.bias": 0.1 * rng.standard_normal(HIDDEN),
        "fc2.weight": rng.standard_normal((OUT, HIDDEN)) / np.sqrt(HIDDEN),
        "fc2.bias": 0.1 * rng.standard_normal(OUT),
    }
    return {name: value.astype(np.float32) for name, value in weights.items()}, rng.standard_normal((BATCH, IN)).astype(np.float32)


def _torch_model(clamp: bool):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(IN, HIDDEN)
            self.fc2 = torch.nn.Linear(HIDDEN, OUT)

        def forward(self, x):
            h = torch.relu(self.fc1(x)) * 2.0
            h = torch.log(h.clamp_min(1e-6)) if clamp else torch.log(h)  # @log
            return torch.softmax(self.fc2(h), -1)

    weights, inputs = _weights()
    model = Net().eval()
    model.load_state_dict({name: torch.from_numpy(value) for name, value in weights.items()})
    return model, (torch.from_numpy(inputs),)


def reference():
    return _torch_model(clamp=True)


def candidate():
    return _torch_model(clamp=False)


def nan_weight():
    import torch

    model, inputs = _torch_model(clamp=True)
    with torch.no_grad():
        model.fc2.weight[1, 2] = float("nan")
    return model, inputs


def paddle_candidate():
    import paddle

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1 = paddle.nn.Linear(IN, HIDDEN)
            self.fc2 = paddle.nn.Linear(HIDDEN, OUT)

        def forward(self, x):
            h = paddle.nn.functional.relu(self.fc1(x)) * 2.0
            h = paddle.log(h)  # @paddle_log
            return paddle.nn.functional.softmax(self.fc2(h), -1)

    weights, inputs = _weights()
    model = Net()
    model.set_state_dict({name: paddle.to_tensor(value.T if name.endswith("weight") else value)
                          for name, value in weights.items()})
    model.eval()
    return model, (paddle.to_tensor(inputs),)


SCALE = 100.0


def _torch_scores():
    import torch

    weights, inputs = _weights()
    fc1 = torch.nn.Linear(IN, HIDDEN)
    fc1.load_state_dict({"weight": torch.from_numpy(weights["fc1.weight"]), "bias": torch.from_numpy(weights["fc1.bias"])})
    return fc1, torch.from_numpy(inputs)


def softmax_reference():
    import torch

    fc1, inputs = _torch_scores()
    return (lambda x: torch.softmax(fc1(x) * SCALE, -1)), (inputs,)  # @softmax


def naive_softmax(scale: float = SCALE):
    import torch

    fc1, inputs = _torch_scores()

    def forward(x):
        e = torch.exp(fc1(x) * scale)  # @exp
        return e / e.sum(-1, keepdim=True)

    return forward, (inputs,)


def hotter_naive_softmax():
    """Scores 5x larger: most rows overflow, the outputs are too far off for the block to pair."""
    return naive_softmax(5 * SCALE)


def paddle_naive_softmax():
    import paddle

    weights, inputs = _weights()
    fc1 = paddle.nn.Linear(IN, HIDDEN)
    fc1.set_state_dict({"weight": paddle.to_tensor(weights["fc1.weight"].T), "bias": paddle.to_tensor(weights["fc1.bias"])})

    def forward(x):
        e = paddle.exp(fc1(x) * SCALE)  # @paddle_exp
        return e / e.sum(-1, keepdim=True)

    return forward, (paddle.to_tensor(inputs),)


def hotter_reference():
    import torch

    fc1, inputs = _torch_scores()
    return (lambda x: torch.softmax(fc1(x) * (5 * SCALE), -1)), (inputs,)  # @hotter_softmax
