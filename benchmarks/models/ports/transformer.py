"""Ports of the single-stack transformers: the causal decoders (Llama ... Falcon), BERT and ViT, and their converters.

`write(p, converter)` fills the `Port` with the family's classes (attention, MLP or MoE, block, the model and, nested,
its embeddings or its decoder in modules of their own) and `converter` with the lines carrying the reference's
weights over. A decoding port's decoder (`decoding.py`) also has its cache class, takes and returns its cache, and
computes its masks and tables at the step's positions.
"""

from __future__ import annotations

from ports import decoding
from ports.layers import (HIDDEN, AttentionSpec, Converter, Port, activation, activation_init, alibi_helper,
                          attention_class, causal_mask_helper, cfg, convert_attention, convert_linear, convert_mlp,
                          convert_norm, function, klass, linear, mask_call, mlp_class, moe_class, norm,
                          padding_mask_helper, reader, rotary_helpers, transposed)

MAX_POSITIONS, TOKEN_TYPES = 64, 2
WEIGHT_AND_BIAS = (("", "weight"), ("_bias", "bias"))  # the converter's variable suffix of each leaf


def write(p: Port, converter: Converter) -> None:
    """Fill `p` with the family's classes and `converter` with its lines."""
    a = p.arch
    p.config.update(vocab=a.vocab, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
                    layers=a.layers, intermediate=a.intermediate, eps=a.eps)
    if a.attn_softcap:
        p.config.update(attn_softcap=a.attn_softcap, final_softcap=a.final_softcap,
                        query_pre_attn_scalar=round(a.query_scale**-2))
    context, spec = decoding.attention_spec(p) if p.decoding else _attention_spec(p)
    attention = attention_class(p, "Attention", spec)
    block = _block_class(p, attention, moe_class(p) if a.experts else mlp_class(p), spec)
    passed = [p.names["cache"] if name == "cache" else name for name in spec.inputs]
    layer_call = f"x = layer(x, {', '.join(passed)})" if passed else "x = layer(x)"
    layers = [f"for layer in self.{p.names['layers']}:", f"    {layer_call}"]
    model = {"decoder": (_decoder, _convert_decoder), "bert": (_bert, _convert_bert), "vit": (_vit, _convert_vit)}
    write_model, convert = model[a.kind]
    write_model(p, block, context + layers)
    convert(p, converter)


def _attention_spec(p: Port) -> tuple[list[str], AttentionSpec]:
    """The model's lines computing the masks and tables (in the drawn order), and what the attention reads; or
    none, and each attention computes its own."""
    a = p.arch
    mask_lines, table_lines, inputs = [], [], ()
    if a.kind == "decoder":
        causal_mask_helper(p)
        mask_lines, inputs = [f"mask = {mask_call(p, 'causal_mask', 's', 'x.dtype')}"], ("mask",)
    elif a.kind == "bert":
        padding_mask_helper(p)
        mask_lines, inputs = [f"mask = {mask_call(p, 'padding_mask', 'attention_mask', 'x.dtype')}"], ("mask",)
    if a.rotary:
        rotary_helpers(p)
        table_lines, inputs = ["cos, sin = rotary_table(s, x.dtype)"], inputs + ("cos", "sin")
    elif a.alibi:
        alibi_helper(p)
        table_lines, inputs = ["bias = alibi_bias(s, x.dtype)"], inputs + ("bias",)
    scale = "CONFIG['query_pre_attn_scalar'] ** -0.5" if a.attn_softcap else "self.head_dim ** -0.5"
    common = dict(mask="mask" if mask_lines else None, bias="bias" if a.alibi else None, rotary=a.rotary > 0,
                  scale=scale, softcap=bool(a.attn_softcap))
    if p.choice("tables") == "per_layer":
        inputs = ("attention_mask",) if a.kind == "bert" else ()
        return [], AttentionSpec(inputs, tuple(mask_lines + table_lines), **common)
    context = table_lines + mask_lines if p.choice("tables") == "model_tables_first" else mask_lines + table_lines
    return context, AttentionSpec(inputs, **common)


