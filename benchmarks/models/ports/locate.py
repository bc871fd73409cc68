"""Where a planted mistake is, for judging bisectr's culprit: the modules a line of the port runs in, and the leaves a
converter's mistake changes.

`modules_by_line(model, run, path)` runs the correct port under `sys.settrace`, restricted to the port's file, with a
stack of the modules whose forward is running (pre- and post-forward hooks on every module): line -> the module
paths (the port's own `named_modules()` / `named_sublayers()` names, '' the root) on top of the stack as it ran.
`changed_leaves(correct, mistaken)` names the converted weights that differ.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Callable

import numpy as np


def modules_by_line(model, framework: str, run: Callable[[], object], path: str) -> dict[int, set[str]]:
    """Line of `path` -> the modules whose forward was running when `run()` ran it."""
    stack: list[str] = []
    lines: dict[int, set[str]] = defaultdict(set)
    handles = _hooks(model, framework, stack)

    def local(frame, event, arg):
        if event == "line":
            lines[frame.f_lineno].add(stack[-1] if stack else "")
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == path else None

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
        for handle in handles:
            handle.remove()
    return dict(lines)


def _hooks(model, framework: str, stack: list[str]) -> list:
    def push(name):
        return lambda *_: stack.append(name)

    def pop(*_):
        stack.pop()

    if framework == "torch":
        modules = model.named_modules()
        return [hook for name, module in modules for hook in (module.register_forward_pre_hook(push(name)),
                                                              module.register_forward_hook(pop))]
    layers = model.named_sublayers(include_self=True)
    return [hook for name, layer in layers for hook in (layer.register_forward_pre_hook(push(name)),
                                                        layer.register_forward_post_hook(pop))]


def changed_leaves(correct: dict[str, np.ndarray], mistaken: dict[str, np.ndarray]) -> list[str]:
    """The leaves the mistaken converter gives otherwise (other values or shape, or none), sorted."""
    changed = set(correct) ^ set(mistaken)
    for name in set(correct) & set(mistaken):
        a, b = np.asarray(correct[name]), np.asarray(mistaken[name])
        if a.shape != b.shape or not np.array_equal(a, b):
            changed.add(name)
    return sorted(changed)


def owners(leaves: list[str]) -> list[str]:
    """The modules holding `leaves`."""
    return sorted({leaf.rpartition(".")[0] for leaf in leaves})
