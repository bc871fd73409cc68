"""`bisectr.weights` pairs BatchNorm running statistics by layer type, both ways, with no name map:
torch `running_mean` / `running_var` <-> paddle `_mean` / `_variance`; torch's `num_batches_tracked`
has no paddle counterpart and is neither copied nor reported."""

import numpy as np
import paddle
import pytest
import torch

from bisectr.capture.modelfile import load_module
from bisectr.weights import paddle_to_torch, torch_to_paddle
from conftest import MODELS

RESNET = load_module(MODELS / "paddle_resnet.py")


def _relative(candidate: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(candidate - reference).max() / np.abs(reference).max())


@pytest.fixture(scope="module")
def paddle_resnet():
    return RESNET._paddle_model()


@pytest.mark.parametrize("source", ["layer", "state dict"])
def test_paddle_resnet_moves_to_its_torch_port_without_a_name_map(paddle_resnet, source):
    model = RESNET._torch_resnet18()
    report = paddle_to_torch(paddle_resnet if source == "layer" else paddle_resnet.state_dict(), model).check()
    assert len(report.copied) == 102 and report.transposed == ["fc.weight"] and not report.layout_unknown
    assert not any(name.endswith("num_batches_tracked") for name in report.copied)
    assert int(model.layer4[1].bn1.num_batches_tracked) == 0
    np.testing.assert_array_equal(
        model.layer4[1].bn1.running_var.numpy(), paddle_resnet.layer4[1].bn1._variance.numpy()
    )

    named = RESNET._torch_resnet18()  # the same copy with the name map users had to write by hand
    paddle_to_torch(
        paddle_resnet, named, name_map=[(r"\._mean$", ".running_mean"), (r"\._variance$", ".running_var")]
    ).check()
    for name, value in named.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name

    inputs = RESNET._inputs(seed=2, batch=1)
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(inputs)).numpy()
    with paddle.no_grad():
        expected = paddle_resnet(paddle.to_tensor(inputs)).numpy()
    assert _relative(logits, expected) < 1e-5  # rounding: measured 2.8e-06


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class PaddleNet(paddle.nn.Layer):
    def __init__(self, norm: str):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.bn = getattr(paddle.nn, norm)(8)
        self.fc = paddle.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(paddle.nn.functional.relu(self.bn(self.conv(x))).mean(axis=(2, 3)))


def _trained_torch_net() -> TorchNet:
    """Running statistics (averaged over 3 batches) far from their initial 0 and 1, and a batch counter of 3."""
    torch.manual_seed(0)
    model = TorchNet().train()
    model.bn.momentum = None
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 8, 8) * 3 + 2)
    return model.eval()


@pytest.mark.parametrize("source", ["module", "state dict"])
@pytest.mark.parametrize("norm", ["BatchNorm2D", "BatchNorm"])
def test_torch_cnn_moves_to_paddle_without_a_name_map(norm, source):
    model = _trained_torch_net()
    assert int(model.bn.num_batches_tracked) == 3
    port = PaddleNet(norm)
    port.eval()
    report = torch_to_paddle(model if source == "module" else model.state_dict(), port).check()
    assert sorted(report.copied) == [
        "bn._mean",
        "bn._variance",
        "bn.bias",
        "bn.weight",
        "conv.bias",
        "conv.weight",
        "fc.bias",
        "fc.weight",
    ]
    assert report.transposed == ["fc.weight"] and not report.unmatched and not report.extra
    np.testing.assert_array_equal(port.bn._mean.numpy(), model.bn.running_mean.numpy())
    np.testing.assert_array_equal(port.bn._variance.numpy(), model.bn.running_var.numpy())
    assert model.bn.running_var.min() > 2  # far from the initial 1: the copy is what makes the outputs agree

    inputs = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(inputs)).numpy()
    with paddle.no_grad():
        logits = port(paddle.to_tensor(inputs)).numpy()
    assert _relative(logits, expected) < 1e-6
