"""Small widgets of the bisectr TUI; their look lives in bisectr.tcss."""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import DataTable, Input, Label, ProgressBar, Sparkline, Static, Tree
from textual.widgets.tree import TreeNode

from ..report import (
    HEADLINE,
    Line,
    culprit_lines,
    error_chart,
    fmt,
    fmt_amplification,
    short_source,
    source_text,
    verdict_lines,
)
from .data import (
    HEAT_LEVELS,
    VERDICT_VARIABLE,
    HeatMap,
    ModuleNode,
    OpRow,
    RunData,
    ShownEvidence,
    fmt_shape,
    source_context,
)


def verdict_style(verdict: str) -> str:
    """A Textual style (theme variables) for a verdict's text."""
    variable = VERDICT_VARIABLE.get(verdict)
    return f"${variable}" if variable else "$text-muted"


def rich_verdict_style(app, verdict: str, bold: bool = False) -> str:
    """The same as a Rich style, resolved against the current theme (for DataTable and Tree)."""
    variable = VERDICT_VARIABLE.get(verdict)
    colour = app.theme_variables.get(variable) if variable else None
    style = colour if colour else "dim"
    return f"bold {style}" if bold else style


def truncate_left(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


# -- overview ------------------------------------------------------------------------
# The theme's styles for the formatter's named styles (`report.Line`).
LINE_STYLES = {
    "bold": "bold",
    "muted": "$text-muted",
    "accent": "$text-accent",
    "source": "underline",
    "code": "$text-primary",
    "warning": "bold $warning",
}


def content_line(line: Line) -> Content:
    """A line of `report`'s formatter, styled with the theme."""
    return Content.assemble(
        *((text, LINE_STYLES.get(style) or (f"bold {verdict_style(style)}" if style else "")) for text, style in line)
    )


class VerdictBanner(Static):
    """The run's verdict on one coloured line."""

    def show(self, data: RunData) -> None:
        verdict = data.verdict
        self.remove_class("-divergent", "-noise", "-match", "-none")
        if verdict is None:
            self.add_class("-none")
            self.update("NO RESULT  this run holds no search result; press b to search")
            return
        self.add_class(f"-{verdict}")
        lines = [content_line(line) for line in verdict_lines(data.result)]
        self.update(Content("\n").join([*lines, Content.styled(HEADLINE[verdict], "$text-muted")]))


class CulpritPanel(Static):
    """The culprit: op, module, both sides' source lines with their text, and the evidence."""

    LISTED = 3  # recurrences and not-blamed differences shown

    def show(self, data: RunData) -> None:
        if data.result is None or data.result.culprit is None:
            self.update(
                Content.styled(
                    "No culprit: " + ("the outputs match." if data.result else "no search was run."), "$text-muted"
                )
            )
            return
        self.update(
            Content("\n").join(content_line(line) for line in culprit_lines(data.run, data.result, self.LISTED))
        )


class ErrorChart(Static):
    """Propagated and local error by op index on a log scale (report.error_chart), culprit marked."""

    LABEL = 11  # "propagated "
    RANGE = 20  # room for "  1e-08..1e-05"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._data: RunData | None = None

    def show(self, data: RunData) -> None:
        self._data = data
        self._render_chart()

    def on_resize(self) -> None:
        self._render_chart()

    def _render_chart(self) -> None:
        data = self._data
        profile = data.result.profile if data and data.result else None
        if not profile:
            self.update(Content.styled("no error profile (no search result)", "$text-muted"))
            return
        width = max(8, (self.content_size.width or 80) - self.LABEL - self.RANGE)
        lines = error_chart(profile, data.culprit_index, width)
        styles = ["$text-primary", "$text-warning", "bold $text-error", "$text-muted"]
        out = []
        for line, style in zip(lines, styles):
            label, body = line[: self.LABEL], line[self.LABEL :]
            out.append(Content.assemble((label, "$text-muted"), (body, style)))
        self.update(Content("\n").join(out))


class RunSummary(Static):
    """Sides, op counts, alignment coverage and the outputs' error."""

    def show(self, data: RunData) -> None:
        run = data.run
        counts = data.counts()
        share = counts["aligned"] / counts["candidate"] if counts["candidate"] else 0.0
        lines = [
            Content.assemble(
                ("sides      ", "$text-muted"),
                *[
                    part
                    for role, trace in run.traces.items()
                    for part in (
                        (role, "bold"),
                        f" {trace.framework} ({trace.device}, {trace.dtype}) {len(trace.ops)} ops",
                        "   ",
                    )
                ],
            )
        ]
        reruns = f" · {data.result.reruns} re-runs" if data.result else ""
        lines.append(
            Content.assemble(
                ("alignment  ", "$text-muted"),
                f"{counts['aligned']} of {counts['candidate']} candidate ops aligned ",
                (f"({share:.0%})", "bold"),
                f", {counts['paired']} paired 1:1{reruns}",
            )
        )
        for key, shape, max_abs, max_rel in data.output_lines()[:4]:
            lines.append(
                Content.assemble(
                    ("output     ", "$text-muted"),
                    (key, "bold"),
                    f" {shape}  max abs {fmt(max_abs)}  max rel {fmt(max_rel)}",
                )
            )
        mode = (
            "live run: b searches again, the op detail can patch and re-run"
            if data.live
            else "saved run (no model loaded): b asks for the model file to trace again; patching needs a live run"
        )
        lines.append(Content.assemble(("run        ", "$text-muted"), (mode, "$text-muted")))
        self.update(Content("\n").join(lines))


# -- ops ------------------------------------------------------------------------------
class ModuleTree(Tree[ModuleNode]):
    """Module paths as a tree, each node coloured by the worst verdict under it."""

    def show(self, data: RunData) -> None:
        self.clear()
        self.nodes: dict[str, TreeNode[ModuleNode]] = {}
        root = data.tree
        self.root.set_label(self._label(root))
        self.root.data = root
        self.nodes[""] = self.root
        self._add(self.root, root, depth=1)
        self.root.expand()

    def _add(self, parent: TreeNode[ModuleNode], module: ModuleNode, depth: int) -> None:
        for child in module.children.values():
            node = parent.add(self._label(child), data=child, expand=depth < 2 or child.worst == "different")
            self.nodes[child.path] = node
            if not child.children:
                node.allow_expand = False
            self._add(node, child, depth + 1)

    def _label(self, module: ModuleNode) -> Text:
        label = Text(module.name, style=rich_verdict_style(self.app, module.worst, bold=module.worst == "different"))
        label.append(f" ({len(module.ops)})", style="dim")
        return label

    def reveal(self, path: str) -> None:
        """Expand down to the module `path` (or its nearest ancestor in the tree) and put the cursor there."""
        parts = path.split(".") if path else []
        while parts and ".".join(parts) not in self.nodes:
            parts.pop()
        node = self.nodes.get(".".join(parts), self.root)
        parent = node.parent
        while parent is not None:
            parent.expand()
            parent = parent.parent
        self.call_after_refresh(self.move_cursor, node)


SORTS = [
    ("op order", None, False),
    ("output error", lambda r: r.output_error if r.output_error is not None else -1.0, True),
    ("local error", lambda r: r.local_error if r.local_error is not None else -1.0, True),
    (
        "amplification",
        lambda r: r.amplification if r.amplification is not None else (math.inf if r.output_error else -1.0),
        True,
    ),
    ("verdict", lambda r: (r.severity, -r.index), True),
]
COLUMN_SORT = {"index": 0, "out": 1, "local": 2, "amp": 3, "verdict": 4}


class OpTable(DataTable):
    """Every candidate op with its evidence and both sources; sortable, filterable."""

    class Filtered(Message):
        def __init__(self, shown: int, total: int) -> None:
            super().__init__()
            self.shown, self.total = shown, total

    COLUMNS = [
        ("#", "index"),
        ("op", "op"),
        ("module", "module"),
        ("shape", "shape"),
        ("out err", "out"),
        ("local", "local"),
        ("amp", "amp"),
        ("verdict", "verdict"),
        ("candidate source", "source"),
        ("ref", "ref"),
        ("reference source", "ref_source"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.data: RunData | None = None
        self.query_text = ""
        self.sort_mode = 0
        self.shown: list[int] = []

    def on_mount(self) -> None:
        for label, key in self.COLUMNS:
            self.add_column(label, key=key)

    def show(self, data: RunData, keep: int | None = None) -> None:
        self.data = data
        self.refill(keep)

    def set_query(self, query: str) -> None:
        self.query_text = query
        self.refill(self.current())

    def cycle_sort(self, mode: int | None = None) -> str:
        self.sort_mode = (self.sort_mode + 1) % len(SORTS) if mode is None else mode
        self.refill(self.current())
        return SORTS[self.sort_mode][0]

    @property
    def sort_name(self) -> str:
        return SORTS[self.sort_mode][0]

    def current(self) -> int | None:
        if not self.shown or self.cursor_row < 0 or self.cursor_row >= len(self.shown):
            return None
        return self.shown[self.cursor_row]

    def refill(self, keep: int | None = None) -> None:
        if self.data is None:
            return
        rows = (
            [r for r in self.data.rows if r.matches(self.query_text)]
            if self.query_text.strip()
            else list(self.data.rows)
        )
        _, key, reverse = SORTS[self.sort_mode]
        if key is not None:
            rows.sort(key=lambda r: (key(r), -r.index) if reverse else (key(r), r.index), reverse=reverse)
        self.clear()
        self.shown = [r.index for r in rows]
        self.add_rows([self._cells(r) for r in rows])
        if keep is not None and keep in self.shown:
            self.move_cursor(row=self.shown.index(keep), animate=False)
        self.post_message(self.Filtered(len(rows), len(self.data.rows)))

    def _cells(self, row: OpRow) -> list:
        style = rich_verdict_style(self.app, row.verdict)
        strong = rich_verdict_style(self.app, row.verdict, bold=row.verdict == "different")
        number = lambda text: Text(text, justify="right")  # noqa: E731
        return [
            Text(str(row.index), style=strong, justify="right"),
            Text(row.op, style=strong),
            truncate_left(row.module or "(top)", 28),
            fmt_shape(row.shape),
            number(fmt(row.output_error) if row.verdict not in ("", "block", "unaligned") else "-"),
            number(fmt(row.local_error) if row.verdict not in ("", "block", "unaligned") else "-"),
            number(
                fmt_amplification(row.amplification, row.output_error)
                if row.verdict not in ("", "block", "unaligned")
                else "-"
            ),
            Text(row.verdict or "-", style=style),
            short_source(row.source),
            number("-" if row.reference is None else str(row.reference)),
            short_source(row.reference_source) if row.reference_source else "-",
        ]

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a sortable column's header sorts by it (again: back to op order)."""
        mode = COLUMN_SORT.get(str(event.column_key.value))
        if mode is not None:
            self.cycle_sort(0 if mode == self.sort_mode else mode)

    def select_op(self, index: int) -> bool:
        """Put the cursor on op `index`; clears the filter when it hides that op."""
        if index not in self.shown and self.query_text:
            self.query_text = ""
            self.refill()
        if index not in self.shown:
            return False
        self.move_cursor(row=self.shown.index(index), animate=False)
        return True


class FilterInput(Input):
    """`/`: filter the op table by words (op, module, verdict, source; `#7` for op 7)."""

    BINDINGS = [("escape", "close", "Close filter")]

    class Closed(Message):
        pass

    def action_close(self) -> None:
        self.post_message(self.Closed())


class OpPreview(Static):
    """The highlighted op in three lines: what it is and both source lines."""

    def show(self, data: RunData, index: int | None) -> None:
        if index is None or index not in data.by_index:
            self.update(Content.styled("no op selected", "$text-muted"))
            return
        row = data.by_index[index]
        head = Content.assemble(
            ("op ", "bold"),
            (str(row.index), "bold"),
            " ",
            (row.op, f"bold {verdict_style(row.verdict)}"),
            " in ",
            (row.module or "(top level)", "$text-accent"),
            " · ",
            (row.verdict or "-", verdict_style(row.verdict)),
            f" · out {fmt(row.output_error)} · local {fmt(row.local_error)} · "
            f"amp {fmt_amplification(row.amplification, row.output_error)}",
            ("  ← culprit" if index == data.culprit_index else "", "bold"),
        )
        lines = [
            head,
            Content.assemble(
                ("cand ", "$text-muted"),
                (short_source(row.source), "underline"),
                "  ",
                (source_text(row.source), "$text-primary"),
            ),
        ]
        if row.reference is not None:
            lines.append(
                Content.assemble(
                    ("ref  ", "$text-muted"),
                    (short_source(row.reference_source), "underline"),
                    "  ",
                    (source_text(row.reference_source), "$text-primary"),
                    (f"  (op {row.reference})", "$text-muted"),
                )
            )
        else:
            lines.append(Content.styled("ref  no reference op paired with this one", "$text-muted"))
        self.update(Content("\n").join(lines))


class SearchProgress(Horizontal):
    """Shown while `b` re-runs the search."""

    STAGES = {"aligning": 1, "replaying ops": 2, "searching": 3}
    TOTAL = 5

    def compose(self) -> ComposeResult:
        yield Label("searching", id="progress-label")
        yield ProgressBar(total=self.TOTAL, show_eta=False, id="progress-bar")

    def stage(self, message: str) -> None:
        self.query_one(Label).update(message)
        step = self.STAGES.get(message, 4 if message.startswith("testing") else None)
        if step is not None:
            bar = self.query_one(ProgressBar)
            bar.update(progress=max(bar.progress, step))

    def start(self) -> None:
        self.query_one(ProgressBar).update(progress=0, total=self.TOTAL)
        self.query_one(Label).update("starting")
        self.display = True

    def finish(self) -> None:
        self.query_one(ProgressBar).update(progress=self.TOTAL)
        self.display = False


# -- op detail ------------------------------------------------------------------------------
class SourcePanel(Static):
    """A few lines of source around the op's call site, the op's line marked."""

    def show(self, title: str, source: str) -> None:
        self.border_title = title
        self.border_subtitle = short_source(source) if source else ""
        context = source_context(source) if source else []
        if not context:
            self.update(Content.styled("source not available" if source else "no paired op", "$text-muted"))
            return
        width = len(str(context[-1][0]))
        lines = []
        for number, text, current in context:
            lines.append(
                Content.assemble(
                    ("▶ " if current else "  ", "bold $text-error"),
                    (f"{number:>{width}} ", "$text-muted"),
                    (text, "bold" if current else "$text-muted"),
                )
            )
        self.update(Content("\n").join(lines))


class EvidencePanel(Static):
    """Errors, amplification and the fp64 oracle for one op."""

    def show(self, data: RunData, index: int, evidence: ShownEvidence | None, pending: bool) -> None:
        row = data.by_index[index]
        lines = [
            Content.assemble(
                ("verdict        ", "$text-muted"),
                (row.verdict or "-", f"bold {verdict_style(row.verdict)}"),
                "  (culprit)" if index == data.culprit_index else "",
            ),
            Content.assemble(
                ("propagated     ", "$text-muted"),
                f"{fmt(row.output_error)} rel" + (f" · {fmt(evidence.output_error)} abs" if evidence else ""),
            ),
            Content.assemble(("local          ", "$text-muted"), f"{fmt(row.local_error)} (on the reference's inputs)"),
        ]
        if evidence:
            lines.append(
                Content.assemble(
                    ("amplification  ", "$text-muted"),
                    f"{fmt_amplification(evidence.amplification, evidence.output_error)}"
                    f" (in {fmt(evidence.input_error)} → out {fmt(evidence.output_error)})",
                )
            )
        else:
            lines.append(
                Content.assemble(
                    ("amplification  ", "$text-muted"), fmt_amplification(row.amplification, row.output_error)
                )
            )
        fp64 = evidence.fp64 if evidence else None
        if fp64:
            cand, ref = fp64.candidate_error, fp64.reference_error
            ratio = f" ({cand / ref:.3g}x)" if cand is not None and ref else ""
            lines.append(
                Content.assemble(("vs fp64        ", "$text-muted"), f"cand {fmt(cand)} · ref {fmt(ref)}{ratio}")
            )
            verdict = evidence.verdict
            meaning = {
                "different": "computes something else",
                "noise": "as close to float64: rounding",
                "exact": "bit-identical",
            }.get(verdict, "")
            lines.append(
                Content.assemble(
                    " " * 15, (f"→ {verdict}", f"bold {verdict_style(verdict)}"), f": {meaning}" if meaning else ""
                )
            )
        elif evidence and evidence.fp64_unavailable:
            lines.append(
                Content.assemble(("vs fp64        ", "$text-muted"), f"no oracle: {evidence.fp64_unavailable}")
            )
        elif pending:
            lines.append(Content.styled("vs fp64        replaying the op…", "$text-muted"))
        elif row.local_error == 0:
            lines.append(
                Content.assemble(
                    ("vs fp64        ", "$text-muted"), "not needed: bit-identical on the reference's inputs"
                )
            )
            lines.append(Content.assemble(" " * 15, ("→ exact", f"bold {verdict_style('exact')}")))
        else:
            lines.append(
                Content.styled("vs fp64        kept for the culprit only; a live run replays any op", "$text-muted")
            )
        self.update(Content("\n").join(lines))


DTYPE_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32"}


class TensorStatsPanel(Static):
    """Input and output statistics of both sides' op."""

    def show(self, data: RunData, index: int) -> None:
        from rich import box
        from rich.table import Table

        table = Table(
            box=box.SIMPLE_HEAD,
            expand=False,
            pad_edge=False,
            header_style="bold",
            show_edge=False,
            collapse_padding=True,
        )
        rows = data.tensor_rows(index)
        bad = any(r.stats.nan or r.stats.inf for r in rows)
        dtypes = {r.dtype for r in rows}
        self.border_subtitle = f"all {dtypes.pop()}" if len(dtypes) == 1 else ""
        columns = (
            [("", "left"), ("tensor", "left"), ("shape", "left")]
            + ([("dtype", "left")] if not self.border_subtitle else [])
            + [("min", "right"), ("max", "right"), ("mean", "right")]
            + ([("nan/inf", "right")] if bad else [])
            + [("err", "right")]
        )
        for column, justify in columns:
            table.add_column(column, justify=justify, no_wrap=True)
        for row in rows:
            stats = row.stats
            cells = (
                [
                    f"{'cand' if row.side == 'candidate' else 'ref'} {row.role.replace(' ', '')}",
                    truncate_left(row.name, 16),
                    fmt_shape(row.shape),
                ]
                + ([] if self.border_subtitle else [DTYPE_SHORT.get(row.dtype, row.dtype)])
                + [fmt(stats.min), fmt(stats.max), fmt(stats.mean)]
            )
            if bad:
                cells.append(f"{stats.nan}/{stats.inf}")
            cells.append(fmt(row.error) if row.error is not None else "")
            table.add_row(*cells)
        self.update(table)


class HeatMapView(Static):
    """Where in the op's output the error sits: a few rows and columns of shaded cells."""

    def show(self, heat: HeatMap | None, problem: str | None = None) -> None:
        if problem is not None:
            self.update(Content.styled(f"values unreadable: {problem}", "$text-error"))
            return
        if heat is None:
            self.update(Content.styled("no stored values on one side: no map", "$text-muted"))
            return
        rows, cols = heat.block
        lines = [
            Content.assemble(("│", "$text-muted"), (line, "$text-error"), ("│", "$text-muted")) for line in heat.lines()
        ]
        where = ",".join(str(i) for i in heat.argmax)
        lines.append(
            Content.styled(
                f"{fmt_shape(heat.shape)} · rows: leading dims · cols: last dim · "
                f"cell: mean |cand - ref| of ≤{rows}x{cols}",
                "$text-muted",
            )
        )
        lines.append(
            Content.assemble(
                "largest ",
                (fmt(heat.max_abs), "bold"),
                f" at [{where}]: cand {fmt(heat.candidate_value)}, ref {fmt(heat.reference_value)}",
            )
        )
        lines.append(
            Content.assemble(
                ("scale ", "$text-muted"), (HEAT_LEVELS[1:], "$text-error"), ("  0 → largest cell", "$text-muted")
            )
        )
        self.update(Content("\n").join(lines))


class StepCurve(Vertical):
    """One number per step (a training loss, a generation's error), as a sparkline under its title."""

    def __init__(self, title: str, values: list[float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title, self.values = title, values

    def compose(self) -> ComposeResult:
        yield Static(self.title, classes="curve-title")
        yield Sparkline(self.values, summary_function=max)
