"""The port of Hugging Face's `ResNetModel` (bottleneck blocks) and its converter.

Each convolution and its BatchNorm are one module (`ConvNorm`): the convolution as the framework's module or the
port's weight and `conv2d`, the norm as the framework's module, its function, written out from its running
statistics, or folded into the convolution by the converter; the blocks in stages (nested) or in one list (flat).
"""

from __future__ import annotations

from ports.layers import Converter, Port, activation, activation_init, cfg, function, klass

STAGES = [[(16, 32, 1)], [(32, 64, 2), (64, 64, 1)]]  # (in channels, out channels, stride) of each block


def write(p: Port, converter: Converter) -> None:
    """Fill `p` with ResNet's classes and `converter` with its lines."""
    p.config.update(channels=3, stem=16, eps=1e-5, reduction=4, stages=STAGES)
    conv_norm = _conv_norm_class(p)
    block = _bottleneck_class(p, conv_norm)
    _model(p, conv_norm, block)
    _convert(p, converter)


def _conv_norm_class(p: Port) -> str:
    d, style, lib = p.d, p.choice("norm"), p.d.lib
    folded = style == "folded"
    weight, bias = p.names["norm_weight"], p.names["norm_bias"]
    if p.choice("conv") == "module":
        init = [f"self.conv = {d.conv2d_module('cin', 'cout', 'kernel', 'stride', 'kernel // 2', folded)}"]
        body = ["x = self.conv(x)"]
    else:
        init = [f"self.conv_weight = {d.parameter('cout, cin, kernel, kernel', None)}",
                "self.stride, self.padding = stride, kernel // 2"]
        if folded:
            init.append(f"self.conv_bias = {d.parameter('cout', 0.0)}")
        conv_bias = "self.conv_bias" if folded else None
        body = [f"x = {d.conv2d('x', 'self.conv_weight', conv_bias, 'self.stride', 'self.padding')}"]
    if style == "module":
        init.append(f"self.bn = {d.batch_norm_module('cout', cfg('eps'))}")
        body.append("return self.bn(x)")
    elif style in ("function", "written"):
        init += [f"self.{weight} = {d.parameter('cout', 1.0)}", f"self.{bias} = {d.parameter('cout', 0.0)}",
                 d.buffer("running_mean", d.zeros("cout", f"{lib}.get_default_dtype()")),
                 d.buffer("running_var", d.ones("cout", f"{lib}.get_default_dtype()")), f"self.eps = {cfg('eps')}"]
        if style == "function":
            body.append("return " + d.batch_norm("x", "self.running_mean", "self.running_var", f"self.{weight}",
                                                 f"self.{bias}", "self.eps"))
        else:
            body += [f"scale = self.{weight} * {lib}.rsqrt(self.running_var + self.eps)",
                     "shift = self.running_mean * scale",
                     f"return x * scale[:, None, None] + (self.{bias} - shift)[:, None, None]"]
    else:
        body.append("return x")
    doc = "A convolution and its BatchNorm" + (" (folded into the convolution by the converter)." if folded else ".")
    return p.klass("ConvNorm", klass("ConvNorm", d.module, doc, init, "x", body, "cin, cout, kernel, stride"))


def _bottleneck_class(p: Port, conv_norm: str) -> str:
    d = p.d
    init = [f"width = cout // {cfg('reduction')}", f"self.reduce = {conv_norm}(cin, width, 1, 1)",
            f"self.conv = {conv_norm}(width, width, 3, stride)", f"self.expand = {conv_norm}(width, cout, 1, 1)",
            f"self.shortcut = {conv_norm}(cin, cout, 1, stride) if cin != cout or stride != 1 else None",
            *activation_init(p, "relu")]
    body = [f"h = {activation(p, 'relu', 'self.reduce(x)')}", f"h = {activation(p, 'relu', 'self.conv(h)')}",
            "h = self.expand(h)", "shortcut = x if self.shortcut is None else self.shortcut(x)",
            f"return {activation(p, 'relu', 'h + shortcut')}"]
    return p.klass("Bottleneck", klass("Bottleneck", d.module, "1x1 reduce, 3x3, 1x1 expand, plus the shortcut.",
                                       init, "x", body, "cin, cout, stride"))


