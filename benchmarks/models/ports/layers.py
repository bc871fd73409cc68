"""The pieces every port is made of, written as source text: linear layers, norms, activations, position tables,
masks, attention and MLPs, each as the structural choices say, with the converter lines that fill its weights.

A `Port` gathers what one port's source holds while the model writers (`transformer.py`, `t5.py`, `resnet.py`) fill
it: its classes, the helper functions its forward calls (each written once), the converter's helpers and
`CONFIG`. Every statement is one line: the mutations (`mutate.py`) replace text inside a line.

A decoding port (`decoding.py`) marks the lines that run at decode steps (`Port.at_decode`: its cache, positions,
masks, tables and the attention's cached path) and registers the decoding mistakes each can be written with
(`Alternative`); `writer.py` strips the marks and gives their line numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ports.architectures import Arch
from ports.dialect import Dialect

INDENT = "    "


def cfg(name: str) -> str:
    """How the port's code reads a size of its config."""
    return f"CONFIG[{name!r}]"


HIDDEN, INTERMEDIATE = cfg("hidden"), cfg("intermediate")


def indented(lines: list[str], depth: int = 1) -> list[str]:
    """`lines` indented by `depth` levels (blank lines left blank)."""
    return [INDENT * depth + line if line else "" for line in lines]


def klass(name: str, base: str, doc: str, init: list[str], forward_args: str, forward: list[str],
          init_args: str = "") -> list[str]:
    """A module class: `__init__(self[, init_args])` holding `init`, `forward(self, forward_args)` computing."""
    return [f"class {name}({base}):", f'    """{doc}"""', "",
            f"    def __init__(self{', ' + init_args if init_args else ''}):", "        super().__init__()",
            *indented(init, 2), "", f"    def forward(self, {forward_args}):", *indented(forward, 2)]


def function(name: str, args: str, doc: str, body: list[str]) -> list[str]:
    """A module-level function's lines."""
    return [f"def {name}({args}):", f'    """{doc}"""', *indented(body)]


def transposed(expression: str) -> str:
    """`expression` transposed, a transpose of a transpose written as neither."""
    return expression[:-2] if expression.endswith(".T") else f"{expression}.T"


DECODE_MARK = "  # @decode:"  # ends a line that runs at decode steps, with its mark's number (stripped by the writer)


@dataclass(frozen=True)
class Alternative:
    """A decoding mistake written out: its kind, and the marked lines it rewrites, `(mark, mistaken text)` (the first
    the line the mistake is judged at)."""

    kind: str
    lines: tuple[tuple[int, str], ...]


def unmarked(line: str) -> tuple[str, int | None]:
    """`line` without its decode mark, and the mark's number (None: unmarked)."""
    text, found, mark = line.rpartition(DECODE_MARK)
    return (text, int(mark)) if found else (line, None)


@dataclass
class Port:
    """One port being written: the family, framework, choices and names it is written with, and what its source
    holds so far."""

    arch: Arch
    framework: str
    choices: dict[str, str]
    names: dict[str, object]
    d: Dialect  # how its framework spells each construct
    config: dict[str, object] = field(default_factory=dict)
    helpers: dict[str, list[str]] = field(default_factory=dict)  # functions the forward calls, by name
    classes: dict[str, list[str]] = field(default_factory=dict)  # by name, in the order written
    converter_helpers: dict[str, list[str]] = field(default_factory=dict)
    marks: int = 0  # decode marks handed out
    alternatives: list[Alternative] = field(default_factory=list)

    @property
    def decoding(self) -> bool:
        """Is this a decoding port (its own cache, for cached decoding)?"""
        return "cache_layout" in self.choices

    def at_decode(self, line: str, *mistakes: tuple[str, str]) -> str:
        """`line` marked as code that runs at decode steps; each `(kind, text)` of `mistakes` a decoding mistake that
        writes the line as `text`."""
        self.marks += 1
        self.alternatives += [Alternative(kind, ((self.marks, text),)) for kind, text in mistakes]
        return f"{line}{DECODE_MARK}{self.marks}"

    def swapped(self, kind: str, first: str, second: str) -> None:
        """A decoding mistake `kind` that exchanges two marked lines of one block (judged at the first's place, which
        then holds the second)."""
        (first_text, first_mark), (second_text, second_mark) = unmarked(first), unmarked(second)
        self.alternatives.append(Alternative(kind, ((first_mark, second_text.strip()), (second_mark,
                                                                                         first_text.strip()))))

    def decode_block(self, lines: list[str]) -> list[str]:
        """A function's or class's lines with every statement of its bodies marked as running at decode steps (those
        marked already kept as they are)."""
        return [line if not line.strip() or line.lstrip().startswith(("def ", "class ", '"""')) or DECODE_MARK in line
                else self.at_decode(line) for line in lines]

    def choice(self, name: str) -> str | None:
        """The value drawn for choice `name`, None where it does not apply."""
        return self.choices.get(name)

    def helper(self, name: str, lines: list[str]) -> str:
        """Add a function the forward calls (once), and return its name."""
        self.helpers.setdefault(name, lines)
        return name

    def converter_helper(self, name: str, lines: list[str]) -> str:
        """Add a function the converter calls (once), and return its name."""
        self.converter_helpers.setdefault(name, lines)
        return name

    def klass(self, name: str, lines: list[str]) -> str:
        """Add a class (once), and return its name."""
        self.classes.setdefault(name, lines)
        return name


