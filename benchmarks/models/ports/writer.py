"""The port writer: a family, a framework and the structural choices in, the source of a hand-style port out.

`write(family, framework, choices, names)` returns one Python file holding the port's classes, `build()` returning
the model (eval), `convert(hf)` mapping the reference's state dict (numpy, by its names) to the port's names and
layouts, and `load(model, weights)`. Every statement of it is on one line (`one_statement_per_line` checks it), so
that a mutation replaces text inside a line and no line number moves.

Choices of a decoding port (`choices.DECODING_CHOICES`) write the decoder with its own cache (`decoding.py`);
`written(...)` also gives the lines of such a port that run at decode steps and its decoding mistakes, each as the
lines it rewrites (`Written`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ports import resnet, t5, transformer
from ports.architectures import ARCHS, DECODING_ARCHS
from ports.decoding import is_decoding
from ports.dialect import DIALECTS
from ports.layers import Converter, Port, function, indented, unmarked

MODEL_WRITERS = {"decoder": transformer, "bert": transformer, "vit": transformer, "t5": t5, "resnet": resnet}


@dataclass(frozen=True)
class Written:
    """A port's source; a decoding port's lines that run at decode steps, and its decoding mistakes: `(kind, ((line,
    mistaken text), ...))`, the first line the one the mistake is judged at (1-based line numbers)."""

    source: str
    decode_lines: frozenset[int] = frozenset()
    mistakes: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()


def write(family: str, framework: str, choices: dict[str, str], names: dict[str, object]) -> str:
    """The source of `family`'s port in `framework`, with `choices` (`choices.draw`) and `names` (`draw_names`)."""
    return written(family, framework, choices, names).source


def written(family: str, framework: str, choices: dict[str, str], names: dict[str, object]) -> Written:
    """`family`'s port in `framework` with its decode lines and decoding mistakes (a decoding port, written against
    `DECODING_ARCHS`' family, where `choices` are a decoding port's)."""
    arch = DECODING_ARCHS[family] if is_decoding(choices) else ARCHS[family]
    port = Port(arch, framework, choices, names, DIALECTS[framework])
    converter = Converter()
    MODEL_WRITERS[arch.kind].write(port, converter)
    lines, line_of_mark = [], {}
    for number, line in enumerate(_assembled(port, converter), start=1):
        text, mark = unmarked(line)
        lines.append(text)
        if mark is not None:
            line_of_mark[mark] = number
    source = "\n".join(lines) + "\n"
    one_statement_per_line(source)
    mistakes = tuple((alternative.kind, tuple((line_of_mark[mark], text) for mark, text in alternative.lines))
                     for alternative in port.alternatives)
    return Written(source, frozenset(line_of_mark.values()), mistakes)


def _assembled(p: Port, converter: Converter) -> list[str]:
    top = list(p.classes)[-1]
    drawn = ", ".join(f"{name} {value}" for name, value in p.choices.items())
    cache = ", decoding with its own cache," if p.decoding else ""
    lines = [f'"""A hand-style {p.framework} port of {p.arch.family} (the Hugging Face model\'s){cache} with its '
             'converter.',
             "", f"Structural choices: {drawn}.", '"""', "", *p.d.imports(), "",
             f"CONFIG = {p.config!r}", "", ""]
    for block in [*p.helpers.values(), *p.classes.values()]:
        lines += block + ["", ""]
    build = ["model = " + top + "()", "model.eval()", "return model"]
    lines += function("build", "", "The port, in eval mode (its weights still to be loaded).", build) + ["", ""]
    if converter.loops:
        p.converter_helper("per_layer", function(
            "per_layer", "hf, prefix", "The reference's weights of each layer under `prefix`, by their names in it.",
            ["return [{name[len(f'{prefix}{i}.'):]: values for name, values in hf.items() if name.startswith(f'{prefix}"
             "{i}.')} for i in range(CONFIG['layers'])]"]))
    for block in p.converter_helpers.values():
        lines += block + ["", ""]
    doc = "The reference's weights (numpy, by its names) in this port's names and layouts."
    lines += function("convert", "hf", doc, _convert_body(converter)) + ["", ""]
    return lines + p.d.state_dict_loader()


def _convert_body(converter: Converter) -> list[str]:
    body = ["out = {}", *converter.before]
    for hf_prefix, mine_prefix, lines in converter.loops:
        body += [f"hf_layers = per_layer(hf, {hf_prefix!r})", "for i in range(CONFIG['layers']):",
                 f"    theirs, mine = hf_layers[i], f'{mine_prefix}{{i}}.'", *indented(lines)]
    return body + converter.after + ["return out"]


def one_statement_per_line(source: str) -> None:
    """Raise where a simple statement of `source`, or the header of a compound one, spans lines (the module's
    docstring aside)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or node is tree.body[0]:
            continue
        if hasattr(node, "body"):
            header = [child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.stmt)]
            end = max([getattr(child, "end_lineno", None) or node.lineno for child in header], default=node.lineno)
        else:
            end = node.end_lineno
        if end != node.lineno:
            raise ValueError(f"line {node.lineno}: a statement over {end - node.lineno + 1} lines")
