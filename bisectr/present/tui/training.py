"""The `bisectr train` TUI: the verdict over steps, both sides' loss curves and the per-step table."""

from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.widgets import DataTable, Footer, Header, Static

from ..report import TRAINING_COLUMNS, fmt, training_lines, training_rows
from ...training import TrainingResult
from .widgets import StepCurve, content_line


class TrainingApp(App[int]):
    """Browse a `bisectr train` result."""

    TITLE = "bisectr train"
    CSS = """
    #verdict { padding: 0 1; margin-bottom: 1; }
    StepCurve { height: 4; padding: 0 1; }
    Sparkline { height: 2; }
    #steps { height: 1fr; }
    """
    BINDINGS = [Binding("q", "quit", "Quit")]

    def __init__(self, result: TrainingResult, model_file: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.result, self.model_file = result, model_file

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static(id="verdict")
        for role in ("reference", "candidate"):
            losses = [getattr(row.loss, role) for row in self.result.steps]
            title = f"loss, {role}: {fmt(losses[0])} -> {fmt(losses[-1])} over {len(losses)} steps"
            yield StepCurve(title, losses, id=f"loss-{role}")
        yield DataTable(id="steps", zebra_stripes=True, cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.model_file
        verdict = self.query_one("#verdict", Static)
        verdict.update(Content("\n").join(content_line(line) for line in training_lines(self.result)))
        table = self.query_one("#steps", DataTable)
        table.add_columns(*TRAINING_COLUMNS)
        table.add_rows(training_rows(self.result))
        if self.result.first_step is not None:
            table.move_cursor(row=self.result.first_step - 1)

    def action_quit(self) -> None:  # type: ignore[override]
        self.exit(0)
