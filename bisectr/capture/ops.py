"""One op vocabulary across frameworks.

`canonical_op("Tensor.__matmul__")`, `canonical_op("matmul")` and
`canonical_op("_C_ops.matmul")` are all "matmul". Names are reduced to their last
dotted part, reversed/in-place/dunder spellings are folded, then the adapters' synonyms
apply (each adapter's `op_synonyms`: its frameworks' names for the shared ops).
"""

from __future__ import annotations

from functools import lru_cache

from ..adapters import op_synonyms


# Ops whose outputs are memory left uninitialised, other values on every run: never compared across runs.
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided"})

# Collectives that sum what each process holds: what they read is each process's part of a sum
# (a partial value), never compared with a whole tensor.
REDUCING_COLLECTIVES = frozenset({"all_reduce", "reduce_scatter_tensor"})
# Collectives after which every process holds the same values: what they hand on is whole, not a part.
SHARING_COLLECTIVES = frozenset({"all_reduce", "all_gather", "all_gather_into_tensor", "broadcast"})

_REVERSED_DUNDERS = {
    "radd",
    "rsub",
    "rmul",
    "rtruediv",
    "rdiv",
    "rpow",
    "rmatmul",
    "rfloordiv",
    "rmod",
    "rand",
    "ror",
    "rxor",
    "rlshift",
    "rrshift",
}


@lru_cache(maxsize=None)
def canonical_op(framework_op: str) -> str:
    if framework_op.endswith(".apply"):  # a custom autograd function: named by its class
        name = framework_op.rsplit(".", 2)[-2]
        return op_synonyms().get(name, name)
    name = framework_op.removesuffix(".__get__").rsplit(".", 1)[-1]
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name in _REVERSED_DUNDERS:
            name = name[1:]
        elif name.startswith("i") and name[1:] in {"add", "sub", "mul", "truediv", "div", "pow", "matmul", "floordiv"}:
            name = name[1:]
    elif name.endswith("_") and not name.startswith("_"):
        name = name[:-1]
    name = name.lstrip("_")
    return op_synonyms().get(name, name)
