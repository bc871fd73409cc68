"""How a trace names its leaves: the inputs, parameters, buffers and constants an op reads that no op made.

A trace stores a leaf's name as one string, "kind:name" (`param:blocks.0.fc.weight`, `input:0`); this
module is the one place that knows that form. Everything else reads a leaf through `LeafRef`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LeafKind = Literal["input", "param", "buffer", "const"]


@dataclass(frozen=True)
class LeafRef:
    kind: LeafKind
    name: str  # the module path of a parameter or buffer, the key of an input, the op count of a constant

    @classmethod
    def parse(cls, leaf: str) -> LeafRef:
        kind, _, name = leaf.partition(":")
        return cls(kind, name)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


def leaf_kind(leaf: str | None) -> LeafKind | None:
    """The kind of a traced leaf name (None for no leaf)."""
    return LeafRef.parse(leaf).kind if leaf else None


def leaf_name(leaf: str) -> str:
    """The name of a traced leaf without its kind (`blocks.0.fc.weight` for `param:blocks.0.fc.weight`)."""
    return LeafRef.parse(leaf).name
