"""Paddle's own ResNet-18 (`paddle.vision.models.ResNet`) against a hand-written torch port of it.

Reference (paddle): `ResNet(BasicBlock, depth=18, num_classes=10)`, seeded, eval, input (1, 3, 64, 64).
Its conv weights are scaled by CONV_SCALE, so that conv outputs have a variance of ~1e-2, and every
BatchNorm gets seeded non-trivial affine parameters and running statistics: the running mean and
variance of its input on a calibration batch, the variance times U(0.5, 1.5). At that variance
the epsilon of a norm matters. Candidate (torch): the same network written out with the same
module names (`conv1`, `bn1`, `layer1.0.conv1`, ..., `fc`), weights copied with
`bisectr.weights.paddle_to_torch`. `candidate_bn_eps()` sets eps=1e-3 (not 1e-5) in the one norm
`layer4.1.bn1` (line marked `# @eps`).

Measured here: logits (magnitude 3.2) differ by 8.8e-06 (2.8e-06 relative); with
`candidate_bn_eps()`, by 0.29 (9.0e-02 relative).

bisectr should conclude: `noise` for `candidate()`; `divergent` for `candidate_bn_eps()`, culprit the
`batch_norm` of `layer4.1.bn1`.
"""
import numpy as np

CONV_SCALE = 0.1


def _inputs(seed, batch):
    return np.random.default_rng(seed).standard_normal((batch, 3, 64, 64)).astype(np.float32)


def _paddle_model():
    import paddle
    from paddle.vision.models import ResNet
    from paddle.vision.models.resnet import BasicBlock

    paddle.seed(0)
    model = ResNet(BasicBlock, depth=18, num_classes=10)
    model.eval()
    rng = np.random.default_rng(0)

    def calibrate(norm, inputs):  # runs before each BatchNorm, in forward order
        x = inputs[0].numpy()
        channels = x.shape[1]
        norm._mean.set_value((x.mean(axis=(0, 2, 3)) + 0.01 * rng.standard_normal(channels)).astype(np.float32))
        norm._variance.set_value((x.var(axis=(0, 2, 3)) * rng.uniform(0.5, 1.5, channels)).astype(np.float32))

    hooks = []
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.Conv2D):
            layer.weight.set_value(layer.weight.numpy() * CONV_SCALE)
        elif isinstance(layer, paddle.nn.BatchNorm2D):
            channels = layer.weight.shape[0]
            layer.weight.set_value((1 + 0.1 * rng.standard_normal(channels)).astype(np.float32))
            layer.bias.set_value((0.1 * rng.standard_normal(channels)).astype(np.float32))
            hooks.append(layer.register_forward_pre_hook(calibrate))
    with paddle.no_grad():
        model(paddle.to_tensor(_inputs(seed=1, batch=4)))
    for hook in hooks:
        hook.remove()
    return model


def reference():
    import paddle

    return _paddle_model(), (paddle.to_tensor(_inputs(seed=2, batch=1)),)


def _torch_resnet18():
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, inplanes, planes, stride=1):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet18(nn.Module):
        def __init__(self, num_classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            self.layer1 = self.stage(64, 64, 1)
            self.layer2 = self.stage(64, 128, 2)
            self.layer3 = self.stage(128, 256, 2)
            self.layer4 = self.stage(256, 512, 2)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        @staticmethod
        def stage(inplanes, planes, stride):
            return nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet18()


def candidate():
    import torch

    from bisectr.weights import paddle_to_torch

    model = _torch_resnet18()
    report = paddle_to_torch(_paddle_model(), model)  # BatchNorm's buffers are paired by bisectr.weights itself
    # Paddle's BatchNorm has no `num_batches_tracked` (unused in eval); everything else must copy.
    assert not report.unmatched and not report.mis_shaped, report
    assert all(name.endswith("num_batches_tracked") for name in report.extra), report
    return model.eval(), (torch.from_numpy(_inputs(seed=2, batch=1)),)


def candidate_bn_eps():
    """The port with eps=1e-3 instead of 1e-5 in the first norm of the last block."""
    model, inputs = candidate()
    model.layer4[1].bn1.eps = 1e-3  # @eps
    return model, inputs


def candidate_bn_stats_default():
    """The port whose weight converter copied the parameters but none of BatchNorm's running statistics:
    every one of the 20 torch BatchNorms keeps running_mean 0 / running_var 1 (first: `bn1`; line marked
    `# @stats`). Measured here: logits (magnitude 3.2) differ by 2.7 (0.85 relative). bisectr should conclude
    `divergent`, culprit the `batch_norm` of `bn1` (leaf `bn1.running_mean` / `running_var`), recurring in
    every later BatchNorm; patching all 20 takes the outputs back to noise."""
    import torch

    from bisectr.weights import paddle_to_torch

    model = _torch_resnet18()
    state = _paddle_model().state_dict()
    # The converter asked torch which entries to fill, and torch's running statistics are buffers:
    parameters = {name: state[name] for name, _ in model.named_parameters()}  # @stats
    report = paddle_to_torch(parameters, model)
    assert not report.unmatched and not report.mis_shaped, report
    assert all(name.rpartition(".")[2] in ("running_mean", "running_var", "num_batches_tracked")
               for name in report.extra), report
    return model.eval(), (torch.from_numpy(_inputs(seed=2, batch=1)),)
