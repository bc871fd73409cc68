"""Decoding ports: a decoder's port extended with its own cache class and a forward for cached decoding (the
`decode_port` form of the seeded-bug benchmark), as a person would write them.

A decoding port's choices (`choices.DECODING_CHOICES`) say how: the cache keeps each layer's k and v [batch, heads,
seq, dim] or [batch, seq, heads, dim], or one tensor per layer holding both stacked, always grown by concatenation
(never written in place); positions are counted from the cache's length or read from `position_ids`; the step's mask
is offset by the cache's length or by the `attention_mask`'s width (its padding masked too); a family with a sliding
window (Gemma-2) evicts from its sliding layers' caches all but the last `window - 1` positions (what the next query
sees) or the last `window`, and counts the positions it has seen apart from those it keeps.

The LM's forward takes `input_ids`, the keywords its choices need (`attention_mask`, `position_ids`) and its cache
(under the name drawn for it; None at the prefill, when the forward makes one), and returns `{'logits': ...,
'cache': ...}`, as `bisectr generate` calls a causal LM. Every line that runs at decode steps is marked
(`Port.at_decode`) and the decoding mistakes of `KINDS` are registered with the lines they rewrite
(`Port.alternatives`).
"""

from __future__ import annotations

from ports.layers import AttentionSpec, Port, alibi_helper, function, mask_is_boolean, padding_mask_helper, \
    rotary_helpers

# The decoding mistakes written out (`Port.alternatives`), beside the syntax-tree kinds of `mutate.py`.
KINDS = (
    "offset_not_advanced",  # positions not offset by the cache (a rotary's, a learned position's), or a rolling
    # cache's positions counted by what it keeps
    "cached_before_rotary",  # k cached before it is turned: the prefill's logits right, its cache not
    "decode_mask_off_by_one",  # the step's mask offset by one position: the new key masked, or the next one seen
    "cache_bfloat16",  # the cache made in bfloat16
    "concatenated_wrong",  # the new k and v concatenated before the cached ones, or along another axis
    "kv_written_swapped",  # the cache keeps the values as keys and the keys as values
)
SEQ_AXIS = {"heads_second": 2, "seq_second": 1, "stacked": 3}  # the cache layouts' sequence axis
UPDATE_DOC = "Layer `index`'s keys and values with the new ones (k, v: [batch, heads, new, dim]) appended: those to " \
             "attend to."


def is_decoding(choices: dict[str, str]) -> bool:
    """Are these a decoding port's choices?"""
    return "cache_layout" in choices


def attention_spec(p: Port) -> tuple[list[str], AttentionSpec]:
    """The cache class and the helpers written, the model's lines computing the step's masks and tables (in the drawn
    order, from the offsets and positions of `prologue`), and what the attention reads: those, and the cache."""
    a = p.arch
    cache_class(p)
    if a.sliding_window:
        p.config.update(window=a.sliding_window, sliding=list(a.sliding_layers),
                        kept=a.sliding_window - (p.choice("window_kept") == "visible"))
    _mask_helpers(p)
    mask_lines, inputs = _mask_lines(p), tuple(_masks(p))
    table_lines = []
    if a.rotary:
        rotary_helpers(p)
        table_lines, inputs = [_rotary_line(p)], inputs + ("cos", "sin")
    elif a.alibi:
        alibi_helper(p)
        table_lines, inputs = [p.at_decode(f"bias = alibi_bias(s, {_offset(p)}, x.dtype)")], inputs + ("bias",)
    scale = "CONFIG['query_pre_attn_scalar'] ** -0.5" if a.attn_softcap else "self.head_dim ** -0.5"
    spec = AttentionSpec(inputs + ("cache",), mask="mask", bias="bias" if a.alibi else None, rotary=a.rotary > 0,
                         scale=scale, softcap=bool(a.attn_softcap), cached=True,
                         window="window" if "window" in inputs else None)
    context = table_lines + mask_lines if p.choice("tables") == "model_tables_first" else mask_lines + table_lines
    return context, spec