def _block_class(p: Port, attention: str, mlp: str, spec: AttentionSpec) -> str:
    """The layer: its norms around the attention and the MLP as the family places them (a decoding port's knowing its
    index, which its attention's cache is kept under)."""
    a, d, inputs = p.arch, p.d, spec.inputs
    attn, ffn = p.names["attention"], p.names["mlp"]
    first, second = p.names["norms"]
    call = f"self.{attn}({', '.join(('h',) + inputs)})"
    init = [f"self.{first} = {norm(p)}", f"self.{attn} = {attention}({'index' if spec.cached else ''})"]
    if a.residual == "parallel_shared":  # Falcon: one norm read by the attention and the MLP
        init.append(f"self.{ffn} = {mlp}()")
        body = [f"h = self.{first}(x)", f"return x + {call} + self.{ffn}(h)"]
        doc = "Parallel attention and MLP, both reading one norm of x."
    elif a.residual == "parallel":
        init += [f"self.{second} = {norm(p)}", f"self.{ffn} = {mlp}()"]
        body = [f"h = self.{first}(x)", f"attended = {call}", f"fed = self.{ffn}(self.{second}(x))",
                "return x + attended + fed"]
        doc = "Parallel residual: x + attention(norm1(x)) + mlp(norm2(x))."
    elif a.residual == "sandwich":
        init += [f"self.post_{first} = {norm(p)}", f"self.{second} = {norm(p)}", f"self.{ffn} = {mlp}()",
                 f"self.post_{second} = {norm(p)}"]
        body = [f"h = self.{first}(x)", f"x = x + self.post_{first}({call})", f"h = self.{ffn}(self.{second}(x))",
                f"return x + self.post_{second}(h)"]
        doc = "Pre- and post-norms around the attention and the MLP."
    elif a.residual == "post_norm":
        init += [f"self.{second} = {norm(p)}", f"self.{ffn} = {mlp}()"]
        body = [f"x = self.{first}(x + {call.replace('(h', '(x')})", f"return self.{second}(x + self.{ffn}(x))"]
        doc = "Post-norm: the norms after each residual sum."
    else:
        init += [f"self.{second} = {norm(p)}", f"self.{ffn} = {mlp}()"]
        body = [f"h = self.{first}(x)", f"x = x + {call}", f"h = self.{second}(x)", f"return x + self.{ffn}(h)"]
        doc = "Pre-norm: x + attention(norm1(x)), then + mlp(norm2(x))."
    return p.klass("Block", klass("Block", d.module, doc, init, ", ".join(("x",) + inputs), body,
                                  "index" if spec.cached else ""))


def _layer_list(p: Port, block: str) -> str:
    if p.decoding:
        return f"self.{p.names['layers']} = {p.d.module_list}([{block}(i) for i in range(CONFIG['layers'])])"
    return f"self.{p.names['layers']} = {p.d.module_list}([{block}() for _ in range(CONFIG['layers'])])"


def _split_off(p: Port, name: str, doc: str, part: tuple[list[str], list[str]], rest: tuple[list[str], list[str]],
               argument: str, passed: str | None = None, returned: str = "x") -> tuple[list[str], list[str], str]:
    """The model's `__init__` and forward lines with `part` (init and forward lines computing `returned` from
    `argument`, called with `passed`: the arguments themselves unless given) a module of its own
    (`self.<name.lower()>`, nested) or inline (flat), and the prefix of `part`'s leaves."""
    if p.choice("tree") != "nested":
        return part[0] + rest[0], part[1] + rest[1], ""
    attribute = "embeddings" if name.endswith("Embeddings") else p.names["wrapper"]
    p.klass(name, klass(name, p.d.module, doc, part[0], argument, part[1] + [f"return {returned}"]))
    return [f"self.{attribute} = {name}()"] + rest[0], \
        [f"{returned} = self.{attribute}({passed or argument})"] + rest[1], f"{attribute}."


# -- decoders ----------------------------------------------------------------------------------------------------------


