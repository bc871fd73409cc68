"""bisectr: find where two implementations of the same neural network start to disagree.

The names below are imported when first used, so that the `bisectr` command can handle a Ctrl-C
before torch, numpy and the rest are loaded."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .errors import BisectrError
    from .generation import generate
    from .measure.result import Result
    from .present.notebook import compare
    from .run import Run, bisect, load, trace
    from .training import train

_MODULE_OF = {
    "BisectrError": ".errors",
    "Result": ".measure.result",
    "Run": ".run",
    "bisect": ".run",
    "compare": ".present.notebook",
    "generate": ".generation",
    "load": ".run",
    "trace": ".run",
    "train": ".training",
}

__all__ = ["BisectrError", "Result", "Run", "bisect", "compare", "generate", "load", "trace", "train"]


def __getattr__(name: str):
    if name == "__version__":
        from importlib.metadata import version

        return version("bisectr")
    if name in _MODULE_OF:
        return getattr(import_module(_MODULE_OF[name], __name__), name)
    raise AttributeError(f"module 'bisectr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