class Converter:
    """The lines of `convert(hf)`: weights outside the layers, and those of each layer in a loop over them."""

    def __init__(self):
        self.before: list[str] = []  # before the loop over layers
        self.loops: list[tuple[str, str, list[str]]] = []  # (HF prefix, port prefix, lines in the loop)
        self.after: list[str] = []

    def loop(self, hf_prefix: str, mine_prefix: str) -> list[str]:
        """A new loop over the layers under `hf_prefix` (the port's under `mine_prefix`): the list of its lines."""
        lines: list[str] = []
        self.loops.append((hf_prefix, mine_prefix, lines))
        return lines


LOOP_PREFIXES = ("mine", "expert")  # the converter's variables holding a layer's (an expert's) prefix


def mine(prefix: str, name: str) -> str:
    """The port's name for a leaf under `prefix`, as a Python expression: `prefix` is a literal, or one of the
    converter's variables `LOOP_PREFIXES`."""
    return f"{prefix} + {name!r}" if prefix in LOOP_PREFIXES else repr(f"{prefix}{name}")


def joined(module: str, leaf: str) -> str:
    """`module.leaf`, or `leaf` where the module is the prefix itself."""
    return f"{module}.{leaf}" if module else leaf


# -- linear layers ---------------------------------------------------------------------------------------------------


def stores_in_out(p: Port) -> bool:
    """Does the port's linear layer keep its weight (in, out)?"""
    linear = p.choice("linear")
    return linear == "own_in_out" or (linear == "framework" and p.d.linear_stores_in_out)


def linear(p: Port, fan_in: str, fan_out: str, bias: bool) -> str:
    """The constructor of a linear layer as the port writes them."""
    if p.choice("linear") == "framework":
        return p.d.linear(fan_in, fan_out, bias)
    p.klass("Linear", _linear_class(p))
    return f"Linear({fan_in}, {fan_out}, bias={bias})"


def _linear_class(p: Port) -> list[str]:
    d, in_out = p.d, p.choice("linear") == "own_in_out"
    shape = "fan_in, fan_out" if in_out else "fan_out, fan_in"
    if d.name == "torch":
        product = "x @ self.weight" if in_out else "x @ self.weight.T"
    else:
        product = "paddle.matmul(x, self.weight)" if in_out else "paddle.matmul(x, self.weight, transpose_y=True)"
    return klass("Linear", d.module, f"y = x W + b, the weight stored ({shape.replace('fan_', '')}).",
                 [f"self.weight = {d.parameter(shape, None)}",
                  f"self.bias = {d.parameter('fan_out', 0.0)} if bias else None"],
                 "x", [f"y = {product}", "return y if self.bias is None else y + self.bias"],
                 init_args="fan_in, fan_out, bias=True")


def convert_linear(p: Port, lines: list[str], prefix: str, name: str, weight: str, bias: str | None) -> None:
    """Converter lines filling linear layer `name` from `weight` (an expression of an (out, in) array) and `bias`."""
    lines.append(f"out[{mine(prefix, joined(name, 'weight'))}] = {transposed(weight) if stores_in_out(p) else weight}")
    if bias is not None:
        lines.append(f"out[{mine(prefix, joined(name, 'bias'))}] = {bias}")


# -- norms -------------------------------------------------------------------------------------------------------------


def norm(p: Port, dim: str = "CONFIG['hidden']") -> str:
    """The constructor of a norm of the hidden states (the family's RMS or layer norm) as the port writes it."""
    style, eps = p.choice("norm"), "CONFIG['eps']"
    if style == "module":
        return p.d.rms_norm_module(dim, eps) if p.arch.norm == "rms" else p.d.layer_norm_module(dim, eps)
    name = "RMSNorm" if p.arch.norm == "rms" else "LayerNorm"
    p.klass(name, _norm_class(p))
    return f"{name}({dim}, {eps})"


def _norm_parameters(p: Port) -> tuple[str, str]:
    weight = "weight" if p.choice("norm") == "module" else p.names["norm_weight"]
    bias = "bias" if p.choice("norm") == "module" else p.names["norm_bias"]
    return weight, bias


