"""Interrupted, starved and concurrent writers of a run directory, with real processes.

`bisectr trace tests/models/slow_sleepy_mlp.py -o RUN --no-tui` (a model that sleeps in its forward,
verdict `divergent`) is interrupted with SIGINT or killed with SIGKILL at several moments (found by
polling the file system for the hidden partial directory `.<name>.partial-<pid>` beside RUN and for
the new traces landing in RUN, or after fixed delays), each time on top of a complete previous run
in RUN. The previous run has `PREVIOUS_LAYERS` blocks and the new one `NEW_LAYERS`, so op counts
tell which run the traces (and a result's op counts) come from.

Afterwards RUN is either a complete, consistent run (the previous one or the new one: both traces
and result.json from the same run, one run id in every file; `bisectr view` exits 1 for its
`divergent` result, 0 without a result) or refused by `bisectr view` with exit 2 and a message.
After SIGINT the process exits 2 and says what was kept, unless the signal came once the new run was
saved and said (its summary on stdout ends "run saved in RUN"): the trace then ends as a complete one,
exit 1. After the next successful trace into RUN
no `.<name>.partial-*` or `.<name>.old-*` directory is left. A trace onto a full disk exits 2 about
the space and leaves the previous run as it was; two writers into one RUN never mix their files.
Run with `-s` to see what happened at each moment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

import bisectr
from bisectr.errors import BisectrError
from conftest import MODELS, mounted_tmpfs

# Torch's own machinery (torch.compile, torchrun's ranks, signals) or the benchmarks: the first CI
# environment runs these, the PaddleFormers one (numpy 1.26) does not (see .ci/run).
pytestmark = pytest.mark.once

MODEL = MODELS / "slow_sleepy_mlp.py"
PREVIOUS_LAYERS, NEW_LAYERS = 4, 6
SLOW_SECONDS = "0.1"  # per block and forward: recording takes ~0.5 s a side, the search several seconds
PROCESS_TIMEOUT_S = 120
RUN_ID_KEY = re.compile(r"^run_?id$", re.IGNORECASE)


# -- processes ---------------------------------------------------------------------------------
def trace_env(layers: int, seconds: str, scratch: Path, width: int | None = None) -> dict[str, str]:
    env = {**os.environ, "SLOW_LAYERS": str(layers), "SLOW_SECONDS": seconds, "TMPDIR": str(scratch)}
    if width is not None:
        env["SLOW_WIDTH"] = str(width)
    return env


def start_trace(run_dir: Path, layers: int, seconds: str = SLOW_SECONDS, width: int | None = None) -> subprocess.Popen:
    """`bisectr trace MODEL -o run_dir --no-tui` in the background (bug logs go beside run_dir)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bisectr", "trace", str(MODEL), "-o", str(run_dir), "--no-tui"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=run_dir.parent,
        env=trace_env(layers, seconds, run_dir.parent, width),
    )


def trace_to_the_end(
    run_dir: Path, layers: int, seconds: str = "0", width: int | None = None
) -> subprocess.CompletedProcess:
    """A complete trace (fast: no sleeping unless asked)."""
    return subprocess.run(
        [sys.executable, "-m", "bisectr", "trace", str(MODEL), "-o", str(run_dir), "--no-tui"],
        capture_output=True,
        text=True,
        cwd=run_dir.parent,
        timeout=PROCESS_TIMEOUT_S,
        env=trace_env(layers, seconds, run_dir.parent, width),
    )


