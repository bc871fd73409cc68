"""The command line: summaries, tables, JSON, exit codes and bad input."""

import json
import os
import pty
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bisectr
from bisectr import load
from bisectr.present import report
from bisectr.present.cli import main
from conftest import EXAMPLES, MODELS


def bisectr_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "bisectr", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_trace_prints_sides_outputs_and_verdict(tmp_path):
    done = bisectr_cli("trace", MODELS / "torch_ops.py", "-o", tmp_path / "run", "--no-tui")
    assert done.returncode == 0, done.stderr
    for text in (
        "reference",
        "candidate",
        "torch",
        "cpu",
        "float32",
        "verdict: match",
        f"bisectr view {tmp_path / 'run'}",
    ):
        assert text in done.stdout
    assert json.loads((tmp_path / "run" / "result.json").read_text())["verdict"] == "match"
    viewed = bisectr_cli("view", tmp_path / "run", "--no-tui")
    assert viewed.returncode == 0 and "verdict: match" in viewed.stdout


def test_trace_alignment_table(tmp_path):
    done = bisectr_cli("trace", MODELS / "torch_decomposed.py", "-o", tmp_path / "run", "--alignment")
    assert done.returncode == 0, done.stderr
    assert "Alignment (candidate -> reference)" in done.stdout
    assert "matched block" in done.stdout and "aligned: 44 of 44 candidate ops" in done.stdout
    assert "Leaves (candidate -> reference)" in done.stdout
    assert re.search(r"param:w_q +│ param:q_proj.weight +│ transposed +│ equal", done.stdout)


def write(tmp_path, text):
    path = tmp_path / "model.py"
    path.write_text(text)
    return path


