"""Framework adapters, installed as `bisectr.adapters` (one module per framework)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from .base import Adapter, CannotUpcast, OpListener


@lru_cache(maxsize=1)
def _registered() -> tuple[Adapter, ...]:
    from .paddle import PaddleAdapter
    from .torch import TorchAdapter

    return (TorchAdapter(), PaddleAdapter())


def adapter_named(name: str) -> Adapter:
    return next(adapter for adapter in _registered() if adapter.name == name)


def input_layout(framework: str, op: str, position: int) -> tuple[int, ...] | None:
    """See `Adapter.input_layout`, by framework name (what the aligner needs)."""
    return adapter_named(framework).input_layout(op, position)


def adapter_for(model: Any, inputs: list[Any]) -> Adapter | None:
    """The adapter whose framework the model (or, for a plain function, its inputs) belongs to."""
    adapters = _registered()
    for candidate in [model, *inputs]:
        for adapter in adapters:
            if adapter.owns(candidate):
                return adapter
    return None


__all__ = ["Adapter", "CannotUpcast", "OpListener", "adapter_for", "adapter_named", "input_layout"]
