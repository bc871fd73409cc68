"""The op detail and help screens."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Header, Input, Static

from ...errors import BisectrError
from ..report import fmt
from .data import RunData
from .widgets import EvidencePanel, HeatMapView, SourcePanel, TensorStatsPanel, verdict_style

KEYS = [
    ("f", "the culprit (op table; the detail when it is open)"),
    ("n / p", "next / previous op judged different (the most amplifying ops when none differs)"),
    ("/", "filter ops by words (op, module, verdict, source); #7 is op 7"),
    ("s", "sort ops: op order, output error, local error, amplification, verdict"),
    ("enter", "op detail: sources, statistics, fp64 evidence, error map, actions"),
    ("r", "in the detail: patch the op with the reference's values, re-run (live runs)"),
    ("b", "run the whole search again, with a progress bar (a saved run asks for its model file)"),
    ("e", "export a repro of the current op (repro.py + inputs.npz)"),
    ("w", "write the run up for an issue: report.md and report.html in the run directory"),
    ("g", "switch between the forward and the backward pass (runs traced with --backward)"),
    ("1 / 2", "overview / ops tab"),
    ("escape", "close the detail, the filter or this help"),
    ("?", "this help"),
    ("q", "quit"),
]


class HelpScreen(ModalScreen[None]):
    """The keys, in a box over the current screen."""

    BINDINGS = [Binding("escape,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(Content.styled("bisectr keys", "bold"), id="help-title")
            lines = [Content.assemble((f"{key:<8}", "bold $text-accent"), text) for key, text in KEYS]
            yield Static(Content("\n").join(lines), id="help-keys")
            yield Static(Content.styled("escape or ? closes", "$text-muted"), id="help-hint")

    def action_dismiss(self, result=None) -> None:  # type: ignore[override]
        self.dismiss(None)


class RetraceScreen(ModalScreen[str | None]):
    """Asks which model file to trace again before a saved run is searched again: a run
    directory is data, so what it names is shown, never run, until the user types it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, recorded: str) -> None:
        super().__init__()
        self.recorded = recorded

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(Content.styled("Search again: trace the models again", "bold"), id="help-title")
            yield Static(
                Content.assemble(
                    "A saved run holds no models. Searching again imports and runs the model file you name here, "
                    "traced into this run directory as a new run (isolated sides run in this interpreter).\n",
                    ("This run was traced from: ", "$text-muted"),
                    (self.recorded, "bold"),
                )
            )
            yield Input(placeholder="path of the model file to run", id="retrace-file")
            yield Static(Content.styled("enter runs it · escape cancels", "$text-muted"), id="help-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class DetailScreen(Screen):
    """One op on both sides: source, statistics, fp64 evidence, error map and actions."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("r", "patch", "Patch & re-run"),
    ]

    @property
    def data(self) -> RunData:
        return self.app.data  # type: ignore[attr-defined]

    @property
    def index(self) -> int:
        """The app's current op, which this screen shows (the app re-shows it when it changes)."""
        return self.app.current  # type: ignore[attr-defined]

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with VerticalScroll(id="detail-body"):
            yield Static(id="detail-title")
            with Horizontal(id="detail-columns"):
                with Vertical(id="detail-left"):
                    yield SourcePanel(id="source-candidate", classes="panel")
                    yield SourcePanel(id="source-reference", classes="panel")
                    yield EvidencePanel(id="evidence", classes="panel")
                with Vertical(id="detail-right"):
                    yield HeatMapView(id="heatmap", classes="panel")
                    yield TensorStatsPanel(id="tensors", classes="panel")
                    with Horizontal(id="actions"):
                        yield Button("Patch & re-run (r)", id="patch", variant="warning")
                        yield Button("Export repro (e)", id="export", variant="primary")
                    yield Static(id="action-log")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#evidence").border_title = "evidence"
        self.query_one("#heatmap").border_title = "where the output differs"
        self.query_one("#tensors").border_title = "inputs and outputs"
        self.query_one("#patch", Button).disabled = not self.data.live
        self.show(self.index)

    def show(self, index: int) -> None:
        """Fill every panel for op `index` (the app's current op, whenever it changes while the detail is open)."""
        data = self.data
        row = data.by_index[index]
        self.sub_title = f"op {index}"
        title = Content.assemble(
            ("op ", "bold"),
            (str(index), "bold"),
            " ",
            (row.op, f"bold {verdict_style(row.verdict)}"),
            "  in ",
            (row.module or "(top level)", "$text-accent"),
            "  ",
            (row.verdict or "-", verdict_style(row.verdict)),
            ("   ← the culprit" if index == data.culprit_index else "", "bold"),
        )
        self.query_one("#detail-title", Static).update(title)
        cand, ref = data.run.candidate, data.run.reference
        self.query_one("#source-candidate", SourcePanel).show(
            f"candidate · {cand.framework} {row.framework_op} · op {index}", row.source
        )
        ref_title = (
            f"reference · {ref.framework} {row.reference_op} · op {row.reference}"
            if row.reference is not None
            else "reference · no paired op"
        )
        self.query_one("#source-reference", SourcePanel).show(ref_title, row.reference_source)
        evidence = data.evidence(index)
        pending = evidence is None and data.run.is_live and row.reference is not None
        self.query_one(EvidencePanel).show(data, index, evidence, pending)
        try:
            heat, problem = data.heat_map(index), None
        except BisectrError as exc:  # a damaged tensor file: say so where the map would be
            heat, problem = None, str(exc)
        self.query_one(HeatMapView).show(heat, problem)
        self.query_one(TensorStatsPanel).show(data, index)
        self.query_one("#action-log", Static).update(
            "" if data.live else Content.styled("patch & re-run needs a live run (bisectr trace)", "$text-muted")
        )
        if pending:
            self.replay(index)

    @work(thread=True, exclusive=True, group="replay", exit_on_error=False)
    def replay(self, index: int) -> None:
        app = self.app
        if not app.claim("replaying op", quiet=True):  # type: ignore[attr-defined]
            app.call_from_thread(self._show_evidence, index, None)
            return
        evidence = None
        try:
            evidence = self.data.replay_evidence(index)
        except Exception as exc:  # a replay that fails leaves the evidence as it was
            app.call_from_thread(app.notify, f"replaying op {index} failed: {exc}", severity="error")
        finally:
            app.release()  # type: ignore[attr-defined]
        app.call_from_thread(self._show_evidence, index, evidence)

    def _show_evidence(self, index: int, evidence: dict | None) -> None:
        if self.is_attached and index == self.index:
            self.query_one(EvidencePanel).show(self.data, index, evidence, False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "patch":
            self.action_patch()
        elif event.button.id == "export":
            self.app.action_export()  # type: ignore[attr-defined]

    def action_patch(self) -> None:
        if not self.data.live:
            self.app.notify(
                "patching needs a live run: trace the model with `bisectr trace` (this run was reopened from disk)",
                severity="warning",
            )
            return
        if not self.app.claim("patching and re-running"):  # type: ignore[attr-defined]
            return
        self.log_line(Content.styled(f"re-running the candidate with op {self.index} patched…", "$text-muted"))
        self.patch(self.index)

    @work(thread=True, exclusive=True, group="patch", exit_on_error=False)
    def patch(self, index: int) -> None:
        app = self.app
        try:
            effect = self.data.patch_effect(index)
        except Exception as exc:
            app.call_from_thread(app.notify, f"re-run failed: {exc}", severity="error")
            app.call_from_thread(self.log_line, Content.styled(f"re-run failed: {exc}", "$text-error"))
            return
        finally:
            app.release()  # type: ignore[attr-defined]
        app.call_from_thread(self.show_effect, index, effect)

    def show_effect(self, index: int, effect: dict) -> None:
        before, only, upto = effect["before"], effect["only_this"], effect["up_to_here"]
        fixed = only <= 0.5 * before if before else True
        self.log_line(
            Content("\n").join(
                [
                    Content.assemble(
                        ("patched op ", "bold"),
                        (str(index), "bold"),
                        f": outputs' error {fmt(before)} → ",
                        (fmt(only), f"bold {'$text-success' if fixed else '$text-warning'}"),
                        " (this op only)",
                    ),
                    Content.assemble(
                        " " * 13, f"{fmt(before)} → ", (fmt(upto), "bold"), f" (everything up to op {index})"
                    ),
                ]
            )
        )
        self.app.notify(f"op {index} patched: outputs' error {fmt(before)} → {fmt(only)}")

    def log_line(self, content: Content | str) -> None:
        if self.is_attached:
            self.query_one("#action-log", Static).update(content)
