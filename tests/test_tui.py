"""The Textual TUI: pilot tests for every key, snapshots of the overview and the op detail,
and end-to-end runs in a real terminal (tmux).

Most tests use tests/models/tui_mlp.py (torch vs torch, the candidate's `blocks.2` uses the tanh
GELU): verdict divergent, culprit op 7 `gelu`, 13 ops on each side. Tests of a saved run and the
snapshots open the runs saved in tests/data/runs (the same digits on every CPU); tests of a live
run trace the model here. The span-head example (torch vs paddle) has its own snapshots and the
`bisectr trace` terminal test.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("textual")
pytest.importorskip("torch")

from textual.widgets import Input, Static  # noqa: E402

import bisectr  # noqa: E402
from bisectr.present.tui.app import BisectrApp  # noqa: E402
from bisectr.present.tui.data import RunData  # noqa: E402
from bisectr.present.tui.screens import DetailScreen, HelpScreen, RetraceScreen  # noqa: E402
from bisectr.present.tui.widgets import (
    CulpritPanel,
    ErrorChart,
    EvidencePanel,
    FilterInput,
    HeatMapView,
    ModuleTree,  # noqa: E402
    OpPreview,
    OpTable,
    SearchProgress,
    VerdictBanner,
)

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "models" / "tui_mlp.py"
RUNS = ROOT / "tests" / "data" / "runs"
CULPRIT = 7
GELU_LINE = "h = F.gelu(h, approximate=self.approximate)"
SIZE = (100, 30)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    """Sources show relative to the working directory: keep it fixed (snapshots must not hold paths)."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A live run (models loaded) and its search result, saved in its run directory."""
    run = bisectr.trace(MODEL, out=tmp_path_factory.mktemp("tui") / "run")
    result = run.bisect()
    run.save()
    return run, result


def committed_run(name: str, tmp_path: Path) -> bisectr.Run:
    """A run saved in tests/data/runs (made by tests/data/make_runs.py), opened from a copy: the
    same digits on every CPU, and nothing the TUI writes lands in the work tree."""
    copy = tmp_path / name
    shutil.copytree(RUNS / name, copy)
    return bisectr.load(copy)


@pytest.fixture
def saved(tmp_path):
    """The tui_mlp run reopened from disk: no models, the result from result.json."""
    return committed_run("tui_mlp", tmp_path)


def live_app(live) -> BisectrApp:
    return BisectrApp(RunData(live[0]))


def saved_app(saved) -> BisectrApp:
    return BisectrApp(RunData(saved))


def text(widget) -> str:
    """The plain text a Static-like widget shows."""
    rendered = widget.content
    if hasattr(rendered, "plain"):
        return rendered.plain
    from rich.console import Console

    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(rendered)
    return console.export_text()


def record_notifications(app: BisectrApp) -> list[str]:
    messages: list[str] = []
    original = app.notify

    def notify(message, *args, **kwargs):
        messages.append(str(message))
        return original(message, *args, **kwargs)

    app.notify = notify  # type: ignore[method-assign]
    return messages


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


# -- data ------------------------------------------------------------------------------
def test_run_data_pairs_every_op_and_builds_the_module_tree(live):
    data = RunData(live[0])
    assert data.culprit_index == CULPRIT and data.verdict == "divergent"
    assert [r.reference for r in data.rows] == list(range(13))
    assert data.by_index[CULPRIT].verdict == "different"
    blocks = data.tree.children["blocks"]
    assert blocks.worst == "different" and blocks.children["2"].worst == "different"
    assert blocks.children["0"].worst == "exact" and data.tree.children["head"].ops == [12]
    assert data.counts() == {"candidate": 13, "reference": 13, "aligned": 13, "paired": 13}
    heat = data.heat_map(CULPRIT)
    assert heat.cells.shape == (3, 16) and heat.max_abs == pytest.approx(live[1].culprit.output_error)


def test_n_p_fall_back_to_the_most_amplifying_ops_when_none_differs(live):
    run, result = live
    noisy = replace(
        result,
        profile=[
            replace(row, verdict="noise" if row.verdict == "different" else row.verdict) for row in result.profile
        ],
    )
    data = RunData(replace(run, result=noisy))
    ops, kind = data.notable()
    assert kind == "amplifying" and ops[0] == CULPRIT  # its error appears from exact inputs: infinite amplification
    assert data.step(None, True) == (CULPRIT, "amplifying")
    assert data.step(CULPRIT, True)[0] == ops[1] and data.step(CULPRIT, False)[0] == ops[-1]


