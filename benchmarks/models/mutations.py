"""Bugs planted where porters make them, each at a site drawn at random: the operators of the seeded-bug benchmark.

An operator takes the candidate (a model of one of `families.py`'s families, its weights already handed over
from the reference by the converter) and a `random.Random`, changes one site in place and returns the `Site`
it changed, or raises `NotApplicable` when the family has no such site. Two kinds:

- `weight` operators are converter mistakes: they change what the converter hands the candidate (rows or
  blocks permuted, a fused weight's parts swapped or laid out per head, a weight transposed, left at init,
  taken from the next layer, a bias dropped, a norm's `1 + w` applied twice, experts swapped, a buffer
  computed with another rotary base). The site is the parameter or buffer.
- `op` operators change what one module computes (its norm's eps or variance, its activation, a scale, a
  soft-cap, a residual or embedding multiplier, its attention mask or position ids, the router's top-k
  normalisation). The site is that module.
- `widen` operators are mistakes of a converter that widens a weight for a port laid out otherwise (the
  `kv_widened` form: a key-value head per query head): the widened key-value heads tiled (h0 h1 h0 h1)
  where each is repeated in place (h0 h0 h1 h1). The site is the parameter.
- `tp` operators are mistakes in a tensor-parallel plan (the `tp` form: the copy sharded over 2 ranks,
  Megatron's layout): a row-parallel projection's output left a partial sum on each rank (its all-reduce
  forgotten), or all-reduced twice; the head's parts gathered along the wrong dim; a fused gate/up
  projection sharded as stored. They note the change on the model (`tp_plan_changes`), which
  `mutant_pair.tensor_parallel` applies. The site is the projection (the MLP, for the fused one).
- `compile` operators plant a compiler bug for a candidate that is then `torch.compile`d: a wrong
  decomposition registered for one aten op (every use of it in the compiled graph goes through it; eager
  code never does), or a branch only compiled code takes (`torch.compiler.is_compiling()`) in one module.
  The site is the aten op (`Site.aten`), or the module.
- `repeat` operators make the candidate not repeat itself, in one module's output: dropout left on, unseeded
  noise added, the output copied into part of a `torch.empty` buffer that is then read whole, its positions
  shuffled by `torch.randperm`. The site is the module; `Operator.cause` is what bisectr must say.
- `decode` operators are mistakes in a port's greedy decoding loop (the `decode` form, `decoding.py`), from a
  decode step drawn at random on: the position id stuck (the rotary offset not advanced), the new token
  masked from itself, one layer's cache written with keys and values swapped. The site is the loop's positions or mask module, or
  the layer's attention (where the cache is written).
- `port` operators are the mutation kinds of `ports/mutate.py` (arguments swapped, a constant changed, a split
  reordered, a dimension permuted, a call dropped, a slice off by one): they change a hand-style port's source
  (the `port` form, `ports/cases.py` draws their sites), never a model, so that `apply` has no site to change.
- `decode_port` operators are the decoding mistakes of `ports/decoding.py` (an offset not advanced, k cached before
  the rotary, the step's mask off by one, the cache in bfloat16, k and v concatenated in the wrong order or axis,
  or kept swapped), written into a decoding port's source (the `decode_port` form, `ports/decode_cases.py` draws
  their sites, with the `port` operators' at the lines that run at decode steps); `apply` has no site either.

Every operator draws its layer (head, expert, block) at random: a bug is never always in layer 0.
"""
from __future__ import annotations

import random
import re
import types
from dataclasses import dataclass
from typing import Callable, Literal

from decoding import STEPS
from families import HEAD_DIM, HEADS, HIDDEN, tensor_parallel_layout
from ports.decoding import KINDS as DECODING_PORT_KINDS
from ports.mutate import KINDS as PORT_KINDS

LAYER = re.compile(r"\.(\d+)\.")
FUSED_QKV = ("qkv_proj", "query_key_value", "c_attn")
FUSED_TWO = ("gate_up_proj", "in_proj")
ROTARY_FAMILIES = ("llama", "qwen2", "qwen2_moe", "mixtral", "gemma2", "phi3", "granite", "gpt_neox")


class NotApplicable(Exception):
    """The family has no site this operator changes."""


@dataclass(frozen=True)
class Site:
    module: str  # the candidate module the culprit must be at (or under)
    leaf: str | None  # the parameter or buffer changed (weight operators), else None
    what: str  # one line: what was changed
    aten: str | None = None  # the aten op whose decomposition is wrong (compile operators)