def _norm_class(p: Port) -> list[str]:
    d, style = p.d, p.choice("norm")
    weight, bias = _norm_parameters(p)
    offset = p.choice("norm_offset") == "forward"
    scale = f"(1.0 + self.{weight})" if offset else f"self.{weight}"
    centred = "x" if p.arch.norm == "rms" else "(x - mean)"
    normalised = f"{centred} * {d.lib}.rsqrt(variance + self.eps)" if style == "written_rsqrt" \
        else f"{centred} / {d.lib}.sqrt(variance + self.eps)"
    init = [f"self.{weight} = {d.parameter('dim', 0.0 if offset else 1.0)}"]
    if p.arch.norm == "rms":
        doc = "RMS norm" + (": x / rms(x) * (1 + w)." if offset else ": x / rms(x) * w.")
        if style == "function":
            forward = [f"return {d.rms_norm('x', 'self.dim', scale, 'self.eps')}"]
        else:
            forward = ["variance = x.pow(2).mean(-1, keepdim=True)", f"x = {normalised}", f"return x * {scale}"]
    else:
        doc = "Layer norm: (x - mean) / std * w + b."
        init.append(f"self.{bias} = {d.parameter('dim', 0.0)}")
        if style == "function":
            forward = [f"return {d.layer_norm('x', 'self.dim', scale, f'self.{bias}', 'self.eps')}"]
        else:
            forward = ["mean = x.mean(-1, keepdim=True)", "variance = (x - mean).pow(2).mean(-1, keepdim=True)",
                       f"x = {normalised}",
                       f"return x * {scale} + self.{bias}"]
    return klass("RMSNorm" if p.arch.norm == "rms" else "LayerNorm", d.module, doc,
                 init + ["self.dim = dim", "self.eps = eps"], "x", forward, init_args="dim, eps")


def convert_norm(p: Port, lines: list[str], prefix: str, name: str, read, hf_name: str) -> None:
    """Converter lines filling norm `name` from the reference's norm `hf_name`, its leaves read by `read(name)`."""
    weight, bias = _norm_parameters(p)
    values = read(f"{hf_name}.weight")
    if p.choice("norm_offset") == "folded":
        values = f"1.0 + {values}"
    lines.append(f"out[{mine(prefix, f'{name}.{weight}')}] = {values}")
    if p.arch.norm == "layer":
        lines.append(f"out[{mine(prefix, f'{name}.{bias}')}] = {read(f'{hf_name}.bias')}")


def reader(dictionary: str):
    """`read(name)`: the expression of the reference's leaf `name` in `dictionary` (`hf`, or a layer's `theirs`)."""
    return lambda name: f"{dictionary}[{name!r}]"


# -- activations -------------------------------------------------------------------------------------------------------


def activation_init(p: Port, kind: str, attribute: str = "act") -> list[str]:
    """The `__init__` line holding the activation, where the port keeps it as a module."""
    if p.choice("activation") != "module":
        return []
    d = p.d
    module = {"silu": "nn.SiLU()", "gelu": d.gelu_module(False), "gelu_tanh": d.gelu_module(True),
              "relu": "nn.ReLU()", "tanh": "nn.Tanh()"}[kind]
    return [f"self.{attribute} = {module}"]


def activation(p: Port, kind: str, x: str, attribute: str = "act") -> str:
    """`kind` applied to `x` as the port writes it: a function, the module `attribute`, or written out."""
    style, lib, d = p.choice("activation"), p.d.lib, p.d
    if style == "module":
        return f"self.{attribute}({x})"
    if style == "function":
        return {"silu": f"F.silu({x})", "gelu": d.gelu(x, False), "gelu_tanh": d.gelu(x, True),
                "relu": f"F.relu({x})", "tanh": f"{lib}.tanh({x})"}[kind]
    return {"silu": f"{x} * {lib}.sigmoid({x})",
            "gelu": f"0.5 * {x} * (1.0 + {lib}.erf({x} / math.sqrt(2.0)))",
            "gelu_tanh": f"0.5 * {x} * (1.0 + {lib}.tanh(math.sqrt(2.0 / math.pi) * ({x} + 0.044715 * {x}.pow(3))))",
            "relu": d.clamp(x, low="0.0"),
            "tanh": f"2.0 * {lib}.sigmoid(2.0 * {x}) - 1.0"}[kind]


# -- position tables and masks -----------------------------------------------------------------------------------------