BAD_FILES = {
    "missing": (None, "no such model file"),
    "no functions": ("x = 1\n", "defines no function reference() for the reference side"),
    "syntax": ("def reference(:\n", "importing the model file raised SyntaxError"),
    "wrong return": (
        "def reference():\n    return 3\ndef candidate():\n    return 3\n",
        "reference() returned int, not (model, inputs)",
    ),
    "bad inputs": (
        "import torch\ndef reference():\n    return torch.nn.Linear(2, 2), 5\ncandidate = reference\n",
        "inputs that are neither a tuple of positional arguments nor a dict of keyword arguments: int",
    ),
    "unsupported": (
        "def reference():\n    return (lambda x: x), ([1.0],)\ncandidate = reference\n",
        "cannot tell the framework of the reference side",
    ),
    "no tensors out": (
        "import torch\ndef reference():\n    return (lambda x: 3), (torch.ones(2),)\ncandidate = reference\n",
        "the reference model returned no tensors",
    ),
    "outputs unmatched": (
        "import torch\ndef reference():\n    return (lambda x: (x * 2, x * 3)), (torch.ones(2),)\n"
        "def candidate():\n    return (lambda x: x * 2), (torch.ones(2),)\n",
        "cannot pair the outputs",
    ),
    "chained cause": (
        "def reference():\n    try:\n        import no_such_module_xyz\n    except ImportError as exc:\n"
        "        raise RuntimeError('cannot build') from exc\ncandidate = reference\n",
        "No module named 'no_such_module_xyz' which caused:",
    ),
    "nan reference": (
        "import torch\ndef reference():\n    return (lambda x: x / 0 * 0), (torch.ones(2),)\ncandidate = reference\n",
        "holds 2 NaN",
    ),
    "compiled function": (
        "import torch\ndef reference():\n    return torch.compile(lambda x: x * 2), (torch.ones(2),)\n"
        "candidate = reference\n",
        "is a compiled function",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["trace", "bisect"])
def test_bad_model_files_exit_2_with_a_message_naming_the_file(tmp_path, case, command, capsys):
    text, message = BAD_FILES[case]
    path = tmp_path / "absent.py" if text is None else write(tmp_path, text)
    args = [command, str(path)] + (["-o", str(tmp_path / "run")] if command == "trace" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(path.name) in err and message in " ".join(err.split()), err
    assert "Traceback (most recent call last)" not in err
    assert not (tmp_path / "run").exists()


def test_exception_in_the_user_model_shows_the_users_frames(capsys):
    assert main(["bisect", str(MODELS / "torch_raises.py")]) == 2
    err = capsys.readouterr().err
    assert "the candidate model returned by candidate() raised RuntimeError" in " ".join(err.split())
    assert 'torch_raises.py", line 16, in forward' in err and "recording.py" not in err


def test_view_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    assert "not a complete bisectr run" in capsys.readouterr().err


def test_missing_function_names_can_be_chosen(tmp_path, capsys):
    path = write(tmp_path, "x = 1\n")
    assert main(["bisect", str(path), "--reference", "torch_side"]) == 2
    assert "defines no function torch_side()" in capsys.readouterr().err


def test_stats_only_trace_summarises_without_searching(tmp_path):
    done = bisectr_cli("trace", MODELS / "torch_gelu_stack.py", "--stats-only", "-o", tmp_path / "run")
    assert done.returncode == 0, done.stderr
    assert "statistics only: no values stored, so no search" in done.stdout and "verdict" not in done.stdout
    viewed = bisectr_cli("view", tmp_path / "run", "--no-tui")
    assert viewed.returncode == 0 and "this run holds no search result" in viewed.stdout


SPAN_HEAD = EXAMPLES / "span_head.py"


def test_trace_in_a_pipe_prints_the_verdict_first_and_whole_table_cells(tmp_path):
    """Off a terminal, even with COLUMNS=80, tables keep their natural width: no cell is cut (`encoder.layer…`)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "trace",
            str(SPAN_HEAD),
            "--ops",
            "--alignment",
            "--no-tui",
            "-o",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "…" not in done.stdout
    order = [
        next(i for i, line in enumerate(lines) if line.startswith(title))
        for title in ("verdict: noise", "Sides", "Outputs", "Alignment (candidate", "Ops (candidate", "run saved in")
    ]
    assert order == sorted(order)
    ops = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines[order[4] :] if line.startswith("│ ")]
    assert len(ops) == len(json.loads((tmp_path / "run" / "result.json").read_text())["profile"]) == 71
    query = next(row for row in ops if row[2] == "encoder.layers.0.attn.q_proj")
    assert query[1] == "linear" and query[3].startswith("examples/_paddle_blocks.py:")
    assert max(map(len, lines[order[4] : order[5]])) > 80


def test_trace_format_tsv_prints_one_table_at_full_precision(tmp_path):
    run_dir = tmp_path / "run"
    done = bisectr_cli("trace", SPAN_HEAD, "--ops", "--format", "tsv", "-o", run_dir)
    assert done.returncode == 0, done.stderr
    header, *rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert header == ["op", "name", "module", "source", "mean dif", "max dif", "max rel", "local", "verdict"]
    profile = json.loads((run_dir / "result.json").read_text())["profile"]
    assert len(rows) == len(profile) == 71
    for row, measured in zip(rows, profile):
        assert int(row[0]) == measured["index"] and row[1] == measured["op"] and row[8] == measured["verdict"]
        assert [float(v) for v in row[4:8]] == [
            measured[k] for k in ("mean_abs", "max_abs", "output_error", "local_error")
        ]
    assert max(float(row[5]) for row in rows) > 1e-3  # the amplified span logits

    done = bisectr_cli("trace", SPAN_HEAD, "--alignment", "--format", "tsv", "-o", run_dir)
    assert done.returncode == 0, done.stderr
    header, *rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert header == ["cand op", "ref op", "op", "candidate module", "reference module", "confidence", "why"]
    run = load(run_dir)
    assert [(int(c), int(r), op) for c, r, op, *_ in rows] == [
        (p.candidate, p.reference, run.candidate.ops[p.candidate].op) for p in run.alignment.pairs
    ]
    assert len(rows) == 70


def test_tsv_needs_exactly_one_table(capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(["trace", str(SPAN_HEAD), "--ops", "--alignment", "--format", "tsv"])
    assert exit_status.value.code == 2 and "give either --ops or --alignment" in capsys.readouterr().err


def test_version_names_the_libraries_found_and_help_the_model_file():
    import importlib.util
    import platform

    import numpy
    import paddle
    import torch

    version = bisectr_cli("--version")
    project = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())["project"]["version"]
    assert version.returncode == 0 and bisectr.__version__ == project
    lines = version.stdout.splitlines()
    assert lines[0] == f"bisectr {project}"
    shown = dict(line.split(maxsplit=1) for line in lines[1:])
    assert shown["python"] == platform.python_version() and shown["numpy"] == numpy.__version__
    assert shown["torch"] == torch.__version__ and shown["paddle"] == paddle.__version__
    assert set(shown) == {"python", "numpy", "torch", "paddle", "transformers", "paddleformers"}
    for library in ("transformers", "paddleformers"):
        found = importlib.util.find_spec(library)
        assert (shown[library] == "not installed") == (found is None), library
    shown = bisectr_cli("--help").stdout
    for text in (
        "def reference():",
        "def candidate():",
        "returning (model, inputs)",
        "bisectr trace examples/span_head.py",
        "0  match or noise",
        "1  divergent",
        "2  usage errors",
        "3  a bug in bisectr",
    ):
        assert text in shown, text
    assert "exit status:" in bisectr_cli("bisect", "--help").stdout


@pytest.mark.parametrize("message", ["profile", "[/__w/pytorch/third_party/gloo/unbound_buffer.cc:129] Timed out"])
def test_a_bug_in_bisectr_exits_3_and_points_at_its_traceback(monkeypatch, capsys, message):
    def broken(*args):
        raise KeyError(message)

    monkeypatch.setattr(report, "print_result", broken)
    assert main(["bisect", str(MODELS / "torch_ops.py")]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"bisectr: internal error: KeyError: {message!r}" in err
        and "This is a bug in bisectr, not in your model" in err
    )
    log = Path(re.search(r"Its traceback is in (\S+);", err).group(1))
    try:
        assert "Traceback (most recent call last)" in log.read_text() and "in broken" in log.read_text()
    finally:
        log.unlink()


def _output_on_a_terminal(*args) -> str:
    """What `bisectr ARGS` writes to a terminal (a pseudo-terminal as stdout and stderr)."""
    main_end, side_end = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "bisectr", *map(str, args)], stdin=side_end, stdout=side_end, stderr=side_end
    )
    os.close(side_end)
    chunks = []
    while True:
        try:
            chunk = os.read(main_end, 1 << 16)
        except OSError:  # the process exited and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait()
    os.close(main_end)
    return b"".join(chunks).decode(errors="replace")


def test_recording_shows_the_op_count_on_a_terminal_only(tmp_path):
    """A status line counts each side's ops as they are recorded; it is drawn a last time as the
    recording ends, so the candidate's full count is always shown."""
    model = MODELS / "hf_llama_activation.py"
    status = re.compile(r"recording (reference|candidate): \d+ ops")
    shown = _output_on_a_terminal("trace", model, "--no-tui", "-o", tmp_path / "run")
    recorded = len(load(tmp_path / "run").candidate.ops)  # 316-320 with the transformers version
    assert f"recording candidate: {recorded} ops" in shown and "verdict: match" in shown
    piped = bisectr_cli("trace", model, "--no-tui", "-o", tmp_path / "run")
    assert not status.search(piped.stdout + piped.stderr) and "verdict: match" in piped.stdout
    quiet = _output_on_a_terminal("bisect", model, "--json")
    assert not status.search(quiet) and json.loads(quiet)["verdict"] == "match"


def test_outputs_of_different_shapes_pair_only_through_a_layout_the_values_confirm():
    model = MODELS / "output_layouts.py"
    transposed = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(model), "--candidate", "candidate_transposed", "--json"],
        capture_output=True,
        text=True,
    )
    assert transposed.returncode == 0 and json.loads(transposed.stdout)["verdict"] == "match"
    reshaped = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(model), "--candidate", "candidate_reshaped"],
        capture_output=True,
        text=True,
    )
    assert reshaped.returncode == 2 and "Traceback" not in reshaped.stderr
    assert "shape [2, 4] in the reference but 'output' has [4, 2]" in reshaped.stderr
    assert "no layout of the candidate's values matches" in reshaped.stderr
