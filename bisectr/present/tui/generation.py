"""The `bisectr generate` TUI: the verdict over steps, the error and margin by step, the per-step table, and
the search inside the step it names (opened as `bisectr trace` opens a run)."""

from __future__ import annotations

import math
from typing import Any

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.widgets import DataTable, Footer, Header, Static

from ..report import GENERATION_COLUMNS, fmt, generation_lines, generation_rows
from ...generation import GenerationResult
from .widgets import StepCurve, content_line

SEARCH = 1  # what the app returns when the user asks for the step's search


class GenerationApp(App[int]):
    """Browse a `bisectr generate` result; `s` opens the search inside the step it names."""

    TITLE = "bisectr generate"
    CSS = """
    #verdict { padding: 0 1; margin-bottom: 1; }
    StepCurve { height: 4; padding: 0 1; }
    Sparkline { height: 2; }
    #steps { height: 1fr; }
    """
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("s", "search", "The step's search")]

    def __init__(self, result: GenerationResult, model_file: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.result, self.model_file = result, model_file

    def compose(self) -> ComposeResult:
        steps = self.result.steps
        yield Header(show_clock=False)
        yield Static(id="verdict")
        for title, values, name in (
            ("logits error, log10", [math.log10(max(row.logits.error, 1e-18)) for row in steps], "error"),
            ("the reference's top-1 margin", [row.margin for row in steps], "margin"),
        ):
            yield StepCurve(
                f"{title}: {fmt(min(values))} .. {fmt(max(values))} over {len(values)} steps",
                values,
                id=f"{name}-curve",
            )
        yield DataTable(id="steps", zebra_stripes=True, cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.model_file
        verdict = self.query_one("#verdict", Static)
        lines = generation_lines(self.result)
        if self.result.search is not None:
            lines.append([(f"press s for the search inside step {self.result.culprit_step}", "accent")])
        verdict.update(Content("\n").join(content_line(line) for line in lines))
        table = self.query_one("#steps", DataTable)
        table.add_columns(*GENERATION_COLUMNS)
        table.add_rows(generation_rows(self.result))
        if self.result.culprit_step is not None:
            table.move_cursor(row=self.result.culprit_step)

    def action_search(self) -> None:
        if self.result.search is not None:
            self.exit(SEARCH)

    def action_quit(self) -> None:  # type: ignore[override]
        self.exit(0)
