"""Hand port of a tiny Hugging Face ResNet (torch) to PaddlePaddle, with planted porting mistakes.

Reference
---------
``transformers.ResNetModel`` built from a tiny ``ResNetConfig``: 3 input channels, embedding_size 16,
hidden_sizes [16, 32, 64], depths [2, 1, 1], layer_type "basic", hidden_act "relu",
downsample_in_first_stage False.  ``torch.manual_seed(0)``, then every weight is redrawn from a seeded
generator at trained-model scale: conv kernels N(0, 1/fan_in), BatchNorm
gamma 1 + 0.2 N(0,1), beta 0.2 N(0,1), running_mean 0.2 N(0,1), running_var U(0.5, 1.5).  ``.eval()``.
Input: ``pixel_values`` of shape (2, 3, 32, 32) from ``numpy.random.default_rng(0)``.  The compared output
is ``last_hidden_state`` (2, 64, 2, 2), the feature map before the global average pool (values O(1)-O(10)).

Port (``candidate``)
--------------------
Written in PaddlePaddle with its own classes and names:
  ``ResNetPaddle`` (root) -> ``stem`` (``Stem``: ``conv`` 7x7/2 + ``bn`` + ReLU, max-pool done functionally,
  not as a sub-layer) -> ``levels`` (LayerList of ``Level``) -> ``units`` (LayerList of ``ResUnit``).
  A ``ResUnit`` holds its layers flat (``conv_a``, ``bn_a``, ``conv_b``, ``bn_b``) instead of two conv-norm-act
  sub-modules, and an optional ``skip`` (``SkipProjection``: ``conv`` 1x1/stride + ``bn``).  The unit adds the
  skip first into the main branch and applies one functional ReLU after the sum; the stage strides are decided
  at the model level and handed down.  paddle.nn.Conv2D (bias-free) and paddle.nn.BatchNorm2D (built with
  keyword momentum/epsilon) are used; eval mode uses the converted running statistics.  The forward takes
  ``pixel_values`` and returns ``{"last_hidden_state": ...}``.

Converter
---------
``convert(sd)`` maps the reference's numpy state dict to the port's names by regex: ``embedder.embedder.*`` ->
``stem.*``, ``encoder.stages.i.layers.j.layer.{0,1}.*`` -> ``levels.i.units.j.{conv,bn}_{a,b}.*``,
``...shortcut.*`` -> ``...skip.*``; ``convolution`` -> ``conv``, ``normalization`` -> ``bn``; BatchNorm
``running_mean``/``running_var`` -> paddle's ``_mean``/``_variance``; ``num_batches_tracked`` is dropped.
Conv layouts are identical ([out, in, kh, kw]) so kernels are copied as they are.  The result must cover the
port's state dict exactly (checked), then ``set_state_dict``.

Planted mistakes (one tagged line each, built by a flag handed to the port / converter)
-----------------------------------------------------------------------------------------
  candidate_bn_train        (tag bn_train): after ``model.eval()`` the first BatchNorm of levels.1.units.0 is left
                            in training mode: it normalises by the batch's statistics (and keeps updating its
                            running statistics); the output is still the same on every call.
  candidate_bn_eps          (tag bn_eps): BatchNorm2D built with torch's positional order ``(c, 1e-5, 0.1)``;
                            paddle's order is (num_features, momentum, epsilon), so every BatchNorm gets
                            epsilon 0.1 (and momentum 1e-5).
  candidate_shortcut_stride (tag shortcut_stride): the skip projection's stride computed as the cumulative
                            reduction 2**level instead of 2; right for level 1, 4 at level 2, where the 1x1 skip
                            map silently broadcasts against the 2x2 main branch.
  candidate_conv_flip       (tag conv_flip): the converter flips every conv kernel spatially (convolution vs
                            cross-correlation confusion); the 1x1 skip kernels are unaffected.
  candidate_var_as_mean     (tag var_as_mean): the converter fills paddle's ``_mean`` from ``running_var``.

Measured (relative error = max|port - ref| / max|ref| on last_hidden_state, max|ref| = 11.9, std 1.65):
  candidate 3.6e-07 (< 1e-5); bn_train 2.8e-01; bn_eps 2.7e-01; shortcut_stride 6.5e-01;
  conv_flip 7.3e-01; var_as_mean 1.0e+00 (each also the same relative distance from the correct port).
  Every function gives bit-identical outputs on two consecutive calls.
"""

import re

import numpy as np

EMBED = 16
HIDDEN = [16, 32, 64]
DEPTHS = [2, 1, 1]
IMAGE = 32
BATCH = 2