def _title(p: Port) -> str:
    return "".join(part.title() for part in p.arch.family.split("_"))


def _decoder(p: Port, block: str, loop: list[str]) -> None:
    """The decoder (embeddings, layers, final norm) and its LM head: nested, the head wraps the decoder."""
    a, d, n = p.arch, p.d, p.names
    init = [f"self.{n['embed']} = {d.embedding(cfg('vocab'), HIDDEN)}"]
    body = ["b, s = input_ids.shape", f"x = self.{n['embed']}(input_ids)"]
    body += decoding.prologue(p) if p.decoding else []
    if a.embed_scale:
        body.append("x = x * CONFIG['hidden'] ** 0.5")
    if a.learned_positions:
        p.config["positions"] = MAX_POSITIONS
        init.append(f"self.{n['positions']} = {d.embedding(cfg('positions'), HIDDEN)}")
        body.append(decoding.positions_added(p) if p.decoding else f"x = x + self.{n['positions']}({d.arange('s')})")
    if a.embed_norm:
        init.append(f"self.embed_norm = {norm(p)}")
        body.append("x = self.embed_norm(x)")
    init += [_layer_list(p, block), f"self.{n['final_norm']} = {norm(p)}"]
    body += loop + (decoding.epilogue(p) if p.decoding else []) + [f"x = self.{n['final_norm']}(x)"]
    head = [f"logits = self.{n['head']}(x)"]
    if a.final_softcap:
        head.append(f"logits = {d.lib}.tanh(logits / CONFIG['final_softcap']) * CONFIG['final_softcap']")
    title = _title(p)
    argument, passed, returned, out = "input_ids", None, "x", "{'logits': logits}"
    if p.decoding:
        argument, passed = decoding.forward_arguments(p), decoding.passed_arguments(p)
        returned, out = f"x, {n['cache']}", f"{{'logits': logits, 'cache': {n['cache']}}}"
    init, body, _ = _split_off(p, f"{title}Model", "The decoder: embeddings, layers, final norm.", (init, body),
                               ([f"self.{n['head']} = {linear(p, HIDDEN, cfg('vocab'), False)}"], head), argument,
                               passed, returned)
    doc = f"{a.family}'s causal LM" + (", decoding with its own cache." if p.decoding else ".")
    p.klass(f"{title}LM", klass(f"{title}LM", d.module, doc, init, argument, body + [f"return {out}"]))


def _convert_decoder(p: Port, converter: Converter) -> None:
    a, n, hf = p.arch, p.names, p.arch.hf
    prefix = f"{n['wrapper']}." if p.choice("tree") == "nested" else ""
    converter.before.append(f"out[{prefix + n['embed'] + '.weight'!r}] = hf[{hf['embed']!r}]")
    if a.learned_positions:
        converter.before.append(f"out[{prefix + n['positions'] + '.weight'!r}] = hf[{hf['positions']!r}]")
    if a.embed_norm:
        convert_norm(p, converter.before, prefix, "embed_norm", reader("hf"), hf["embed_norm"])
    lines = converter.loop(hf["layers"], f"{prefix}{n['layers']}.")
    first, second = n["norms"]
    read = reader("theirs")
    convert_norm(p, lines, "mine", first, read, hf["norm1"])
    if a.residual == "sandwich":
        convert_norm(p, lines, "mine", f"post_{first}", read, hf["post_attn_norm"])
        convert_norm(p, lines, "mine", f"post_{second}", read, hf["post_mlp_norm"])
    if a.residual != "parallel_shared":
        convert_norm(p, lines, "mine", second, read, hf["norm2"])
    _their_attention(p, lines)
    convert_attention(p, lines, "mine", n["attention"])
    if a.experts:
        _convert_experts(p, lines)
    else:
        convert_mlp(p, lines, "mine", n["mlp"], _their_mlp(p))
    convert_norm(p, converter.after, prefix, n["final_norm"], reader("hf"), hf["final_norm"])
    convert_linear(p, converter.after, "", n["head"], f"hf[{hf['head']!r}]", None)


