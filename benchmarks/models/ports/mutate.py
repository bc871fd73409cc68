"""Mistakes planted in a port's source: each a node of its syntax tree, replaced in the text of its own line.

`sites(source, kind)` lists every way a mutation of `kind` can change the port: in its classes' methods (the
modules' forward, a decoding port's cache's) and the functions they call, and in `convert` and the functions it
calls (never in `CONFIG`, the imports, `__init__`, `build` or `load`). `mutated(source, site)` is the port with
that one change; no line number moves. The kinds:

- `arguments_swapped`: the operands of a binary op that does not commute, two arguments of a call, or two elements
  of a list handed to a call;
- `constant_changed`: a numeric literal, a float x2, x0.5 or x10, an int +1 or -1;
- `split_reordered`: the targets of a tuple unpacking of a split (a split or chunk call, or slices written out), or
  the sizes of a split;
- `dimension_permuted`: an axis argument +1 or -1, two entries of a permutation or of a shape swapped;
- `call_dropped`: a call replaced by its first tensor argument (its receiver, for a method): a norm, an
  activation, a transpose (`.T` too), a rotary turn left out;
- `slice_off_by_one`: a slice bound or an index +1 or -1 (a layer index in the converter `hf_layers[i]` too).
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass

KINDS = ("arguments_swapped", "constant_changed", "split_reordered", "dimension_permuted", "call_dropped",
         "slice_off_by_one")
CONVERTER = "convert"
NOT_MUTATED = ("__init__", "build", "load")
COMMUTING = (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr)
AXIS_KEYWORDS = ("dim", "axis")
AXIS_METHODS = ("transpose", "mean", "sum", "softmax", "flatten", "unsqueeze", "squeeze", "cumsum", "swapaxes")
SHAPE_METHODS = ("reshape", "view", "expand", "permute")
SPLITS = ("split", "chunk", "split_per_head", "split_per_group")
ATOMS = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Call, ast.List, ast.Tuple)
LIBRARIES = ("torch", "paddle", "F", "np", "nn", "math")
BUILTINS = ("range", "len", "enumerate", "list", "float", "int", "tuple", "zip", "max", "min", "sum", "super",
            "isinstance", "print", "dict", "set", "sorted", "repr", "str")


@dataclass(frozen=True)
class Edit:
    """Text replacing a span of a line."""

    column: int
    end_column: int
    text: str


@dataclass(frozen=True)
class Site:
    """One mutation: its kind, its line, the edits it makes on it and where the line is."""

    kind: str
    line: int  # 1-based: the line every edit is on
    edits: tuple[Edit, ...]
    function: str  # where the line is: `Class.method` or a function's name
    in_converter: bool  # in `convert` or a function it calls: judged by the leaves it changes

    def what(self, source: str) -> str:
        """One line saying what the mutation changes in `source`: the line before and after."""
        before = source.splitlines()[self.line - 1].strip()
        after = mutated(source, self).splitlines()[self.line - 1].strip()
        return f"line {self.line} ({self.function}): {before}  ->  {after}"


def mutated(source: str, site: Site) -> str:
    """`source` with `site`'s edits made."""
    lines = source.splitlines(keepends=True)
    line = lines[site.line - 1]
    for edit in sorted(site.edits, key=lambda e: e.column, reverse=True):
        line = line[:edit.column] + edit.text + line[edit.end_column:]
    lines[site.line - 1] = line
    return "".join(lines)


def sites(source: str, kind: str) -> list[Site]:
    """Every site of `kind` in `source`, in source order, one per variant."""
    tree = ast.parse(source)
    _link_parents(tree)
    found = []
    for function, qualified, in_converter in _mutable_functions(tree):
        for statement in function.body:
            if _is_docstring(statement):
                continue
            for node in ast.walk(statement):
                for edits in FINDERS[kind](node, source):
                    found.append(Site(kind, node.lineno, tuple(edits), qualified, in_converter))
    return found


# -- which functions ---------------------------------------------------------------------------------------------------


def _mutable_functions(tree: ast.Module) -> list[tuple[ast.FunctionDef, str, bool]]:
    """The classes' methods (the modules' forwards, a decoding port's cache's methods) and what they call, and
    `convert` and what it calls: `(function, name, in converter)`."""
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    methods = [(node, item) for node in tree.body if isinstance(node, ast.ClassDef) for item in node.body
               if isinstance(item, ast.FunctionDef) and item.name not in NOT_MUTATED]
    from_forward = _reachable([item for _, item in methods], functions)
    from_converter = _reachable([functions[CONVERTER]], functions) if CONVERTER in functions else set()
    chosen = [(item, f"{owner.name}.{item.name}", False) for owner, item in methods]
    chosen += [(functions[name], name, False) for name in sorted(from_forward - from_converter)]
    chosen += [(functions[name], name, True) for name in sorted(from_converter)]
    return [(function, name, converter) for function, name, converter in chosen if function.name not in NOT_MUTATED]