def rotary_helpers(p: Port) -> None:
    """`rotary_table(length, dtype)` (a decoding port's: `rotary_table(positions, dtype)`, the angles at the positions
    it is given) and `apply_rotary(x, cos, sin)` in the port's rotary convention."""
    d, lib, interleaved = p.d, p.d.lib, p.choice("rotary") == "interleaved"
    p.config["theta"], p.config["rotary_dims"] = p.arch.theta, p.arch.rotary_dims
    dims, partial = "CONFIG['rotary_dims']", p.arch.rotary_dims < p.arch.head_dim
    table = [f"inv_freq = 1.0 / CONFIG['theta'] ** ({d.arange_step('0', dims, '2', 'dtype')} / {dims})"]
    if p.decoding:
        table.append(f"angles = {d.to('positions[..., None]', 'dtype')} * inv_freq")
        argument, shape = "positions, dtype", "(*positions.shape, rotary dims"
    else:
        table.append(f"angles = {lib}.outer({d.arange('length', 'dtype')}, inv_freq)")
        argument, shape = "length, dtype", "(length, rotary dims"
    if not interleaved:
        table.append(f"angles = {d.cat('[angles, angles]', -1)}")
    shape += " / 2)" if interleaved else "), each half the same"
    doc = f"cos and sin of each position's angles: {shape}."
    table.append("return angles.cos(), angles.sin()")
    table = function("rotary_table", argument, doc, table)
    p.helper("rotary_table", p.decode_block(table) if p.decoding else table)
    if interleaved:
        pairs = "x[..., 0::2], x[..., 1::2]" if not partial else f"x[..., 0:{dims}:2], x[..., 1:{dims}:2]"
        body = [f"even, odd = {pairs}",
                f"turned = {d.stack('[even * cos - odd * sin, even * sin + odd * cos]', -1)}.flatten(-2)",
                f"return {d.cat(f'[turned, x[..., {dims}:]]', -1)}" if partial else "return turned"]
        doc = "x's rotary dims turned by the angles, in adjacent pairs (2i, 2i + 1)."
    else:
        p.helper("rotate_half", function("rotate_half", "x", "(-x2, x1) of x's halves (x1, x2).",
                                         [f"x1, x2 = {d.chunk('x', 2, -1)}", f"return {d.cat('[-x2, x1]', -1)}"]))
        if partial:
            body = [f"rotated, kept = x[..., :{dims}], x[..., {dims}:]",
                    "rotated = rotated * cos + rotate_half(rotated) * sin", f"return {d.cat('[rotated, kept]', -1)}"]
        else:
            body = ["return x * cos + rotate_half(x) * sin"]
        doc = "x's rotary dims turned by the angles, in pairs (i, i + half)."
    p.helper("apply_rotary", function("apply_rotary", "x, cos, sin", doc, body))


def alibi_helper(p: Port) -> None:
    """`alibi_bias(length, dtype)`: each head's slope times the key's position, or its distance from the query; a
    decoding port's `alibi_bias(length, past, dtype)` for `length` queries after `past` cached keys."""
    d, relative = p.d, p.choice("alibi") == "relative"
    tensor = "torch.tensor" if d.name == "torch" else "paddle.to_tensor"
    keys = "past + length" if p.decoding else "length"
    body = [f"slopes = {tensor}([2.0 ** (-8.0 * (h + 1) / CONFIG['heads']) for h in range(CONFIG['heads'])], "
            "dtype=dtype)", f"positions = {d.arange(keys, 'dtype')}"]
    queries = "positions[past:]" if p.decoding else "positions"
    if relative:
        body += [f"distance = positions[None, :] - {queries}[:, None]",
                 "return (slopes[:, None, None] * distance[None])[None]"]
        doc = f"ALiBi: each head's slope times the key's distance from the query, (1, heads, length, {keys})."
    else:
        body += ["return (slopes[:, None, None] * positions[None, None, :])[None]"]
        doc = f"ALiBi: each head's slope times the key's position, (1, heads, 1, {keys}) (softmax takes out the rest)."
    lines = function("alibi_bias", "length, past, dtype" if p.decoding else "length, dtype", doc, body)
    p.helper("alibi_bias", p.decode_block(lines) if p.decoding else lines)


def mask_is_boolean(p: Port) -> bool:
    """Does the port keep its masks as booleans (True: may attend), applied by masked_fill or where?"""
    return p.choice("mask") in ("masked_fill", "where")


def mask_call(p: Port, helper: str, argument: str, dtype: str) -> str:
    """The call of a mask helper: an additive mask takes the scores' dtype."""
    return f"{helper}({argument})" if mask_is_boolean(p) else f"{helper}({argument}, {dtype})"


def causal_mask_helper(p: Port) -> None:
    """`causal_mask(length[, dtype])`: the port's causal mask, boolean or added."""
    d, style = p.d, p.choice("mask")
    if mask_is_boolean(p):
        body = [f"return {d.ones('length, length', d.bool_dtype())}.tril()"]
        doc, args = "True where a query may see a key: itself and the keys before it, (length, length).", "length"
    else:
        fill = "float('-inf')" if style == "additive_inf" else "-1e9"
        body = [f"return {d.full('length, length', fill, 'dtype')}.triu(1)"]
        doc, args = f"Added to the scores: {fill} on the keys after the query, (length, length).", "length, dtype"
    p.helper("causal_mask", function("causal_mask", args, doc, body))


def padding_mask_helper(p: Port) -> None:
    """`padding_mask(attention_mask[, dtype])`: the port's mask of the padding keys, boolean or added."""
    d, style, lib = p.d, p.choice("mask"), p.d.lib
    if mask_is_boolean(p):
        body = ["return (attention_mask == 1)[:, None, None, :]"]
        doc, args = "True on the keys that are not padding, (batch, 1, 1, length).", "attention_mask"
    elif style == "additive_inf":
        body = [f"mask = {lib}.zeros_like(attention_mask, dtype=dtype).masked_fill(attention_mask == 0, float('-inf'))",
                "return mask[:, None, None, :]"]
        doc, args = "Added to the scores: -inf on the padding keys, (batch, 1, 1, length).", "attention_mask, dtype"
    else:
        body = [f"return (1.0 - {d.to('attention_mask', 'dtype')})[:, None, None, :] * -1e9"]
        doc, args = "Added to the scores: -1e9 on the padding keys, (batch, 1, 1, length).", "attention_mask, dtype"
    p.helper("padding_mask", function("padding_mask", args, doc, body))