@dataclass(frozen=True)
class Operator:
    name: str
    kind: Literal["weight", "op", "widen", "tp", "compile", "decode", "repeat", "port", "decode_port"]
    apply: Callable[[object, random.Random], Site]
    cause: str | None = None  # a `repeat` operator's: the cause bisectr must name


def _layer(name: str) -> int | None:
    found = LAYER.search("." + name + ".")
    return int(found.group(1)) if found else None


def _pick(rng: random.Random, names: list[str]) -> str:
    if not names:
        raise NotApplicable
    return rng.choice(sorted(names))


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _output_axis(model, parameter: str) -> int:
    """The axis of `parameter` that indexes its module's outputs (GPT-2's Conv1D stores [in, out])."""
    return 1 if type(model.get_submodule(_parent(parameter))).__name__ == "Conv1D" else 0


def _layer_weights(model, select: Callable[[str, object], bool]) -> list[str]:
    return [name for name, p in model.named_parameters() if _layer(name) is not None and select(name, p)]


def _projection(name: str, p) -> bool:
    """A 2-D weight of a Linear or Conv1D projection."""
    return p.dim() == 2 and name.endswith(".weight") and "embed" not in name and "conv" not in name


def _blocks(values, axis: int, count: int):
    import torch

    return list(torch.chunk(values, count, dim=axis))


def _set(model, name: str, values) -> None:
    import torch

    with torch.no_grad():
        model.get_parameter(name).copy_(values.clone())


# weight operators: converter mistakes