def _reachable(roots: list[ast.FunctionDef], functions: dict[str, ast.FunctionDef]) -> set[str]:
    """The module-level functions called, directly or not, from `roots` (the roots among them by name)."""
    seen = {root.name for root in roots if root.name in functions}
    pending = list(roots)
    while pending:
        for node in ast.walk(pending.pop()):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
                if node.func.id not in seen:
                    seen.add(node.func.id)
                    pending.append(functions[node.func.id])
    return seen


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _link_parents(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node


# -- the kinds ---------------------------------------------------------------------------------------------------------


def _text(node: ast.AST, source: str) -> str:
    return ast.get_source_segment(source, node)


def _span(node: ast.AST) -> tuple[int, int]:
    return node.col_offset, node.end_col_offset


def _movable(node: ast.AST, source: str) -> str:
    """`node`'s text, parenthesised where moving it elsewhere could regroup it."""
    text = _text(node, source)
    return text if isinstance(node, ATOMS) else f"({text})"


def _swap(first: ast.AST, second: ast.AST, source: str) -> list[Edit] | None:
    one, other = _text(first, source), _text(second, source)
    if one == other or first.lineno != second.lineno or isinstance(first, ast.Starred) or isinstance(second,
                                                                                                     ast.Starred):
        return None
    return [Edit(*_span(first), _movable(second, source)), Edit(*_span(second), _movable(first, source))]


def _method(node: ast.Call) -> str | None:
    return node.func.attr if isinstance(node.func, ast.Attribute) else None


def _called(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _is_shape_call(call: ast.Call) -> bool:
    """A call whose arguments (or whose one list argument) are a shape or a permutation."""
    name = _method(call)
    if name in SHAPE_METHODS:
        return True
    return name == "transpose" and len(call.args) == 1 and isinstance(call.args[0], (ast.List, ast.Tuple))


def _dimension_entries(call: ast.Call) -> list[ast.AST]:
    if not _is_shape_call(call):
        return []
    if len(call.args) == 1 and isinstance(call.args[0], (ast.List, ast.Tuple)):
        return list(call.args[0].elts)
    return list(call.args)


def _axis_arguments(call: ast.Call) -> list[ast.AST]:
    """The integer literals of a call naming axes (`dim=`, `axis=`, or a reduction's or transpose's arguments; each
    entry of a list of axes)."""
    axes = [keyword.value for keyword in call.keywords if keyword.arg in AXIS_KEYWORDS]
    if _method(call) in AXIS_METHODS and not _is_shape_call(call):
        axes += list(call.args)
    axes = [entry for axis in axes for entry in (axis.elts if isinstance(axis, (ast.List, ast.Tuple)) else [axis])]
    return [axis for axis in axes if _integer(axis) is not None]


def _integer(node: ast.AST) -> int | None:
    value = _number(node)
    return value if isinstance(value, int) else None


def _number(node: ast.AST) -> int | float | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float):
        return -node.operand.value
    return None


def _owned_by_other_kinds(node: ast.AST) -> bool:
    """Is this literal an index, a slice bound, an axis or a shape entry (the other kinds change those)?"""
    parent = getattr(node, "parent", None)
    if isinstance(parent, ast.UnaryOp):
        node, parent = parent, getattr(parent, "parent", None)
    if isinstance(parent, (ast.Slice, ast.Subscript)) or (isinstance(parent, ast.Tuple) and isinstance(
            getattr(parent, "parent", None), ast.Subscript)):
        return True
    if isinstance(parent, ast.keyword) and parent.arg in AXIS_KEYWORDS:
        return True
    call = parent if isinstance(parent, ast.Call) else getattr(parent, "parent", None)
    return isinstance(call, ast.Call) and (node in _axis_arguments(call) or node in _dimension_entries(call))


def arguments_swapped(node: ast.AST, source: str) -> list[list[Edit]]:
    """The two operands of a binary op that does not commute, two arguments of a call, two elements of a list."""
    found = []
    if isinstance(node, ast.BinOp) and not isinstance(node.op, COMMUTING):
        found.append(_swap(node.left, node.right, source))
    elif isinstance(node, ast.Call) and _called(node) not in BUILTINS and not _is_shape_call(node) \
            and _method(node) not in AXIS_METHODS:  # transpose(1, 2) and transpose(2, 1) are one
        found += [_swap(a, b, source) for a, b in itertools.combinations(node.args, 2)]
        for argument in node.args:
            if isinstance(argument, (ast.List, ast.Tuple)) and _called(node) not in SPLITS:
                found += [_swap(a, b, source) for a, b in itertools.combinations(argument.elts, 2)]
    return [edits for edits in found if edits]


def constant_changed(node: ast.AST, source: str) -> list[list[Edit]]:
    """A numeric literal (not an index, slice bound, axis or shape entry): a float x2, x0.5, x10, an int +1, -1."""
    value = _number(node)
    if value is None or isinstance(getattr(node, "parent", None), ast.UnaryOp) or _owned_by_other_kinds(node):
        return []
    changed = [value + 1, value - 1] if isinstance(value, int) else [value * 2, value * 0.5, value * 10]
    return [[Edit(*_span(node), repr(new) if new >= 0 else f"({new!r})")] for new in changed]


def split_reordered(node: ast.AST, source: str) -> list[list[Edit]]:
    """The targets of a split's tuple unpacking in another order, or the sizes of a split."""
    found = []
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple):
        value, targets = node.value, node.targets[0].elts
        written_out = isinstance(value, ast.Tuple) and all(isinstance(e, ast.Subscript) for e in value.elts)
        if (isinstance(value, ast.Call) and _called(value) in SPLITS) or written_out:
            texts = [_text(t, source) for t in targets]
            for order in itertools.permutations(range(len(targets))):
                if list(order) != sorted(order):
                    found.append([Edit(*_span(t), texts[i]) for t, i in zip(targets, order)])
    if isinstance(node, ast.Call) and _called(node) == "split":
        sizes = next((a for a in node.args[1:] if isinstance(a, (ast.List, ast.Tuple))), None)
        if sizes is not None:
            texts = [_text(e, source) for e in sizes.elts]
            orders = {tuple(texts[i] for i in order) for order in itertools.permutations(range(len(texts)))}
            found += [[Edit(*_span(e), t) for e, t in zip(sizes.elts, order)] for order in sorted(orders)
                      if list(order) != texts]
    return found