def _their_attention(p: Port, lines: list[str]) -> None:
    """Lines reading the reference's q, k, v, o (and biases) of one layer into (out, in) arrays."""
    a, hf = p.arch, p.arch.hf
    if a.hf_qkv == "separate":
        for x in "qkv":
            lines.append(f"{x} = theirs[{hf[x] + '.weight'!r}]")
            if a.qkv_bias:
                lines.append(f"{x}_bias = theirs[{hf[x] + '.bias'!r}]")
    elif a.hf_qkv == "blocks_in_out":  # GPT-2's Conv1D: (in, out), [Q | K | V] along out
        lines += [f"q, k, v = np.split(theirs[{hf['qkv'] + '.weight'!r}].T, 3)",
                  f"q_bias, k_bias, v_bias = np.split(theirs[{hf['qkv'] + '.bias'!r}], 3)"]
    else:
        split = p.converter_helper(*_their_split(a.hf_qkv))
        lines.append(f"q, k, v = {split}(theirs[{hf['qkv'] + '.weight'!r}])")
        if a.qkv_bias:
            lines.append(f"q_bias, k_bias, v_bias = {split}(theirs[{hf['qkv'] + '.bias'!r}])")
    o = f"theirs[{hf['o'] + '.weight'!r}]"
    lines.append(f"o = {transposed(o) if a.hf_in_out else o}")
    if a.out_bias:
        lines.append(f"o_bias = theirs[{hf['o'] + '.bias'!r}]")


def _their_split(layout: str) -> tuple[str, list[str]]:
    """The converter helper splitting the reference's fused q/k/v: per head ([q_h; k_h; v_h] for each head h, GPT-NeoX
    and Bloom) or per key-value group (Falcon's [query heads; k; v])."""
    tail = "*fused.shape[1:]"
    back = f"return q.reshape(-1, {tail}), k.reshape(-1, {tail}), v.reshape(-1, {tail})"
    if layout == "per_head":
        return "split_per_head", function("split_per_head", "fused", "q, k, v of a projection fused per head.", [
            f"parts = fused.reshape(CONFIG['heads'], 3, CONFIG['head_dim'], {tail})",
            "q, k, v = parts[:, 0], parts[:, 1], parts[:, 2]", back])
    groups = f"CONFIG['kv_heads'], CONFIG['heads'] // CONFIG['kv_heads'] + 2, CONFIG['head_dim'], {tail}"
    return "split_per_group", function("split_per_group", "fused", "q, k, v of a projection fused per key-value "
                                       "group.", [f"groups = fused.reshape({groups})",
                                                  "q, k, v = groups[:, :-2], groups[:, -2], groups[:, -1]", back])


def _their_mlp(p: Port) -> dict[str, str]:
    """The reference's MLP weights of one layer as (out, in) expressions, by role."""
    a, hf = p.arch, p.arch.hf
    if a.gated:
        return {role: f"theirs[{hf[role] + '.weight'!r}]" for role in ("gate", "up", "down")}
    parts = {}
    for role in ("fc_in", "fc_out"):
        weight = f"theirs[{hf[role] + '.weight'!r}]"
        parts[role] = transposed(weight) if a.hf_in_out else weight
        if a.mlp_bias:
            parts[f"{role}_bias"] = f"theirs[{hf[role] + '.bias'!r}]"
    return parts


def _convert_experts(p: Port, lines: list[str]) -> None:
    """The router, then each expert's slice of the reference's stacked expert weights ([gate; up] and down)."""
    n, hf = p.names, p.arch.hf
    convert_linear(p, lines, "mine", f"{n['mlp']}.{n['router']}", f"theirs[{hf['router']!r}]", None)
    expert: list[str] = [f"expert = f'{{mine}}{n['mlp']}.{n['experts']}.{{e}}.'",
                         f"gate, up = np.split(theirs[{hf['gate_up']!r}][e], 2)", f"down = theirs[{hf['down']!r}][e]"]
    convert_mlp(p, expert, "expert", "", {"gate": "gate", "up": "up", "down": "down"})
    lines += ["for e in range(CONFIG['experts']):"] + ["    " + line for line in expert]


