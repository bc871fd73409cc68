"""`--isolate`: each side in its own worker process, with the same results and errors as in-process."""

import json
import os
import pickle
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

import bisectr
from bisectr.present.cli import main
from bisectr.errors import BisectrError, TraceMismatchError
from bisectr.capture.calls import Slot
from bisectr.sides.isolate import _portable
from bisectr.present.repro import python_literal
from bisectr.sides.runner import RecordedCall, Rerun
from conftest import EXAMPLES, MODELS


def bisectr_cli(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "bisectr", *map(str, args)],
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
        cwd=cwd,
    )


def make_interpreter(directory: Path, hide: tuple[str, ...] | None = None) -> str:
    """A virtual environment's interpreter: bare (no bisectr, no framework) when `hide` is None,
    else seeing this environment's packages except the modules in `hide`, which it cannot import
    (as if they were not installed there)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    if hide is not None:
        own = Path(sysconfig.get_path("purelib", vars={"base": str(directory), "platbase": str(directory)}))
        (own / "_overlay.pth").write_text(
            f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
            f"import sys; sys.modules.update(dict.fromkeys({list(hide)!r}))\n"
        )
    return str(directory / "bin" / "python")


@pytest.mark.parametrize("example", ["tanh_gelu.py", "untransposed_weight.py"])
def test_isolated_bisect_gives_the_in_process_result(example):
    results = []
    for extra in ([], ["--isolate"]):
        done = bisectr_cli("bisect", EXAMPLES / example, "--json", *extra)
        assert done.returncode == 1, done.stderr
        results.append(json.loads(done.stdout))
    in_process, isolated = results
    assert isolated["verdict"] == "divergent" and isolated["culprit"]["candidate"] == in_process["culprit"]["candidate"]
    assert isolated == in_process  # every number: the same ops, re-runs, replays and fp64 evidence


def test_isolated_recording_writes_the_same_run_directory(tmp_path):
    runs = [
        bisectr.trace(EXAMPLES / "untransposed_weight.py", out=tmp_path / name, isolate=isolate)
        for name, isolate in (("in_process", False), ("isolated", True))
    ]
    ids = [run.run_id.encode() for run in runs]  # each file names its own run
    for side in ("reference", "candidate"):
        written = [(run.run_dir / side / "tensors.bin").read_bytes() for run in runs]
        assert written[0] == written[1], f"{side}/tensors.bin"
        traces = [
            json.loads((run.run_dir / side / "trace.json").read_bytes().replace(id_, ids[1]))
            for run, id_ in zip(runs, ids)
        ]
        # The settings are each process's own (its thread count may differ): the same names, recorded in both.
        settings = [trace.pop("settings") for trace in traces]
        assert traces[0] == traces[1], f"{side}/trace.json"
        assert settings[0].keys() == settings[1].keys() and settings[0]


PID_MODEL = """
import os


def _model(role):
    import torch

    with open(os.environ["BISECTR_TEST_PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\\n")
    print(f"the {role} model prints while it is built")  # must not disturb the worker's replies
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2), (torch.ones(2, 3),)


def reference():
    return _model("reference")


def candidate():
    return _model("candidate")


def candidate_broken():
    model, inputs = _model("candidate")

    def broken(x):
        raise ValueError("the candidate is broken")

    return broken, inputs
