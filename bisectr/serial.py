"""Dataclasses to JSON and back, checked against their type hints: the one codec of every
document bisectr writes (run files and `--json` alike), but for the traces.

A trace (`capture.trace.Trace`) holds a record per op and per tensor, hundreds of thousands in a
large model: it writes them field by field (`to_json`) and checks them by the set of their types
(`Trace.check`), since checking each value against its annotation here costs more than parsing the
JSON (measured on a trace of 20,000 ops and tensors: 4.6x slower to write, 3.4x to read).

`to_plain` turns a dataclass (nested dataclasses, lists, tuples, dicts) into what
`json.dumps` writes. `from_plain(cls, data)` builds the dataclass again and checks every
field against its annotation, so a crafted or damaged file is refused with the path of
the offending field (`PlainError`) instead of failing later, somewhere in a view.
Unknown keys are ignored (a newer bisectr may add some); missing keys take the field's
default, or are refused when it has none. A field's JSON key is its name, or its metadata's
"key" (`pass`, a Python keyword); a field with `init=False` is derived: written, not read.

The dialect is standard JSON: a number that is not finite is the string "Infinity",
"-Infinity" or "NaN" (`plain_number`), read back as that float.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class PlainError(ValueError):
    """A JSON value that does not fit the record: `where` is its path (`culprit.candidate.index`)."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where or 'the document'}: {problem}")
        self.where = where


NONFINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def plain_number(value: float) -> float | str:
    """A float as the dialect writes it: itself, or "Infinity", "-Infinity", "NaN"."""
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def number(value: Any) -> Any:
    """What `plain_number` wrote, as the float it was (anything else as it is)."""
    return NONFINITE.get(value, value) if type(value) is str else value


def to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.metadata.get("key", f.name): to_plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.metadata.get("plain", True)
        }
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, float):
        return plain_number(value)
    return value


def from_plain(cls: type[T], data: Any, where: str = "") -> T:
    return _convert(cls, data, where)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(hint: Any, data: Any, where: str) -> Any:
    if hint is Any:
        return data
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, data, where)
            except PlainError:
                continue
        raise PlainError(where, f"{_describe(data)} fits none of {hint}")
    if dataclasses.is_dataclass(hint):
        return _record(hint, data, where)
    if origin is Literal:
        if data not in args:
            raise PlainError(where, f"expected one of {', '.join(map(repr, args))}, got {_describe(data)}")
        return data
    if origin is list:
        _expect(data, list, where)
        return [_convert(args[0], item, f"{where}[{i}]") for i, item in enumerate(data)]
    if origin is tuple:
        _expect(data, list, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], item, f"{where}[{i}]") for i, item in enumerate(data))
        if len(data) != len(args):
            raise PlainError(where, f"expected {len(args)} items, got {len(data)}")
        return tuple(_convert(a, item, f"{where}[{i}]") for i, (a, item) in enumerate(zip(args, data)))
    if origin is dict:
        _expect(data, dict, where)
        key_type, value_type = args
        return {_key(key_type, k, where): _convert(value_type, v, f"{where}.{k}") for k, v in data.items()}
    if hint is float:
        data = number(data)
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise PlainError(where, f"expected a number, got {_describe(data)}")
        return float(data)
    if hint in (int, str, bool):
        if not isinstance(data, hint) or (hint is int and isinstance(data, bool)):
            raise PlainError(where, f"expected {hint.__name__}, got {_describe(data)}")
        return data
    if hint is dict:
        _expect(data, dict, where)
        return data
    raise TypeError(f"from_plain cannot check {hint!r} at {where}")


def _record(cls: type, data: Any, where: str) -> Any:
    _expect(data, dict, where)
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if not f.init or not f.metadata.get("plain", True):
            continue
        key = f.metadata.get("key", f.name)
        path = f"{where}.{key}" if where else key
        if key in data:
            values[f.name] = _convert(hints[f.name], data[key], path)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PlainError(path, "missing")
    return cls(**values)


def _key(hint: Any, key: str, where: str) -> Any:
    if hint is int:
        try:
            return int(key)
        except ValueError:
            raise PlainError(where, f"key {key!r} is not an integer") from None
    return key


def _expect(data: Any, kind: type, where: str) -> None:
    if not isinstance(data, kind):
        raise PlainError(where, f"expected a JSON {'object' if kind is dict else 'array'}, got {_describe(data)}")


def _describe(data: Any) -> str:
    text = repr(data)
    return f"{type(data).__name__} {text[:40] + '...' if len(text) > 40 else text}"