def forward_arguments(p: Port) -> str:
    """The LM's (and its decoder's) forward arguments: the ids, the keywords its choices read, the cache."""
    keywords = ["attention_mask"] if p.choice("decode_mask") == "attention_mask" else []
    keywords += ["position_ids"] if p.choice("positions") == "position_ids" else []
    return ", ".join(["input_ids", *keywords, f"{p.names['cache']}=None"])


def passed_arguments(p: Port) -> str:
    """The forward arguments as the LM hands them to its decoder."""
    return ", ".join(argument.partition("=")[0] for argument in forward_arguments(p).split(", "))


def prologue(p: Port) -> list[str]:
    """The model's lines after the embedding lookup: the cache made at the prefill, the offsets and the positions the
    masks and tables read."""
    d, cache, cache_type = p.d, p.names["cache"], p.names["cache_class"]
    bfloat16 = "torch.bfloat16" if d.name == "torch" else "'bfloat16'"
    made = p.at_decode(f"    {cache} = {cache_type}(x.dtype)",
                       ("cache_bfloat16", f"{cache} = {cache_type}({bfloat16})"))
    lines = [p.at_decode(f"if {cache} is None:"), made]
    if p.choice("positions") == "cache_length" or _offset(p) == "past":
        lines.append(p.at_decode(f"past = {cache}.length()"))
    if p.choice("decode_mask") == "attention_mask":
        lines.append(p.at_decode("start = attention_mask.shape[1] - s"))
    if p.choice("positions") == "cache_length":
        lines.append(p.at_decode(f"positions = {d.lib}.arange(past, past + s)",
                                 ("offset_not_advanced", f"positions = {d.lib}.arange(s)")))
    return lines


def positions_added(p: Port) -> str:
    """The line adding a learned position embedding at the step's positions."""
    table = f"self.{p.names['positions']}"
    if p.choice("positions") == "position_ids":
        return p.at_decode(f"x = x + {table}(position_ids)",
                           ("offset_not_advanced", f"x = x + {table}({p.d.lib}.arange(s))"))
    return p.at_decode(f"x = x + {table}(positions)")


def epilogue(p: Port) -> list[str]:
    """The model's lines after its layers: a rolling cache counts the positions it has seen."""
    return [p.at_decode(f"{p.names['cache']}.advance(s)")] if p.arch.sliding_window else []


def _offset(p: Port) -> str:
    """The variable holding how many positions came before this step's, as the step's mask (and ALiBi) read it."""
    return "start" if p.choice("decode_mask") == "attention_mask" else "past"


def _rotary_line(p: Port) -> str:
    """The line computing the rotary table at the step's positions."""
    if p.choice("positions") == "position_ids":
        return p.at_decode("cos, sin = rotary_table(position_ids[:, None], x.dtype)",
                           ("offset_not_advanced", f"cos, sin = rotary_table({p.d.lib}.arange(s), x.dtype)"))
    return p.at_decode("cos, sin = rotary_table(positions, x.dtype)")


# -- masks -------------------------------------------------------------------------------------------------------------


def _masks(p: Port) -> dict[str, str]:
    """The step's masks the model computes: variable -> the helper computing it. `mask`, of the layers that do not
    slide (of every layer where all slide); `window`, of the sliding layers where only some slide."""
    sliding = p.arch.sliding_layers
    if sliding and all(sliding):
        return {"mask": "window_mask"}
    return {"mask": "causal_mask", "window": "window_mask"} if any(sliding) else {"mask": "causal_mask"}


def _mask_helpers(p: Port) -> None:
    """The helpers of the step's masks (`_masks`): `causal_mask(length, past[, dtype])`, a sliding window's
    `window_mask` (same arguments), and, where the mask reads the attention_mask, `padding_mask`: boolean or added,
    as the port's masks are."""
    boolean, helpers = mask_is_boolean(p), set(_masks(p).values())
    args = "length, past" if boolean else "length, past, dtype"
    if "causal_mask" in helpers:
        p.helper("causal_mask", function("causal_mask", args, *_causal_mask(p, boolean)))
    if "window_mask" in helpers:
        p.helper("window_mask", function("window_mask", args, _window_doc(boolean), _window_body(p, boolean)))
    if p.choice("decode_mask") == "attention_mask":
        padding_mask_helper(p)
        p.helpers["padding_mask"] = p.decode_block(p.helpers["padding_mask"])


