"""Framework adapters, installed as `bisectr.adapters`: one module per framework, each defining
one `Adapter` subclass (which may also implement the optional interfaces `Training` and
`WeightConversion`, asked for with `facet`). Every module of this package but `base` is an adapter:
importing it registers its adapter (`Adapter.__init_subclass__`), and importing one never imports its framework.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from functools import lru_cache
from typing import Any

from .base import (
    COMPILED_OP,
    REGISTERED,
    Adapter,
    Autograd,
    CannotUpcast,
    CompiledGraphs,
    Determinism,
    DeterminismFixes,
    Interception,
    OpListener,
    Reductions,
    Tensors,
    Training,
    WeightConversion,
    facet,
)


@lru_cache(maxsize=1)
def registered() -> tuple[Adapter, ...]:
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    return tuple(adapter_class() for adapter_class in REGISTERED)


def silence_import_warnings() -> None:
    """Ignore the warnings each framework prints as it is imported (`Adapter.import_warnings`)."""
    for adapter in registered():
        for message in adapter.import_warnings:
            warnings.filterwarnings("ignore", message=message)


@lru_cache(maxsize=1)
def op_synonyms() -> dict[str, str]:
    """Every adapter's `op_synonyms` in one table (a name one framework uses may be another's)."""
    merged: dict[str, str] = {}
    for adapter in registered():
        merged.update(adapter.op_synonyms)
    return merged


def adapter_named(name: str) -> Adapter:
    return next(adapter for adapter in registered() if adapter.name == name)


def input_layout(framework: str, op: str, position: int) -> tuple[int, ...] | None:
    """See `Adapter.input_layout`, by framework name (what the aligner needs)."""
    return adapter_named(framework).input_layout(op, position)


def adapter_for(model: Any, inputs: list[Any]) -> Adapter | None:
    """The adapter whose framework the model (or, for a plain function, its inputs) belongs to."""
    adapters = registered()
    for candidate in [model, *inputs]:
        for adapter in adapters:
            if adapter.owns(candidate):
                return adapter
    return None


__all__ = [
    "COMPILED_OP",
    "Adapter",
    "Autograd",
    "CannotUpcast",
    "CompiledGraphs",
    "Determinism",
    "DeterminismFixes",
    "Interception",
    "OpListener",
    "Reductions",
    "Tensors",
    "Training",
    "WeightConversion",
    "adapter_for",
    "adapter_named",
    "facet",
    "input_layout",
    "op_synonyms",
    "registered",
    "silence_import_warnings",
]
