"""The port of T5 (encoder-decoder) and its converter: RMS norms, no attention scaling, a relative position bias
(bucketed, from a table of each stack), cross-attention, a ReLU MLP, and the LM head tied to the embedding.

`write(p, converter)` fills the `Port`: the bias helpers, the attentions, the layers, the two stacks (nested as
modules of their own, or flat in the model) and the model, and the converter's lines for both stacks.
"""

from __future__ import annotations

from ports.layers import (HIDDEN, AttentionSpec, Converter, Port, attention_class, causal_mask_helper, cfg,
                          convert_attention, convert_linear, convert_mlp, convert_norm, function, klass, linear,
                          mask_call, mlp_class, norm, reader)


def write(p: Port, converter: Converter) -> None:
    """Fill `p` with T5's classes and `converter` with its lines."""
    a = p.arch
    p.config.update(vocab=a.vocab, hidden=a.hidden, heads=a.heads, kv_heads=a.heads, head_dim=a.head_dim,
                    layers=a.layers, intermediate=a.intermediate, eps=a.eps, buckets=32, max_distance=128)
    _bias_helpers(p)
    causal_mask_helper(p)
    attention = attention_class(p, "Attention", AttentionSpec(("bias",), bias="bias", scale=None, optional_mask=True))
    cross = attention_class(p, "CrossAttention", AttentionSpec(("memory",), cross=True, scale=None))
    mlp = mlp_class(p)
    encoder_layer, decoder_layer = _layers(p, attention, cross, mlp)
    _model(p, encoder_layer, decoder_layer)
    _convert(p, converter)


def _bias_helpers(p: Port) -> None:
    d, lib = p.d, p.d.lib
    long, real = (".long()", ".float()") if d.name == "torch" else (".astype('int64')", ".astype('float32')")
    p.helper("relative_buckets", function(
        "relative_buckets", "relative, bidirectional",
        "T5's bucket of each relative position (key - query): one per distance below half the buckets, "
        "logarithmic above.",
        ["buckets = CONFIG['buckets'] // 2 if bidirectional else CONFIG['buckets']",
         f"offset = (relative > 0){long} * buckets if bidirectional else 0",
         f"distance = relative.abs() if bidirectional else -{d.clamp('relative', high='0')}",
         "exact = buckets // 2",
         f"large = exact + ({lib}.log(distance{real} / exact) / math.log(CONFIG['max_distance'] / exact) * (buckets - "
         f"exact)){long}",
         f"large = {d.clamp('large', high='buckets - 1')}",
         f"return offset + {d.where('distance < exact', 'distance', 'large')}"]))
    p.helper("relative_bias", function(
        "relative_bias", "table, queries, keys, bidirectional",
        "T5's position bias: the table's row of each (query, key)'s bucket, (1, heads, queries, keys).",
        [f"relative = {d.arange('keys')}[None, :] - {d.arange('queries')}[:, None]",
         f"return {d.permute('table(relative_buckets(relative, bidirectional))', (2, 0, 1))}[None]"]))


def _layers(p: Port, attention: str, cross: str, mlp: str) -> tuple[str, str]:
    d, n = p.d, p.names
    attn, ffn = n["attention"], n["mlp"]
    first, second = n["norms"]
    encoder = klass("EncoderLayer", d.module, "Self-attention and MLP, each after an RMS norm, added.",
                    [f"self.{first} = {norm(p)}", f"self.{attn} = {attention}()", f"self.{second} = {norm(p)}",
                     f"self.{ffn} = {mlp}()"], "x, bias",
                    [f"x = x + self.{attn}(self.{first}(x), bias)", f"return x + self.{ffn}(self.{second}(x))"])
    decoder = klass("DecoderLayer", d.module, "Causal self-attention, cross-attention and MLP, each after a norm.",
                    [f"self.{first} = {norm(p)}", f"self.{attn} = {attention}()", f"self.cross_norm = {norm(p)}",
                     f"self.cross = {cross}()", f"self.{second} = {norm(p)}", f"self.{ffn} = {mlp}()"],
                    "x, bias, mask, memory",
                    [f"x = x + self.{attn}(self.{first}(x), bias, mask)",
                     "x = x + self.cross(self.cross_norm(x), memory)", f"return x + self.{ffn}(self.{second}(x))"])
    return p.klass("EncoderLayer", encoder), p.klass("DecoderLayer", decoder)