def _causal_mask(p: Port, boolean: bool) -> tuple[str, list[str]]:
    """The causal mask helper's docstring and body, with its off-by-one mistakes registered."""
    if boolean:
        ones = p.d.ones("length, past + length", p.d.bool_dtype())
        body = [p.at_decode(f"return {ones}.tril(past)", ("decode_mask_off_by_one", f"return {ones}.tril(past - 1)"),
                            ("decode_mask_off_by_one", f"return {ones}.tril(past + 1)"))]
        doc = "True where a query may see a key: the `past` cached and the new ones up to itself, (length, past + " \
              "length)."
    else:
        full = p.d.full("length, past + length", _fill(p), "dtype")
        body = [p.at_decode(f"return {full}.triu(past + 1)", ("decode_mask_off_by_one", f"return {full}.triu(past)"),
                            ("decode_mask_off_by_one", f"return {full}.triu(past + 2)"))]
        doc = f"Added to the scores: {_fill(p)} on the keys after the query, (length, past + length)."
    return doc, body


def _fill(p: Port) -> str:
    """What an additive mask adds on the keys a query may not see."""
    return "float('-inf')" if p.choice("mask") == "additive_inf" else "-1e9"


def _window_doc(boolean: bool) -> str:
    what = "True where a query may see a key" if boolean else "Added to the scores: 0 where a query may see a key"
    return (f"{what} of a sliding layer: those its cache kept and the new ones, up to the query and fewer than the "
            "window behind it, (length, kept + length).")


def _window_body(p: Port, boolean: bool) -> list[str]:
    """The window mask helper's body, by the positions of its queries and keys, with its off-by-one mistakes
    registered."""
    lib = p.d.lib
    visible = "visible = (keys <= queries) & (keys > queries - CONFIG['window'])"
    lines = [p.at_decode(f"queries = {lib}.arange(past, past + length)[:, None]"),
             p.at_decode(f"keys = {lib}.arange(max(past - CONFIG['kept'], 0), past + length)[None, :]"),
             p.at_decode(visible, ("decode_mask_off_by_one", visible.replace("> queries", ">= queries")),
                         ("decode_mask_off_by_one", visible.replace("<= queries", "< queries")))]
    if boolean:
        return lines + [p.at_decode("return visible")]
    return lines + [p.at_decode(f"return {lib}.zeros(visible.shape, dtype=dtype).masked_fill(~visible, {_fill(p)})")]


def _mask_lines(p: Port) -> list[str]:
    """The model's lines computing the step's masks (`_masks`), the padding masked too where they read the
    attention_mask (a window's over the keys its layers kept)."""
    boolean, offset, masks = mask_is_boolean(p), _offset(p), _masks(p)
    dtype = "" if boolean else ", x.dtype"
    lines = [p.at_decode(f"{name} = {helper}(s, {offset}{dtype})") for name, helper in masks.items()]
    if p.choice("decode_mask") != "attention_mask":
        return lines
    padding = f"padding_mask(attention_mask{dtype})"
    if p.choice("kv_heads") == "grouped" and p.choice("attention") != "fused":
        padding += "[:, None]"  # the scores hold the query heads of each key-value head in an axis of their own
    combine = "&" if boolean else "+"
    for name, helper in masks.items():
        kept = f"[..., -{name}.shape[-1]:]" if helper == "window_mask" else ""
        lines.append(p.at_decode(f"{name} = {name} {combine} {padding}{kept}"))
    return lines


# -- the cache ---------------------------------------------------------------------------------------------------------


