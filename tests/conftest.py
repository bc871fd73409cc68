from pathlib import Path

import pytest

MODELS = Path(__file__).parent / "models"
EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture
def models() -> Path:
    return MODELS


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the first line containing `marker`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


def assert_replay_matches_model_rerun(run, role: str) -> None:
    """Executing the recorded calls (`rerun_recorded`) gives what re-running the model's code
    gives, bit for bit, for patches cut after several ops (op outputs moved off their recorded
    values, a parameter replaced) and captured tensors; the patches do move the outputs."""
    import numpy as np

    from bisectr.recording import rerun_recorded
    from bisectr.trace import is_floating

    trace, side = run.traces[role], run.runners[role]
    assert side.recording.replayable(side.side.adapter)
    floating = [tid for op in trace.ops for tid in op.outputs if is_floating(trace.tensors[tid].dtype)]
    parameter = next(tid for name, tid in trace.leaves.items() if name.startswith("param:"))
    n = len(trace.ops)
    moved = 0
    for cut in (-1, 0, n // 3, 2 * n // 3, n - 1):
        patches = {tid: trace.value(tid) * 1.5 + 0.25 for tid in floating if trace.tensors[tid].producer <= cut}
        if cut == n // 3:
            patches[parameter] = trace.value(parameter) * 0.5
        capture = {tid for op in trace.ops[n // 2:n // 2 + 3] for tid in op.outputs}
        by_model = side.rerun_model(trace, patches, capture)
        by_calls = rerun_recorded(side.side.adapter, trace, side.recording, patches, capture)
        for key, values in by_model.outputs.items():
            assert np.array_equal(by_calls.outputs[key], values, equal_nan=True), (cut, key)
        assert by_calls.captured.keys() == by_model.captured.keys() == capture
        for tid, values in by_model.captured.items():
            assert np.array_equal(by_calls.captured[tid], values, equal_nan=True), (cut, tid)
        moved += any(not np.array_equal(values, trace.value(trace.outputs[key])) for key, values in by_model.outputs.items())
    assert moved == 4  # every cut but the one before the first op


def assert_verdict_contract(result: dict) -> None:
    """What a user may rely on in any result (`bisect --json` or `Result.to_dict()`): "confirmed"
    only where the numbers fell below half (and under a tenth, or to rounding); `divergent` either
    confirmed or bracketed; `noise` never against a float64 check that disagrees."""
    confirmation, check = result["confirmation"], result["fp64_check"]
    if confirmation and confirmation["confirmed"] and confirmation["before"] is not None:
        assert confirmation["output_error"] < 0.5 * confirmation["before"], confirmation
    if result["verdict"] == "divergent":
        assert (confirmation and confirmation["confirmed"]) or result["bracket"], result
    if result["verdict"] == "noise" and check:
        assert check["status"] != "disagree", check
        if check["status"] == "agree":  # the triangle inequality: measured <= predicted + what float64 leaves
            assert check["error"] <= 1.01 * (check["predicted"] + check["float64_error"]), check