"""


@pytest.mark.parametrize("function, status", [("candidate", 0), ("candidate_broken", 2)])
def test_sides_run_in_workers_that_exit_with_the_command(tmp_path, function, status):
    model = tmp_path / "model.py"
    model.write_text(PID_MODEL)
    pids_file = tmp_path / "pids"
    done = bisectr_cli("bisect", model, "--candidate", function, "--isolate", env={"BISECTR_TEST_PIDS": str(pids_file)})
    assert done.returncode == status, done.stderr
    pids = [int(line) for line in pids_file.read_text().split()]
    assert len(set(pids)) == 2
    deadline = time.time() + 10
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), "a worker outlived the command"
    if status == 2:
        assert "candidate_broken() raised ValueError: the candidate is broken" in " ".join(done.stderr.split())
        assert 'raise ValueError("the candidate is broken")' in done.stderr  # the user's frames came back


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    "model_text, model_name",
    [
        pytest.param(None, "torch_raises.py", id="exception in the user's forward"),
        pytest.param(
            "def reference():\n    return 3\ndef candidate():\n    return 3\n", "wrong_return.py", id="model file error"
        ),
        pytest.param(
            "import torch\ndef reference():\n    return (lambda x: x / 0 * 0), (torch.ones(2),)\n"
            "candidate = reference\n",
            "nan_reference.py",
            id="NaN reference output",
        ),
    ],
)
def test_errors_in_workers_are_reported_as_in_process(tmp_path, capsys, model_text, model_name):
    path = MODELS / model_name
    if model_text is not None:
        path = tmp_path / model_name
        path.write_text(model_text)
    errors = []
    for extra in ([], ["--isolate"]):
        assert main(["bisect", str(path), *extra]) == 2
        errors.append(capsys.readouterr().err)
    assert errors[0] and errors[1] == errors[0]


def test_a_departing_rerun_raises_trace_mismatch_and_the_worker_keeps_serving(models, tmp_path):
    run = bisectr.trace(models / "torch_data_dependent.py", out=tmp_path / "run", isolate=True)
    doubled, exponential = run.candidate.ops[0].outputs[0], run.candidate.ops[-1].outputs[0]
    # The patch takes the other branch while a tensor of the recorded one is asked for: the re-run departs.
    with pytest.raises(TraceMismatchError, match="at op 2 .*calls Tensor.tanh where the recording called Tensor.exp"):
        run.live.ask("candidate", Rerun({doubled: -np.ones(4, np.float32)}, {exponential}))
    result = run.live.ask("candidate", Rerun({doubled: np.full(4, 3.0, np.float32)}, {doubled}))
    np.testing.assert_array_equal(result.outputs["output"], np.exp(np.full(4, 3.0, np.float32)))
    np.testing.assert_array_equal(result.captured[doubled], 3.0)
    call = run.live.ask(
        "candidate", RecordedCall(0)
    )  # y = x * 2: the arguments come back, the function stays in the worker
    assert isinstance(call.args[0], Slot) and call.args[1:] == (2,)
    with pytest.raises(BisectrError, match="lives in its side's worker"):
        call.fn()


def test_recorded_call_arguments_travel_without_their_framework():
    torch = pytest.importorskip("torch")
    portable = _portable((Slot(3), torch.float32, torch.Size([2, 3]), {"dims": [1, slice(None, 2)]}))
    code = "import pickle, sys; sys.modules['torch'] = None; print(repr(pickle.loads(sys.stdin.buffer.read())))"
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(portable), capture_output=True, check=True)
    assert done.stdout.decode().strip() == "(Slot(tid=3), torch.float32, (2, 3), {'dims': [1, slice(None, 2, None)]})"
    assert python_literal(portable[1]) == "torch.float32"  # what a repro script writes for it


def test_reference_interpreter_without_bisectr(tmp_path):
    python = make_interpreter(tmp_path / "bare")
    done = bisectr_cli("bisect", EXAMPLES / "untransposed_weight.py", "--reference-python", python, cwd=tmp_path)
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert f"the reference side's interpreter {python} cannot run bisectr's worker" in message
    assert "No module named 'bisectr'" in message and "Traceback (most recent call last)" not in message


def test_candidate_interpreter_without_its_framework(tmp_path):
    python = make_interpreter(tmp_path / "no-paddle", hide=("paddle",))
    done = bisectr_cli("bisect", EXAMPLES / "untransposed_weight.py", "--candidate-python", python)
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "candidate() raised ModuleNotFoundError" in message and "paddle" in message
    assert f"in the candidate side's interpreter {python}, which cannot import what the side needs" in message


def test_missing_interpreter(tmp_path):
    done = bisectr_cli("bisect", EXAMPLES / "untransposed_weight.py", "--reference-python", tmp_path / "nowhere")
    assert done.returncode == 2
    assert f"cannot start the reference side's interpreter {tmp_path / 'nowhere'}" in " ".join(done.stderr.split())