EXPECTED = {
    "candidate": {"verdict": "noise"},
    "candidate_bn_train": {
        "verdict": "divergent",
        "module": "levels.1.units.0.bn_a",
        "kind": "other",
        "what": "This BatchNorm is left in training mode after eval(), so it normalises by the batch "
                "statistics instead of the loaded running statistics (and keeps updating them).",
    },
    "candidate_bn_eps": {
        "verdict": "divergent",
        "module": "stem.bn",
        "kind": "default",
        "what": "BatchNorm2D is called with torch's positional order (c, eps, momentum), but paddle's is "
                "(c, momentum, epsilon), so every BatchNorm runs with epsilon 0.1 instead of 1e-5.",
    },
    "candidate_shortcut_stride": {
        "verdict": "divergent",
        "module": "levels.2.units.0.skip.conv",
        "kind": "other",
        "what": "The 1x1 skip-projection conv of level 2 uses stride 4 (cumulative 2**level) instead of 2, and "
                "its 1x1 output silently broadcasts over the 2x2 main branch in the residual add.",
    },
    "candidate_conv_flip": {
        "verdict": "divergent",
        "module": "stem.conv",
        "leaf": "stem.conv.weight",
        "kind": "converter",
        "what": "The converter flips every conv kernel spatially ([:, :, ::-1, ::-1]), as if paddle computed a "
                "true convolution rather than a cross-correlation.",
    },
    "candidate_var_as_mean": {
        "verdict": "divergent",
        "module": "stem.bn",
        "leaf": "stem.bn._mean",
        "kind": "converter",
        "what": "The converter loads each BatchNorm's running_var into paddle's _mean buffer, so every "
                "BatchNorm subtracts the variance instead of the mean.",
    },
}


def _pixels():
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32)


# --------------------------------------------------------------------------------------------------------------
# reference
# --------------------------------------------------------------------------------------------------------------

def _reference_model():
    import torch
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    cfg = ResNetConfig(num_channels=3, embedding_size=EMBED, hidden_sizes=list(HIDDEN), depths=list(DEPTHS),
                       layer_type="basic", hidden_act="relu", downsample_in_first_stage=False)
    model = ResNetModel(cfg)
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Conv2d):
                fan_in = mod.weight.shape[1] * mod.weight.shape[2] * mod.weight.shape[3]
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * (1.0 / fan_in) ** 0.5)
            elif isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(1.0 + 0.2 * torch.randn(c, generator=gen))
                mod.bias.copy_(0.2 * torch.randn(c, generator=gen))
                mod.running_mean.copy_(0.2 * torch.randn(c, generator=gen))
                mod.running_var.copy_(0.5 + torch.rand(c, generator=gen))
    model.eval()
    return model


def reference():
    import torch

    model = _reference_model()
    return model, {"pixel_values": torch.from_numpy(_pixels())}


# --------------------------------------------------------------------------------------------------------------
# port
# --------------------------------------------------------------------------------------------------------------

def _make_bn(channels, bug):
    from paddle import nn

    bn = nn.BatchNorm2D(channels, momentum=0.9, epsilon=1e-5)
    if bug == "bn_eps": bn = nn.BatchNorm2D(channels, 1e-5, 0.1)  # @bn_eps
    return bn