# -- BERT --------------------------------------------------------------------------------------------------------------


def _bert(p: Port, block: str, loop: list[str]) -> None:
    """BERT: word, token type and position embeddings (normed), post-norm layers, the pooler."""
    d, n = p.d, p.names
    p.config.update(positions=MAX_POSITIONS, token_types=TOKEN_TYPES)
    embeddings = ([f"self.{n['embed']} = {d.embedding(cfg('vocab'), HIDDEN)}",
                   f"self.{n['positions']} = {d.embedding(cfg('positions'), HIDDEN)}",
                   f"self.{n['token_types']} = {d.embedding(cfg('token_types'), HIDDEN)}",
                   f"self.embed_norm = {norm(p)}"],
                  ["s = input_ids.shape[1]",
                   f"x = self.{n['embed']}(input_ids) + self.{n['token_types']}({d.lib}.zeros_like(input_ids))",
                   f"x = x + self.{n['positions']}({d.arange('s')})", "x = self.embed_norm(x)"])
    rest = ([_layer_list(p, block), f"self.{n['pooler']} = {linear(p, HIDDEN, HIDDEN, True)}",
             *activation_init(p, "tanh", "pooler_act")], loop + _pooled(p))
    init, body, _ = _split_off(p, "Embeddings", "Word, token type and position embeddings, normed.", embeddings,
                               rest, "input_ids")
    p.klass("BertEncoder", klass("BertEncoder", d.module, "BERT: embeddings, post-norm layers, pooler.", init,
                                 "input_ids, attention_mask", body))


def _pooled(p: Port) -> list[str]:
    pooled = activation(p, "tanh", f"self.{p.names['pooler']}(x[:, 0])", "pooler_act")
    return [f"pooled = {pooled}", "return {'last_hidden_state': x, 'pooler_output': pooled}"]


def _convert_bert(p: Port, converter: Converter) -> None:
    n = p.names
    prefix = "embeddings." if p.choice("tree") == "nested" else ""
    for mine_name, theirs in ((n["embed"], "word_embeddings"), (n["positions"], "position_embeddings"),
                              (n["token_types"], "token_type_embeddings")):
        converter.before.append(f"out[{prefix + mine_name + '.weight'!r}] = hf['embeddings.{theirs}.weight']")
    convert_norm(p, converter.before, prefix, "embed_norm", reader("hf"), "embeddings.LayerNorm")
    lines = converter.loop("encoder.layer.", f"{n['layers']}.")
    first, second = n["norms"]
    convert_norm(p, lines, "mine", first, reader("theirs"), "attention.output.LayerNorm")
    convert_norm(p, lines, "mine", second, reader("theirs"), "output.LayerNorm")
    for x, theirs in (("q", "query"), ("k", "key"), ("v", "value")):
        lines += [f"{x}{suffix} = theirs['attention.self.{theirs}.{leaf}']" for suffix, leaf in WEIGHT_AND_BIAS]
    lines += ["o = theirs['attention.output.dense.weight']", "o_bias = theirs['attention.output.dense.bias']"]
    convert_attention(p, lines, "mine", n["attention"])
    convert_mlp(p, lines, "mine", n["mlp"], {"fc_in": "theirs['intermediate.dense.weight']",
                                            "fc_in_bias": "theirs['intermediate.dense.bias']",
                                            "fc_out": "theirs['output.dense.weight']",
                                            "fc_out_bias": "theirs['output.dense.bias']"})
    convert_linear(p, converter.after, "", n["pooler"], "hf['pooler.dense.weight']", "hf['pooler.dense.bias']")


# -- ViT ---------------------------------------------------------------------------------------------------------------