def dimension_permuted(node: ast.AST, source: str) -> list[list[Edit]]:
    """An axis +1 or -1, or two entries of a permutation or a shape swapped."""
    if not isinstance(node, ast.Call):
        return []
    found = [[Edit(*_span(axis), repr(_integer(axis) + step))] for axis in _axis_arguments(node) for step in (1, -1)]
    entries = _dimension_entries(node)
    found += [_swap(a, b, source) for a, b in itertools.combinations(entries, 2)]
    return [edits for edits in found if edits]


def call_dropped(node: ast.AST, source: str) -> list[list[Edit]]:
    """A call (or a `.T`) replaced by the tensor it works on."""
    if isinstance(node, ast.Attribute) and node.attr == "T" and isinstance(node.ctx, ast.Load):
        return [[Edit(*_span(node), _movable(node.value, source))]]
    if not isinstance(node, ast.Call) or _called(node) in BUILTINS or isinstance(getattr(node, "parent", None),
                                                                                  ast.Expr):
        return []
    first = _first_tensor(node)
    if first is None or isinstance(first, (ast.List, ast.Tuple, ast.Constant)) or _number(first) is not None:
        return []
    return [[Edit(*_span(node), _movable(first, source))]]


def _first_tensor(call: ast.Call) -> ast.AST | None:
    """The tensor a call works on: the receiver of a tensor's method, else its first argument (of a library's
    function, or of a module: `self.norm(x)`)."""
    if isinstance(call.func, ast.Attribute):
        owner = call.func.value
        of_library = isinstance(owner, ast.Name) and owner.id in LIBRARIES
        of_self = (isinstance(owner, ast.Name) and owner.id == "self") or (
            isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self")
        if not of_library and not of_self:
            return owner
    return call.args[0] if call.args else None


def slice_off_by_one(node: ast.AST, source: str) -> list[list[Edit]]:
    """A slice bound or an index (a literal or a name) +1 or -1."""
    if not isinstance(node, ast.Subscript):
        return []
    bounds = []
    for part in (node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]):
        if isinstance(part, ast.Slice):
            bounds += [b for b in (part.lower, part.upper) if b is not None]
        elif _integer(part) is not None or isinstance(part, ast.Name):
            bounds.append(part)
    found = []
    for bound in bounds:
        value = _integer(bound)
        text = _text(bound, source)
        for step in (1, -1):
            new = repr(value + step) if value is not None else f"{text} {'+' if step > 0 else '-'} 1"
            found.append([Edit(*_span(bound), new)])
    return found


FINDERS = {"arguments_swapped": arguments_swapped, "constant_changed": constant_changed,
           "split_reordered": split_reordered, "dimension_permuted": dimension_permuted,
           "call_dropped": call_dropped, "slice_off_by_one": slice_off_by_one}