def rows_permuted(model, rng):
    """Blocks of a projection's outputs handed over in another order (heads, where it has heads)."""
    import torch

    name = _pick(rng, _layer_weights(model, lambda n, p: _projection(n, p) and p.shape[_output_axis(model, n)] % HEAD_DIM == 0
                                      and p.shape[_output_axis(model, n)] >= 2 * HEAD_DIM))
    axis, values = _output_axis(model, name), model.get_parameter(name).detach()
    blocks = _blocks(values, axis, values.shape[axis] // HEAD_DIM)
    order = list(range(len(blocks)))
    while order == sorted(order):
        rng.shuffle(order)
    _set(model, name, torch.cat([blocks[i] for i in order], dim=axis))
    return Site(_parent(name), name, f"{name}: blocks of {HEAD_DIM} along axis {axis} in order {order}")


def transposed(model, rng):
    """A square projection handed over without its transpose."""
    name = _pick(rng, _layer_weights(model, lambda n, p: _projection(n, p) and p.shape[0] == p.shape[1]))
    _set(model, name, model.get_parameter(name).detach().t())
    return Site(_parent(name), name, f"{name}: transposed")


def fused_parts_swapped(model, rng):
    """Two parts of a fused weight (q/k/v, gate/up, an expert stack's gate/up) swapped."""
    import torch

    name = _pick(rng, _layer_weights(model, lambda n, p: any(f in n for f in FUSED_QKV + FUSED_TWO)
                                      and p.dim() >= 2 and n.endswith(("weight", "proj"))))
    values = model.get_parameter(name).detach()
    axis = (1 if values.dim() == 3 else _output_axis(model, name))
    if any(f in name for f in FUSED_QKV):
        q, kv = HEADS * HEAD_DIM, values.shape[axis] - HEADS * HEAD_DIM
        parts = list(torch.split(values, [q, kv // 2, kv // 2], dim=axis))
        first, second = (1, 2) if kv // 2 != q else tuple(rng.sample(range(3), 2))
    else:
        parts, (first, second) = _blocks(values, axis, 2), (0, 1)
    parts[first], parts[second] = parts[second], parts[first]
    if values.dim() == 3:  # one expert of the stack
        expert = rng.randrange(values.shape[0])
        swapped = values.clone()
        swapped[expert] = torch.cat(parts, dim=axis)[expert]
        _set(model, name, swapped)
        return Site(_parent(name), name, f"{name}: expert {expert}'s parts {first} and {second} swapped")
    _set(model, name, torch.cat(parts, dim=axis))
    return Site(_parent(name), name, f"{name}: parts {first} and {second} along axis {axis} swapped")


def fused_layout(model, rng):
    """A fused q/k/v weight laid out per head ([q_h, k_h, v_h] per head) where blocked ([Q; K; V]) is
    read, or the other way round."""
    import torch

    name = _pick(rng, _layer_weights(model, lambda n, p: any(f in n for f in FUSED_QKV) and _projection(n, p)
                                      and p.shape[_output_axis(model, n)] == 3 * HIDDEN))
    axis, values = _output_axis(model, name), model.get_parameter(name).detach()
    per_head = "query_key_value" in name
    moved = values.movedim(axis, 0)
    tail = moved.shape[1:]
    if per_head:  # rows [h][qkv][d] read as [qkv][h][d]
        laid = moved.reshape(HEADS, 3, HEAD_DIM, *tail).transpose(0, 1).reshape(moved.shape)
    else:
        laid = moved.reshape(3, HEADS, HEAD_DIM, *tail).transpose(0, 1).reshape(moved.shape)
    _set(model, name, laid.movedim(0, axis))
    return Site(_parent(name), name, f"{name}: {'per-head' if per_head else 'blocked'} q/k/v re-laid the other way")


def heads_repeated(model, rng):
    """One head's rows of a q/k/v projection handed over in place of another's (h0 h0 for h0 h1)."""
    import torch

    name = _pick(rng, _layer_weights(model, lambda n, p: _projection(n, p) and re.search(r"\.(q|k|v)_proj\.|\.(query|key|value)\.", n)))
    values = model.get_parameter(name).detach()
    blocks = _blocks(values, 0, values.shape[0] // HEAD_DIM)
    source, target = rng.sample(range(len(blocks)), 2)
    blocks[target] = blocks[source]
    _set(model, name, torch.cat(blocks))
    return Site(_parent(name), name, f"{name}: head {source}'s rows also in head {target}'s place")


def rotary_rows_interleaved(model, rng):
    """q or k rows of every head reordered for the interleaved rotary convention (as a Meta <-> Hugging Face
    conversion does) where the model rotates half-split pairs."""
    if model.config.model_type not in ROTARY_FAMILIES:
        raise NotApplicable
    name = _pick(rng, _layer_weights(model, lambda n, p: re.search(r"\.(q|k)_proj\.weight$", n)))
    values = model.get_parameter(name).detach()
    heads = values.shape[0] // HEAD_DIM
    _set(model, name, values.unflatten(0, (heads, 2, HEAD_DIM // 2)).transpose(1, 2).flatten(0, 2))
    return Site(_parent(name), name, f"{name}: rows of each head interleaved (0, 8, 1, 9, ...)")


def left_at_init(model, rng):
    """A projection the converter never wrote: the candidate's own random init."""
    import torch

    name = _pick(rng, _layer_weights(model, _projection))
    values = model.get_parameter(name).detach()
    generator = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    _set(model, name, torch.randn(values.shape, generator=generator, dtype=values.dtype) * HIDDEN ** -0.5)
    return Site(_parent(name), name, f"{name}: left at init")


def off_by_one_layer(model, rng):
    """A layer's parameter handed over from the next layer."""
    name = _pick(rng, _layer_weights(model, lambda n, p: _layer(n) + 1 < model.config.num_hidden_layers))
    layer = _layer(name)
    source = name.replace(f".{layer}.", f".{layer + 1}.", 1)
    _set(model, name, model.get_parameter(source).detach())
    return Site(_parent(name), name, f"{name}: holds layer {layer + 1}'s")


def norm_plus_one(model, rng):
    """A norm's weight handed over as 1 + w (the Gemma convention applied twice)."""
    name = _pick(rng, _layer_weights(model, lambda n, p: p.dim() == 1 and n.endswith("weight")
                                      and "norm" in type(model.get_submodule(_parent(n))).__name__.lower()))
    _set(model, name, 1 + model.get_parameter(name).detach())
    return Site(_parent(name), name, f"{name}: 1 + w")


def bias_missing(model, rng):
    """A bias the converter dropped (the candidate's zeros)."""
    name = _pick(rng, _layer_weights(model, lambda n, p: n.endswith(".bias") and "norm" not in n.lower() and "conv" not in n))
    _set(model, name, 0 * model.get_parameter(name).detach())
    return Site(_parent(name), name, f"{name}: zeros")


def experts_swapped(model, rng):
    """Two experts of a 3-D expert stack handed over in each other's place."""
    name = _pick(rng, _layer_weights(model, lambda n, p: p.dim() == 3 and "expert" in n))
    values = model.get_parameter(name).detach().clone()
    first, second = rng.sample(range(values.shape[0]), 2)
    values[[first, second]] = values[[second, first]]
    _set(model, name, values)
    return Site(_parent(name), name, f"{name}: experts {first} and {second} swapped")


def kv_heads_tiled(model, rng):
    """A k or v projection of a `kv_widened` candidate (weight and bias) with its key-value heads tiled
    (h0 h1 h0 h1), so that query heads read another group's keys or values."""
    groups = getattr(model, "kv_heads_widened_from", None)
    if groups is None:
        raise NotApplicable
    name = _pick(rng, _layer_weights(model, lambda n, p: re.search(r"\.(k|v)_proj\.weight$", n)))
    module = model.get_submodule(_parent(name))
    for parameter in ("weight", "bias"):
        values = getattr(module, parameter, None)
        if values is not None:
            heads = values.shape[0] // HEAD_DIM
            each = values.detach().unflatten(0, (groups, heads // groups, HEAD_DIM))[:, 0]
            _set(model, f"{_parent(name)}.{parameter}", each.repeat(heads // groups, *([1] * (each.dim() - 1))).flatten(0, 1))
    return Site(_parent(name), name, f"{_parent(name)}: key-value heads tiled (h0 h1 h0 h1) where repeated in place")


def rope_base(model, rng):
    """The rotary frequencies computed with another base (theta)."""
    import torch

    names = [n for n, _ in model.named_buffers() if n.endswith("inv_freq") and "original" not in n]
    name = _pick(rng, names)
    buffer = model.get_buffer(name)
    theta = rng.choice([5000.0, 20000.0, 500000.0])
    dim = 2 * buffer.numel()
    with torch.no_grad():
        buffer.copy_(1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return Site(_parent(name), name, f"{name}: base {theta:g}")


# op operators: what one module computes


def _modules(model, select: Callable[[str, object], bool], in_layer: bool = True) -> list[str]:
    return [name for name, m in model.named_modules() if name and (not in_layer or _layer(name) is not None) and select(name, m)]


def _is_norm(name: str, module) -> bool:
    return "norm" in type(module).__name__.lower() and any(hasattr(module, a) for a in ("eps", "variance_epsilon"))


def _eps_attribute(module) -> str:
    return "eps" if hasattr(module, "eps") else "variance_epsilon"


def eps(model, rng):
    """A norm with another epsilon."""
    name = _pick(rng, _modules(model, _is_norm))
    module = model.get_submodule(name)
    attribute = _eps_attribute(module)
    setattr(module, attribute, max(getattr(module, attribute) * 1e4, 1e-2))
    return Site(name, None, f"{name}: {attribute} {getattr(module, attribute):g}")


def _unbiased_norm_forward(self, x):
    import torch

    n = x.shape[-1]
    epsilon = getattr(self, _eps_attribute(self))
    if isinstance(self, torch.nn.LayerNorm):
        centered = x - x.mean(-1, keepdim=True)
        variance = centered.pow(2).sum(-1, keepdim=True) / (n - 1)
        return centered * torch.rsqrt(variance + epsilon) * self.weight + self.bias
    variance = x.pow(2).sum(-1, keepdim=True) / (n - 1)
    scale = (1 + self.weight) if "Gemma" in type(self).__name__ else self.weight
    return (x * torch.rsqrt(variance + epsilon)) * scale


def norm_variance(model, rng):
    """A norm written with the unbiased variance (divides by n - 1)."""
    import torch

    name = _pick(rng, _modules(model, lambda n, m: _is_norm(n, m) and (isinstance(m, torch.nn.LayerNorm) or hasattr(m, "weight"))))
    module = model.get_submodule(name)
    module.forward = types.MethodType(_unbiased_norm_forward, module)
    return Site(name, None, f"{name}: unbiased variance")


def activation(model, rng):
    """An MLP's activation replaced by a variant (exact <-> tanh GELU, SiLU -> GELU, ReLU -> leaky)."""
    import torch

    def is_activation(name, module):
        return type(module).__module__ in ("transformers.activations", "torch.nn.modules.activation") \
            and not isinstance(module, (torch.nn.Tanh, torch.nn.Softmax)) and "mixer" not in name

    name = _pick(rng, _modules(model, is_activation))
    old = model.get_submodule(name)
    kind = type(old).__name__.lower()
    if "tanh" in kind or "new" in kind or "fast" in kind:
        new = torch.nn.GELU()
    elif "gelu" in kind:
        new = torch.nn.GELU(approximate="tanh")
    elif "relu" in kind:
        new = torch.nn.LeakyReLU(0.1)
    else:
        new = torch.nn.GELU()
    parent, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent), attribute, new)
    return Site(parent, None, f"{name}: {type(old).__name__} -> {type(new).__name__}")


def _scaled_output_forward(self, *args, **kwargs):
    return _scaled(type(self).forward(self, *args, **kwargs), self.mutant_scale)


def _scaled(out, scale):
    """A forward's output (its first item, where it returns a tuple) times `scale`."""
    return (out[0] * scale, *out[1:]) if isinstance(out, tuple) else out * scale


def _wrap_output(module, scale: float) -> None:
    module.mutant_scale = scale
    module.forward = types.MethodType(_scaled_output_forward, module)


def extra_scale(model, rng):
    """An attention (or mixer) block whose output is scaled once more (head_dim^-0.5 applied twice)."""
    name = _pick(rng, _modules(model, lambda n, m: re.search(r"(attention|attn|mixer)$", n) is not None
                               and not re.search(r"\.(self|output)$", n)))
    _wrap_output(model.get_submodule(name), HEAD_DIM ** 0.25)
    return Site(name, None, f"{name}: output x {HEAD_DIM ** 0.25:g}")


def _changed_output_forward(self, *args, **kwargs):
    out = type(self).forward(self, *args, **kwargs)
    if isinstance(out, tuple):
        return (self.mutant_change(out[0]), *out[1:])
    return self.mutant_change(out)


def _dropped(x):
    import torch

    return torch.nn.functional.dropout(x, 0.1, training=True)


def _noisy(x):
    import torch

    return x + 0.01 * torch.randn_like(x)


def _half_uninitialised(x):
    import torch

    buffer = torch.empty_like(x)
    buffer[..., : x.shape[-1] // 2] = x[..., : x.shape[-1] // 2]
    return buffer * 1.0


def _shuffled(x):
    import torch

    return x[:, torch.randperm(x.shape[1])] if x.dim() > 1 else x[torch.randperm(x.shape[0])]


def _output_changed(change: Callable, what: str):
    """A `repeat` operator: the output of an attention or MLP block drawn at random goes through `change`."""

    def apply(model, rng):
        name = _pick(rng, _modules(model, lambda n, m: re.search(r"(attention|attn|mixer|mlp|feed_forward)$", n)
                                   is not None and not re.search(r"\.(self|output)$", n)))
        module = model.get_submodule(name)
        module.mutant_change = change
        module.forward = types.MethodType(_changed_output_forward, module)
        return Site(name, None, f"{name}: {what}")

    return apply


def _residual_scaled_forward(self, hidden_states, *args, **kwargs):
    out = type(self).forward(self, hidden_states, *args, **kwargs)
    first = out[0] if isinstance(out, tuple) else out
    scaled = hidden_states + (first - hidden_states) * self.mutant_scale
    return (scaled, *out[1:]) if isinstance(out, tuple) else scaled


def residual_multiplier(model, rng):
    """A layer whose residual branch is multiplied once more (a residual multiplier applied twice)."""
    import torch

    names = _modules(model, lambda n, m: re.search(r"\.\d+$", n) is not None and not isinstance(m, torch.nn.ModuleList)
                     and re.search(r"(layers?|h|blocks?)\.\d+$", n) is not None)
    name = _pick(rng, names)
    module = model.get_submodule(name)
    module.mutant_scale = 1.5
    module.forward = types.MethodType(_residual_scaled_forward, module)
    return Site(name, None, f"{name}: residual branch x 1.5")


def embedding_multiplier(model, rng):
    """The token embedding's normaliser missing (Gemma's sqrt(hidden)) or added where the model has none."""
    import torch

    embedding = model.get_input_embeddings()
    name = _pick(rng, [n for n, m in model.named_modules() if m is embedding])
    module = model.get_submodule(name)
    if torch.is_tensor(getattr(module, "embed_scale", None)):
        with torch.no_grad():
            module.embed_scale.fill_(1.0)
        return Site(name, f"{name}.embed_scale", f"{name}: sqrt(hidden) normaliser missing")
    _wrap_output(module, HIDDEN ** 0.5)
    return Site(name, None, f"{name}: output x sqrt(hidden)")


def _soft_capped_forward(self, *args, **kwargs):
    import torch

    out = type(self).forward(self, *args, **kwargs)
    return torch.tanh(out / self.mutant_cap) * self.mutant_cap


def soft_cap(model, rng):
    """The final logit soft-cap left out (where the model has one) or added (where it has none)."""
    if getattr(model.config, "final_logit_softcapping", None):
        model.config.final_logit_softcapping = None
        return Site("", None, "final logit soft-cap left out")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise NotApplicable
    name = _pick(rng, [n for n, m in model.named_modules() if m is head])
    head.mutant_cap = 10.0
    head.forward = types.MethodType(_soft_capped_forward, head)
    return Site(name, None, f"{name}: soft-cap 10 added")


def _mask_shifted_forward(self, *args, **kwargs):
    import torch

    mask = kwargs.get("attention_mask")
    if mask is not None:
        kwargs["attention_mask"] = torch.cat([mask[..., :1], mask[..., :-1]], dim=-1)
    return type(self).forward(self, *args, **kwargs)


def mask_off_by_one(model, rng):
    """An attention's mask shifted by one key position (a causal mask that shows the next token, a
    padding mask that shows one padded position)."""
    import inspect

    name = _pick(rng, _modules(model, lambda n, m: "attention_mask" in inspect.signature(type(m).forward).parameters
                               and re.search(r"(attention|attn|self)$", n) is not None
                               and not hasattr(m, "self")))
    module = model.get_submodule(name)
    module.forward = types.MethodType(_mask_shifted_forward, module)
    return Site(name, None, f"{name}: attention mask shifted by one key")


def _positions_shifted_forward(self, positions, *args, **kwargs):
    return type(self).forward(self, positions + 1, *args, **kwargs)


def position_offset(model, rng):
    """Positions off by one where a learned position embedding reads them (under rotary embeddings a shift
    of every position changes nothing)."""
    import torch

    name = _pick(rng, _modules(model, lambda n, m: type(m) is torch.nn.Embedding and "position" in n, in_layer=False))
    module = model.get_submodule(name)
    module.forward = types.MethodType(_positions_shifted_forward, module)
    return Site(name, None, f"{name}: positions + 1")


def _router_forward(self, hidden_states):
    import torch
    import torch.nn.functional as F

    hidden_states = hidden_states.reshape(-1, self.weight.shape[1])
    logits = F.linear(hidden_states, self.weight)
    probabilities = torch.softmax(logits, dim=-1, dtype=torch.float)
    top, indices = torch.topk(probabilities, self.top_k, dim=-1)
    if self.mutant_renormalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), indices


def router_topk_norm(model, rng):
    """A router that renormalises its top-k weights where the reference does not, or the other way round."""
    name = _pick(rng, _modules(model, lambda n, m: "router" in type(m).__name__.lower()))
    module = model.get_submodule(name)
    module.mutant_renormalize = not getattr(module, "norm_topk_prob", True)
    module.forward = types.MethodType(_router_forward, module)
    return Site(name, None, f"{name}: top-k {'renormalised' if module.mutant_renormalize else 'not renormalised'}")


# tp operators: mistakes in a tensor-parallel plan

def _plan_changed(model, name: str, change: str, what: str, site: str | None = None) -> Site:
    model.tp_plan_changes = {name: change}
    return Site(site or name, None, f"{name}: {what}")


def _sharded(model, rng, style: str) -> str:
    return _pick(rng, [n for n, s in tensor_parallel_layout(model).items() if s == style and _layer(n) is not None])


def reduction_forgotten(model, rng):
    """A row-parallel projection whose output stays a partial sum on each rank: its all-reduce forgotten."""
    return _plan_changed(model, _sharded(model, rng, "rowwise"), "partial", "row-parallel output left partial (all-reduce forgotten)")


def reduction_doubled(model, rng):
    """A row-parallel projection whose output is all-reduced once more."""
    return _plan_changed(model, _sharded(model, rng, "rowwise"), "reduced_twice", "row-parallel output all-reduced twice")


def fused_sharded_as_stored(model, rng):
    """A fused gate/up projection sharded as stored, not packed: one rank's rows all gate, the other's all up,
    which the MLP's `chunk` splits as if each held both. The site is the MLP (the weight, or what splits it)."""
    name = _sharded(model, rng, "packed_colwise")
    return _plan_changed(model, name, "as_stored", "fused gate/up sharded as stored (not packed per rank)", _parent(name))


def head_gathered_interleaved(model, rng):
    """The column-parallel head's vocabulary parts gathered along the wrong dim: the logits' columns interleaved."""
    head = next(n for n, m in model.named_modules() if m is model.get_output_embeddings())
    return _plan_changed(model, head, "interleaved", "vocabulary parts gathered along the wrong dim (interleaved)")


# compile operators: compiler bugs


def _tanh_gelu(x, approximate="none"):
    import math

    import torch

    if approximate == "tanh":  # the bug: the other formula of the two
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _unbiased_mean(x, dim, keepdim=False, dtype=None):
    import torch

    count = 1
    for d in dim:
        count *= x.shape[d]
    return torch.sum(x, dim, keepdim) / (count - 1)


def _quick_silu(x):
    import torch

    return x * torch.sigmoid(1.702 * x)


def _softmax_max_in_numerator_only(x, dim, half_to_float):
    import torch

    shifted = torch.exp(x - torch.amax(x, dim, keepdim=True))
    return shifted / torch.sum(torch.exp(x), dim, keepdim=True)


def _var_mean_unbiased(x, dim=None, *, correction=None, keepdim=False):
    import torch

    mean = torch.mean(x, dim, keepdim=True)
    count = x.numel() // mean.numel()
    var = torch.sum((x - mean) ** 2, dim, keepdim=keepdim) / (count - 1)
    return var, (mean if keepdim else mean.squeeze(dim))


def _half_tanh(x):
    import torch

    return 2 * torch.sigmoid(x) - 1


def _pow_through_log(x, exponent):
    import torch

    return torch.exp(exponent * torch.log(torch.abs(x)))


def _addmm_bias_twice(bias, mat1, mat2, beta=1, alpha=1):
    import torch

    return 2 * beta * bias + alpha * torch.mm(mat1, mat2)


def _sigmoid_sign(x):
    import torch

    return 1 / (1 + torch.exp(x))


WRONG_DECOMPOSITIONS = {  # aten op -> a wrong decomposition of it
    "gelu.default": _tanh_gelu,
    "mean.dim": _unbiased_mean,
    "silu.default": _quick_silu,
    "_softmax.default": _softmax_max_in_numerator_only,
    "var_mean.correction": _var_mean_unbiased,
    "tanh.default": _half_tanh,
    "pow.Tensor_Scalar": _pow_through_log,
    "addmm.default": _addmm_bias_twice,
    "sigmoid.default": _sigmoid_sign,
}


def _decomposition(aten: str) -> Callable[[object, random.Random], Site]:
    def plant(model, rng):
        import torch
        import torch._inductor.config
        from torch._inductor import decomposition

        packet, overload = aten.split(".")
        decomposition.decompositions[getattr(getattr(torch.ops.aten, packet), overload)] = WRONG_DECOMPOSITIONS[aten]
        decomposition.fast_random_decomps.cache_clear()  # the table inductor reads, copied at its first compile
        torch._inductor.config.force_disable_caches = True  # its cache keys do not include a decomposition added at run time
        return Site("", None, f"aten.{aten}: {WRONG_DECOMPOSITIONS[aten].__name__.strip('_').replace('_', ' ')}", aten)

    plant.__doc__ = f"A wrong decomposition of aten.{aten} ({WRONG_DECOMPOSITIONS[aten].__name__})."
    return plant


def _compiling_branch_forward(self, *args, **kwargs):
    import torch

    out = type(self).forward(self, *args, **kwargs)
    if torch.compiler.is_compiling():  # @compiled_branch
        return _scaled(out, 1.25)
    return out


def compiled_branch(model, rng):
    """A module that scales its output once more in a branch only compiled code takes."""
    name = _pick(rng, _modules(model, lambda n, m: re.search(r"(attention|attn|mixer|mlp)$", n) is not None
                               and not re.search(r"\.(self|output)$", n)))
    module = model.get_submodule(name)
    module.forward = types.MethodType(_compiling_branch_forward, module)
    return Site(name, None, f"{name}: output x 1.25 under torch.compiler.is_compiling()")


def _decoding(model):
    if not hasattr(model, "positions"):  # not `decoding.greedy_decoding`'s loop
        raise NotApplicable
    return model


def positions_stuck(model, rng):
    """From a decode step on, the position id stops advancing (the rotary offset, or a learned position's index)."""
    step = rng.randrange(1, STEPS)
    _decoding(model).positions.stuck_from = step
    return Site("positions", None, f"positions stuck from decode step {step}")


def self_blocked(model, rng):
    """From a decode step on, the mask's entry for the new token is 0: it cannot attend to itself."""
    step = rng.randrange(1, STEPS + 1)
    _decoding(model).mask.self_blocked_from = step
    return Site("mask", None, f"new token masked from decode step {step}")


def cache_kv_swapped(model, rng):
    """From a decode step on, one layer's cache is written with the new keys and values swapped."""
    layers = {m.layer_idx: name for name, m in _decoding(model).lm.named_modules() if isinstance(getattr(m, "layer_idx", None), int)}
    layer, step = rng.choice(sorted(layers)), rng.randrange(1, STEPS + 1)
    model.swapped_write = (layer, step)
    return Site(f"lm.{layers[layer]}", None, f"lm.{layers[layer]}: cache written with keys and values swapped from decode step {step}")


def _in_a_port_source(model, rng):
    """A `port` or `decode_port` operator's site is in a port's source (`ports/cases.py`, `ports/decode_cases.py`),
    not in a model."""
    raise NotApplicable


OPERATORS = {operator.name: operator for operator in [
    Operator("rows_permuted", "weight", rows_permuted),
    Operator("transposed", "weight", transposed),
    Operator("fused_parts_swapped", "weight", fused_parts_swapped),
    Operator("fused_layout", "weight", fused_layout),
    Operator("heads_repeated", "weight", heads_repeated),
    Operator("rotary_rows_interleaved", "weight", rotary_rows_interleaved),
    Operator("left_at_init", "weight", left_at_init),
    Operator("off_by_one_layer", "weight", off_by_one_layer),
    Operator("norm_plus_one", "weight", norm_plus_one),
    Operator("bias_missing", "weight", bias_missing),
    Operator("experts_swapped", "weight", experts_swapped),
    Operator("rope_base", "weight", rope_base),
    Operator("kv_heads_tiled", "widen", kv_heads_tiled),
    Operator("eps", "op", eps),
    Operator("norm_variance", "op", norm_variance),
    Operator("activation", "op", activation),
    Operator("extra_scale", "op", extra_scale),
    Operator("residual_multiplier", "op", residual_multiplier),
    Operator("embedding_multiplier", "op", embedding_multiplier),
    Operator("soft_cap", "op", soft_cap),
    Operator("mask_off_by_one", "op", mask_off_by_one),
    Operator("position_offset", "op", position_offset),
    Operator("router_topk_norm", "op", router_topk_norm),
    Operator("reduction_forgotten", "tp", reduction_forgotten),
    Operator("reduction_doubled", "tp", reduction_doubled),
    Operator("head_gathered_interleaved", "tp", head_gathered_interleaved),
    Operator("fused_sharded_as_stored", "tp", fused_sharded_as_stored),
    Operator("compiled_branch", "compile", compiled_branch),
    Operator("dropout_left_on", "repeat", _output_changed(_dropped, "dropout(0.1) on its output, on"), "random"),
    Operator("unseeded_noise", "repeat", _output_changed(_noisy, "unseeded noise added to its output"), "random"),
    Operator("uninitialised_read", "repeat", _output_changed(_half_uninitialised, "half its output left in torch.empty memory"),
             "uninitialized"),
    Operator("shuffled", "repeat", _output_changed(_shuffled, "its output's positions shuffled by randperm"), "random"),
    Operator("positions_stuck", "decode", positions_stuck),
    Operator("self_blocked", "decode", self_blocked),
    Operator("cache_kv_swapped", "decode", cache_kv_swapped),
    *(Operator(f"decomposition_{aten.split('.')[0].strip('_')}", "compile", _decomposition(aten)) for aten in WRONG_DECOMPOSITIONS),
    *(Operator(kind, "port", _in_a_port_source) for kind in PORT_KINDS),
    *(Operator(kind, "decode_port", _in_a_port_source) for kind in DECODING_PORT_KINDS),
]}
