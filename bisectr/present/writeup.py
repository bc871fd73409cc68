"""A run written up for a GitHub issue: Markdown, and a self-contained HTML page.

The Markdown holds the verdict, the culprit with both source lines in context, the evidence,
recurrences, the leaves that differ, the bracket of an unconfirmed difference and the environment.
The HTML page is that Markdown rendered, plus the error-by-op plot (bokeh, the `report` extra: the
page says so and goes on without it), the op table (click a heading to sort) and the repro script.
Both open with nothing but a browser or a Markdown viewer: no network, no bisectr.
"""

from __future__ import annotations

import html
import linecache
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..environment import LIBRARIES, describe
from ..measure.result import Result
from ..measure.runrecord import RunRecord
from .report import (
    HEADLINE,
    TRAINING_COLUMNS,
    Line,
    bracket_lines,
    compiled_code_name,
    compiled_lines,
    confirmation_text,
    culprit_role,
    float64_text,
    fmt,
    fmt_amplification,
    measured,
    moved_text,
    nonfinite_text,
    not_blamed_text,
    op_rows,
    placements_text,
    rewired_lines,
    short_source,
    training_lines,
    training_rows,
    GENERATION_COLUMNS,
    generation_lines,
    generation_rows,
)
from .repro import NoRepro, write_repro

if TYPE_CHECKING:
    from ..generation import GenerationResult
    from ..training import TrainingResult

CONTEXT = 2  # lines of code shown before and after a culprit's line
SECTIONS = (
    "Sides",
    "Verdict",
    "Culprit",
    "Evidence",
    "Recurrences",
    "Parameters and buffers that differ",
    "Where the difference enters",
    "Environment",
)
OP_COLUMNS = ("op", "name", "module", "source", "mean abs", "max abs", "error", "local error", "verdict")


def markdown(run: RunRecord) -> str:
    """The write-up of `run` and its result, as Markdown for an issue."""
    findings, closing = _sections(run)
    return _joined(findings + closing)


def _sections(run: RunRecord) -> tuple[list[str], list[str]]:
    """The Markdown sections: (what the run found, the environment and the note closing it)."""
    result = run.result
    model = Path(run.traced.model_file).name
    findings = [f"## bisectr: {result.verdict if result else 'traced'} in `{model}`", _settings(result), _sides(run)]
    if result is None:
        findings.append("This run holds no search result (traced with `--stats-only`, or not searched yet).")
    else:
        findings += _pass(run, result)
        if result.backward is not None:
            findings += [f"## Backward pass ({result.backward.activations} activations)", *_pass(run, result.backward)]
    return findings, [
        _environment(run),
        f"<sub>Written by `bisectr report` from run `{run.run_id}` of `{model}`.</sub>",
    ]


def _joined(parts: list[str]) -> str:
    return "\n\n".join(part for part in parts if part) + "\n"


def _sides(run: RunRecord) -> str:
    rows = [("function", *(f"`{getattr(run.traced, role + '_fn')}()`" for role in ("reference", "candidate")))]
    for label, value in (
        ("framework", lambda t: t.framework),
        ("device", lambda t: t.device),
        ("dtype", lambda t: t.dtype),
        ("ops recorded", lambda t: str(len(t.ops))),
    ):
        rows.append((label, value(run.reference), value(run.candidate)))
    return "### Sides\n\n" + _table(("", "reference", "candidate"), rows)


def _pass(run: RunRecord, result: Result) -> list[str]:
    error = result.output_error
    difference = "NaN/Inf" if result.nonfinite else f"{fmt(error.max_abs)} (relative {fmt(error.max_rel)})"
    unconfirmed = " (unconfirmed)" if result.unconfirmed else ""
    verdict = [
        f"### Verdict\n\n**{result.verdict}{unconfirmed}**: {HEADLINE[result.verdict]}; "
        f"the {measured(result)} differ by "
        f"{difference}."
    ]
    for text in (
        result.missing_gradient,
        result.unreduced_gradient,
        result.nonfinite and nonfinite_text(result.nonfinite),
        result.fp64_check and float64_text(result.fp64_check, measured(result)),
        f"aligned: {result.ops.aligned} of {result.ops.candidate} candidate ops "
        f"({result.ops.reference} reference ops); "
        f"candidate re-runs: {result.reruns}",
    ):
        if text:
            verdict.append(_escape(text))
    parts = ["\n\n".join(verdict)]
    if result.verdict == "nondeterministic":
        parts.append(_not_repeated(result))
    elif result.culprit is not None:
        parts += [_culprit(run, result), _evidence(run, result)]
    parts += [_recurrences(result), _different_leaves(result)]
    if result.bracket is not None:
        parts.append(
            "### Where the difference enters\n\n```text\n" + "\n".join(bracket_lines(result.bracket)) + "\n```"
        )
    return parts