def cache_class(p: Port) -> str:
    """The port's cache class: each layer's k and v in the drawn layout, kept in its dtype, grown by concatenation;
    a sliding layer's rolling, the positions seen counted apart."""
    name, layout, rolling = p.names["cache_class"], p.choice("cache_layout"), bool(p.arch.sliding_window)
    what = {"heads_second": "each layer's keys and values [batch, heads, seq, dim]",
            "seq_second": "each layer's keys and values [batch, seq, heads, dim]",
            "stacked": "each layer's keys and values stacked in one tensor [2, batch, heads, seq, dim]"}[layout]
    doc = f"The port's cache: {what}, kept in `dtype` and grown by concatenation"
    doc += "; a sliding layer keeps its last CONFIG['kept'] positions, the positions seen counted apart." if rolling \
        else "."
    init = ["self.dtype = dtype", "self.layers = [None] * CONFIG['layers']"] + (["self.seen = 0"] if rolling else [])
    methods = [_method("__init__", "dtype", "An empty cache keeping its tensors in `dtype`.", init),
               _length(p, layout, rolling), _update(p, layout, rolling)]
    if rolling:
        methods.append(_method("advance", "length", "Count `length` more positions seen.",
                               ["self.seen = self.seen + length"]))
    lines = [f"class {name}:", f'    """{doc}"""']
    for method in methods:
        lines += [""] + ["    " + line for line in method]
    return p.klass(name, p.decode_block(lines))


def _method(name: str, args: str, doc: str, body: list[str]) -> list[str]:
    """A method's lines (`self` first)."""
    return function(name, f"self, {args}" if args else "self", doc, body)


def _length(p: Port, layout: str, rolling: bool) -> list[str]:
    """`length()`: the positions cached so far (a rolling cache's: those seen, however many it keeps)."""
    first = "self.layers[0]" if layout == "stacked" else "self.layers[0][0]"
    kept_length = f"return {first}.shape[{SEQ_AXIS[layout]}] if self.layers[0] is not None else 0"
    if not rolling:
        return _method("length", "", "The positions cached so far.", [kept_length])
    return _method("length", "", "The positions seen so far (a sliding layer keeps fewer).",
                   [p.at_decode("return self.seen", ("offset_not_advanced", kept_length))])


def _update(p: Port, layout: str, rolling: bool) -> list[str]:
    """`update(index, k, v)`: layer `index`'s keys and values with the new ones appended (the mistakes: concatenated
    in the other order or along another axis), kept in the cache's dtype (a sliding layer's last positions only;
    the mistake: k and v kept swapped), and returned whole for the attention."""
    d, axis = p.d, SEQ_AXIS[layout]

    def appended(new: str, old: str) -> str:
        return p.at_decode(f"{new} = {d.cat(f'[{old}, {new}]', axis)}",
                           ("concatenated_wrong", f"{new} = {d.cat(f'[{new}, {old}]', axis)}"),
                           ("concatenated_wrong", f"{new} = {d.cat(f'[{old}, {new}]', axis - 1)}"))

    if layout == "stacked":
        body = [p.at_decode(f"kv = {d.stack('[k, v]', 0)}", ("kv_written_swapped", f"kv = {d.stack('[v, k]', 0)}")),
                "if self.layers[index] is not None:",
                "    " + appended("kv", d.to("self.layers[index]", "kv.dtype")),
                f"kept = {d.to('kv', 'self.dtype')}"]
        last, back = "kept[:, :, :, -CONFIG['kept']:]", "kv[0], kv[1]"
    else:
        kept = f"kept = ({d.to('k', 'self.dtype')}, {d.to('v', 'self.dtype')})"
        body = [f"k, v = {d.swap('k', 1, 2, 4)}, {d.swap('v', 1, 2, 4)}"] if layout == "seq_second" else []
        body += ["if self.layers[index] is not None:",
                 "    " + appended("k", d.to("self.layers[index][0]", "k.dtype")),
                 "    " + appended("v", d.to("self.layers[index][1]", "v.dtype")),
                 p.at_decode(kept, ("kv_written_swapped", f"kept = ({d.to('v', 'self.dtype')}, "
                                                          f"{d.to('k', 'self.dtype')})"))]
        window = "[:, :, -CONFIG['kept']:]" if layout == "heads_second" else "[:, -CONFIG['kept']:]"
        last = f"(kept[0]{window}, kept[1]{window})"
        back = f"{d.swap('k', 1, 2, 4)}, {d.swap('v', 1, 2, 4)}" if layout == "seq_second" else "k, v"
    if rolling:
        body += ["if CONFIG['sliding'][index]:", f"    kept = {last}"]
    return _method("update", "index, k, v", UPDATE_DOC, body + ["self.layers[index] = kept", f"return {back}"])