def _model(p: Port, conv_norm: str, block: str) -> None:
    d, nested = p.d, p.choice("tree") == "nested"
    init = [f"self.stem = {conv_norm}({cfg('channels')}, {cfg('stem')}, 7, 2)", *activation_init(p, "relu")]
    body = [f"x = {activation(p, 'relu', 'self.stem(pixel_values)')}"]
    if p.choice("conv") == "module":
        init.append(f"self.pool = {d.max_pool_module(3, 2, 1)}")
        body.append("x = self.pool(x)")
    else:
        body.append(f"x = {d.max_pool('x', 3, 2, 1)}")
    if nested:
        init.append(f"self.stages = {d.module_list}([{d.module_list}([{block}(*spec) for spec in stage]) for stage in "
                    f"{cfg('stages')}])")
        body += ["for stage in self.stages:", "    for block in stage:", "        x = block(x)"]
    else:
        init.append(f"self.blocks = {d.module_list}([{block}(*spec) for stage in {cfg('stages')} for spec in stage])")
        body += ["for block in self.blocks:", "    x = block(x)"]
    body += ["pooled = x.mean([2, 3], keepdim=True)" if p.choice("conv") == "module" else
             "pooled = F.adaptive_avg_pool2d(x, 1)", "return {'last_hidden_state': x, 'pooler_output': pooled}"]
    p.klass("ResNet", klass("ResNet", d.module, "ResNet: the stem, its max pool, the bottleneck blocks, the average.",
                            init, "pixel_values", body))


def _convert(p: Port, converter: Converter) -> None:
    style, conv_name = p.choice("norm"), "conv.weight" if p.choice("conv") == "module" else "conv_weight"
    lines = ["weight = hf[theirs + 'convolution.weight']",
             "gamma, beta = hf[theirs + 'normalization.weight'], hf[theirs + 'normalization.bias']",
             "mean, var = hf[theirs + 'normalization.running_mean'], hf[theirs + 'normalization.running_var']"]
    if style == "folded":
        bias_name = "conv.bias" if p.choice("conv") == "module" else "conv_bias"
        lines += [f"scale = gamma / np.sqrt(var + {cfg('eps')})",
                  f"out[mine + {conv_name!r}] = weight * scale[:, None, None, None]",
                  f"out[mine + {bias_name!r}] = beta - mean * scale"]
    else:
        lines.append(f"out[mine + {conv_name!r}] = weight")
        if style == "module":
            stats = ("bn._mean", "bn._variance") if p.d.name == "paddle" else ("bn.running_mean", "bn.running_var")
            names = ("bn.weight", "bn.bias") + stats
        else:
            names = (p.names["norm_weight"], p.names["norm_bias"], "running_mean", "running_var")
        lines += [f"out[mine + {name!r}] = {value}" for name, value in zip(names, ("gamma", "beta", "mean", "var"))]
        if style == "module" and p.d.name == "torch":
            lines.append("out[mine + 'bn.num_batches_tracked'] = hf[theirs + 'normalization.num_batches_tracked']")
    folded = " (the norm folded into the convolution's weight and bias)" if style == "folded" else ""
    p.converter_helper("conv_norm", function("conv_norm", "out, hf, theirs, mine",
                                             f"One convolution and its BatchNorm{folded}.", lines))
    nested = p.choice("tree") == "nested"
    mine = "f'stages.{s}.{b}.'" if nested else "f'blocks.{j}.'"
    converter.before += [
        "conv_norm(out, hf, 'embedder.embedder.', 'stem.')",
        "blocks = [(s, b) for s, stage in enumerate(CONFIG['stages']) for b in range(len(stage))]",
        "for j, (s, b) in enumerate(blocks):",
        f"    theirs, mine = f'encoder.stages.{{s}}.layers.{{b}}.', {mine}",
        "    conv_norm(out, hf, theirs + 'layer.0.', mine + 'reduce.')",
        "    conv_norm(out, hf, theirs + 'layer.1.', mine + 'conv.')",
        "    conv_norm(out, hf, theirs + 'layer.2.', mine + 'expand.')",
        "    if theirs + 'shortcut.convolution.weight' in hf:",
        "        conv_norm(out, hf, theirs + 'shortcut.', mine + 'shortcut.')"]
