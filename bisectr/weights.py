"""Copy weights between a torch module and a paddle layer, by name.

Parameters and buffers are paired by their dotted names (`blocks.0.attn.q_proj.weight`),
optionally rewritten first by `name_map` rules. Whether a weight is transposed on the way is
decided by the TYPE of the layer that owns it, never by its shape: torch `nn.Linear` stores
`weight` as (out, in) and paddle `nn.Linear` as (in, out), and a square `q_proj` looks the same
either way, so a shape test would silently copy it wrong. A weight whose owner is a linear layer
on only one side (a custom layer on the other) is copied as stored and listed in
`WeightReport.layout_unknown`; `transpose_overrides` settles such cases, and can also skip one
transpose on purpose (the `untransposed_weight` example does that to plant a bug).

Nothing is raised for a model mismatch: names without a partner and shapes that do not fit are
listed in the returned `WeightReport`; call `report.check()` to turn them into an error.

    from bisectr.weights import torch_to_paddle
    report = torch_to_paddle(torch_model, paddle_model, name_map=[(r"^bert\\.", "")]).check()
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["WeightReport", "torch_to_paddle", "paddle_to_torch", "copy_weights"]

NameMap = Sequence[tuple[str, str]]

# Layouts of a linear layer's weight matrix.
OUT_IN = "(out, in)"
IN_OUT = "(in, out)"


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


def torch_to_paddle(torch_module: Any, paddle_layer: Any, name_map: NameMap | None = None,
                    transpose_overrides: Mapping[str, bool] | None = None) -> WeightReport:
    """Copy the parameters and buffers of a `torch.nn.Module` into a `paddle.nn.Layer`.

    `name_map`: (regex, replacement) rules applied in order with `re.sub` to each source name.
    `transpose_overrides`: {name: bool} forcing (True) or forbidding (False) the transpose of one
    entry, named by its source or destination name; a name that matches nothing raises ValueError.
    """
    _require(torch_module, "torch")
    _require(paddle_layer, "paddle")
    return copy_weights(torch_module, paddle_layer, name_map, transpose_overrides)


def paddle_to_torch(paddle_layer: Any, torch_module: Any, name_map: NameMap | None = None,
                    transpose_overrides: Mapping[str, bool] | None = None) -> WeightReport:
    """Copy the parameters and buffers of a `paddle.nn.Layer` into a `torch.nn.Module`.

    Arguments as for `torch_to_paddle`.
    """
    _require(paddle_layer, "paddle")
    _require(torch_module, "torch")
    return copy_weights(paddle_layer, torch_module, name_map, transpose_overrides)


def copy_weights(source: Any, destination: Any, name_map: NameMap | None = None,
                 transpose_overrides: Mapping[str, bool] | None = None) -> WeightReport:
    """Copy by name between any two torch modules / paddle layers (same framework too)."""
    src_entries = _entries(source)
    dst_entries = _entries(destination)
    rules = [(re.compile(pattern), repl) for pattern, repl in (name_map or ())]

    pairs: dict[str, _Entry] = {}  # destination name -> source entry
    report = WeightReport()
    for entry in src_entries.values():
        target = entry.name
        for pattern, repl in rules:
            target = pattern.sub(repl, target)
        if target not in dst_entries:
            report.unmatched.append(target)
        elif target in pairs:
            raise ValueError(f"name_map sends both {pairs[target].name!r} and {entry.name!r} to {target!r}")
        else:
            pairs[target] = entry

    overrides = dict(transpose_overrides or {})
    known = set(pairs) | {e.name for e in pairs.values()}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"transpose_overrides names no copied weight: {', '.join(unknown)}")

    for name, dst in dst_entries.items():
        src = pairs.get(name)
        if src is None:
            report.extra.append(name)
            continue
        transpose = src.layout is not None and dst.layout is not None and src.layout != dst.layout
        override = overrides.get(name, overrides.get(src.name))
        if override is not None:
            transpose = override
        elif (src.layout is None) != (dst.layout is None):
            report.layout_unknown.append(name)
        value = _to_numpy(src.tensor)
        if transpose:
            if value.ndim != 2:
                report.mis_shaped.append((name, tuple(value.shape), tuple(_shape(dst.tensor))))
                continue
            value = value.T
        if tuple(value.shape) != tuple(_shape(dst.tensor)):
            report.mis_shaped.append((name, tuple(value.shape), tuple(_shape(dst.tensor))))
            continue
        _assign(dst.tensor, value)
        report.copied.append(name)
        if transpose:
            report.transposed.append(name)
    return report


@dataclass
class _Entry:
    name: str
    tensor: Any
    layout: str | None  # OUT_IN / IN_OUT for a linear layer's weight, else None


def _framework(obj: Any) -> str | None:
    for module_name, framework in (("torch", "torch"), ("paddle", "paddle")):
        mod = sys.modules.get(module_name)
        if mod is None:
            continue
        base = mod.nn.Module if framework == "torch" else mod.nn.Layer
        if isinstance(obj, base):
            return framework
    return None


def _require(obj: Any, framework: str) -> None:
    if _framework(obj) != framework:
        kind = "torch.nn.Module" if framework == "torch" else "paddle.nn.Layer"
        raise TypeError(f"expected a {kind}, got {type(obj).__module__}.{type(obj).__qualname__}")


def _entries(root: Any) -> dict[str, _Entry]:
    """Every parameter and buffer under `root`, with the weight layout its owner implies."""
    framework = _framework(root)
    if framework == "torch":
        owners = dict(root.named_modules(remove_duplicate=False))
        tensors: Iterable[tuple[str, Any]] = [*root.named_parameters(remove_duplicate=False),
                                              *root.named_buffers(remove_duplicate=False)]
        layout_of = _torch_layout
    elif framework == "paddle":
        owners = dict(root.named_sublayers(include_self=True, remove_duplicate=False))
        tensors = [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]
        layout_of = _paddle_layout
    else:
        raise TypeError(f"expected a torch.nn.Module or a paddle.nn.Layer, got {type(root).__qualname__}")
    entries = {}
    for name, tensor in tensors:
        owner_name, _, local = name.rpartition(".")
        entries[name] = _Entry(name, tensor, layout_of(owners[owner_name], local))
    return entries


def _torch_layout(owner: Any, local: str) -> str | None:
    import torch

    if local != "weight":
        return None
    if isinstance(owner, torch.nn.Linear):
        return OUT_IN
    # Hugging Face GPT-2 style `Conv1D` is a linear layer that stores (in, out).
    if type(owner).__name__ == "Conv1D" and type(owner).__module__.startswith("transformers"):
        return IN_OUT
    return None


def _paddle_layout(owner: Any, local: str) -> str | None:
    import paddle

    if local == "weight" and isinstance(owner, paddle.nn.Linear):
        return IN_OUT
    return None


def _shape(tensor: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.shape)


def _to_numpy(tensor: Any) -> np.ndarray:
    if _is_torch(tensor):
        import torch

        t = tensor.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    import paddle

    if tensor.dtype == paddle.bfloat16:
        tensor = tensor.astype("float32")
    return tensor.numpy()


def _assign(tensor: Any, value: np.ndarray) -> None:
    if _is_torch(tensor):
        import torch

        with torch.no_grad():
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(value)))
        return
    import paddle

    tensor.set_value(paddle.to_tensor(np.ascontiguousarray(value), place=tensor.place).astype(tensor.dtype))


def _is_torch(tensor: Any) -> bool:
    return type(tensor).__module__.startswith("torch")
