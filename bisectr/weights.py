"""Copy weights between a torch module and a paddle layer, by name.

Parameters and buffers are paired by their dotted names (`blocks.0.attn.q_proj.weight`),
optionally rewritten first by `name_map` rules. Whether a weight is transposed on the way is
decided by the TYPE of the layer that owns it, never by its shape: torch `nn.Linear` stores
`weight` as (out, in) and paddle `nn.Linear` as (in, out), and a square `q_proj` looks the same
either way, so a shape test would silently copy it wrong. A weight whose owner is a linear layer
on only one side (a custom layer on the other) is copied as stored and listed in
`WeightReport.layout_unknown`; `transpose_overrides` settles such cases, and can also skip one
transpose on purpose (the `untransposed_weight` example does that to plant a bug).

BatchNorm running statistics are paired by the owner's type as well: torch `running_mean` /
`running_var` and paddle `_mean` / `_variance` of a BatchNorm layer on both sides fill each other
without a `name_map`. Torch's `num_batches_tracked` (a training counter that eval ignores) has no
paddle counterpart; without a partner it is neither copied nor reported.

Linear layers of model libraries that are not `nn.Linear` are known by type too: Hugging Face's
GPT-2 `Conv1D` stores (in, out), PaddleFormers' `LMHead` stores (vocab, hidden) = (out, in) like
Hugging Face's `lm_head`. PaddleFormers names its Llama/Qwen2 parameters as Hugging Face does
(`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`), so no `name_map` is needed there.

The source may also be a state dict (name -> torch tensor, paddle tensor or numpy array), e.g. a
checkpoint read in a process that cannot import the other framework. A state dict carries no layer
types, so its weights are taken to be in its framework's `nn.Linear` layout wherever the
destination's owner is a linear layer (the destination's type still decides), and the destination's
non-persistent buffers (a rotary `inv_freq`, computed by the model) are not expected in it.

Nothing is raised for a model mismatch: names without a partner and shapes that do not fit are
listed in the returned `WeightReport`; call `report.check()` to turn them into an error.

    from bisectr.weights import torch_to_paddle
    report = torch_to_paddle(torch_model, paddle_model, name_map=[(r"^bert\\.", "")]).check()
    report = torch_to_paddle(hf_state_dict, paddleformers_model).check()
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .adapters import Adapter, WeightConversion, adapter_for, adapter_named, facet, registered

__all__ = ["WeightReport", "torch_to_paddle", "paddle_to_torch", "copy_weights"]

NameMap = Sequence[tuple[str, str]]
# A torch module, a paddle layer, or a state dict: name -> torch tensor, paddle tensor or numpy array.
Source = Any

# A BatchNorm's batch counter (torch's `num_batches_tracked`): not every framework has one, so it may go
# without a partner.
_BATCH_COUNT = "count"


@dataclass
class WeightReport:
    """What a weight copy did. Names are destination names unless said otherwise."""

    copied: list[str] = field(default_factory=list)
    """Destination entries that received a value."""
    transposed: list[str] = field(default_factory=list)
    """The subset of `copied` that was transposed on the way."""
    unmatched: list[str] = field(default_factory=list)
    """Source names (after `name_map`) with no destination entry of that name."""
    extra: list[str] = field(default_factory=list)
    """Destination entries that no source entry filled: they keep their old values."""
    mis_shaped: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """(destination name, source shape as it would be written, destination shape); not copied."""
    layout_unknown: list[str] = field(default_factory=list)
    """Copied as stored because only one side's owner is a known linear layer: check these."""

    @property
    def ok(self) -> bool:
        """True when every entry on both sides was paired and copied."""
        return not (self.unmatched or self.extra or self.mis_shaped)

    def check(self) -> "WeightReport":
        """Return self, or raise ValueError describing what did not copy."""
        if not self.ok:
            raise ValueError(f"incomplete weight copy: {self}")
        return self

    def __str__(self) -> str:
        parts = [f"{len(self.copied)} copied ({len(self.transposed)} transposed)"]
        if self.unmatched:
            parts.append(f"unmatched source entries: {', '.join(self.unmatched)}")
        if self.extra:
            parts.append(f"destination entries left unset: {', '.join(self.extra)}")
        if self.mis_shaped:
            parts.append("mis-shaped: " + ", ".join(f"{n} {list(s)} -> {list(d)}" for n, s, d in self.mis_shaped))
        if self.layout_unknown:
            parts.append(f"copied without knowing the layout: {', '.join(self.layout_unknown)}")
        return "; ".join(parts)


