import contextlib
import importlib.util
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

MODELS = Path(__file__).parent / "models"


def pytest_configure(config):
    """A failed snapshot's report goes to the temporary directory, not into the work tree."""
    if getattr(config.option, "snapshot_report", None) == "snapshot_report.html":
        config.option.snapshot_report = str(Path(tempfile.gettempdir()) / "bisectr_snapshot_report.html")


EXAMPLES = Path(__file__).parent.parent / "examples"

# `BISECTR_FULL_SETS=1` runs every member of the sets the tests otherwise sample (`sampled`).
FULL_SETS = os.environ.get("BISECTR_FULL_SETS") == "1"


def sampled(members: list, every: int) -> list:
    """Every `every`-th member, from the first (each kind of a set listed in turn keeps some), or all of them
    with `BISECTR_FULL_SETS=1`: a slow set's sample for each test run, the whole set when asked for."""
    return list(members) if FULL_SETS else list(members)[::every]


@pytest.fixture
def models() -> Path:
    return MODELS


needs_paddleformers = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("transformers", "paddleformers")),
    reason="needs transformers and paddleformers in one environment (the reference runs in a copy of it that hides "
    "paddlecodec's torchcodec module: see examples/hf_llama.py)",
)


@pytest.fixture(scope="module")
def hf_python(tmp_path_factory) -> str:
    """This environment without `torchcodec` (PaddleFormers' `paddlecodec` installs one that keeps
    transformers from importing torch models): the Hugging Face reference's interpreter."""
    from test_isolate import make_interpreter

    return make_interpreter(tmp_path_factory.mktemp("hf") / "venv", hide=("torchcodec",))


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the first line containing `marker`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


def assert_replay_matches_model_rerun(run, role: str) -> None:
    """Executing the recorded calls (`rerun_recorded`) gives what re-running the model's code
    gives, bit for bit, for patches cut after several ops (op outputs moved off their recorded
    values, a parameter replaced) and captured tensors; every cut that patches something moves the outputs."""
    import numpy as np

    from bisectr.capture.trace import is_floating
    from bisectr.engines.patched import rerun_model, rerun_recorded

    trace, side = run.traces[role], run.live.runners[role]
    assert side.recorded.replayable(side.side.adapter)
    floating = [tid for op in trace.ops for tid in op.outputs if is_floating(trace.tensors[tid].dtype)]
    parameter = next(tid for name, tid in trace.leaves.items() if name.startswith("param:"))
    n = len(trace.ops)
    moved = patched = 0
    for cut in (-1, 0, n // 3, 2 * n // 3, n - 1):
        patches = {tid: trace.value(tid) * 1.5 + 0.25 for tid in floating if trace.tensors[tid].producer <= cut}
        if cut == n // 3:
            patches[parameter] = trace.value(parameter) * 0.5
        capture = {tid for op in trace.ops[n // 2 : n // 2 + 3] for tid in op.outputs}
        by_model = rerun_model(side.side, trace, patches, capture)
        by_calls = rerun_recorded(side.side.adapter, trace, side.recorded, patches, capture)
        for key, values in by_model.outputs.items():
            assert np.array_equal(by_calls.outputs[key], values, equal_nan=True), (cut, key)
        assert by_calls.captured.keys() == by_model.captured.keys() == capture
        for tid, values in by_model.captured.items():
            assert np.array_equal(by_calls.captured[tid], values, equal_nan=True), (cut, tid)
        patched += bool(patches)
        moved += any(
            not np.array_equal(values, trace.value(trace.outputs[key])) for key, values in by_model.outputs.items()
        )
    assert moved == patched >= 3


def assert_verdict_contract(result: dict) -> None:
    """What a user may rely on in any result (`bisect --json` or `Result.to_dict()`): "confirmed"
    only where the numbers fell below half (and under a tenth, or to rounding); `divergent` either
    confirmed, bracketed or (backward) a gradient one side lacks, said plainly; `noise` never against
    a float64 check that disagrees; `nondeterministic` names a side that does not repeat itself, its op as the
    culprit and a fix, and searches nothing. A backward pass's result is held to the same."""
    from bisectr.serial import number  # JSON writes a number that is not finite as "Infinity" / "NaN"

    confirmation, check = result["confirmation"], result["fp64_check"]
    if confirmation and confirmation["confirmed"] and math.isfinite(number(confirmation["before"])):
        assert number(confirmation["output_error"]) < 0.5 * number(confirmation["before"]), confirmation
    if result["verdict"] == "divergent":
        assert (confirmation and confirmation["confirmed"]) or result["bracket"] or result.get("missing_gradient"), (
            result
        )
    if result["verdict"] == "noise" and check:
        assert check["status"] != "disagree", check
        if check["status"] == "agree":  # the triangle inequality: measured <= predicted + what float64 leaves
            assert number(check["error"]) <= 1.01 * (number(check["predicted"]) + number(check["float64_error"])), check
    if result["verdict"] == "nondeterministic":
        first = result["nondeterminism"][0]
        assert result["culprit"]["candidate"] == first["op"] and first["fix"] and result["reruns"] == 0
        assert first["cause"] in ("random", "uninitialized", "kernel", "other") and result["backward"] is None
    else:
        assert result["nondeterminism"] == []
    if result.get("backward") is not None:
        assert result["backward"]["pass"] == "backward"
        assert_verdict_contract(result["backward"])


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str):
    """A tmpfs of `size` (such as "1m") mounted at `mount_point` while the block runs, to fill a disk
    for real; skips the test where that cannot be done (not root, no `mount`, a refusing kernel)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mount_point.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