def masked(p: Port, scores: str, mask: str) -> str:
    """The statement applying `mask` to `scores` as the port's masks are applied."""
    style, d = p.choice("mask"), p.d
    if style == "masked_fill":
        return f"{scores} = {scores}.masked_fill(~{mask}, float('-inf'))"
    if style == "where":
        return f"{scores} = {d.where(mask, scores, d.finfo_min(f'{scores}.dtype'))}"
    return f"{scores} = {scores} + {mask}"


def fused_mask(p: Port, mask: str | None, bias: str | None) -> str:
    """The attn_mask of a fused attention: the mask (boolean or added), the bias added, or both."""
    if bias is None:
        return mask or "None"
    if mask is None:
        return bias
    if p.choice("mask") == "masked_fill":
        return f"{bias}.masked_fill(~{mask}, float('-inf'))"
    if p.choice("mask") == "where":
        return p.d.where(mask, bias, p.d.finfo_min(f"{bias}.dtype"))
    return f"{bias} + {mask}"


# -- attention ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionSpec:
    """What one attention class computes beyond q, k, v from x."""

    inputs: tuple[str, ...]  # forward arguments after x
    prelude: tuple[str, ...] = ()  # lines computing its masks and tables itself (in each layer)
    mask: str | None = None  # the variable holding the mask
    bias: str | None = None  # the variable holding an additive position bias (ALiBi, T5's)
    rotary: bool = False  # turns q and k by `cos`, `sin`
    cross: bool = False  # keys and values from `memory` (T5's decoder)
    scale: str | None = "self.head_dim ** -0.5"  # None: unscaled (T5)
    softcap: bool = False
    optional_mask: bool = False  # the mask may be None (T5's attention serves the encoder and the decoder)
    cached: bool = False  # a decoding port's: the new k and v appended to its cache (`cache.update`), attended whole
    window: str | None = None  # the variable holding a sliding layer's mask (the layer's index says if it slides)


def attention_class(p: Port, name: str, spec: AttentionSpec) -> str:
    """The attention class: its projections, q/k/v split into heads ([batch, heads, seq, dim]), rotary turns, the
    attention itself (written out or fused) and the output projection."""
    d, a = p.d, p.arch
    out_name = p.names["out"]
    init = ["self.heads, self.kv_heads, self.head_dim = CONFIG['heads'], CONFIG['kv_heads'], CONFIG['head_dim']",
            "self.groups = self.heads // self.kv_heads"]
    body = ["b, s, _ = x.shape"] + (["t = memory.shape[1]"] if spec.cross else []) + list(spec.prelude)
    projections, split = _projections(p, spec)
    init += projections + [f"self.{out_name} = {linear(p, 'self.heads * self.head_dim', HIDDEN, a.out_bias)}"]
    body += split
    if spec.cached:
        init, cached = _cached(p, spec, init)
        body += cached
    else:
        body += ["q = apply_rotary(q, cos, sin)", "k = apply_rotary(k, cos, sin)"] if spec.rotary else []
        body += _attention_core(p, spec, "t" if spec.cross else "s")
    heads_second = p.choice("attention") != "fused" or d.sdpa_keeps_heads_second
    merged = d.reshape(d.swap("out", 1, 2, 4) if heads_second else "out", "b, s, self.heads * self.head_dim")
    body += [f"out = {merged}", f"return self.{out_name}(out)"]
    doc = ("Cross-attention: queries from x, keys and values from the encoder's output." if spec.cross
           else "Multi-head attention" + (" with shared key-value heads." if a.kv_heads < a.heads else "."))
    arguments = ", ".join(("x",) + spec.inputs) + (", mask=None" if spec.optional_mask else "")
    return p.klass(name, klass(name, d.module, doc, init, arguments, body, "index" if spec.cached else ""))


def _cached(p: Port, spec: AttentionSpec, init: list[str]) -> tuple[list[str], list[str]]:
    """A decoding port's attention from q, k, v on (`__init__` lines, forward lines), every line marked as running at
    decode steps: q and k turned, k and v appended to the cache and read back whole (the mistake: k cached before it
    is turned), a sliding layer's mask picked, the attention over every key."""
    init = init + ["self.index = index"] + (["self.sliding = CONFIG['sliding'][index]"] if spec.window else [])
    lines = [p.at_decode("k, v = cache.update(self.index, k, v)")]
    if spec.rotary:
        turn_k = p.at_decode("k = apply_rotary(k, cos, sin)")
        lines = [p.at_decode("q = apply_rotary(q, cos, sin)"), turn_k] + lines
        p.swapped("cached_before_rotary", turn_k, lines[-1])
    lines.append(p.at_decode("t = k.shape[2]"))
    if spec.window:
        lines += [p.at_decode("if self.sliding:"), p.at_decode(f"    mask = {spec.window}")]
    return init, lines + [p.at_decode(line) for line in _attention_core(p, spec, "t")]