def torch_to_paddle(
    torch_module: Source,
    paddle_layer: Any,
    name_map: NameMap | None = None,
    transpose_overrides: Mapping[str, bool] | None = None,
) -> WeightReport:
    """Copy the parameters and buffers of a `torch.nn.Module` (or a torch state dict) into a `paddle.nn.Layer`.

    `name_map`: (regex, replacement) rules applied in order with `re.sub` to each source name.
    `transpose_overrides`: {name: bool} forcing (True) or forbidding (False) the transpose of one
    entry, named by its source or destination name; a name that matches nothing raises ValueError.
    """
    _require(torch_module, "torch", state_dict_ok=True)
    _require(paddle_layer, "paddle")
    return copy_weights(torch_module, paddle_layer, name_map, transpose_overrides, source_framework="torch")


def paddle_to_torch(
    paddle_layer: Source,
    torch_module: Any,
    name_map: NameMap | None = None,
    transpose_overrides: Mapping[str, bool] | None = None,
) -> WeightReport:
    """Copy the parameters and buffers of a `paddle.nn.Layer` (or a paddle state dict) into a `torch.nn.Module`.

    Arguments as for `torch_to_paddle`.
    """
    _require(paddle_layer, "paddle", state_dict_ok=True)
    _require(torch_module, "torch")
    return copy_weights(paddle_layer, torch_module, name_map, transpose_overrides, source_framework="paddle")


def copy_weights(
    source: Source,
    destination: Any,
    name_map: NameMap | None = None,
    transpose_overrides: Mapping[str, bool] | None = None,
    source_framework: str | None = None,
) -> WeightReport:
    """Copy by name between any two torch modules / paddle layers (same framework too).

    A state dict `source` follows the layouts of `source_framework` (default: the destination's).
    """
    rules = [(re.compile(pattern), repl) for pattern, repl in (name_map or ())]
    from_state_dict = _is_state_dict(source)
    dst_entries = _entries(destination, persistent_only=from_state_dict)
    dst_adapter = _adapter(destination)
    if from_state_dict:
        framework = adapter_named(source_framework) if source_framework else dst_adapter
        src_entries = _state_dict_entries(source, framework, dst_entries, rules)
    else:
        src_entries = _entries(source)

    report = WeightReport()
    pairs = _pair(src_entries, dst_entries, rules, report)
    overrides = dict(transpose_overrides or {})
    known = set(pairs) | {e.name for e in pairs.values()}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"transpose_overrides names no copied weight: {', '.join(unknown)}")

    filled = set()  # ids of the destination tensors copied into
    for name, dst in dst_entries.items():
        src = pairs.get(name)
        if src is None:
            continue
        transpose = src.layout is not None and dst.layout is not None and src.layout != dst.layout
        override = overrides.get(name, overrides.get(src.name))
        if override is not None:
            transpose = override
        elif (src.layout is None) != (dst.layout is None):
            report.layout_unknown.append(name)
        value = src.tensor if isinstance(src.tensor, np.ndarray) else adapter_for(src.tensor, []).to_numpy(src.tensor)
        if transpose:
            if value.ndim != 2:
                report.mis_shaped.append((name, tuple(value.shape), tuple(_shape(dst.tensor))))
                continue
            value = value.T
        if tuple(value.shape) != tuple(_shape(dst.tensor)):
            report.mis_shaped.append((name, tuple(value.shape), tuple(_shape(dst.tensor))))
            continue
        dst_adapter.assign(dst.tensor, np.ascontiguousarray(value))
        filled.add(id(dst.tensor))
        report.copied.append(name)
        if transpose:
            report.transposed.append(name)
    # An entry under a second name of a tensor copied into (paddle's RNN cells' `0.cell.weight_ih` is its
    # `weight_ih_l0`) is filled.
    report.extra = [
        name
        for name, dst in dst_entries.items()
        if name not in pairs and dst.statistic != _BATCH_COUNT and id(dst.tensor) not in filled
    ]
    return report