def _settings(result: Result | None) -> str:
    """The settings that change numerics which the sides ran with different values of, and what
    `--fix-nondeterminism` changed: before any number."""
    if result is None or not (result.settings or result.fixed):
        return ""
    parts = []
    if result.settings:
        rows = [(d.name, f"`{d.reference}`", f"`{d.candidate}`") for d in result.settings]
        parts.append(
            "### Settings that differ\n\nThe sides ran with different settings that change numerics:\n\n"
            + _table(("setting", "reference", "candidate"), rows)
        )
    if result.fixed:
        parts.append(
            "### Fixed before recording\n\n`--fix-nondeterminism` changed the sides before they were recorded:\n\n"
            + "\n".join(f"- {_escape(change)}" for change in result.fixed)
        )
    return "\n\n".join(parts)


def _not_repeated(result: Result) -> str:
    parts = []
    for found in result.nondeterminism:
        rows = [
            (
                found.side,
                f"{found.op.index} `{found.op.op}`",
                f"`{found.op.module or '(top level)'}`",
                f"`{short_source(found.op.source)}`" if found.op.source else "",
            )
        ]
        parts += [
            f"### The {found.side} does not repeat itself\n\nThe first op that differs between two of its runs:",
            _table(("side", "op", "module", "source"), rows),
            _context(found.op.source),
            "\n".join(
                f"- {_escape(item)}"
                for item in (
                    moved_text(found),
                    f"cause: {found.cause}",
                    f"fix: {found.fix}",
                )
            ),
        ]
    return "\n\n".join(part for part in parts if part)


def _culprit(run: RunRecord, result: Result) -> str:
    culprit = result.culprit
    role = culprit_role(result)
    what = role if role.startswith(("a ", "where ")) else f"the {role}"
    name = compiled_code_name(culprit) if culprit.compiled else f"`{culprit.op}`"
    leaf = f" (its leaf `{culprit.leaf}`)" if culprit.leaf else ""
    rows = [
        (
            role,
            f"{site.index} `{site.op}`",
            f"`{site.module or '(top level)'}`",
            f"`{short_source(site.source)}`" if site.source else "",
        )
        for role, site in (("candidate", culprit.candidate), ("reference", culprit.reference))
    ]
    parts = [f"### Culprit: {name}{leaf}, {what}", _table(("side", "op", "module", "source"), rows)]
    sources = [("candidate", culprit.candidate.source), ("reference", culprit.reference.source)]
    if culprit.compiled:
        sources.append(("inside the compiled code", culprit.compiled.source))
    for where, source in sources:
        context = _context(source)
        if context:
            parts.append(f"{where}, `{short_source(source)}`:\n\n{context}")
    return "\n\n".join(parts)


def _context(source: str) -> str:
    """The lines around `source` ("path:line"), its own marked, as a fenced Python block ("" where unreadable)."""
    path, _, line = source.rpartition(":")
    if not (path and line.isdigit() and os.path.isfile(path)):
        return ""
    number = int(line)
    shown = [(n, linecache.getline(path, n).rstrip()) for n in range(max(1, number - CONTEXT), number + CONTEXT + 1)]
    shown = [(n, text) for n, text in shown if text or n <= number]
    return "```python\n" + "\n".join(f"{'>' if n == number else ' '} {n:>4}  {text}" for n, text in shown) + "\n```"


