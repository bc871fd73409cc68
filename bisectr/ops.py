"""One op vocabulary across frameworks.

`canonical_op("Tensor.__matmul__")`, `canonical_op("matmul")` and
`canonical_op("_C_ops.matmul")` are all "matmul". Names are reduced to their last
dotted part, reversed/in-place/dunder spellings are folded, then synonyms apply.
"""
from __future__ import annotations

from functools import lru_cache

SYNONYMS = {
    "mm": "matmul",
    "bmm": "matmul",
    "linear_v2": "linear",
    "fused_linear": "linear",
    "multiply": "mul",
    "subtract": "sub",
    "divide": "div",
    "truediv": "div",
    "true_divide": "div",
    "floordiv": "floor_divide",
    "elementwise_add": "add",
    "elementwise_sub": "sub",
    "elementwise_mul": "mul",
    "elementwise_div": "div",
    "elementwise_pow": "pow",
    "negative": "neg",
    "getitem": "getitem",
    "slice": "getitem",
    "strided_slice": "getitem",
    "set_value": "setitem",
    "set_value_with_tensor": "setitem",
    "permute": "transpose",
    "swapaxes": "transpose",
    "T": "transpose",
    "mT": "transpose",
    "t": "transpose",
    "view": "reshape",
    "reshape_": "reshape",
    "flatten": "reshape",
    "squeeze": "reshape",
    "unsqueeze": "reshape",
    "cast": "cast",
    "to": "cast",
    "type": "cast",
    "astype": "cast",
    "float": "cast",
    "half": "cast",
    "bfloat16": "cast",
    "double": "cast",
    "long": "cast",
    "int": "cast",
    "bool": "cast",
    "clone": "copy",
    "assign": "copy",
    "contiguous": "copy",
    "detach": "copy",
    "masked_fill": "where",
    "embedding": "embedding",
    "lookup_table_v2": "embedding",
    "softmax_": "softmax",
    "scaled_dot_product_attention": "attention",
    "multi_head_attention_forward": "attention",
    "chunk": "split",
    "split_with_num": "split",
    "unbind": "split",
    "concat": "cat",
    "concatenate": "cat",
    "greater_than": "gt",
    "less_than": "lt",
    "greater_equal": "ge",
    "less_equal": "le",
    "equal": "eq",
    "not_equal": "ne",
    "expand_as": "expand",
    "broadcast_to": "expand",
    "full_like": "full",
    "fill_constant": "full",
    "rsqrt": "rsqrt",
    "reduce_mean": "mean",
    "reduce_sum": "sum",
    "max_pool2d": "max_pool",
    "pool2d": "max_pool",
}

_REVERSED_DUNDERS = {"radd", "rsub", "rmul", "rtruediv", "rdiv", "rpow", "rmatmul", "rfloordiv", "rmod", "rand", "ror", "rxor"}


@lru_cache(maxsize=None)
def canonical_op(framework_op: str) -> str:
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
    return SYNONYMS.get(name, name)