def _vit(p: Port, block: str, loop: list[str]) -> None:
    """ViT: patches embedded (a convolution, or a linear layer on the flattened patches), a class token and learned
    positions, pre-norm layers, final norm, the pooler."""
    d, n = p.d, p.names
    p.config.update(channels=3, patch=4, grid=4)
    patches = n["patches"]
    tokens = "CONFIG['grid'] ** 2"
    init = [f"self.cls = {d.parameter(f'1, 1, {HIDDEN}', 0.0)}",
            f"self.{n['positions']} = {d.parameter(f'1, {tokens} + 1, {HIDDEN}', 0.0)}"]
    body = ["b = pixel_values.shape[0]"]
    if p.choice("patch") == "conv":
        conv = d.conv2d_module(cfg("channels"), HIDDEN, cfg("patch"), cfg("patch"), "0", True)
        init.insert(0, f"self.{patches} = {conv}")
        body.append(f"x = {d.swap(f'self.{patches}(pixel_values).flatten(2)', 1, 2, 3)}")
    else:
        fan_in = "CONFIG['channels'] * CONFIG['patch'] ** 2"
        init.insert(0, f"self.{patches} = {linear(p, fan_in, HIDDEN, True)}")
        grid = "b, CONFIG['channels'], CONFIG['grid'], CONFIG['patch'], CONFIG['grid'], CONFIG['patch']"
        body += [f"x = {d.permute(d.reshape('pixel_values', grid), (0, 2, 4, 1, 3, 5))}",
                 f"x = self.{patches}({d.reshape('x', f'b, {tokens}, {fan_in}')})"]
    cls = d.expand("self.cls", "b, -1, -1")
    body += [f"x = {d.cat(f'[{cls}, x]', 1)}", f"x = x + self.{n['positions']}"]
    rest = ([_layer_list(p, block), f"self.{n['final_norm']} = {norm(p)}",
             f"self.{n['pooler']} = {linear(p, HIDDEN, HIDDEN, True)}", *activation_init(p, "tanh", "pooler_act")],
            loop + [f"x = self.{n['final_norm']}(x)"] + _pooled(p))
    init, body, _ = _split_off(p, "PatchEmbeddings", "Patches embedded, a class token, positions.", (init, body), rest,
                               "pixel_values")
    p.klass("ViT", klass("ViT", d.module, "ViT: patch embeddings and a class token, pre-norm layers, pooler.", init,
                         "pixel_values", body))


def _convert_vit(p: Port, converter: Converter) -> None:
    n, top = p.names, converter.before
    prefix = "embeddings." if p.choice("tree") == "nested" else ""
    weight, bias = (f"hf['embeddings.patch_embeddings.projection.{leaf}']" for leaf in ("weight", "bias"))
    if p.choice("patch") == "conv":
        top += [f"out[{prefix + n['patches'] + '.weight'!r}] = {weight}",
                f"out[{prefix + n['patches'] + '.bias'!r}] = {bias}"]
    else:
        convert_linear(p, top, prefix, n["patches"], f"{weight}.reshape(CONFIG['hidden'], -1)", bias)
    top += [f"out[{prefix + 'cls'!r}] = hf['embeddings.cls_token']",
            f"out[{prefix + n['positions']!r}] = hf['embeddings.position_embeddings']"]
    lines = converter.loop("layers.", f"{n['layers']}.")
    first, second = n["norms"]
    convert_norm(p, lines, "mine", first, reader("theirs"), "layernorm_before")
    convert_norm(p, lines, "mine", second, reader("theirs"), "layernorm_after")
    lines += [f"{x}{suffix} = theirs['attention.{x}_proj.{leaf}']" for x in "qkvo" for suffix, leaf in WEIGHT_AND_BIAS]
    convert_attention(p, lines, "mine", n["attention"])
    convert_mlp(p, lines, "mine", n["mlp"], {f"{role}{suffix}": f"theirs['mlp.{theirs}.{leaf}']"
                                            for role, theirs in (("fc_in", "fc1"), ("fc_out", "fc2"))
                                            for suffix, leaf in WEIGHT_AND_BIAS})
    convert_norm(p, converter.after, "", n["final_norm"], reader("hf"), "layernorm")
    convert_linear(p, converter.after, "", n["pooler"], "hf['pooler.dense.weight']", "hf['pooler.dense.bias']")
