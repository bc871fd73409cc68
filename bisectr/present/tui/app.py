"""The bisectr TUI: overview, module tree + op table, op detail."""

from __future__ import annotations

import threading
from typing import Any, Literal

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.reactive import var
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Header, Input, TabbedContent, TabPane, Tree

from ...measure.result import Result
from ...run import Run
from .data import RunData
from .screens import DetailScreen, HelpScreen, RetraceScreen
from .widgets import (
    CulpritPanel,
    ErrorChart,
    FilterInput,
    ModuleTree,
    OpPreview,
    OpTable,
    RunSummary,
    SearchProgress,
    VerdictBanner,
)


class BisectrApp(App[int]):
    """Browse a bisectr run: where the two sides start to disagree, and why."""

    CSS_PATH = "bisectr.tcss"
    TITLE = "bisectr"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    BINDINGS = [
        Binding("f", "culprit", "Culprit"),
        Binding("n", "step(1)", "Next"),
        Binding("p", "step(-1)", "Prev"),
        Binding("slash", "filter", "Filter"),
        Binding("enter", "detail", "Detail"),
        Binding("b", "bisect", "Search"),
        Binding("e", "export", "Export"),
        Binding("w", "write_report", "Report", show=False),
        Binding("g", "switch_pass", "Fwd/Bwd"),
        Binding("s", "sort", "Sort", show=False),
        Binding("1", "tab('overview')", "Overview", show=False),
        Binding("2", "tab('ops')", "Ops", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    # The op shown everywhere: the table's cursor, the module tree, the preview, an open detail screen.
    current: var[int | None] = var(None, init=False)
    # The pass whose result is shown: the forward's, or (searched with --backward) the backward's.
    showing: var[Literal["forward", "backward"]] = var("forward", init=False)

    def __init__(self, data: RunData, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data = data
        self.set_reactive(
            BisectrApp.current, data.culprit_index if data.culprit_index is not None else (0 if data.rows else None)
        )
        self._busy: str | None = None
        self._busy_lock = threading.Lock()

    # -- layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with TabbedContent(initial="overview", id="tabs"):
            with TabPane("Overview", id="overview"):
                with VerticalScroll(id="overview-body"):
                    yield VerdictBanner(id="banner")
                    yield CulpritPanel(id="culprit", classes="panel")
                    yield ErrorChart(id="chart", classes="panel")
                    yield RunSummary(id="summary", classes="panel")
            with TabPane("Ops", id="ops"):
                with Horizontal(id="ops-body"):
                    yield ModuleTree("model", id="modules")
                    with Vertical(id="ops-right"):
                        yield OpTable(id="table")
                        yield FilterInput(
                            placeholder="filter: words (op, module, verdict, source), #7 for op 7", id="filter"
                        )
                yield OpPreview(id="preview")
        yield SearchProgress(id="progress")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.data.run.model_file.name
        self.query_one("#summary").border_title = "run"
        self.query_one("#culprit").border_title = "culprit"
        self.query_one("#filter").display = False
        self.query_one(SearchProgress).display = False
        self.refresh_views()
        self.theme_changed_signal.subscribe(self, lambda theme: self.refresh_views())

    def refresh_views(self) -> None:
        """(Re)fill every view from `self.data` (after mount, a new search or a theme change)."""
        data = self.data
        measured = "gradient error" if data.backward else "error"
        self.query_one("#chart").border_title = f"{measured} by op · relative, log scale"
        self.query_one(VerdictBanner).show(data)
        self.query_one(CulpritPanel).show(data)
        self.query_one(ErrorChart).show(data)
        self.query_one(RunSummary).show(data)
        self.query_one(ModuleTree).show(data)
        self.query_one(OpTable).show(data, keep=self.current)
        self._show_current()

    def watch_current(self) -> None:
        table = self.query_one(OpTable)
        if self.current is not None and table.current() != self.current:
            table.select_op(self.current)  # its highlight sets `current` again, to the same op
        self._show_current()

    def watch_showing(self, showing: str) -> None:
        self.data = RunData(self.data.run, backward=showing == "backward")
        shown = self.current
        self.refresh_views()
        self.current = self.data.culprit_index if self.data.culprit_index is not None else shown
        self.notify(f"showing the {showing} pass")

    def _show_current(self) -> None:
        index = self.current
        self.query_one(OpPreview).show(self.data, index)
        if index is None:
            return
        self.query_one(ModuleTree).reveal(self.data.by_index[index].module)
        if isinstance(self.screen, DetailScreen):
            self.screen.show(index)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide the keys that do nothing on the op detail screen."""
        if action in ("detail", "filter", "sort") and isinstance(self.screen, DetailScreen):
            return False
        if action == "switch_pass" and not self.data.has_backward:
            return False
        return True

    # -- work gate: one model computation at a time ------------------------------------------
    def claim(self, what: str, quiet: bool = False) -> bool:
        """Reserve the models for `what` (re-runs and replays must not overlap). False when busy,
        with a notice unless `quiet` (workers pass quiet=True: notify is for the UI thread)."""
        with self._busy_lock:
            busy = self._busy
            if busy is None:
                self._busy = what
                return True
        if not quiet:
            self.notify(f"busy {busy}; try again when it is done", severity="warning")
        return False

    def release(self) -> None:
        with self._busy_lock:
            self._busy = None

    # -- op table <-> tree <-> preview ---------------------------------------------------------
    @on(DataTable.RowHighlighted, "#table")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        index = self.query_one(OpTable).current()
        if index is not None:
            self.current = index

    @on(DataTable.RowSelected, "#table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_detail()

    @on(Tree.NodeSelected, "#modules")
    def _module_selected(self, event: Tree.NodeSelected) -> None:
        module = event.node.data
        if module is None or not module.ops:
            return
        table = self.query_one(OpTable)
        under = set(module.ops)
        table.select_op(next((i for i in table.shown if i in under), module.ops[0]))  # its highlight sets `current`

    @on(OpTable.Filtered)
    def _filtered(self, event: OpTable.Filtered) -> None:
        table = self.query_one(OpTable)
        what = f"{event.shown} of {event.total} ops" if table.query_text.strip() else f"{event.total} ops"
        query = f" · filter “{table.query_text.strip()}”" if table.query_text.strip() else ""
        self.query_one("#ops-right").border_title = f"{what} · sorted by {table.sort_name}{query}"

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_one(OpTable).set_query(event.value)

    @on(Input.Submitted, "#filter")
    @on(FilterInput.Closed)
    def _filter_done(self, event) -> None:
        filter_input = self.query_one(FilterInput)
        if isinstance(event, FilterInput.Closed):
            filter_input.value = ""
            self.query_one(OpTable).set_query("")
        filter_input.display = False
        self.query_one(OpTable).focus()

    # -- navigation --------------------------------------------------------------------------
    def select(self, index: int, show_ops: bool = True) -> None:
        """Make op `index` the current op; show the ops tab unless a detail is open."""
        self.current = index
        if not isinstance(self.screen, DetailScreen) and show_ops:
            self.query_one(TabbedContent).active = "ops"
            self.query_one(OpTable).focus()

    def action_culprit(self) -> None:
        index = self.data.culprit_index
        if index is None:
            self.notify(
                "no culprit: " + ("the outputs match" if self.data.verdict == "match" else "no search result"),
                severity="warning",
            )
            return
        self.select(index)

    def action_step(self, direction: int) -> None:
        index, kind = self.data.step(self.current, direction > 0)
        if index is None:
            self.notify("no op is judged different and none amplifies an error", severity="warning")
            return
        if kind == "amplifying" and not getattr(self, "_told_amplifying", False):
            self._told_amplifying = True
            self.notify("no op is judged different: n / p walk the most amplifying ops")
        self.select(index)

    def action_tab(self, tab: str) -> None:
        if isinstance(self.screen, DetailScreen):
            self.pop_screen()
        self.query_one(TabbedContent).active = tab
        if tab == "ops":
            self.query_one(OpTable).focus()

    def action_filter(self) -> None:
        if isinstance(self.screen, DetailScreen):
            self.pop_screen()
        self.query_one(TabbedContent).active = "ops"
        filter_input = self.query_one(FilterInput)
        filter_input.display = True
        filter_input.focus()

    def action_sort(self) -> None:
        if isinstance(self.screen, DetailScreen):
            return
        name = self.query_one(OpTable).cycle_sort()
        self.query_one(TabbedContent).active = "ops"
        self.notify(f"ops sorted by {name}", timeout=2)

    def action_detail(self) -> None:
        if isinstance(self.screen, DetailScreen) or self.current is None:
            return
        self.push_screen(DetailScreen())

    def action_switch_pass(self) -> None:
        """Show the backward pass's result (gradients), or the forward's again."""
        self.showing = "forward" if self.showing == "backward" else "backward"

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        else:
            self.push_screen(HelpScreen())

    def action_quit(self) -> None:  # type: ignore[override]
        self.exit(0)

    # -- long work -------------------------------------------------------------------------------
    def action_bisect(self) -> None:
        if self.data.live:
            self.start_search(None)
        else:  # a saved run runs nothing by itself: the user names the model file to trace again
            self.push_screen(RetraceScreen(self.data.run.traced.model_file), self.start_search)

    def start_search(self, model_file: str | None) -> None:
        if not self.data.live and not model_file:
            return
        if not self.claim("searching"):
            return
        if isinstance(self.screen, DetailScreen):
            self.pop_screen()
        progress = self.query_one(SearchProgress)
        progress.start()
        self.bisect_worker(progress, model_file)

    @work(thread=True, exclusive=True, group="bisect", exit_on_error=False)
    def bisect_worker(self, progress: SearchProgress, model_file: str | None) -> None:
        try:
            result = self.data.search_again(
                progress=lambda message: self.call_from_thread(progress.stage, message), model_file=model_file
            )
        except Exception as exc:
            self.call_from_thread(self._bisect_failed, exc)
            return
        finally:
            self.release()
        self.call_from_thread(self._bisect_done, result)

    def _bisect_failed(self, exc: Exception) -> None:
        self.query_one(SearchProgress).finish()
        self.notify(f"the search failed: {exc}", severity="error", timeout=8)

    def _bisect_done(self, result: Result) -> None:
        self.query_one(SearchProgress).finish()
        self.data.refresh()  # here, not in the worker: the rows are what the UI reads
        self.refresh_views()
        if self.data.culprit_index is not None:
            self.current = self.data.culprit_index
        culprit = result.culprit
        where = f", culprit op {culprit.candidate.index} {culprit.op}" if culprit else ""
        self.notify(f"search done: {result.verdict}{where} ({result.reruns} re-runs)")

    def action_export(self) -> None:
        if self.current is None:
            self.notify("no op to export", severity="warning")
            return
        self.export_worker(self.current)

    @work(thread=True, group="export", exit_on_error=False)
    def export_worker(self, index: int) -> None:
        try:
            path = self.data.export_repro(index)
        except Exception as exc:
            self.call_from_thread(self.notify, f"export failed: {exc}", severity="error")
            return
        self.exported = path
        self.call_from_thread(self._exported, index, path)

    @work(thread=True, group="export", exit_on_error=False)
    def action_write_report(self) -> None:
        try:
            written = self.data.write_report()
        except Exception as exc:
            self.call_from_thread(self.notify, f"report failed: {exc}", severity="error")
            return
        self.call_from_thread(self.notify, f"report written: {', '.join(map(str, written))}", timeout=10)

    def _exported(self, index: int, path) -> None:
        message = f"repro of op {index} written to {path}/repro.py (+ inputs.npz)"
        self.notify(message, timeout=10)
        if isinstance(self.screen, DetailScreen):
            self.screen.log_line(message)


def run_app(run: Run) -> int:
    """Open the TUI on `run` (live after `bisectr.trace`, or reopened by `bisectr.load`).
    Returns the TUI's exit status: 0 when the user quits."""
    app = BisectrApp(RunData(run))
    app.run()
    return app.return_code or 0