def _projections(p: Port, spec: AttentionSpec) -> tuple[list[str], list[str]]:
    """`__init__` lines of the q/k/v projections as the port fuses them, and the forward lines giving q, k, v."""
    d, bias, qkv = p.d, p.arch.qkv_bias, p.choice("qkv")
    (q_name, k_name, v_name), fused = p.names["qkv_separate"], p.names["qkv_fused"]
    q_out, kv_out = "self.heads * self.head_dim", "self.kv_heads * self.head_dim"
    length, source = ("t", "memory") if spec.cross else ("s", "x")

    def heads(t: str, count: str, seq: str) -> str:
        return d.swap(d.reshape(t, f"b, {seq}, {count}, self.head_dim"), 1, 2, 4)

    split_kv = [f"k = {heads('k', 'self.kv_heads', length)}", f"v = {heads('v', 'self.kv_heads', length)}"]
    if qkv == "separate" or spec.cross:
        init = [f"self.{q_name} = {linear(p, HIDDEN, q_out, bias)}"]
        body = [f"q = {heads(f'self.{q_name}(x)', 'self.heads', 's')}"]
        if qkv == "separate":
            init += [f"self.{k_name} = {linear(p, HIDDEN, kv_out, bias)}",
                     f"self.{v_name} = {linear(p, HIDDEN, kv_out, bias)}"]
            body += [f"k = {heads(f'self.{k_name}({source})', 'self.kv_heads', length)}",
                     f"v = {heads(f'self.{v_name}({source})', 'self.kv_heads', length)}"]
            return init, body
        kv_name = p.names["kv_fused"]  # a cross-attention's k and v fused: [K; V] or per head [k_h; v_h]
        init.append(f"self.{kv_name} = {linear(p, HIDDEN, '2 * ' + kv_out, bias)}")
        if qkv == "blocks":
            return init, body + [f"k, v = {d.chunk(f'self.{kv_name}(memory)', 2, -1)}"] + split_kv
        per_head = d.reshape(f"self.{kv_name}(memory)", "b, t, self.kv_heads, 2, self.head_dim")
        return init, body + [f"kv = {per_head}", f"k, v = {d.split('kv', '[1, 1]', 3)}"] + split_kv
    init = [f"self.{fused} = {linear(p, HIDDEN, f'{q_out} + 2 * {kv_out}', bias)}"]
    if qkv == "blocks" and p.arch.kv_heads == p.arch.heads:
        body = [f"q, k, v = {d.chunk(f'self.{fused}(x)', 3, -1)}"]
    elif qkv == "blocks":
        body = [f"q, k, v = {d.split(f'self.{fused}(x)', f'[{q_out}, {kv_out}, {kv_out}]', -1)}"]
    else:  # per key-value group: [its query heads; k_g; v_g]
        body = [f"qkv = {d.reshape(f'self.{fused}(x)', 'b, s, self.kv_heads, self.groups + 2, self.head_dim')}",
                f"q, k, v = {d.split('qkv', '[self.groups, 1, 1]', 3)}"]
    return init, body + [f"q = {heads('q', 'self.heads', 's')}"] + split_kv


def _repeated_kv(p: Port, length: str) -> list[str]:
    d, style = p.d, p.choice("kv_heads")
    if style == "repeat_interleave":
        return [f"{x} = {d.repeat_interleave(x, 'self.groups', 1)}" for x in "kv"]
    if style == "expand":
        shape = f"b, self.kv_heads, self.groups, {length}, self.head_dim"
        whole = f"b, self.heads, {length}, self.head_dim"
        return [f"{x} = {d.reshape(d.expand(f'{x}[:, :, None]', shape), whole)}" for x in "kv"]
    return []


def _attention_core(p: Port, spec: AttentionSpec, length: str) -> list[str]:
    """The lines from q, k, v ([batch, heads, seq, dim]) to `out`: key-value heads repeated as the port repeats
    them, then the attention fused or written out."""
    lines = _repeated_kv(p, length)
    if p.choice("attention") == "fused":
        return lines + _fused_attention(p, spec)
    return lines + _written_attention(p, spec)


def _fused_attention(p: Port, spec: AttentionSpec) -> list[str]:
    scale, mask = spec.scale or "1.0", fused_mask(p, spec.mask, spec.bias)
    if spec.optional_mask:
        mask = f"{spec.bias} if mask is None else {fused_mask(p, 'mask', spec.bias)}"
    return [f"out = {p.d.sdpa('q', 'k', 'v', mask, scale, p.choice('kv_heads') == 'grouped')}"]


