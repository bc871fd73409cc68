"""Walking nested arguments and outputs (tuples, lists, dicts, dict-like model outputs)."""

from __future__ import annotations

from typing import Any, Callable


def _is_mapping(obj: Any) -> bool:
    return isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__") and not hasattr(obj, "shape"))


_CONTAINERS = (tuple, list, dict)


def map_tensors(obj: Any, is_tensor: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    """A copy of `obj` with every tensor replaced by `fn(tensor)`; other leaves kept as they are.
    Runs on every op's arguments, so only nested containers cost a recursive call."""
    if is_tensor(obj):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, is_tensor, fn) for k, v in obj.items()}
    if not isinstance(obj, (tuple, list)):
        return obj
    mapped = [
        fn(x) if is_tensor(x) else map_tensors(x, is_tensor, fn) if isinstance(x, _CONTAINERS) else x for x in obj
    ]
    if isinstance(obj, list):
        return mapped
    return type(obj)(*mapped) if hasattr(obj, "_fields") else tuple(mapped)


def iter_tensors(obj: Any, is_tensor: Callable[[Any], bool]) -> list[Any]:
    """The tensors in `obj`, depth first, in argument order."""
    found: list[Any] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if is_tensor(item):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def call_tensors(args: tuple, kwargs: dict, is_tensor: Callable[[Any], bool]) -> list[Any]:
    """`iter_tensors((args, kwargs))`, with a fast path for the usual op call (runs on every
    op): positional arguments only, none of them a container."""
    if kwargs:
        return iter_tensors((args, kwargs), is_tensor)
    found = []
    for arg in args:
        if is_tensor(arg):
            found.append(arg)
        elif isinstance(arg, (tuple, list, dict)):
            return iter_tensors(args, is_tensor)
    return found


def flatten_outputs(obj: Any, is_tensor: Callable[[Any], bool], prefix: str = "") -> list[tuple[str, Any]]:
    """(key, tensor) pairs of a model's output: "0", "1.logits", "start_logits", ...

    Dict-like outputs (Hugging Face `ModelOutput`, Paddle's equivalents) are walked by
    key; `None` entries are skipped; anything else that is not a tensor is dropped.
    """
    if is_tensor(obj):
        return [(prefix or "output", obj)]
    if isinstance(obj, (tuple, list)):
        children = [(str(i), v) for i, v in enumerate(obj)]
    elif _is_mapping(obj):
        children = [(str(k), obj[k]) for k in obj.keys()]
    else:
        return []
    pairs: list[tuple[str, Any]] = []
    for key, value in children:
        pairs.extend(flatten_outputs(value, is_tensor, f"{prefix}.{key}" if prefix else key))
    return pairs