def _evidence(run: RunRecord, result: Result) -> str:
    culprit = result.culprit
    items: list[str] = []  # plain text, escaped below
    if culprit.local_error is not None or culprit.input_error is not None:
        if result.pass_ == "backward":
            items.append(
                f"gradient error reaching it {fmt(culprit.output_error_rel)} (relative); "
                f"local backward error {fmt(culprit.local_error)}"
            )
        else:
            items.append(
                f"input error {fmt(culprit.input_error)} -> output error {fmt(culprit.output_error)} "
                f"({fmt_amplification(culprit.amplification, culprit.output_error)}); "
                f"local error {fmt(culprit.local_error)}"
            )
    if culprit.fp64:
        items.append(
            f"vs the fp64 oracle: candidate {fmt(culprit.fp64.candidate_error)}, reference "
            f"{fmt(culprit.fp64.reference_error)} -> {culprit.verdict}"
        )
    elif culprit.fp64_unavailable:
        items.append(f"vs the fp64 oracle: none ({culprit.fp64_unavailable})")
    if culprit.compiled:  # its source line is shown in context above
        items += [
            _line_text(line)
            for line in compiled_lines(run, culprit.compiled)
            if not any(style == "source" for _, style in line)
        ]
    if culprit.rewired:
        items += [_line_text(line) for line in rewired_lines(culprit.rewired)]
    if culprit.placements:
        items.append(placements_text(culprit.placements))
    if result.confirmation:
        items.append(confirmation_text(result.confirmation, measured(result), culprit.block))
    items += [not_blamed_text(item) for item in result.not_blamed]
    return "### Evidence\n\n" + "\n".join(f"- {_escape(item)}" for item in items if item)


def _line_text(line: Line) -> str:
    """A text report's line as one sentence (its column padding dropped)."""
    return " ".join("".join(text for text, _ in line).split())


def _recurrences(result: Result) -> str:
    if not result.recurrences:
        return ""
    rows = [
        (
            str(item.index),
            f"`{item.op}`",
            f"`{item.module or '(top level)'}`",
            f"`{short_source(item.source)}`",
            fmt(item.local_error),
            "" if item.share is None else f"{item.share:.0%}",
        )
        for item in result.recurrences
    ]
    return (
        f"### Recurrences\n\nThe same difference in {len(rows)} places (the first is the culprit), "
        "with the share of the "
        "error each makes alone:\n\n" + _table(("op", "name", "module", "source", "local error", "share"), rows)
    )


def _different_leaves(result: Result) -> str:
    pairs = [pair for pair in (result.leaves.pairs if result.leaves else []) if pair.status == "different"]
    if not pairs:
        return ""
    rows = [
        (f"`{pair.candidate}`", f"`{pair.reference}`", pair.layout, _escape(pair.description or ""), fmt(pair.max_rel))
        for pair in pairs
    ]
    return "### Parameters and buffers that differ\n\n" + _table(
        ("candidate", "reference", "layout", "how", "max rel"), rows
    )


def _environment(run: RunRecord) -> str:
    if not run.traced.environment:
        return "### Environment\n\nnot recorded (a run written by an earlier bisectr)"
    return _environment_table(run.traced.environment) + _settings_table(run)


def _settings_table(run: RunRecord) -> str:
    """Each side's settings that change numerics, as it ran."""
    reference, candidate = run.reference.settings, run.candidate.settings
    names = list(dict.fromkeys([*reference, *candidate]))
    if not names:
        return ""
    rows = [
        (name, f"`{reference[name]}`" if name in reference else "", f"`{candidate[name]}`" if name in candidate else "")
        for name in names
    ]
    return "\n\nSettings that change numerics, as each side ran:\n\n" + _table(
        ("setting", "reference", "candidate"), rows
    )


def _environment_table(found: dict[str, str | None]) -> str:
    names = ["bisectr", "python", *LIBRARIES, "cpu", "gpu"]
    rows = [
        (name, f"`{found[name]}`" if found.get(name) else "not installed" if name in LIBRARIES else "none")
        for name in names
        if name in found
    ]
    return "### Environment\n\n" + _table(("", "version"), rows)


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _escape(text: str) -> str:
    """Plain text that Markdown would read as markup (`*`, `_`, `<`) kept as written."""
    for char in ("\\", "*", "_", "<", "[", "]", "`"):
        text = text.replace(char, "\\" + char)
    return text


