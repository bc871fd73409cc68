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
# A re-run fills it with a value beyond any it held when recorded (`recording.poison_for`), so that a read of it shows.
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided"})

# Ops that draw from a random generator: other values on every run where it is not seeded.
DROPOUT = frozenset(
    {"dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "native_dropout"}
)
RANDOM = DROPOUT | frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "bernoulli",
        "multinomial",
        "normal",
        "uniform",
        "poisson",
        "exponential",
        "geometric",
        "cauchy",
        "log_normal",
        "random",
        "rrelu",
        "gumbel_softmax",
        "gaussian",
        "standard_normal",
        "shuffle",
    }
)

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