@dataclass
class _Entry:
    name: str
    tensor: Any
    layout: str | None  # OUT_IN / IN_OUT for a linear layer's weight, else None
    statistic: str | None = None  # what a BatchNorm's running statistic holds ("mean", "variance", "count")


def _rename(name: str, rules: list[tuple[re.Pattern, str]]) -> str:
    for pattern, repl in rules:
        name = pattern.sub(repl, name)
    return name


def _pair(
    src_entries: dict[str, _Entry],
    dst_entries: dict[str, _Entry],
    rules: list[tuple[re.Pattern, str]],
    report: WeightReport,
) -> dict[str, _Entry]:
    """Destination name -> source entry; source names without a destination go to `report.unmatched`.
    A BatchNorm statistic without a destination of its name goes to the same statistic of the
    destination's BatchNorm at the same path (the other framework's name for it)."""
    statistics = {(_owner_path(name), entry.statistic): name for name, entry in dst_entries.items() if entry.statistic}
    pairs: dict[str, _Entry] = {}
    for entry in src_entries.values():
        target = _rename(entry.name, rules)
        if target not in dst_entries and entry.statistic:
            target = statistics.get((_owner_path(target), entry.statistic), target)
        if target not in dst_entries:
            if entry.statistic != _BATCH_COUNT:
                report.unmatched.append(target)
        elif target in pairs:
            raise ValueError(f"name_map sends both {pairs[target].name!r} and {entry.name!r} to {target!r}")
        else:
            pairs[target] = entry
    return pairs


def _state_dict_entries(
    state: Mapping[str, Any], framework: Adapter, dst_entries: dict[str, _Entry], rules: list[tuple[re.Pattern, str]]
) -> dict[str, _Entry]:
    """A state dict's entries, each in `framework`'s nn.Linear layout where its destination is a linear
    weight, and named as `framework` names BatchNorm statistics where its destination's owner is a BatchNorm."""
    norms = {_owner_path(name) for name, entry in dst_entries.items() if entry.statistic}
    linear_layout = facet(framework, WeightConversion).linear_layout
    entries = {}
    for name, value in state.items():
        target = _rename(name, rules)
        dst = dst_entries.get(target)
        linear = dst is not None and dst.layout is not None
        owner, _, local = target.rpartition(".")
        statistic = framework.norm_statistics.get(local) if owner in norms else None
        entries[name] = _Entry(name, value, linear_layout if linear else None, statistic)
    return entries


def _owner_path(name: str) -> str:
    return name.rpartition(".")[0]


def _adapter(obj: Any) -> Adapter | None:
    """The adapter of the framework whose model `obj` is."""
    return next((adapter for adapter in registered() if adapter.is_module(obj)), None)


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and _adapter(obj) is None


def _require(obj: Any, framework: str, state_dict_ok: bool = False) -> None:
    """`obj` must be a model of `framework` (or, if `state_dict_ok`, a state dict)."""
    adapter = _adapter(obj)
    if (adapter is not None and adapter.name == framework) or (state_dict_ok and _is_state_dict(obj)):
        return
    raise TypeError(
        f"expected a {adapter_named(framework).module_kind}, got {type(obj).__module__}.{type(obj).__qualname__}"
    )


def _entries(root: Any, persistent_only: bool = False) -> dict[str, _Entry]:
    """Every parameter and buffer under `root`, with the weight layout its owner implies.
    `persistent_only` leaves out the buffers a state dict would not hold."""
    adapter = _adapter(root)
    if adapter is None:
        kinds = " or a ".join(a.module_kind for a in registered())
        raise TypeError(f"expected a {kinds}, got {type(root).__qualname__}")
    conversion = facet(adapter, WeightConversion)
    owners = dict(conversion.named_modules(root))
    entries = {}
    for name, tensor in conversion.named_tensors(root, persistent_only):
        owner_name, _, local = name.rpartition(".")
        owner = owners[owner_name]
        entries[name] = _Entry(
            name, tensor, conversion.weight_layout(owner, local), conversion.norm_statistic(owner, local)
        )
    return entries


def _shape(tensor: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.shape)