def training_markdown(result: TrainingResult, model_file: str) -> str:
    """The write-up of `bisectr train`'s result: the verdict, the culprit, every step's losses and errors."""
    lines = [_line_text(line) for line in training_lines(result)]
    steps = _table(TRAINING_COLUMNS[:-1] + ("semantic",), [tuple(row) for row in training_rows(result)])
    parts = [
        f"## bisectr train: {result.verdict} in `{Path(model_file).name}`",
        "### Verdict\n\n" + "\n\n".join(map(_escape, lines)),
        "### Steps\n\nErrors relative; rounding predicts and float64 differ: the update of the parameter rounding "
        "explains least.\n\n" + steps,
        _environment_table(describe()),
    ]
    return "\n\n".join(parts) + "\n"


def generation_markdown(result: GenerationResult, model_file: str) -> str:
    """The write-up of `bisectr generate`'s result: the verdict, every step's errors, then the step searched."""
    lines = [_line_text(line) for line in generation_lines(result)]
    steps = _table(GENERATION_COLUMNS[:-1] + ("verdict",), [tuple(row) for row in generation_rows(result)])
    parts = [
        f"## bisectr generate: {result.verdict} in `{Path(model_file).name}`",
        "### Verdict\n\n" + "\n\n".join(map(_escape, lines)),
        "### Steps\n\nStep 0 is the prefill; logits of the last position, errors relative; margin: the reference's "
        "gap between its top-1 and top-2 logits; cache: the entry rounding explains least.\n\n" + steps,
    ]
    if result.run is not None and result.run.result is not None:
        found, _ = _sections(result.run)
        parts += [f"### Inside step {result.culprit_step}", *found[1:]]
    parts.append(_environment_table(describe()))
    return "\n\n".join(parts) + "\n"