def view(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bisectr", "view", str(run_dir), "--no-tui"],
        capture_output=True,
        text=True,
        cwd=run_dir.parent,
        timeout=PROCESS_TIMEOUT_S,
        env={**os.environ, "TMPDIR": str(run_dir.parent)},
    )


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    """Wait for the process; its exit status, stdout and stderr."""
    try:
        stdout, stderr = process.communicate(timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        stderr += f"\n[test: killed after {PROCESS_TIMEOUT_S} s]"
    return process.returncode, stdout, stderr


def leftovers(run_dir: Path) -> list[str]:
    """Partial and retired directories of writers beside the run (`.<name>.partial-*`, `.<name>.old-*`)."""
    return sorted(
        p.name
        for p in run_dir.parent.iterdir()
        if p.name.startswith((f".{run_dir.name}.partial-", f".{run_dir.name}.old-"))
    )


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


# -- judging a run directory -----------------------------------------------------------------------
@dataclass
class Generations:
    """(reference ops, candidate ops) of a complete trace with each number of blocks."""

    ops: dict[int, tuple[int, int]]

    def which(self, counts: tuple[int, int]) -> int | None:
        return next((layers for layers, known in self.ops.items() if known == counts), None)


@dataclass
class State:
    """What a run directory holds after the fact."""

    kind: str  # "refused" (also when RUN is gone), or "<n> layers with result" / "... without result"
    layers: int | None = None
    has_result: bool = False
    problems: list[str] = field(default_factory=list)


def run_ids(run_dir: Path) -> dict[str, object]:
    """The run id in every top-level JSON object of the run that has one, by file."""
    found = {}
    for path in sorted(run_dir.rglob("*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(document, dict):
            for key, value in document.items():
                if RUN_ID_KEY.match(key):
                    found[str(path.relative_to(run_dir))] = value
    return found


def assess(run_dir: Path, generations: Generations) -> State:
    """Open the run as a user would (`bisectr view`, then `bisectr.load`) and check that it is one
    complete run: traces of one generation, a result with their op counts, one run id."""
    shown = view(run_dir)
    if "Traceback" in shown.stderr:
        return State("refused", problems=[f"view printed a traceback: {last_line(shown.stderr)}"])
    if shown.returncode == 2:
        named = str(run_dir) in shown.stderr or str(run_dir.resolve()) in shown.stderr
        return State(
            "refused", problems=[] if named else [f"view exit 2 without naming the run: {last_line(shown.stderr)}"]
        )
    if shown.returncode not in (0, 1):
        return State("refused", problems=[f"view exit {shown.returncode}: {last_line(shown.stderr)}"])
    try:
        run = bisectr.load(run_dir)
    except BisectrError as exc:
        return State("refused", problems=[f"view exit {shown.returncode} but bisectr.load refuses: {exc}"])
    counts = (len(run.reference.ops), len(run.candidate.ops))
    layers = generations.which(counts)
    result = saved_result(run)
    state = State(f"{layers} layers {'with' if result else 'without'} result", layers, bool(result))
    if layers is None:
        state.problems.append(f"traces of two runs mixed: {counts[0]} reference and {counts[1]} candidate ops")
    if result:
        result_counts = (result.get("ops", {}).get("reference"), result.get("ops", {}).get("candidate"))
        if result_counts != counts:
            state.problems.append(f"result.json is another run's: its ops {result_counts}, the traces' {counts}")
        expected = 1 if result.get("verdict") == "divergent" else 0
        if shown.returncode != expected:
            state.problems.append(f"view exit {shown.returncode} for verdict {result.get('verdict')}")
    elif shown.returncode != 0:
        state.problems.append(f"view exit {shown.returncode} for a run without a result")
    ids = run_ids(run_dir)
    if len(set(map(str, ids.values()))) > 1:
        state.problems.append(f"files of different runs: run ids {ids}")
    return state


def saved_result(run: bisectr.Run) -> dict | None:
    """The run's saved search result as a dict (None: the run was never searched)."""
    return None if run.result is None else run.result.to_dict()


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def complete_runs(tmp_path_factory) -> dict[int, Path]:
    """A complete run of each generation (traced in parallel, fast), to copy and to count ops."""
    root = tmp_path_factory.mktemp("complete")
    runs = {layers: root / f"layers{layers}" / "run" for layers in (PREVIOUS_LAYERS, NEW_LAYERS)}
    for run_dir in runs.values():
        run_dir.parent.mkdir()
    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(runs, pool.map(lambda item: trace_to_the_end(item[1], item[0]), runs.items())))
    for layers, completed in done.items():
        assert completed.returncode == 1, completed.stderr  # the model is divergent
    return runs


@pytest.fixture(scope="module")
def generations(complete_runs) -> Generations:
    ops = {}
    for layers, run_dir in complete_runs.items():
        run = bisectr.load(run_dir)
        ops[layers] = (len(run.reference.ops), len(run.candidate.ops))
    assert len(set(ops.values())) == len(ops)
    return Generations(ops)


def previous_run_in(directory: Path, complete_runs: dict[int, Path]) -> Path:
    """`directory/run`: a copy of the complete previous run."""
    run_dir = directory / "run"
    shutil.copytree(complete_runs[PREVIOUS_LAYERS], run_dir)
    return run_dir


# -- moments -----------------------------------------------------------------------------------------
def wait_for(condition: Callable[[], bool], process: subprocess.Popen, timeout: float = 60.0) -> bool:
    """Poll until `condition()`; False when the process ended first (the moment was missed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.005)
    return False


def partial_dirs(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.parent.iterdir() if p.name.startswith(f".{run_dir.name}.partial-")]


def new_traces_landed(run_dir: Path, previous_manifest: bytes) -> bool:
    """RUN holds another manifest than the previous run's: the new traces were moved in."""
    try:
        return (run_dir / "manifest.json").read_bytes() != previous_manifest
    except OSError:
        return False


Moment = Callable[[subprocess.Popen, Path, bytes], bool]


def after(seconds: float) -> Moment:
    def reached(process: subprocess.Popen, run_dir: Path, previous_manifest: bytes) -> bool:
        time.sleep(seconds)
        return process.poll() is None

    return reached


def recording_reference(process: subprocess.Popen, run_dir: Path, previous_manifest: bytes) -> bool:
    """The partial directory exists (the reference is being recorded), plus a little."""
    reached = wait_for(lambda: bool(partial_dirs(run_dir)), process)
    time.sleep(0.15)
    return reached and process.poll() is None


def recording_candidate(process: subprocess.Popen, run_dir: Path, previous_manifest: bytes) -> bool:
    """Something named `candidate` appeared in the partial directory, plus a little."""

    def candidate_started() -> bool:
        return any(any(p.name.startswith("candidate") for p in partial.rglob("*")) for partial in partial_dirs(run_dir))

    reached = wait_for(candidate_started, process)
    time.sleep(0.15)
    return reached and process.poll() is None


def traces_landed(process: subprocess.Popen, run_dir: Path, previous_manifest: bytes) -> bool:
    """Right after the new run (or its traces, before the search) replaced the previous one in RUN."""
    return wait_for(lambda: new_traces_landed(run_dir, previous_manifest), process)


def searching(process: subprocess.Popen, run_dir: Path, previous_manifest: bytes) -> bool:
    """2 s after the candidate's recording started: the search is running (recording a side takes
    under a second here, the search several)."""
    reached = recording_candidate(process, run_dir, previous_manifest)
    time.sleep(2.0)
    return reached and process.poll() is None


MOMENTS: dict[str, Moment] = {  # in the order a trace reaches them
    "after_0.3s": after(0.3),  # importing bisectr's modules
    "after_1s": after(1.0),  # loading bisectr, torch and the model
    "recording_reference": recording_reference,
    "recording_candidate": recording_candidate,
    "searching": searching,
    "traces_landed": traces_landed,
    "after_6s": after(6.0),
}


# -- kills --------------------------------------------------------------------------------------------
@dataclass
class KillReport:
    signal_name: str
    moment: str
    reached: bool
    exit_status: int
    stderr: str
    after_kill: State
    leftovers_after_kill: list[str]
    next_trace: str = ""
    leftovers_after_next: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        said = " / ".join(line.strip() for line in self.stderr.strip().splitlines())[:300] or "(nothing)"
        lines = [
            f"{self.signal_name} {self.moment}: {'killed' if self.reached else 'moment missed, ran to the end'}, "
            f"exit {self.exit_status}; RUN: {self.after_kill.kind}; "
            f"beside it: {self.leftovers_after_kill or 'nothing'}",
            f"    stderr: {said}",
            f"    next trace: {self.next_trace}; left beside RUN after it: {self.leftovers_after_next or 'nothing'}",
        ]
        lines += [f"    PROBLEM: {problem}" for problem in self.problems]
        return "\n".join(lines)


def finished_before_the_signal(report: KillReport, stdout: str) -> bool:
    """The new run was saved and its summary printed before SIGINT arrived: the trace is complete."""
    said_saved = last_line(stdout).startswith("run saved in")
    return (
        report.exit_status == 1
        and said_saved
        and report.after_kill.layers == NEW_LAYERS
        and report.after_kill.has_result
    )


def check_sigint_message(report: KillReport) -> None:
    """Exit 2, no traceback, and a message saying what was kept that matches what RUN holds."""
    if report.exit_status != 2:
        report.problems.append(f"exit {report.exit_status} after SIGINT (expected 2)")
    if "Traceback" in report.stderr:
        report.problems.append(f"traceback after SIGINT: {last_line(report.stderr)}")
    said = report.stderr.lower()
    if not ("untouched" in said or "saved" in said):
        report.problems.append(f"stderr does not say what was kept: {last_line(report.stderr)!r}")
    if report.after_kill.layers == NEW_LAYERS and ("untouched" in said or "nothing was saved" in said):
        report.problems.append(f"stderr says {last_line(report.stderr)!r} but the new traces replaced the previous run")


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_a_killed_trace_leaves_a_complete_run_or_a_refused_one(
    tmp_path, complete_runs, generations, signal_name, moment
):
    run_dir = previous_run_in(tmp_path, complete_runs)
    previous_manifest = (run_dir / "manifest.json").read_bytes()
    process = start_trace(run_dir, NEW_LAYERS)
    reached = MOMENTS[moment](process, run_dir, previous_manifest)
    if reached:
        process.send_signal(getattr(signal, signal_name))
    status, stdout, stderr = finish(process)
    report = KillReport(signal_name, moment, reached, status, stderr, assess(run_dir, generations), leftovers(run_dir))
    report.problems += report.after_kill.problems
    if report.after_kill.layers == PREVIOUS_LAYERS and not report.after_kill.has_result:
        report.problems.append("the previous run lost its result.json")
    if reached and signal_name == "SIGINT" and not finished_before_the_signal(report, stdout):
        check_sigint_message(report)
    if not reached and status != 1:
        report.problems.append(f"ran to the end with exit {status}: {last_line(stderr)}")

    following = trace_to_the_end(run_dir, NEW_LAYERS)
    report.next_trace = f"exit {following.returncode}" + (
        f" ({last_line(following.stderr)})" if following.returncode not in (0, 1) else ""
    )
    report.leftovers_after_next = leftovers(run_dir)
    if following.returncode not in (0, 1):
        report.problems.append(f"the next trace into RUN failed: {last_line(following.stderr)}")
    if report.leftovers_after_next:
        report.problems.append(f"left beside RUN after the next successful trace: {report.leftovers_after_next}")
    final = assess(run_dir, generations)
    report.problems += [f"after the next trace: {problem}" for problem in final.problems]
    print("\n" + report.text())
    assert not report.problems, report.text()


# -- disk full -----------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs mounted at tmp_path/small (root only), unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "small", "1m") as mount_point:
        yield mount_point


def test_a_full_disk_is_exit_2_about_space_and_keeps_the_previous_run(small_disk, generations):
    run_dir = small_disk / "run"
    previous = trace_to_the_end(run_dir, PREVIOUS_LAYERS, width=16)  # a few KB: fits
    assert previous.returncode == 1, previous.stderr
    done = trace_to_the_end(run_dir, NEW_LAYERS, width=256)  # megabytes of tensors: cannot fit
    problems = []
    if done.returncode != 2:
        problems.append(f"exit {done.returncode} on a full disk (expected 2): {last_line(done.stderr)}")
    if "Traceback" in done.stderr:
        problems.append(f"traceback: {last_line(done.stderr)}")
    if not re.search(r"disk|space", done.stderr, re.IGNORECASE):
        problems.append(f"the message says nothing about the disk or space: {last_line(done.stderr)!r}")
    if partial_dirs(run_dir):
        problems.append(f"partial directories left: {[p.name for p in partial_dirs(run_dir)]}")
    state = assess(run_dir, generations)
    problems += state.problems
    if state.layers != PREVIOUS_LAYERS or not state.has_result:
        problems.append(f"the previous run was not kept as it was: RUN is {state.kind}")
    text = (
        f"full disk: exit {done.returncode}; stderr: {last_line(done.stderr)}; RUN: {state.kind}; "
        f"on the disk: {sorted(p.name for p in small_disk.iterdir())}"
    )
    print("\n" + text + "".join(f"\n    PROBLEM: {p}" for p in problems))
    assert not problems, text + "\n" + "\n".join(problems)


# -- two writers ----------------------------------------------------------------------------------------
def check_two_writers(
    first: subprocess.Popen, second: subprocess.Popen, run_dir: Path, generations: Generations
) -> str:
    """Both finish; at most one fails, with exit 2 naming the other's pid; RUN is one complete run."""
    outcomes = {"first": (first, *finish(first)), "second": (second, *finish(second))}
    problems = []
    failed = [name for name, (_, status, _, _) in outcomes.items() if status not in (0, 1)]
    if len(failed) > 1:
        problems.append("both writers failed")
    for name, (process, status, _, stderr) in outcomes.items():
        other = outcomes["second" if name == "first" else "first"][0]
        if "Traceback" in stderr:
            problems.append(f"{name}: traceback: {last_line(stderr)}")
        if status not in (0, 1) and not (status == 2 and str(other.pid) in stderr):
            problems.append(
                f"{name} failed with exit {status} without naming the other writer (pid {other.pid}): "
                f"{last_line(stderr)}"
            )
    state = assess(run_dir, generations)
    problems += state.problems
    if not state.has_result:
        problems.append(f"RUN is {state.kind} after both writers finished")
    leftover = leftovers(run_dir)
    if leftover:
        problems.append(f"left beside RUN: {leftover}")
    statuses = ", ".join(
        f"{name} exit {status} ({last_line(stderr) if status not in (0, 1) else 'ok'})"
        for name, (_, status, _, stderr) in outcomes.items()
    )
    text = f"{statuses}; RUN: {state.kind}" + "".join(f"\n    PROBLEM: {p}" for p in problems)
    print("\n" + text)
    return text if problems else ""


def test_two_writers_started_together_never_mix(tmp_path, complete_runs, generations):
    run_dir = previous_run_in(tmp_path, complete_runs)
    first = start_trace(run_dir, PREVIOUS_LAYERS, seconds="0.05")
    second = start_trace(run_dir, NEW_LAYERS, seconds="0.05")
    problems = check_two_writers(first, second, run_dir, generations)
    assert not problems, problems


def test_a_writer_starting_while_another_searches_never_mixes(tmp_path, complete_runs, generations):
    """The second trace (fast) starts while the first is searching and finishes before it: the
    first's result must not land on the second's traces, nor the second's files mix with the first's."""
    run_dir = previous_run_in(tmp_path, complete_runs)
    previous_manifest = (run_dir / "manifest.json").read_bytes()
    first = start_trace(run_dir, PREVIOUS_LAYERS)
    in_search = searching(first, run_dir, previous_manifest)
    second = start_trace(run_dir, NEW_LAYERS, seconds="0")
    problems = check_two_writers(first, second, run_dir, generations)
    assert not problems, ("" if in_search else "(the first trace ended before the second started)\n") + problems