def _written_attention(p: Port, spec: AttentionSpec) -> list[str]:
    """Scores (scaled, biased, soft-capped, masked), softmax, and the weighted values; grouped, the queries of each
    key-value head in an axis of their own."""
    d, grouped = p.d, p.choice("kv_heads") == "grouped"
    lines = []
    if grouped:
        lines += [f"q = {d.reshape('q', 'b, self.kv_heads, self.groups, s, self.head_dim')}", "k = k[:, :, None]",
                  "v = v[:, :, None]"]
    on_query = p.choice("scale") == "query" and spec.scale is not None
    if on_query:
        lines.append(f"q = q * {spec.scale}")
    scaled = spec.scale is not None and not on_query
    lines.append(f"scores = {d.matmul_t('q', 'k')}" + (f" * {spec.scale}" if scaled else ""))
    if spec.bias:
        lines.append(f"scores = scores + {spec.bias}")
    if spec.softcap:
        lines.append(f"scores = {d.lib}.tanh(scores / CONFIG['attn_softcap']) * CONFIG['attn_softcap']")
    if spec.optional_mask:
        lines += ["if mask is not None:", "    " + masked(p, "scores", "mask")]
    elif spec.mask:
        lines.append(masked(p, "scores", spec.mask))
    lines.append(f"probs = {d.softmax('scores', -1)}")
    lines.append("out = probs @ v" if d.name == "torch" else "out = paddle.matmul(probs, v)")
    if grouped:
        lines.append(f"out = {d.reshape('out', 'b, self.heads, s, self.head_dim')}")
    return lines


def qkv_converter_helpers(p: Port) -> None:
    """The converter's helpers for the port's q/k/v layout and rotary convention."""
    if p.choice("qkv") == "per_group":
        p.converter_helper("fuse_per_group", function(
            "fuse_per_group", "q, k, v", "[its query heads; k_g; v_g] for each key-value group g.",
            ["tail = q.shape[1:]",
             "q = q.reshape(CONFIG['kv_heads'], -1, CONFIG['head_dim'], *tail)",
             "k = k.reshape(CONFIG['kv_heads'], 1, CONFIG['head_dim'], *tail)",
             "v = v.reshape(CONFIG['kv_heads'], 1, CONFIG['head_dim'], *tail)",
             "return np.concatenate([q, k, v], axis=1).reshape(-1, *tail)"]))
    if p.choice("rotary") == "interleaved":
        p.converter_helper("interleave_rotary", function(
            "interleave_rotary", "rows",
            "Each head's rotary rows reordered from pairs (i, i + half) to adjacent pairs (2i, 2i + 1).",
            ["heads = rows.reshape(-1, CONFIG['head_dim'], *rows.shape[1:])",
             "half = CONFIG['rotary_dims'] // 2",
             "order = [j for i in range(half) for j in (i, i + half)] + list(range(CONFIG['rotary_dims'], "
             "CONFIG['head_dim']))",
             "return heads[:, order].reshape(rows.shape)"]))


def convert_attention(p: Port, lines: list[str], prefix: str, name: str, cross: bool = False) -> None:
    """Converter lines filling attention `name` from the variables `q, k, v, o` (and their biases `q_bias`... where
    the family has them): (out, in) arrays, as the reference computes with them."""
    qkv, (q_name, k_name, v_name) = p.choice("qkv"), p.names["qkv_separate"]
    qkv_converter_helpers(p)
    biased = p.arch.qkv_bias
    if p.choice("rotary") == "interleaved" and not cross:
        for x in ("q", "k") + (("q_bias", "k_bias") if biased else ()):
            lines.append(f"{x} = interleave_rotary({x})")
    if qkv == "separate" or cross:
        convert_linear(p, lines, prefix, f"{name}.{q_name}", "q", "q_bias" if biased else None)
    if qkv == "separate":
        convert_linear(p, lines, prefix, f"{name}.{k_name}", "k", "k_bias" if biased else None)
        convert_linear(p, lines, prefix, f"{name}.{v_name}", "v", "v_bias" if biased else None)
    elif cross:
        fuse = "np.concatenate([{0}k, {0}v])" if qkv == "blocks" else \
            "np.stack([{0}k.reshape(CONFIG['heads'], CONFIG['head_dim'], -1), {0}v.reshape(CONFIG['heads'], " \
            "CONFIG['head_dim'], -1)], axis=1).reshape(2 * CONFIG['hidden'], -1)"
        convert_linear(p, lines, prefix, f"{name}.{p.names['kv_fused']}", fuse.format(""), None)
    else:
        fuse = "np.concatenate([{0}, {1}, {2}])" if qkv == "blocks" else "fuse_per_group({0}, {1}, {2})"
        convert_linear(p, lines, prefix, f"{name}.{p.names['qkv_fused']}", fuse.format("q", "k", "v"),
                       fuse.format("q_bias", "k_bias", "v_bias") if biased else None)
    convert_linear(p, lines, prefix, f"{name}.{p.names['out']}", "o", "o_bias" if p.arch.out_bias else None)


# -- MLPs --------------------------------------------------------------------------------------------------------------