# -- the HTML page ---------------------------------------------------------------------------------------
_STYLE = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto; \
padding: 0 1em; color: #1f2328; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; border-radius: 6px; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
table.ops th { cursor: pointer; user-select: none; }
table.ops td.culprit { font-weight: bold; background: #ffebe9; }
.note { color: #59636e; }
"""
_SORTING = """
document.querySelectorAll("table.ops th").forEach((heading, column) => heading.addEventListener("click", () => {
  const body = heading.closest("table").tBodies[0];
  const ascending = heading.dataset.order !== "ascending";
  heading.dataset.order = ascending ? "ascending" : "descending";
  const key = row => { const text = row.cells[column].textContent; const number = parseFloat(text);
                       return isNaN(number) ? text : number; };
  Array.from(body.rows).sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (ascending ? 1 : -1))
       .forEach(row => body.appendChild(row));
}));
"""


def html_page(run: RunRecord, repro: str | None = None) -> str:
    """The write-up of `run` as one self-contained HTML page: the Markdown rendered, the error-by-op plot,
    the op table and `repro` (the repro script's text, where there is one)."""
    repro_part = (
        "<details><summary>repro script (with <code>inputs.npz</code> beside it)</summary>"
        f"<pre><code>{html.escape(repro)}"
        "</code></pre></details>"
        if repro
        else ""
    )
    title = f"bisectr: {run.result.verdict if run.result else 'traced'} in {Path(run.traced.model_file).name}"
    figures = [_error_plot] if run.result is not None and run.result.profile else []
    findings, closing = _sections(run)
    return _page(title, _joined(findings), _figures(figures, run), _op_table(run) + repro_part, _joined(closing))


def training_html_page(result: TrainingResult, model_file: str) -> str:
    """The training write-up as one self-contained HTML page, with both loss curves and the per-step errors."""
    title = f"bisectr train: {result.verdict} in {Path(model_file).name}"
    return _page(title, training_markdown(result, model_file), _figures([_loss_plot, _step_error_plot], result), "", "")


def generation_html_page(result: GenerationResult, model_file: str) -> str:
    """The generation write-up as one self-contained HTML page: error and margin by step, then the step's
    error by op and op table."""
    title = f"bisectr generate: {result.verdict} in {Path(model_file).name}"
    head, plots = _figures([_generation_plot], result)
    after = ""
    if result.run is not None and result.run.result is not None and result.run.result.profile:
        _, op_plot = _figures([_error_plot], result.run)
        after = op_plot + _op_table(result.run)
    return _page(title, generation_markdown(result, model_file), (head, plots), after, "")


def _page(title: str, text: str, figures: tuple[str, str], after: str, closing: str) -> str:
    """`text` (Markdown) rendered, then the figures, `after` (HTML) and `closing` (Markdown)."""
    from markdown_it import MarkdownIt

    head, plots = figures
    render = MarkdownIt("commonmark", {"html": True}).enable("table").render
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style>{head}</head><body>\n{render(text)}\n{plots}\n{after}\n{render(closing)}\n"
        f"<script>{_SORTING}</script></body></html>\n"
    )


def _figures(makers: list, subject) -> tuple[str, str]:
    """(what the page's head needs, the figures `makers` draw of `subject`); a note where bokeh is missing."""
    if not makers:
        return "", ""
    try:
        from bokeh.embed import components
        from bokeh.resources import Resources
    except ImportError:
        return "", (
            "<p class=\"note\">(the plots need bokeh: <code>pip install 'bisectr[report]'</code>; "
            "the tables have the same numbers)</p>"
        )
    parts = []
    for make in makers:
        heading, plot = make(subject)
        script, div = components(plot)
        parts.append(f"<h3>{heading}</h3>\n{div}\n{script}")
    return Resources(mode="inline", components=["bokeh"]).render(), "\n".join(parts)  # BokehJS alone: 1.3 MB


def _error_plot(run: RunRecord):
    from bokeh.models import ColumnDataSource, HoverTool, Span
    from bokeh.plotting import figure

    result = run.result
    candidate = run.candidate
    rows = result.profile
    floor = min((v for row in rows for v in (row.output_error, row.local_error) if v), default=1e-12) / 10
    data = ColumnDataSource(
        {
            "index": [row.index for row in rows],
            "propagated": [max(row.output_error, floor) for row in rows],
            "local": [max(row.local_error or 0.0, floor) for row in rows],
            "op": [row.op for row in rows],
            "module": [row.module or "(top level)" for row in rows],
            "source": [short_source(candidate.ops[row.index].source) for row in rows],
        }
    )
    plot = figure(
        height=320,
        sizing_mode="stretch_width",
        y_axis_type="log",
        x_axis_label="candidate op",
        y_axis_label="error (relative)",
        title="error by op: propagated and local",
        tools="pan,wheel_zoom,box_zoom,reset",
    )
    plot.line("index", "propagated", source=data, legend_label="propagated", line_width=2, color="#0969da")
    plot.scatter("index", "local", source=data, legend_label="local", size=5, color="#cf222e", alpha=0.7)
    plot.add_tools(
        HoverTool(
            tooltips=[
                ("op", "@index @op"),
                ("module", "@module"),
                ("source", "@source"),
                ("propagated", "@propagated{0.00e0}"),
                ("local", "@local{0.00e0}"),
            ]
        )
    )
    if result.culprit is not None:
        plot.add_layout(
            Span(location=result.culprit.candidate.index, dimension="height", line_color="#cf222e", line_dash="dashed")
        )
    plot.legend.location = "top_left"
    return "Error by op", plot


def _loss_plot(result: TrainingResult):
    from bokeh.plotting import figure

    steps = [row.step for row in result.steps]
    plot = figure(
        height=280,
        sizing_mode="stretch_width",
        x_axis_label="step",
        y_axis_label="loss",
        title="loss, both sides",
        tools="pan,wheel_zoom,box_zoom,reset,hover",
    )
    for role, color in (("reference", "#0969da"), ("candidate", "#cf222e")):
        plot.line(
            steps, [getattr(row.loss, role) for row in result.steps], legend_label=role, line_width=2, color=color
        )
    return "Loss curves", plot


def _per_step_figure(title: str, x_label: str, y_label: str):
    """An empty plot of errors (log scale) by step."""
    from bokeh.plotting import figure

    return figure(
        height=280,
        sizing_mode="stretch_width",
        y_axis_type="log",
        x_axis_label=x_label,
        y_axis_label=y_label,
        title=title,
        tools="pan,wheel_zoom,box_zoom,reset,hover",
    )


def _step_error_plot(result: TrainingResult):
    steps = [row.step for row in result.steps]
    plot = _per_step_figure("candidate against reference, per step", "step", "error (relative)")
    for measure, color in (("loss", "#0969da"), ("gradient", "#cf222e"), ("update", "#1a7f37"), ("moments", "#8250df")):
        values = [max(getattr(row.error, measure), 1e-18) for row in result.steps]
        plot.line(steps, values, legend_label=measure, line_width=2, color=color)
    plot.legend.location = "bottom_right"
    return "Error per step", plot


def _generation_plot(result: GenerationResult):
    from bokeh.models import LinearAxis, Range1d

    steps = [row.step for row in result.steps]
    plot = _per_step_figure(
        "candidate against reference, per step; the reference's top-1 margin on the right",
        "step (0: the prefill)",
        "logits error (relative)",
    )
    for values, label, color in (
        ([row.logits.error for row in result.steps], "logits error", "#cf222e"),
        ([row.logits.rounding for row in result.steps], "rounding predicts", "#0969da"),
        ([row.logits.float64_error for row in result.steps], "float64 differ", "#8250df"),
    ):
        plot.line(steps, [max(v, 1e-18) for v in values], legend_label=label, line_width=2, color=color)
    margins = [row.margin for row in result.steps]
    plot.extra_y_ranges = {"margin": Range1d(0, max(margins, default=1.0) * 1.1 or 1.0)}
    plot.add_layout(LinearAxis(y_range_name="margin", axis_label="margin (logits)"), "right")
    plot.scatter(steps, margins, y_range_name="margin", legend_label="margin", size=6, color="#1a7f37")
    plot.legend.location = "bottom_right"
    return "Error and margin by step", plot


def _op_table(run: RunRecord) -> str:
    if run.result is None or not run.result.profile:
        return ""
    culprit = run.result.culprit.candidate.index if run.result.culprit else None
    rows = []
    for row in op_rows(run, run.result):
        marked = ' class="culprit"' if row[0] == culprit else ""
        cells = "".join(
            f"<td{marked}>{html.escape(fmt(cell) if isinstance(cell, float) else str(cell))}</td>" for cell in row
        )
        rows.append(f"<tr>{cells}</tr>")
    headings = "".join(f"<th>{column}</th>" for column in OP_COLUMNS)
    return (
        f"<details><summary>every paired op ({len(rows)}; click a heading to sort)</summary>\n"
        '<table class="ops"><thead>'
        f"<tr>{headings}</tr></thead><tbody>{''.join(rows)}</tbody></table></details>"
    )


def write_report(run: RunRecord, path: str | os.PathLike) -> list[Path]:
    """`PATH.md` and `PATH.html` (a suffix .md or .html of `path` dropped), each written whole or not at
    all; the culprit's repro script beside them (`PATH.repro/`), inline in the page."""
    base = _base(path)
    return _write(base, markdown(run), html_page(run, _repro_text(run, base)))


def write_training_report(result: TrainingResult, model_file: str, path: str | os.PathLike) -> list[Path]:
    """`PATH.md` and `PATH.html` of `bisectr train`'s result."""
    return _write(_base(path), training_markdown(result, model_file), training_html_page(result, model_file))


def write_generation_report(result: GenerationResult, model_file: str, path: str | os.PathLike) -> list[Path]:
    """`PATH.md` and `PATH.html` of `bisectr generate`'s result."""
    return _write(_base(path), generation_markdown(result, model_file), generation_html_page(result, model_file))


def _base(path: str | os.PathLike) -> Path:
    base = Path(path)
    base = base.with_suffix("") if base.suffix in (".md", ".html") else base
    base.parent.mkdir(parents=True, exist_ok=True)
    return base


def _write(base: Path, markdown_text: str, html_text: str) -> list[Path]:
    written = []
    for suffix, text in ((".md", markdown_text), (".html", html_text)):
        target = base.with_name(base.name + suffix)
        temporary = target.with_name(f".{target.name}.{os.getpid()}")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, target)
        written.append(target)
    return written


def _repro_text(run: RunRecord, base: Path) -> str | None:
    """The culprit's repro script, written beside the report (`PATH.repro/`), or None where there is none."""
    culprit = run.result.culprit if run.result else None
    if culprit is None or culprit.kind != "op":
        return None
    try:
        where = write_repro(
            run, culprit.candidate.index, base.with_name(base.name + ".repro"), getattr(run, "sides", None)
        )
    except NoRepro:
        return None
    return (where / "repro.py").read_text()