# -- overview --------------------------------------------------------------------------------
async def test_overview_shows_verdict_culprit_sources_and_chart(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert text(app.query_one(VerdictBanner)).startswith("verdict: divergent")
        culprit = text(app.query_one(CulpritPanel))
        assert "gelu" in culprit and "blocks.2" in culprit and culprit.count(GELU_LINE) == 2
        assert "tests/models/tui_mlp.py:25" in culprit and "different" in culprit
        chart = text(app.query_one(ErrorChart)).splitlines()
        assert chart[0].startswith("propagated") and chart[1].startswith("local")
        assert chart[2].index("^") == len("propagated ") + CULPRIT


async def test_a_side_that_does_not_repeat_itself_shows_its_op_cause_and_fix(tmp_path):
    run = bisectr.trace(ROOT / "tests" / "models" / "nondeterministic_torch.py", candidate="candidate_dropout")
    run.bisect()
    app = BisectrApp(RunData(run))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert text(app.query_one(VerdictBanner)).startswith("verdict: nondeterministic")
        culprit = text(app.query_one(CulpritPanel))
        assert "the candidate does not repeat itself" in culprit and "blocks.0.drop" in culprit
        assert "cause: random" in culprit and "model.eval()" in culprit
        assert app.query_one(ErrorChart) is not None and RunData(run).culprit_index == 2


# -- keys ------------------------------------------------------------------------------
async def test_f_goes_to_the_culprit_in_the_op_table(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        app.select(0, show_ops=False)
        await pilot.press("f")
        await pilot.pause()
        assert app.query_one("#tabs").active == "ops"
        assert app.query_one(OpTable).current() == CULPRIT and app.focused is app.query_one(OpTable)
        preview = text(app.query_one(OpPreview))
        assert f"op {CULPRIT} gelu" in preview and GELU_LINE in preview
        tree = app.query_one(ModuleTree)
        assert tree.cursor_node is not None and tree.cursor_node.data.path == "blocks.2"


async def test_n_and_p_walk_the_ops_judged_different(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        app.select(0)
        await pilot.press("n")
        assert app.current == CULPRIT
        app.select(12)
        await pilot.press("p")
        assert app.current == CULPRIT and app.query_one(OpTable).current() == CULPRIT


async def test_slash_filters_the_op_table(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash")
        filter_input = app.query_one(FilterInput)
        assert filter_input.display and app.focused is filter_input
        await pilot.press(*"gelu")
        await pilot.pause()
        table = app.query_one(OpTable)
        assert table.shown == [1, 4, 7, 10] and table.row_count == 4
        assert "4 of 13 ops" in str(app.query_one("#ops-right").border_title)
        await pilot.press("enter")
        assert not filter_input.display and app.focused is table and table.shown == [1, 4, 7, 10]
        await pilot.press("slash")
        filter_input.value = "gelu different"
        await pilot.press("enter")
        assert table.shown == [CULPRIT]
        await pilot.press("slash", "escape")  # escape clears the filter
        assert len(table.shown) == 13


async def test_s_sorts_and_the_tree_follows_the_table(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2", "s")
        table = app.query_one(OpTable)
        assert table.sort_name == "output error" and table.shown[0] == 8  # the residual add after the gelu
        table.select_op(9)
        await pilot.pause()
        tree = app.query_one(ModuleTree)
        assert tree.cursor_node.data.path == "blocks.3.fc"
        tree.select_node(tree.nodes["head"])
        await pilot.pause()
        assert app.current == 12 and table.current() == 12


async def test_enter_opens_the_op_detail(saved):
    app = saved_app(saved)
    async with app.run_test(size=(100, 50)) as pilot:
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, DetailScreen) and screen.index == CULPRIT
        assert GELU_LINE in text(screen.query_one("#source-candidate")) and GELU_LINE in text(
            screen.query_one("#source-reference")
        )
        evidence = text(screen.query_one(EvidencePanel))
        assert "vs fp64" in evidence and "different" in evidence
        assert_gelu_evidence(evidence)
        heat = text(screen.query_one(HeatMapView))
        assert "█" in heat and "[3,16]" in heat
        assert "op 6" in text(screen.query_one("#tensors"))
        assert screen.query_one("#patch").disabled  # a saved run cannot re-run
        await pilot.press("n")  # f / n / p move the detail too
        assert screen.index == CULPRIT
        await pilot.press("escape")
        assert not isinstance(app.screen, DetailScreen)


def assert_gelu_evidence(evidence: str) -> None:
    """The culprit gelu's fp64 evidence: the candidate's tanh GELU ~1.5e-05 from float64, the
    reference's exact GELU at rounding (~1e-08; how far below depends on the CPU's kernels)."""
    found = re.search(r"cand (\S+) · ref (\S+)", evidence)
    assert found, evidence
    cand, ref = map(float, found.groups())
    assert 5e-6 < cand < 5e-5 and 1e-9 < ref < 1e-7 and cand > 100 * ref, evidence


@pytest.mark.parametrize("line", ["cand 1.53e-05 · ref 1.13e-08", "cand 1.53e-05 · ref 8.56e-09"])  # Intel, AMD EPYC
def test_the_detail_check_takes_any_cpus_digits(line):
    assert_gelu_evidence(line)


@pytest.mark.parametrize("line", ["cand 1.53e-05 · ref 1.13e-05", "cand 1.53e-07 · ref 1.13e-08", "ref 1.13e-08"])
def test_the_detail_check_fails_on_other_evidence(line):
    with pytest.raises(AssertionError):
        assert_gelu_evidence(line)


async def test_detail_patches_the_op_and_reruns_a_live_run(live):
    app = live_app(live)
    async with app.run_test(size=(100, 50)) as pilot:
        app.select(9, show_ops=False)
        await pilot.press("enter")
        await settle(pilot)
        evidence = text(app.screen.query_one(EvidencePanel))
        assert "→ exact" in evidence and "bit-identical on the reference's inputs" in evidence
        await pilot.press("f")
        await pilot.press("r")
        await settle(pilot)
        log = text(app.screen.query_one("#action-log"))
        assert f"patched op {CULPRIT}" in log and "→ 0 (this op only)" in log


async def test_patching_a_saved_run_says_it_needs_a_live_run(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        messages = record_notifications(app)
        await pilot.press("enter", "r")
        assert any("live run" in m for m in messages)


async def test_b_searches_again_with_a_progress_bar(live):
    app = live_app(live)
    async with app.run_test(size=SIZE) as pilot:
        messages = record_notifications(app)
        progress = app.query_one(SearchProgress)
        stages: list[str] = []
        start, stage = progress.start, progress.stage
        progress.start = lambda: (
            stages.append(f"shown: {progress.display}"),
            start(),
            stages.append(f"shown: {progress.display}"),
        )
        progress.stage = lambda message: (stages.append(message), stage(message))  # type: ignore[method-assign]
        await pilot.press("b")
        await settle(pilot)
        assert not progress.display
        assert stages[:7] == [
            "shown: False",
            "shown: True",
            "re-running each side unpatched",
            "replaying ops",
            "running both sides in float64",
            "comparing parameters and buffers",
            "searching",
        ]
        assert any(m.startswith("search done: divergent, culprit op 7") for m in messages)
        assert app.data.culprit_index == CULPRIT and bisectr.load(live[0].run_dir).result.verdict == "divergent"


async def test_b_on_a_saved_run_asks_for_the_model_file_and_escape_searches_nothing(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("b")
        await pilot.pause()
        assert isinstance(app.screen, RetraceScreen)
        shown = " ".join(" ".join(text(widget).split()) for widget in app.screen.query(Static))
        assert f"This run was traced from: {MODEL.relative_to(ROOT)}" in shown  # as tests/data/make_runs.py stores it
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, RetraceScreen) and not app.query_one(SearchProgress).display
        assert app.data.result is saved.result and not app.data.live


async def test_b_on_a_saved_run_traces_the_named_model_file_again(tmp_path):
    run = bisectr.trace(MODEL, out=tmp_path / "run")
    first_id = run.run_id
    app = saved_app(bisectr.load(tmp_path / "run"))
    async with app.run_test(size=SIZE) as pilot:
        assert text(app.query_one(VerdictBanner)).startswith("NO RESULT")
        await pilot.press("b")
        await pilot.pause()
        app.screen.query_one(Input).value = str(MODEL)
        await pilot.press("enter")
        await settle(pilot)
        assert text(app.query_one(VerdictBanner)).startswith("verdict: divergent") and app.current == CULPRIT
        assert app.data.live
    reopened = bisectr.load(tmp_path / "run")
    assert reopened.run_id != first_id and reopened.result.culprit.candidate.index == CULPRIT


async def test_e_exports_a_repro_that_reproduces_the_op(live, tmp_path):
    app = live_app(live)
    async with app.run_test(size=SIZE) as pilot:
        messages = record_notifications(app)
        await pilot.press("e")
        await settle(pilot)
    directory = app.exported
    assert any(str(directory) in m for m in messages)
    assert (directory / "repro.py").is_file() and (directory / "inputs.npz").is_file()
    assert "approximate='tanh'" in (directory / "repro.py").read_text()
    out = subprocess.run(
        [sys.executable, str(directory / "repro.py")], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    _, result = live
    assert f"candidate vs reference:         {result.culprit.local_error:.3g}" in out.stdout
    assert f"candidate op vs float64 oracle: {result.culprit.fp64.candidate_error:.3g}" in out.stdout
    assert "=> different: the candidate computes something else" in out.stdout


async def test_w_writes_the_run_up_in_its_directory(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        messages = record_notifications(app)
        await pilot.press("w")
        await settle(pilot)
    report = Path(saved.run_dir) / "report.md"
    assert any(f"report written: {report}" in m for m in messages), messages
    assert "### Culprit: `gelu`" in report.read_text() and (Path(saved.run_dir) / "report.html").is_file()


async def test_a_matching_run_has_no_culprit(tmp_path):
    run = bisectr.trace(MODEL, candidate="reference", out=tmp_path / "run")
    run.bisect()
    app = BisectrApp(RunData(run))
    async with app.run_test(size=SIZE) as pilot:
        messages = record_notifications(app)
        assert text(app.query_one(VerdictBanner)).startswith("verdict: match")
        assert "No culprit" in text(app.query_one(CulpritPanel))
        await pilot.press("f", "n", "enter")
        await pilot.pause()
        assert any("no culprit" in m for m in messages) and any("no op is judged different" in m for m in messages)
        assert isinstance(app.screen, DetailScreen) and app.screen.index == 0


async def test_b_searches_a_live_run_that_has_no_result_yet(tmp_path):
    run = bisectr.trace(MODEL, out=tmp_path / "run")
    app = BisectrApp(RunData(run))
    async with app.run_test(size=SIZE) as pilot:
        assert text(app.query_one(VerdictBanner)).startswith("NO RESULT")
        await pilot.press("b")
        await settle(pilot)
        assert text(app.query_one(VerdictBanner)).startswith("verdict: divergent") and app.current == CULPRIT
        assert (tmp_path / "run" / "result.json").is_file()


async def test_question_mark_shows_the_keys(saved):
    app = saved_app(saved)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "next / previous op judged different" in text(app.screen.query_one("#help-keys"))
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_q_quits_with_status_0(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_small_terminal_and_light_theme(saved):
    app = saved_app(saved)
    async with app.run_test(size=(80, 24)) as pilot:
        app.theme = "textual-light"
        await pilot.pause()
        await pilot.press("f", "enter")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)


async def test_g_switches_between_the_forward_and_the_backward_pass(tmp_path):
    run = bisectr.trace(
        ROOT / "tests" / "models" / "backward_ports.py", candidate="candidate_pylayer", out=tmp_path / "run"
    )
    run.bisect(backward=True)
    run.save()
    app = saved_app(bisectr.load(tmp_path / "run"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert text(app.query_one(VerdictBanner)).startswith("verdict: noise")
        await pilot.press("g")
        await pilot.pause()
        assert text(app.query_one(VerdictBanner)).startswith("backward verdict: divergent")
        culprit = text(app.query_one(CulpritPanel))
        assert "first op whose backward differs" in culprit and "WrongGeluGrad" in culprit and "confirmed" in culprit
        assert app.query_one(ErrorChart).border_title.startswith("gradient error by op")
        assert app.current == 7  # the culprit, in the op table too
        await pilot.press("g")
        await pilot.pause()
        assert text(app.query_one(VerdictBanner)).startswith("verdict: noise")


async def test_g_does_nothing_for_a_run_without_a_backward_pass(saved):
    app = saved_app(saved)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        await pilot.pause()
        assert not app.data.backward and text(app.query_one(VerdictBanner)).startswith("verdict: divergent")


async def test_the_training_tui_shows_the_verdict_both_loss_curves_and_the_steps():
    from textual.widgets import DataTable, Sparkline

    from bisectr.training import train
    from bisectr.present.tui.training import TrainingApp

    result = train(str(ROOT / "tests" / "models" / "training_ports.py"), candidate="candidate_eps", steps=3)
    app = TrainingApp(result, "training_ports.py")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        verdict = text(app.query_one("#verdict"))
        assert verdict.startswith("training verdict: divergent at step 1 of 3 (stage: optimizer)")
        assert "the optimizer's epsilon (reference 1e-08, candidate 1e-06)" in verdict
        curves = list(app.query(Sparkline))
        assert [list(c.data) for c in curves] == [
            [getattr(row.loss, role) for row in result.steps] for role in ("reference", "candidate")
        ]
        table = app.query_one(DataTable)
        assert table.row_count == 3 and table.cursor_row == 0
        assert table.get_row_at(0)[-1] == "semantic"
        await pilot.press("q")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
async def test_the_generation_tui_shows_the_steps_and_s_opens_the_search_inside_the_step():
    from textual.widgets import DataTable, Sparkline

    from bisectr.generation import generate
    from bisectr.present.tui.generation import SEARCH, GenerationApp

    result = generate(ROOT / "tests" / "models" / "generate_hf_llama.py", candidate="candidate_decode_mask", tokens=3)
    app = GenerationApp(result, "generate_hf_llama.py")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        verdict = text(app.query_one("#verdict"))
        assert verdict.startswith("generation verdict: divergent at step 1, over 4 steps")
        assert "press s for the search inside step 1" in verdict
        error_curve, margin_curve = app.query(Sparkline)
        assert list(margin_curve.data) == [row.margin for row in result.steps]
        assert list(error_curve.data)[0] < -17 < -1 < list(error_curve.data)[1]  # step 0 matches, step 1 differs
        table = app.query_one(DataTable)
        assert table.row_count == 4 and table.cursor_row == 1 and table.get_row_at(1)[-1] == "divergent"
        await pilot.press("s")
    assert app.return_value == SEARCH


# -- snapshots ---------------------------------------------------------------------------
def test_snapshot_overview(snap_compare, saved):
    assert snap_compare(saved_app(saved), terminal_size=(80, 24))


def test_snapshot_ops(snap_compare, saved):
    assert snap_compare(saved_app(saved), terminal_size=SIZE, press=["f"])


def test_snapshot_op_detail(snap_compare, saved):
    assert snap_compare(saved_app(saved), terminal_size=(100, 40), press=["enter"])


# -- a real terminal ---------------------------------------------------------------------------
def _wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


class Terminal:
    """A command running in a detached tmux session: read the screen, type keys, get its exit status."""

    def __init__(self, command: str, status: Path, size: tuple[int, int]):
        self.session = f"bisectr-{uuid.uuid4().hex[:8]}"
        self.status = status
        env = {**os.environ, "TERM": "xterm-256color"}
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                self.session,
                "-x",
                str(size[0]),
                "-y",
                str(size[1]),
                f"cd {ROOT} && {command}; echo $? > {status}",
            ],
            check=True,
            env=env,
        )

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.session], capture_output=True, text=True).stdout

    def press(self, key: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.session, key], check=True)

    def exit_status(self, timeout: float = 20.0) -> str:
        assert _wait_for(lambda: self.status.exists() and self.status.read_text().strip() != "", timeout), self.screen()
        return self.status.read_text().strip()

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.session], capture_output=True)


@pytest.fixture
def terminal(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    opened: list[Terminal] = []

    def open_terminal(command: str, size: tuple[int, int] = SIZE) -> Terminal:
        opened.append(Terminal(command, tmp_path / "status", size))
        return opened[-1]

    yield open_terminal
    for term in opened:
        term.close()


def test_tmux_end_to_end(live, terminal):
    term = terminal(f"{sys.executable} -m bisectr.present.tui {live[0].run_dir}")
    assert _wait_for(lambda: "verdict: divergent" in term.screen()), term.screen()
    term.press("f")
    assert _wait_for(lambda: "op 7 gelu in blocks.2" in term.screen()), term.screen()
    shown = term.screen()
    assert GELU_LINE in shown and "tests/models/tui_mlp.py:25" in shown
    term.press("q")
    assert term.exit_status() == "0"


# -- the span-head example (seed 004): torch reference, paddle candidate ------------------------
@pytest.fixture
def span_head(tmp_path):
    """The span-head example's saved run, as `bisectr view` opens it."""
    return committed_run("span_head", tmp_path)


def test_snapshot_span_head_overview(snap_compare, span_head):
    assert snap_compare(saved_app(span_head), terminal_size=(100, 30))


def test_snapshot_span_head_culprit_detail(snap_compare, span_head):
    assert snap_compare(saved_app(span_head), terminal_size=(100, 40), press=["f", "enter"])


def test_tmux_bisectr_trace_opens_the_tui_on_the_span_head(terminal, tmp_path):
    """`bisectr trace` on a terminal opens the TUI; `f` shows the culprit's source line; `q` exits 0."""
    pytest.importorskip("paddle")
    term = terminal(f"{sys.executable} -m bisectr trace examples/span_head.py -o {tmp_path / 'run'}", (110, 32))
    assert _wait_for(lambda: "verdict: noise" in term.screen(), 120), term.screen()
    term.press("f")
    assert _wait_for(lambda: "_logits = paddle.matmul(temp," in term.screen()), term.screen()
    term.press("q")
    assert term.exit_status() == "0"