def _classes():
    import paddle
    from paddle import nn
    import paddle.nn.functional as F

    class Stem(nn.Layer):
        def __init__(self, in_ch, out_ch, bug):
            super().__init__()
            self.conv = nn.Conv2D(in_ch, out_ch, 7, stride=2, padding=3, bias_attr=False)
            self.bn = _make_bn(out_ch, bug)

        def forward(self, x):
            x = F.relu(self.bn(self.conv(x)))
            return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)

    class SkipProjection(nn.Layer):
        def __init__(self, in_ch, out_ch, stride, bug):
            super().__init__()
            self.conv = nn.Conv2D(in_ch, out_ch, 1, stride=stride, padding=0, bias_attr=False)
            self.bn = _make_bn(out_ch, bug)

        def forward(self, x):
            return self.bn(self.conv(x))

    class ResUnit(nn.Layer):
        def __init__(self, in_ch, out_ch, stride, skip_stride, bug):
            super().__init__()
            self.conv_a = nn.Conv2D(in_ch, out_ch, 3, stride=stride, padding=1, bias_attr=False)
            self.bn_a = _make_bn(out_ch, bug)
            self.conv_b = nn.Conv2D(out_ch, out_ch, 3, stride=1, padding=1, bias_attr=False)
            self.bn_b = _make_bn(out_ch, bug)
            if in_ch != out_ch or stride != 1:
                self.skip = SkipProjection(in_ch, out_ch, skip_stride, bug)
            else:
                self.skip = None

        def forward(self, x):
            identity = x if self.skip is None else self.skip(x)
            h = F.relu(self.bn_a(self.conv_a(x)))
            h = identity + self.bn_b(self.conv_b(h))
            return F.relu(h)

    class Level(nn.Layer):
        def __init__(self, in_ch, out_ch, depth, stride, skip_stride, bug):
            super().__init__()
            units = [ResUnit(in_ch, out_ch, stride, skip_stride, bug)]
            units += [ResUnit(out_ch, out_ch, 1, 1, bug) for _ in range(depth - 1)]
            self.units = nn.LayerList(units)

        def forward(self, x):
            for unit in self.units:
                x = unit(x)
            return x

    class ResNetPaddle(nn.Layer):
        def __init__(self, bug=None):
            super().__init__()
            self.stem = Stem(3, EMBED, bug)
            levels = []
            in_ch = EMBED
            for i, (out_ch, depth) in enumerate(zip(HIDDEN, DEPTHS)):
                stride = 1 if i == 0 else 2
                skip_stride = stride
                if bug == "shortcut_stride": skip_stride = 2 ** i  # @shortcut_stride
                levels.append(Level(in_ch, out_ch, depth, stride, skip_stride, bug))
                in_ch = out_ch
            self.levels = nn.LayerList(levels)

        def forward(self, pixel_values):
            x = self.stem(pixel_values)
            for level in self.levels:
                x = level(x)
            return {"last_hidden_state": x}

    return ResNetPaddle


_STEM_RE = re.compile(r"^embedder\.embedder\.(convolution|normalization)\.(\w+)$")
_UNIT_RE = re.compile(r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.(layer\.0|layer\.1|shortcut)\."
                      r"(convolution|normalization)\.(\w+)$")


def convert(state_dict, bug=None):
    """Reference (HF ResNet, numpy) state dict -> port state dict (numpy, float32)."""
    mean_src = "running_mean"
    if bug == "var_as_mean": mean_src = "running_var"  # @var_as_mean
    out = {}
    for name, value in state_dict.items():
        if name.endswith("num_batches_tracked"):
            continue
        m = _STEM_RE.match(name)
        if m:
            kind, leaf = m.groups()
            prefix = "stem." + ("conv" if kind == "convolution" else "bn")
        else:
            m = _UNIT_RE.match(name)
            if m is None:
                raise KeyError(f"unmapped reference parameter {name}")
            lvl, unit, part, kind, leaf = m.groups()
            sub = {"layer.0": "{}_a", "layer.1": "{}_b", "shortcut": "skip.{}"}[part]
            prefix = f"levels.{lvl}.units.{unit}." + sub.format("conv" if kind == "convolution" else "bn")
        arr = np.asarray(value, dtype=np.float32)
        if kind == "convolution":
            if bug == "conv_flip": arr = arr[:, :, ::-1, ::-1]  # @conv_flip
            out[f"{prefix}.weight"] = np.ascontiguousarray(arr)
        elif leaf == "running_mean":
            continue  # filled together with running_var below
        elif leaf == "running_var":
            base = name[: -len("running_var")]
            out[f"{prefix}._mean"] = np.asarray(state_dict[base + mean_src], dtype=np.float32)
            out[f"{prefix}._variance"] = arr
        else:
            out[f"{prefix}.{leaf}"] = arr
    return out


def _build(bug=None):
    import paddle

    paddle.set_device("cpu")
    paddle.seed(0)
    ref = _reference_model()
    sd = {k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()}
    model = _classes()(bug=bug)
    converted = convert(sd, bug=bug)
    target = model.state_dict()
    missing = set(target) - set(converted)
    extra = set(converted) - set(target)
    if missing or extra:
        raise KeyError(f"converter mismatch: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for k, v in converted.items():
        if tuple(target[k].shape) != v.shape:
            raise ValueError(f"shape mismatch for {k}: {tuple(target[k].shape)} vs {v.shape}")
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in converted.items()})
    model.eval()
    if bug == "bn_train": model.levels[1].units[0].bn_a.train()  # @bn_train
    return model, {"pixel_values": paddle.to_tensor(_pixels())}


def candidate():
    return _build()


def candidate_bn_train():
    return _build("bn_train")


def candidate_bn_eps():
    return _build("bn_eps")


def candidate_shortcut_stride():
    return _build("shortcut_stride")


def candidate_conv_flip():
    return _build("conv_flip")


def candidate_var_as_mean():
    return _build("var_as_mean")
