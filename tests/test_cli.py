"""The command line: summaries, JSON, exit codes and bad input."""
import json
import subprocess
import sys

import pytest

from bisectr.cli import main
from conftest import MODELS


def bisectr_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "bisectr", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_trace_prints_sides_outputs_and_verdict(tmp_path):
    done = bisectr_cli("trace", MODELS / "torch_ops.py", "-o", tmp_path / "run", "--no-tui")
    assert done.returncode == 0, done.stderr
    for text in ("reference", "candidate", "torch", "cpu", "float32", "verdict: match", f"bisectr view {tmp_path / 'run'}"):
        assert text in done.stdout
    assert json.loads((tmp_path / "run" / "result.json").read_text())["verdict"] == "match"
    viewed = bisectr_cli("view", tmp_path / "run", "--no-tui")
    assert viewed.returncode == 0 and "verdict: match" in viewed.stdout


def test_trace_alignment_table(tmp_path):
    done = bisectr_cli("trace", MODELS / "torch_decomposed.py", "-o", tmp_path / "run", "--alignment")
    assert done.returncode == 0, done.stderr
    assert "Alignment (candidate -> reference)" in done.stdout
    assert "matched block" in done.stdout and "aligned: 44 of 44 candidate ops" in done.stdout


def write(tmp_path, text):
    path = tmp_path / "model.py"
    path.write_text(text)
    return path


BAD_FILES = {
    "missing": (None, "no such model file"),
    "no functions": ("x = 1\n", "defines no function reference() for the reference side"),
    "syntax": ("def reference(:\n", "importing the model file raised SyntaxError"),
    "wrong return": ("def reference():\n    return 3\ndef candidate():\n    return 3\n", "must return (model, inputs), got int"),
    "bad inputs": ("import torch\ndef reference():\n    return torch.nn.Linear(2, 2), 5\ncandidate = reference\n",
                   "inputs as a tuple of positional arguments or a dict of keyword arguments, got int"),
    "unsupported": ("def reference():\n    return (lambda x: x), ([1.0],)\ncandidate = reference\n",
                    "cannot tell the framework of the reference side"),
    "no tensors out": ("import torch\ndef reference():\n    return (lambda x: 3), (torch.ones(2),)\ncandidate = reference\n",
                       "the reference model returned no tensors"),
    "outputs unmatched": ("import torch\ndef reference():\n    return (lambda x: (x * 2, x * 3)), (torch.ones(2),)\n"
                          "def candidate():\n    return (lambda x: x * 2), (torch.ones(2),)\n", "cannot pair the outputs"),
    "chained cause": ("def reference():\n    try:\n        import no_such_module_xyz\n    except ImportError as exc:\n"
                      "        raise RuntimeError('cannot build') from exc\ncandidate = reference\n",
                      "No module named 'no_such_module_xyz' which caused:"),
    "nan reference": ("import torch\ndef reference():\n    return (lambda x: x / 0 * 0), (torch.ones(2),)\ncandidate = reference\n",
                      "holds 2 NaN"),
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