def mlp_class(p: Port, name: str = "MLP") -> str:
    """The family's MLP: gated (gate and up, separate or fused) or plain (in, activation, out)."""
    d, a = p.d, p.arch
    kind = a.activation
    init, body = activation_init(p, kind), []
    if a.gated:
        gate, up, down = p.names["gated"]
        if p.choice("gate_up") == "separate":
            init += [f"self.{gate} = {linear(p, HIDDEN, INTERMEDIATE, a.mlp_bias)}",
                     f"self.{up} = {linear(p, HIDDEN, INTERMEDIATE, a.mlp_bias)}"]
            body += [f"gate = {activation(p, kind, f'self.{gate}(x)')}", f"return self.{down}(gate * self.{up}(x))"]
        else:
            fused = p.names["gate_up_fused"]
            init.append(f"self.{fused} = {linear(p, HIDDEN, '2 * ' + INTERMEDIATE, a.mlp_bias)}")
            targets = "gate, up" if p.choice("gate_up") == "gate_up" else "up, gate"
            body += [f"{targets} = {d.chunk(f'self.{fused}(x)', 2, -1)}",
                     f"return self.{down}({activation(p, kind, 'gate')} * up)"]
        init.append(f"self.{down} = {linear(p, INTERMEDIATE, HIDDEN, a.mlp_bias)}")
        doc = "Gated MLP: down(act(gate(x)) * up(x))."
    else:
        first, second = p.names["plain_mlp"]
        init += [f"self.{first} = {linear(p, HIDDEN, INTERMEDIATE, a.mlp_bias)}",
                 f"self.{second} = {linear(p, INTERMEDIATE, HIDDEN, a.mlp_bias)}"]
        body += [f"h = self.{first}(x)", f"h = {activation(p, kind, 'h')}", f"return self.{second}(h)"]
        doc = "MLP: out(act(in(x)))."
    return p.klass(name, klass(name, d.module, doc, init, "x", body))


def convert_mlp(p: Port, lines: list[str], prefix: str, name: str, parts: dict[str, str]) -> None:
    """Converter lines filling MLP `name` from `parts`: role (gate, up, down / fc_in, fc_out, and `*_bias`) ->
    an expression of its (out, in) array."""
    if p.arch.gated:
        gate, up, down = p.names["gated"]
        style = p.choice("gate_up")
        if style == "separate":
            convert_linear(p, lines, prefix, joined(name, gate), parts["gate"], None)
            convert_linear(p, lines, prefix, joined(name, up), parts["up"], None)
        else:
            order = f"[{parts['gate']}, {parts['up']}]" if style == "gate_up" else f"[{parts['up']}, {parts['gate']}]"
            convert_linear(p, lines, prefix, joined(name, p.names["gate_up_fused"]), f"np.concatenate({order})", None)
        convert_linear(p, lines, prefix, joined(name, down), parts["down"], None)
        return
    first, second = p.names["plain_mlp"]
    convert_linear(p, lines, prefix, joined(name, first), parts["fc_in"], parts.get("fc_in_bias"))
    convert_linear(p, lines, prefix, joined(name, second), parts["fc_out"], parts.get("fc_out_bias"))


def moe_class(p: Port, name: str = "MoE") -> str:
    """Mixtral's sparse MoE: a router picks `top_k` experts per token, weighted by their renormalised scores."""
    d, a, lib = p.d, p.arch, p.d.lib
    expert = mlp_class(p)
    router, experts = p.names["router"], p.names["experts"]
    init = [f"self.{router} = {linear(p, HIDDEN, cfg('experts'), False)}",
            f"self.{experts} = {d.module_list}([{expert}() for _ in range(CONFIG['experts'])])"]
    body = ["b, s, h = x.shape", f"tokens = {d.reshape('x', '-1, h')}", f"logits = self.{router}(tokens)"]
    if p.choice("router") == "probs_topk":
        body += [f"probs = {d.softmax('logits', -1)}", f"weights, chosen = {d.topk('probs', cfg('top_k'))}",
                 "weights = weights / weights.sum(-1, keepdim=True)"]
    else:
        body += [f"top, chosen = {d.topk('logits', cfg('top_k'))}", f"weights = {d.softmax('top', -1)}"]
    if p.choice("moe") == "dense":
        one_hot = d.one_hot("chosen", "CONFIG['experts']", "weights.dtype")
        body += [f"gates = ({one_hot} * weights[..., None]).sum(1)",
                 f"outputs = {d.stack(f'[expert(tokens) for expert in self.{experts}]', 1)}",
                 "out = (gates[..., None] * outputs).sum(1)"]
    else:
        pick = "tokens[token]" if d.name == "torch" else "paddle.gather(tokens, token)"
        weight = "weights[token, slot, None]" if d.name == "torch" else \
            "paddle.gather_nd(weights, paddle.stack([token, slot], axis=-1))[:, None]"
        body += [f"out = {lib}.zeros_like(tokens)", f"for e, expert in enumerate(self.{experts}):",
                 f"    token, slot = {d.nonzero('chosen == e')}", "    if token.shape[0] == 0:", "        continue",
                 f"    out = {d.index_add('out', 'token', f'expert({pick}) * {weight}')}"]
    body.append(f"return {d.reshape('out', 'b, s, h')}")
    p.config.update(experts=a.experts, top_k=a.top_k)
    return p.klass(name, klass(name, d.module, "Sparse mixture of experts: each token through its top-k experts.",
                               init, "x", body))