def _stack_lines(p: Port, side: str, prefix: str) -> tuple[list[str], list[str]]:
    """`__init__` and forward lines of one stack, its modules named `prefix...` (flat: `encoder_`; nested: none)."""
    d, n = p.d, p.names
    layer = "EncoderLayer" if side == "encoder" else "DecoderLayer"
    layers, final, table = f"{prefix}{n['layers']}", f"{prefix}{n['final_norm']}", f"{prefix}{n['bias_table']}"
    init = [f"self.{layers} = {d.module_list}([{layer}() for _ in range(CONFIG['layers'])])",
            f"self.{final} = {norm(p)}", f"self.{table} = {d.embedding(cfg('buckets'), cfg('heads'))}"]
    x = "x" if side == "encoder" else "h"
    bias = f"bias = relative_bias(self.{table}, s, s, {side == 'encoder'})"
    if side == "encoder":
        body = [f"s = {x}.shape[1]", bias, f"for layer in self.{layers}:", f"    {x} = layer({x}, bias)"]
    else:
        mask = f"mask = {mask_call(p, 'causal_mask', 's', f'{x}.dtype')}"
        tables = [bias, mask] if p.choice("tables") == "model_tables_first" else [mask, bias]
        body = [f"s = {x}.shape[1]", *tables, f"for layer in self.{layers}:",
                f"    {x} = layer({x}, bias, mask, memory)"]
    return init, body + [f"{x} = self.{final}({x})"]


def _model(p: Port, encoder_layer: str, decoder_layer: str) -> None:
    d, n = p.d, p.names
    nested = p.choice("tree") == "nested"
    embed, head = n["embed"], n["head"]
    init = [f"self.{embed} = {d.embedding(cfg('vocab'), HIDDEN)}"]
    if nested:
        for side in ("encoder", "decoder"):
            stack_init, stack_body = _stack_lines(p, side, "")
            x = "x" if side == "encoder" else "h"
            args = "x" if side == "encoder" else "h, memory"
            p.klass(side.title(), klass(side.title(), d.module, f"T5's {side} stack: layers, final norm, its bias "
                                        "table.", stack_init, args, stack_body + [f"return {x}"]))
            init.append(f"self.{side} = {side.title()}()")
        body = [f"memory = self.encoder(self.{embed}(input_ids))",
                f"h = self.decoder(self.{embed}(decoder_input_ids), memory)"]
    else:
        encoder_init, encoder_body = _stack_lines(p, "encoder", "encoder_")
        decoder_init, decoder_body = _stack_lines(p, "decoder", "decoder_")
        init += encoder_init + decoder_init
        body = [f"x = self.{embed}(input_ids)", *encoder_body, "memory = x",
                f"h = self.{embed}(decoder_input_ids)", *decoder_body]
    if p.choice("head") == "own":
        init.append(f"self.{head} = {linear(p, HIDDEN, cfg('vocab'), False)}")
        body.append(f"logits = self.{head}(h)")
    else:
        body.append(f"logits = {d.matmul_t('h', f'self.{embed}.weight')}")
    body.append("return {'logits': logits, 'encoder_last_hidden_state': memory}")
    p.klass("T5", klass("T5", d.module, "T5: the encoder, the decoder reading its output, the LM head.", init,
                        "input_ids, decoder_input_ids", body))


def _convert(p: Port, converter: Converter) -> None:
    n, nested = p.names, p.choice("tree") == "nested"
    converter.before.append(f"out[{n['embed'] + '.weight'!r}] = hf['shared.weight']")
    first, second = n["norms"]
    for side in ("encoder", "decoder"):
        prefix = f"{side}." if nested else f"{side}_"
        lines = converter.loop(f"{side}.block.", f"{prefix}{n['layers']}.")
        read = reader("theirs")
        ffn = "layer.1" if side == "encoder" else "layer.2"
        convert_norm(p, lines, "mine", first, read, "layer.0.layer_norm")
        convert_norm(p, lines, "mine", second, read, f"{ffn}.layer_norm")
        lines += [f"{x} = theirs['layer.0.SelfAttention.{x}.weight']" for x in "qkvo"]
        convert_attention(p, lines, "mine", n["attention"])
        if side == "decoder":
            convert_norm(p, lines, "mine", "cross_norm", read, "layer.1.layer_norm")
            lines += [f"{x} = theirs['layer.1.EncDecAttention.{x}.weight']" for x in "qkvo"]
            convert_attention(p, lines, "mine", "cross", cross=True)
        convert_mlp(p, lines, "mine", n["mlp"], {"fc_in": f"theirs['{ffn}.DenseReluDense.wi.weight']",
                                                "fc_out": f"theirs['{ffn}.DenseReluDense.wo.weight']"})
        table = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        converter.after.append(f"out[{prefix + n['bias_table'] + '.weight'!r}] = hf[{table!r}]")
        convert_norm(p, converter.after, prefix, n["final_norm"], reader("hf"), f"{side}.final_layer_norm")
    if p.choice("head") == "own":
        convert_linear(p, converter.after, "", n["head"], "hf['lm_head.weight']", None)
